//! A bounded head-and-tail collector for a command's output.
//!
//! A guest may print without end; the server keeps at most a fixed number of bytes per stream
//! whatever it prints: the first half of the budget as it arrives, and the last half in a ring
//! that forgets the oldest bytes. The bytes between are counted, never held.

use std::collections::VecDeque;

/// What [`HeadTail`] keeps of one stream.
#[derive(Debug)]
pub struct HeadTail {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    total: u64,
}

impl HeadTail {
    /// A collector that keeps at most `budget` bytes: `budget / 2` rounded up from the start, the
    /// rest from the end.
    pub fn new(budget: usize) -> Self {
        let head_cap = budget.div_ceil(2);
        HeadTail {
            head: Vec::new(),
            tail: VecDeque::new(),
            head_cap,
            tail_cap: budget - head_cap,
            total: 0,
        }
    }

    /// Takes one chunk. Memory never grows past the budget.
    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total = self.total.saturating_add(bytes.len() as u64);
        let room = self.head_cap - self.head.len();
        if room > 0 {
            let take = room.min(bytes.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        if self.tail_cap == 0 || bytes.is_empty() {
            return;
        }
        if bytes.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.tail_cap..]);
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow);
        self.tail.extend(bytes);
    }

    /// Every byte seen, kept or not.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Whether bytes were dropped.
    pub fn truncated(&self) -> bool {
        self.total > (self.head.len() + self.tail.len()) as u64
    }

    /// The kept bytes as text (invalid UTF-8 replaced). When bytes were dropped, a marker saying
    /// how many stands between the head and the tail.
    pub fn text(&self) -> String {
        let head = String::from_utf8_lossy(&self.head);
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        let tail = String::from_utf8_lossy(&tail);
        if self.truncated() {
            let dropped = self.total - (self.head.len() + self.tail.len()) as u64;
            format!("{head}\n[... {dropped} bytes omitted ...]\n{tail}")
        } else {
            format!("{head}{tail}")
        }
    }

    /// Bytes held (for the memory bound's tests).
    pub fn held(&self) -> usize {
        self.head.len() + self.tail.len()
    }
}

/// The last complete or partial line of output, for progress messages; bounded too.
#[derive(Debug, Default)]
pub struct LastLine {
    current: Vec<u8>,
    last: Vec<u8>,
}

/// The longest progress message kept.
const LAST_LINE_MAX: usize = 200;

impl LastLine {
    /// Takes one chunk.
    pub fn push(&mut self, bytes: &[u8]) {
        for piece in bytes.split_inclusive(|b| *b == b'\n') {
            let (body, ends) = match piece.strip_suffix(b"\n") {
                Some(body) => (body, true),
                None => (piece, false),
            };
            let room = LAST_LINE_MAX.saturating_sub(self.current.len());
            self.current
                .extend_from_slice(&body[..room.min(body.len())]);
            if ends {
                if !self.current.is_empty() {
                    self.last = std::mem::take(&mut self.current);
                }
                self.current.clear();
            }
        }
    }

    /// The latest non-empty line (a partial one if it is newer), as text.
    pub fn latest(&self) -> Option<String> {
        let line = if self.current.is_empty() {
            &self.last
        } else {
            &self.current
        };
        (!line.is_empty()).then(|| String::from_utf8_lossy(line).trim_end().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let mut c = HeadTail::new(10);
        c.push(b"abc");
        c.push(b"def");
        assert!(!c.truncated());
        assert_eq!(c.text(), "abcdef");
        assert_eq!(c.total(), 6);
    }

    #[test]
    fn exactly_the_budget_is_not_truncated() {
        let mut c = HeadTail::new(6);
        c.push(b"abcdef");
        assert!(!c.truncated());
        assert_eq!(c.text(), "abcdef");
    }

    #[test]
    fn long_output_keeps_head_and_tail_and_says_how_much_is_gone() {
        let mut c = HeadTail::new(6);
        for chunk in [&b"0123"[..], b"4567", b"89", b"ABCDEFG"] {
            c.push(chunk);
        }
        assert!(c.truncated());
        assert_eq!(c.total(), 17);
        assert_eq!(c.text(), "012\n[... 11 bytes omitted ...]\nEFG");
    }

    #[test]
    fn memory_stays_within_the_budget_whatever_is_pushed() {
        let mut c = HeadTail::new(1000);
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..160 {
            c.push(&chunk);
            assert!(c.held() <= 1000);
        }
        assert_eq!(c.total(), 160 * 64 * 1024);
        assert!(c.truncated());
    }

    #[test]
    fn tail_follows_many_small_chunks() {
        let mut c = HeadTail::new(4);
        for b in b"abcdefghij" {
            c.push(&[*b]);
        }
        assert_eq!(c.text(), "ab\n[... 6 bytes omitted ...]\nij");
    }

    #[test]
    fn last_line_is_the_newest_non_empty_line() {
        let mut l = LastLine::default();
        assert_eq!(l.latest(), None);
        l.push(b"one\ntw");
        assert_eq!(l.latest().as_deref(), Some("tw"));
        l.push(b"o\n\n");
        assert_eq!(l.latest().as_deref(), Some("two"));
        l.push(&vec![b'z'; 1000]);
        assert_eq!(l.latest().map(|s| s.len()), Some(LAST_LINE_MAX));
    }
}
