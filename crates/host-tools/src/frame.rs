//! The channel's frames and their bounded decoder. No I/O: both sides (the host's dispatcher and
//! the guest's relay and client) and the fuzz targets use this one definition.
//!
//! A frame is an 8-byte header and a payload:
//!
//! ```text
//! b'H'  VERSION  kind  0  | payload length (u32, big-endian) | payload (JSON, or empty)
//! ```
//!
//! The decoder refuses a frame whose header announces more than its bound before reading the
//! payload, so a peer can never make the other side hold more than one bound's worth of bytes.

use serde_json::{json, Map, Value};

/// The first byte of every frame.
const MAGIC: u8 = b'H';
/// The version this crate speaks; a frame of another version is refused.
pub const VERSION: u8 = 1;
/// The header's length.
pub const HEADER_BYTES: usize = 8;
/// The default bound on one frame's payload: room for a result at the default cap
/// ([`RunBounds`](crate::RunBounds)) and its JSON envelope.
pub const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024 + 4096;

const KIND_CALL: u8 = 1;
const KIND_RESULT: u8 = 2;
const KIND_FAILURE: u8 = 3;
const KIND_READY: u8 = 4;
const KIND_DRAIN: u8 = 5;

/// Why a call failed, as the guest sees it. The wire name is [`FailureCode::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureCode {
    /// No tool of that name is registered.
    UnknownTool,
    /// The tool exists but this run did not declare it.
    UndeclaredTool,
    /// The arguments do not satisfy the tool's schema.
    InvalidArguments,
    /// The arguments are larger than the run's bound.
    ArgumentsTooLarge,
    /// The tool's result is larger than the run's bound.
    ResultTooLarge,
    /// The run has made as many calls as its bound allows.
    TooManyCalls,
    /// The run has as many calls in flight as its bound allows.
    TooManyInFlight,
    /// Another call in flight has the same id.
    DuplicateCallId,
    /// The tool did not answer within the call's deadline.
    DeadlineExceeded,
    /// The tool's handler refused or failed.
    ToolFailed,
    /// The run ended (or the relay shut down) before the call was answered.
    RunEnded,
    /// The guest side's own failure: the relay unreachable, a malformed reply.
    Channel,
}

impl FailureCode {
    /// Every code, for tests and documentation.
    pub const ALL: [FailureCode; 12] = [
        FailureCode::UnknownTool,
        FailureCode::UndeclaredTool,
        FailureCode::InvalidArguments,
        FailureCode::ArgumentsTooLarge,
        FailureCode::ResultTooLarge,
        FailureCode::TooManyCalls,
        FailureCode::TooManyInFlight,
        FailureCode::DuplicateCallId,
        FailureCode::DeadlineExceeded,
        FailureCode::ToolFailed,
        FailureCode::RunEnded,
        FailureCode::Channel,
    ];

    /// The code's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureCode::UnknownTool => "unknown_tool",
            FailureCode::UndeclaredTool => "undeclared_tool",
            FailureCode::InvalidArguments => "invalid_arguments",
            FailureCode::ArgumentsTooLarge => "arguments_too_large",
            FailureCode::ResultTooLarge => "result_too_large",
            FailureCode::TooManyCalls => "too_many_calls",
            FailureCode::TooManyInFlight => "too_many_in_flight",
            FailureCode::DuplicateCallId => "duplicate_call_id",
            FailureCode::DeadlineExceeded => "deadline_exceeded",
            FailureCode::ToolFailed => "tool_failed",
            FailureCode::RunEnded => "run_ended",
            FailureCode::Channel => "channel",
        }
    }

    /// The code of a wire name.
    pub fn from_wire(name: &str) -> Option<FailureCode> {
        FailureCode::ALL
            .into_iter()
            .find(|code| code.as_str() == name)
    }
}

impl std::fmt::Display for FailureCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One frame of the channel.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// Guest to host: call `tool` with `arguments`; the answer carries the same `id`.
    Call {
        /// The call's id, unique among the calls in flight.
        id: u64,
        /// The tool's name.
        tool: String,
        /// The arguments, checked against the tool's schema on the host.
        arguments: Value,
    },
    /// Host to guest: the call's result.
    Result {
        /// The call's id.
        id: u64,
        /// The tool's result.
        value: Value,
    },
    /// Host to guest (or relay to client): the call failed.
    Failure {
        /// The call's id.
        id: u64,
        /// Why.
        code: FailureCode,
        /// One line for a person; never a secret of the host's.
        message: String,
    },
    /// Relay to host, once: the relay listens at `socket`.
    Ready {
        /// The socket's path in the guest.
        socket: String,
    },
    /// Host to relay: the run is over; answer what is pending with `run_ended`, remove the run's
    /// directory and exit.
    Drain,
}

impl Frame {
    /// The frame's bytes: header and payload.
    pub fn encode(&self) -> Vec<u8> {
        let (kind, payload) = match self {
            Frame::Call {
                id,
                tool,
                arguments,
            } => (
                KIND_CALL,
                json!({"id": id, "tool": tool, "arguments": arguments}),
            ),
            Frame::Result { id, value } => (KIND_RESULT, json!({"id": id, "value": value})),
            Frame::Failure { id, code, message } => (
                KIND_FAILURE,
                json!({"id": id, "code": code.as_str(), "message": message}),
            ),
            Frame::Ready { socket } => (KIND_READY, json!({"socket": socket})),
            Frame::Drain => (KIND_DRAIN, Value::Null),
        };
        let body = if payload.is_null() {
            Vec::new()
        } else {
            // Serialising a Value cannot fail: its keys are strings.
            serde_json::to_vec(&payload).unwrap_or_default()
        };
        let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
        bytes.extend_from_slice(&[MAGIC, VERSION, kind, 0]);
        bytes.extend_from_slice(&(body.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&body);
        bytes
    }

    /// The call id the frame answers or carries, if any.
    pub fn id(&self) -> Option<u64> {
        match self {
            Frame::Call { id, .. } | Frame::Result { id, .. } | Frame::Failure { id, .. } => {
                Some(*id)
            }
            Frame::Ready { .. } | Frame::Drain => None,
        }
    }
}

/// Why bytes are not a frame. Every one ends the channel: after a malformed frame, nothing that
/// follows can be trusted to start at a frame boundary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The first byte is not the frame marker.
    #[error("not a host-tool frame (first byte {0:#04x})")]
    BadMagic(u8),
    /// A version this side does not speak.
    #[error("host-tool frame version {0}, this side speaks {VERSION}")]
    Version(u8),
    /// A kind byte no frame has, or a non-zero reserved byte.
    #[error("unknown host-tool frame kind {0}")]
    Kind(u8),
    /// The header announces more than the bound.
    #[error("a host-tool frame of {announced} bytes is over the {bound}-byte bound")]
    Oversized {
        /// The announced payload length.
        announced: u64,
        /// The decoder's bound.
        bound: usize,
    },
    /// The payload is not the JSON the kind requires.
    #[error("malformed host-tool frame payload: {0}")]
    Payload(String),
}

impl FrameError {
    #[cold]
    fn payload(reason: impl Into<String>) -> FrameError {
        FrameError::Payload(reason.into())
    }
}

/// Splits a byte stream into frames, holding at most one frame's header and bounded payload.
#[derive(Debug)]
pub struct Decoder {
    buffer: Vec<u8>,
    max_payload: usize,
    failed: Option<FrameError>,
}

impl Decoder {
    /// A decoder refusing payloads over `max_payload` bytes.
    pub fn new(max_payload: usize) -> Decoder {
        Decoder {
            buffer: Vec::new(),
            max_payload,
            failed: None,
        }
    }

    /// Takes bytes from `input` as far as the next frame boundary needs and returns the frame
    /// they complete, if any, with how many bytes of `input` were consumed. Call again with the
    /// rest of `input` until it is consumed. After an error, every later call returns it again.
    ///
    /// # Errors
    /// A [`FrameError`] when the bytes cannot be a frame.
    pub fn feed(&mut self, input: &[u8]) -> (usize, Result<Option<Frame>, FrameError>) {
        if let Some(error) = &self.failed {
            return (input.len(), Err(error.clone()));
        }
        let mut consumed = 0;
        if self.buffer.len() < HEADER_BYTES {
            let take = (HEADER_BYTES - self.buffer.len()).min(input.len());
            self.buffer.extend_from_slice(&input[..take]);
            consumed += take;
            if self.buffer.len() < HEADER_BYTES {
                return (consumed, Ok(None));
            }
            if let Err(error) = self.check_header() {
                self.failed = Some(error.clone());
                return (input.len(), Err(error));
            }
        }
        let total = HEADER_BYTES + self.announced();
        let take = (total - self.buffer.len()).min(input.len() - consumed);
        self.buffer
            .extend_from_slice(&input[consumed..consumed + take]);
        consumed += take;
        if self.buffer.len() < total {
            return (consumed, Ok(None));
        }
        let result = parse(self.buffer[2], &self.buffer[HEADER_BYTES..]);
        self.buffer.clear();
        match result {
            Ok(frame) => (consumed, Ok(Some(frame))),
            Err(error) => {
                self.failed = Some(error.clone());
                (input.len(), Err(error))
            }
        }
    }

    /// Every frame `input` completes, in order; stops at the first error.
    ///
    /// # Errors
    /// The first [`FrameError`]; frames before it are lost with the channel.
    pub fn feed_all(&mut self, mut input: &[u8]) -> Result<Vec<Frame>, FrameError> {
        let mut frames = Vec::new();
        while !input.is_empty() {
            let (consumed, result) = self.feed(input);
            if let Some(frame) = result? {
                frames.push(frame);
            }
            input = &input[consumed..];
        }
        Ok(frames)
    }

    /// True when no partial frame is held.
    pub fn is_idle(&self) -> bool {
        self.buffer.is_empty() && self.failed.is_none()
    }

    fn announced(&self) -> usize {
        let length = u32::from_be_bytes([
            self.buffer[4],
            self.buffer[5],
            self.buffer[6],
            self.buffer[7],
        ]);
        length as usize
    }

    fn check_header(&self) -> Result<(), FrameError> {
        let header = &self.buffer[..HEADER_BYTES];
        if header[0] != MAGIC {
            return Err(FrameError::BadMagic(header[0]));
        }
        if header[1] != VERSION {
            return Err(FrameError::Version(header[1]));
        }
        if !(KIND_CALL..=KIND_DRAIN).contains(&header[2]) || header[3] != 0 {
            return Err(FrameError::Kind(header[2]));
        }
        let announced = self.announced();
        if announced > self.max_payload {
            return Err(FrameError::Oversized {
                announced: announced as u64,
                bound: self.max_payload,
            });
        }
        Ok(())
    }
}

fn parse(kind: u8, payload: &[u8]) -> Result<Frame, FrameError> {
    if kind == KIND_DRAIN {
        return if payload.is_empty() {
            Ok(Frame::Drain)
        } else {
            Err(FrameError::payload("a drain frame carries nothing"))
        };
    }
    let value: Value = serde_json::from_slice(payload)
        .map_err(|error| FrameError::payload(format!("not JSON: {error}")))?;
    let Value::Object(mut object) = value else {
        return Err(FrameError::payload("not a JSON object"));
    };
    let frame = match kind {
        KIND_CALL => Frame::Call {
            id: take_id(&mut object)?,
            tool: take_string(&mut object, "tool")?,
            arguments: object
                .remove("arguments")
                .ok_or_else(|| FrameError::payload("a call has no arguments"))?,
        },
        KIND_RESULT => Frame::Result {
            id: take_id(&mut object)?,
            value: object
                .remove("value")
                .ok_or_else(|| FrameError::payload("a result has no value"))?,
        },
        KIND_FAILURE => {
            let id = take_id(&mut object)?;
            let code = take_string(&mut object, "code")?;
            Frame::Failure {
                id,
                code: FailureCode::from_wire(&code)
                    .ok_or_else(|| FrameError::payload(format!("unknown failure code {code:?}")))?,
                message: take_string(&mut object, "message")?,
            }
        }
        KIND_READY => Frame::Ready {
            socket: take_string(&mut object, "socket")?,
        },
        other => return Err(FrameError::Kind(other)),
    };
    if let Some(extra) = object.keys().next() {
        return Err(FrameError::payload(format!("unexpected field {extra:?}")));
    }
    Ok(frame)
}

fn take_id(object: &mut Map<String, Value>) -> Result<u64, FrameError> {
    object
        .remove("id")
        .and_then(|id| id.as_u64())
        .ok_or_else(|| FrameError::payload("no unsigned integer id"))
}

fn take_string(object: &mut Map<String, Value>, field: &str) -> Result<String, FrameError> {
    match object.remove(field) {
        Some(Value::String(text)) => Ok(text),
        _ => Err(FrameError::payload(format!("no string {field:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frames() -> impl Strategy<Value = Frame> {
        let text = "[ -~é\u{1F600}]{0,20}";
        let value = prop_oneof![
            Just(Value::Null),
            any::<i64>().prop_map(Value::from),
            text.prop_map(Value::from),
            proptest::collection::vec(any::<bool>(), 0..4).prop_map(Value::from),
        ];
        prop_oneof![
            (any::<u64>(), text, value.clone()).prop_map(|(id, tool, arguments)| Frame::Call {
                id,
                tool,
                arguments
            }),
            (any::<u64>(), value).prop_map(|(id, value)| Frame::Result { id, value }),
            (any::<u64>(), 0..FailureCode::ALL.len(), text).prop_map(|(id, code, message)| {
                Frame::Failure {
                    id,
                    code: FailureCode::ALL[code],
                    message,
                }
            }),
            text.prop_map(|socket| Frame::Ready { socket }),
            Just(Frame::Drain),
        ]
    }

    proptest! {
        /// Frames survive any split of their concatenated bytes.
        #[test]
        fn frames_round_trip_across_any_split(
            sent in proptest::collection::vec(frames(), 0..6),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let bytes: Vec<u8> = sent.iter().flat_map(Frame::encode).collect();
            let mut points: Vec<usize> = cuts.iter().map(|cut| cut.index(bytes.len() + 1)).collect();
            points.push(0);
            points.push(bytes.len());
            points.sort_unstable();
            let mut decoder = Decoder::new(DEFAULT_MAX_PAYLOAD);
            let mut received = Vec::new();
            for pair in points.windows(2) {
                received.extend(decoder.feed_all(&bytes[pair[0]..pair[1]]).unwrap());
            }
            prop_assert_eq!(received, sent);
            prop_assert!(decoder.is_idle());
        }

        /// Whatever the bytes, the decoder holds at most one bounded frame.
        #[test]
        fn arbitrary_bytes_never_grow_the_buffer_past_the_bound(
            bytes in proptest::collection::vec(any::<u8>(), 0..4096),
        ) {
            let mut decoder = Decoder::new(64);
            let _ = decoder.feed_all(&bytes);
            prop_assert!(decoder.buffer.len() <= HEADER_BYTES + 64);
        }
    }

    #[test]
    fn an_oversized_announcement_is_refused_from_the_header_alone() {
        let mut header = vec![MAGIC, VERSION, KIND_CALL, 0];
        header.extend_from_slice(&u32::MAX.to_be_bytes());
        let mut decoder = Decoder::new(1024);
        let error = decoder.feed_all(&header).unwrap_err();
        assert_eq!(
            error,
            FrameError::Oversized {
                announced: u64::from(u32::MAX),
                bound: 1024
            }
        );
        // The channel stays failed.
        assert_eq!(decoder.feed_all(&Frame::Drain.encode()).unwrap_err(), error);
    }

    #[test]
    fn the_payload_at_the_bound_passes_and_one_byte_over_fails() {
        let frame = Frame::Ready {
            socket: "x".repeat(100),
        };
        let bytes = frame.encode();
        let payload = bytes.len() - HEADER_BYTES;
        assert_eq!(Decoder::new(payload).feed_all(&bytes).unwrap(), vec![frame]);
        assert!(matches!(
            Decoder::new(payload - 1).feed_all(&bytes),
            Err(FrameError::Oversized { .. })
        ));
    }

    #[test]
    fn each_malformed_header_byte_has_its_error() {
        let good = Frame::Drain.encode();
        let mut bad = good.clone();
        bad[0] = b'X';
        assert_eq!(
            Decoder::new(8).feed_all(&bad),
            Err(FrameError::BadMagic(b'X'))
        );
        let mut bad = good.clone();
        bad[1] = 2;
        assert_eq!(Decoder::new(8).feed_all(&bad), Err(FrameError::Version(2)));
        for kind in [0, 6, 255] {
            let mut bad = good.clone();
            bad[2] = kind;
            assert_eq!(Decoder::new(8).feed_all(&bad), Err(FrameError::Kind(kind)));
        }
        let mut bad = good;
        bad[3] = 1;
        assert_eq!(
            Decoder::new(8).feed_all(&bad),
            Err(FrameError::Kind(KIND_DRAIN))
        );
    }

    #[test]
    fn payloads_must_be_exact() {
        let frame = |kind: u8, body: &[u8]| {
            let mut bytes = vec![MAGIC, VERSION, kind, 0];
            bytes.extend_from_slice(&(body.len() as u32).to_be_bytes());
            bytes.extend_from_slice(body);
            bytes
        };
        for (kind, body) in [
            (KIND_CALL, &br#"{"id":1,"tool":"t"}"#[..]),
            (KIND_CALL, br#"{"id":-1,"tool":"t","arguments":1}"#),
            (KIND_CALL, br#"{"id":1,"tool":2,"arguments":1}"#),
            (KIND_CALL, br#"{"id":1,"tool":"t","arguments":1,"x":0}"#),
            (KIND_RESULT, br#"{"id":1}"#),
            (KIND_FAILURE, br#"{"id":1,"code":"nope","message":""}"#),
            (KIND_READY, br#"[]"#),
            (KIND_READY, b"not json"),
            (KIND_DRAIN, b"{}"),
        ] {
            let result = Decoder::new(1024).feed_all(&frame(kind, body));
            assert!(
                matches!(result, Err(FrameError::Payload(_))),
                "{}: {result:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn failure_codes_round_trip_by_name() {
        for code in FailureCode::ALL {
            assert_eq!(FailureCode::from_wire(code.as_str()), Some(code));
            assert_eq!(code.to_string(), code.as_str());
        }
        assert_eq!(FailureCode::from_wire("Unknown_Tool"), None);
    }

    #[test]
    fn ids_are_those_of_calls_and_answers_only() {
        assert_eq!(
            Frame::Result {
                id: 7,
                value: Value::Null
            }
            .id(),
            Some(7)
        );
        assert_eq!(Frame::Drain.id(), None);
        assert_eq!(
            Frame::Ready {
                socket: String::new()
            }
            .id(),
            None
        );
    }
}
