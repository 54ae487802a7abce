//! Stdio with a line limit that answers: a request longer than the limit gets a JSON-RPC error.
//!
//! The SDK's stdio transport drops a line over its length limit and answers nothing, so the
//! client waits for a response that never comes. [`BoundedLines`] sits between standard input
//! and the transport: it hands over whole lines only, and a line past the limit is read to its
//! end without being kept (only its top-level `id` is picked out as the bytes go by) and replaced
//! by a small request of the server's own, [`TOO_LARGE_METHOD`], carrying that `id`. The server
//! answers it with an `invalid request` error naming the limit ([`too_large`]), so the client's
//! pending call ends with a readable error. A line whose `id` cannot be found is replaced by a
//! well-formed message that is no request, which the SDK answers with an error of id `null`.
//!
//! The limit is the one HTTP applies to a request body, derived from `--max-file-bytes`
//! ([`crate::config::request_bytes_for`]), so a file within the limit fits either way.

use std::pin::Pin;
use std::task::{Context, Poll};

use rmcp::ErrorData;
use tokio::io::{AsyncRead, ReadBuf};

/// The method of the request that stands in for one over the limit; its `params.limit` is the
/// limit in bytes.
pub const TOO_LARGE_METHOD: &str = "sandbox-mcp/request-too-large";

/// The error that answers a request over the line limit of `limit` bytes.
#[cold]
pub fn too_large(limit: Option<u64>) -> ErrorData {
    let limit = limit.map_or_else(String::new, |n| format!(" of {n} bytes"));
    ErrorData::invalid_request(
        format!(
            "the request is longer than the server's limit{limit} and was not read; send less (a file within the server's file limit always fits as base64)"
        ),
        None,
    )
}

/// The longest `id` value picked out of an oversized line, in bytes.
const ID_MAX: usize = 256;

/// Reads `inner` line by line, handing over each line whole once it has ended, and a line longer
/// than `max` bytes as the stand-in request.
#[derive(Debug)]
pub struct BoundedLines<R> {
    inner: R,
    max: usize,
    /// The line being read (at most `max` bytes).
    line: Vec<u8>,
    /// Bytes ready to be handed over, and how many of them were.
    ready: Vec<u8>,
    given: usize,
    /// Set while the rest of an oversized line is read and dropped.
    dropping: Option<IdScan>,
    eof: bool,
}

impl<R> BoundedLines<R> {
    /// Lines of `inner`, each at most `max` bytes (the newline included).
    pub fn new(inner: R, max: usize) -> Self {
        BoundedLines {
            inner,
            max: max.max(1),
            line: Vec::new(),
            ready: Vec::new(),
            given: 0,
            dropping: None,
            eof: false,
        }
    }

    /// Takes bytes just read, moving whole lines to `ready`.
    fn take(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let newline = bytes.iter().position(|b| *b == b'\n');
            let end = newline.map_or(bytes.len(), |at| at + 1);
            let (piece, rest) = bytes.split_at(end);
            bytes = rest;
            if let Some(scan) = &mut self.dropping {
                scan.feed(piece);
            } else if self.line.len() + piece.len() > self.max {
                let mut scan = IdScan::default();
                scan.feed(&self.line);
                scan.feed(piece);
                self.line = Vec::new();
                self.dropping = Some(scan);
            } else {
                self.line.extend_from_slice(piece);
            }
            if newline.is_some() {
                match self.dropping.take() {
                    Some(scan) => self.ready.extend(stand_in(scan.id(), self.max)),
                    None => self.ready.append(&mut self.line),
                }
            }
        }
    }
}

/// The line that replaces an oversized one: the stand-in request with its `id`, or, without one,
/// a well-formed message that is no request.
fn stand_in(id: Option<serde_json::Value>, max: usize) -> Vec<u8> {
    let message = match id {
        Some(id) => serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": TOO_LARGE_METHOD,
            "params": { "limit": max },
        }),
        None => serde_json::json!({ "jsonrpc": "2.0", "error": "request too large" }),
    };
    let mut line = message.to_string().into_bytes();
    line.push(b'\n');
    line
}

impl<R: AsyncRead + Unpin> AsyncRead for BoundedLines<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.given < this.ready.len() {
                let n = (this.ready.len() - this.given).min(buf.remaining());
                buf.put_slice(&this.ready[this.given..this.given + n]);
                this.given += n;
                if this.given == this.ready.len() {
                    this.ready.clear();
                    this.given = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // A last line without a newline is handed over as it is; the transport drops it.
                if !this.line.is_empty() {
                    this.ready.append(&mut this.line);
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 64 * 1024];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    if read.filled().is_empty() {
                        this.eof = true;
                    } else {
                        this.take(read.filled());
                    }
                }
            }
        }
    }
}

/// Picks the top-level `id` (a number or a string) out of a JSON object read in pieces, keeping
/// nothing else.
#[derive(Debug, Default)]
struct IdScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// The top-level string just read, while it may be the key `id`.
    key: Vec<u8>,
    /// The last top-level string was `"id"` and a `:` followed: the next value is the id.
    want_value: bool,
    /// Reading the id's string (`Some(true)`) or number (`Some(false)`).
    capturing: Option<bool>,
    value: Vec<u8>,
    id: Option<serde_json::Value>,
    key_is_id: bool,
}

impl IdScan {
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    fn byte(&mut self, b: u8) {
        if self.in_string {
            if self.capturing == Some(true) && self.value.len() < ID_MAX {
                self.value.push(b);
            } else if self.depth == 1 && self.key.len() < 8 {
                self.key.push(b);
            }
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.capturing == Some(true) {
                    self.finish();
                } else if self.depth == 1 {
                    self.key_is_id = self.key == b"id\"";
                }
            }
            return;
        }
        if self.capturing == Some(false) {
            if b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E') {
                if self.value.len() < ID_MAX {
                    self.value.push(b);
                }
                return;
            }
            self.finish();
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.want_value && self.depth == 1 {
                    self.want_value = false;
                    self.capturing = Some(true);
                    self.value = vec![b'"'];
                } else {
                    self.key.clear();
                }
            }
            b'{' | b'[' => {
                self.want_value = false;
                self.depth += 1;
            }
            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
            b':' => {
                self.want_value = self.depth == 1 && std::mem::take(&mut self.key_is_id);
            }
            b',' => self.key_is_id = false,
            b' ' | b'\t' | b'\r' | b'\n' => {}
            b'-' | b'0'..=b'9' if self.want_value => {
                self.want_value = false;
                self.capturing = Some(false);
                self.value = vec![b];
            }
            _ => self.want_value = false,
        }
    }

    /// The id just read, kept when it is the first and a JSON-RPC id (a string or an integer).
    fn finish(&mut self) {
        self.capturing = None;
        let value = std::mem::take(&mut self.value);
        if self.id.is_none() {
            self.id = serde_json::from_slice::<serde_json::Value>(&value)
                .ok()
                .filter(|v| v.is_string() || v.is_i64() || v.is_u64());
        }
    }

    fn id(mut self) -> Option<serde_json::Value> {
        if self.capturing == Some(false) {
            self.finish();
        }
        self.id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt as _;

    async fn through(input: &[u8], max: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let reader = tokio_test_reader(input);
        BoundedLines::new(reader, max)
            .read_to_end(&mut out)
            .await
            .unwrap();
        out
    }

    /// A reader that hands its bytes over in small pieces, as a pipe may.
    struct Pieces(std::collections::VecDeque<Vec<u8>>);

    impl AsyncRead for Pieces {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if let Some(piece) = self.0.pop_front() {
                buf.put_slice(&piece);
            }
            Poll::Ready(Ok(()))
        }
    }

    fn tokio_test_reader(input: &[u8]) -> Pieces {
        Pieces(input.chunks(7).map(<[u8]>::to_vec).collect())
    }

    fn lines(bytes: &[u8]) -> Vec<serde_json::Value> {
        bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn lines_within_the_limit_pass_whole_and_an_oversized_one_becomes_the_stand_in() {
        let small = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        let big = format!(
            r#"{{"jsonrpc":"2.0","id":"call-7","method":"tools/call","params":{{"arguments":{{"content":"{}","id":3}}}}}}"#,
            "x".repeat(500)
        );
        let mut input = Vec::new();
        for line in [&small[..], big.as_bytes(), &small[..]] {
            input.extend_from_slice(line);
            input.push(b'\n');
        }
        let out = lines(&through(&input, 200).await);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0]["method"], "ping");
        assert_eq!(out[1]["method"], TOO_LARGE_METHOD);
        assert_eq!(out[1]["id"], "call-7", "the top-level id, not a nested one");
        assert_eq!(out[1]["params"]["limit"], 200);
        assert_eq!(out[2]["id"], 1);
    }

    #[tokio::test]
    async fn the_id_is_found_after_the_payload_and_without_one_no_request_is_made() {
        let late = format!(
            r#"{{"method":"tools/call","params":{{"s":"{}\"id\":9"}},"id" : 42}}"#,
            "y".repeat(500)
        );
        let none = format!(
            r#"{{"method":"notifications/x","params":"{}"}}"#,
            "z".repeat(500)
        );
        let input = format!("{late}\n{none}\n");
        let out = lines(&through(input.as_bytes(), 100).await);
        assert_eq!(out[0]["id"], 42);
        assert_eq!(out[0]["method"], TOO_LARGE_METHOD);
        assert!(
            out[1].get("id").is_none() && out[1].get("method").is_none(),
            "{}",
            out[1]
        );
    }
}
