//! The one reader of a wrapper call's stderr, fed as it arrives: it finds the first line the
//! wrapper marks with the call's nonce and splits transport noise from the command's stderr.
//!
//! [`crate::outcome::parse_result`] feeds it a whole stderr at once; a streaming backend feeds it
//! chunk by chunk, however the chunks cut the nonce line. It holds a bounded amount of stderr
//! whatever the command writes: before its verdict, an unclassified remainder of at most one
//! marker line; at every point, the last [`STDERR_TAIL_BYTES`] bytes for a failure's
//! classification.

use crate::call_identity::{Nonce, NONCE_HEX_LEN};
use crate::nonce_result::{outcome_of, WrapperOutcome, NO_CWD_REASON_BYTES, STDERR_TAIL_BYTES};
use bounded_process::ExitKind;

/// The longest word of a marker line `<nonce>-<word>\n` (lowercase ASCII letters).
pub(crate) const MAX_MARKER_WORD: usize = 32;

/// Where a call's stderr stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StderrPhase {
    /// No nonce line yet: everything so far is transport noise.
    Searching,
    /// The nonce line `<nonce>\n` came: every later byte is the command's.
    Started,
    /// A marker line `<nonce>-<word>\n` came first (`nocwd`, `unmounted`): the wrapper stopped
    /// before the command, and what follows is the wrapper's message, never the command's.
    Marker(String),
}

/// What a wrapper call's stderr and client status said, before it is read as a
/// [`WrapperOutcome`]: the marker's word and message as they came. Private: callers get the
/// outcome, the one enum of a call's end; this raw reading exists so the splitter's model test can
/// check the splitter alone, apart from the interpretation in [`outcome_of`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallEnd {
    /// The nonce line came and the client exited: the status is the command's.
    Ran {
        /// The command's status, verbatim.
        status: i32,
    },
    /// A marker line came first.
    Marker {
        /// Its word (`nocwd`, `unmounted`).
        word: String,
        /// The client's status.
        status: i32,
        /// What stderr held after the marker line: its first [`NO_CWD_REASON_BYTES`] bytes.
        message: Vec<u8>,
        /// The last [`STDERR_TAIL_BYTES`] bytes of the client's stderr.
        stderr_tail: Vec<u8>,
    },
    /// No nonce line: the engine, the transport or the wrapper failed first.
    NoNonce {
        /// The client's status.
        status: i32,
        /// The last [`STDERR_TAIL_BYTES`] bytes of the client's stderr.
        stderr_tail: Vec<u8>,
    },
    /// The client was killed by a signal: an engine failure, never a command's status.
    ClientKilled {
        /// The signal number.
        signal: i32,
        /// The last [`STDERR_TAIL_BYTES`] bytes of the client's stderr.
        stderr_tail: Vec<u8>,
    },
}

/// The incremental nonce-line reader of one call (docs/wrapper-protocol.md#reading-the-result).
///
/// The first occurrence of the nonce followed by `\n` (the nonce line) or by `-<word>\n` (a marker
/// line, `word` being 1 to 32 lowercase letters) decides. A guest can print the
/// nonce again or forge text after it, which only changes its own result: it cannot write before
/// the real nonce line.
#[derive(Debug, Clone)]
pub struct NonceSplitter {
    nonce: [u8; NONCE_HEX_LEN],
    phase: StderrPhase,
    /// Bytes not yet classified while searching: at most a partial marker line plus one chunk.
    pending: Vec<u8>,
    /// After a marker line: the first [`NO_CWD_REASON_BYTES`] bytes that followed it.
    message: Vec<u8>,
    tail: Vec<u8>,
    noise: bool,
}

impl NonceSplitter {
    /// A reader for the call of `nonce`.
    pub fn new(nonce: &Nonce) -> Self {
        let mut text = [0u8; NONCE_HEX_LEN];
        text.copy_from_slice(nonce.as_str().as_bytes());
        NonceSplitter {
            nonce: text,
            phase: StderrPhase::Searching,
            pending: Vec::new(),
            message: Vec::new(),
            tail: Vec::new(),
            noise: false,
        }
    }

    /// Where the stderr stands so far.
    pub fn phase(&self) -> &StderrPhase {
        &self.phase
    }

    /// Whether the nonce line has come: the command was about to start.
    pub fn started(&self) -> bool {
        self.phase == StderrPhase::Started
    }

    /// Feeds the next stderr bytes; returns those of them that are the command's.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.keep_tail(bytes);
        match self.phase {
            StderrPhase::Started => return bytes.to_vec(),
            StderrPhase::Marker(_) => {
                self.keep_message(bytes);
                return Vec::new();
            }
            StderrPhase::Searching => {}
        }
        self.pending.extend_from_slice(bytes);
        let mut from = 0;
        while let Some(at) = find(&self.pending[from..], &self.nonce).map(|i| i + from) {
            let after = at + NONCE_HEX_LEN;
            match self.pending.get(after) {
                None => {
                    self.hold_from(at);
                    return Vec::new();
                }
                Some(b'\n') => {
                    self.note_noise(at);
                    self.phase = StderrPhase::Started;
                    let rest = self.pending[after + 1..].to_vec();
                    self.pending = Vec::new();
                    return rest;
                }
                Some(b'-') => match marker_word(&self.pending[after + 1..]) {
                    Word::Incomplete => {
                        self.hold_from(at);
                        return Vec::new();
                    }
                    Word::Complete(word) => {
                        self.note_noise(at);
                        let rest = self.pending[after + 2 + word.len()..].to_vec();
                        self.phase = StderrPhase::Marker(word);
                        self.pending = Vec::new();
                        self.keep_message(&rest);
                        return Vec::new();
                    }
                    Word::Invalid => from = at + 1,
                },
                Some(_) => from = at + 1,
            }
        }
        // No nonce: only a suffix that may begin one is kept.
        let keep = self.pending.len().min(NONCE_HEX_LEN - 1);
        let drop = self.pending.len() - keep;
        self.note_noise(drop);
        self.pending.drain(..drop);
        Vec::new()
    }

    /// The call's outcome, once its client has exited with `status`. A streaming reader has
    /// already handed the command's bytes on, so its [`WrapperOutcome::Ran`] carries none: only
    /// the status.
    pub fn finish(self, status: ExitKind) -> WrapperOutcome {
        outcome_of(self.read_end(status), Vec::new(), Vec::new())
    }

    /// The raw reading of the call's end (see [`CallEnd`]).
    pub(crate) fn read_end(self, status: ExitKind) -> CallEnd {
        let code = match status {
            ExitKind::Exited(code) => code,
            ExitKind::Signaled(signal) => {
                return CallEnd::ClientKilled {
                    signal,
                    stderr_tail: self.tail,
                }
            }
        };
        match self.phase {
            StderrPhase::Started => CallEnd::Ran { status: code },
            StderrPhase::Marker(word) => CallEnd::Marker {
                word,
                status: code,
                message: self.message,
                stderr_tail: self.tail,
            },
            StderrPhase::Searching => CallEnd::NoNonce {
                status: code,
                stderr_tail: self.tail,
            },
        }
    }

    /// The last [`STDERR_TAIL_BYTES`] bytes fed so far.
    pub fn stderr_tail(&self) -> &[u8] {
        &self.tail
    }

    /// Keeps `pending` from `at`, where a nonce line may be beginning; what comes before is noise.
    fn hold_from(&mut self, at: usize) {
        self.note_noise(at);
        self.pending.drain(..at);
    }

    fn note_noise(&mut self, bytes: usize) {
        if bytes > 0 && !self.noise {
            self.noise = true;
            tracing::debug!(
                noise = %String::from_utf8_lossy(&self.pending[..bytes.min(STDERR_TAIL_BYTES)]),
                "transport output before the nonce line"
            );
        }
    }

    fn keep_message(&mut self, bytes: &[u8]) {
        let room = NO_CWD_REASON_BYTES - self.message.len();
        self.message
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn keep_tail(&mut self, bytes: &[u8]) {
        let bytes = &bytes[bytes.len().saturating_sub(STDERR_TAIL_BYTES)..];
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(STDERR_TAIL_BYTES);
        self.tail.drain(..overflow);
        self.tail.extend_from_slice(bytes);
    }
}

enum Word {
    Complete(String),
    Incomplete,
    Invalid,
}

/// Reads `<word>\n` at the start of `bytes`.
fn marker_word(bytes: &[u8]) -> Word {
    for (i, &byte) in bytes.iter().enumerate().take(MAX_MARKER_WORD + 1) {
        match byte {
            b'\n' if i > 0 => {
                return Word::Complete(String::from_utf8_lossy(&bytes[..i]).into_owned())
            }
            b'a'..=b'z' if i < MAX_MARKER_WORD => {}
            _ => return Word::Invalid,
        }
    }
    Word::Incomplete
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NONCE: &str = "0123456789abcdef01234567";

    fn nonce() -> Nonce {
        Nonce::parse(NONCE).unwrap()
    }

    /// Feeds `stderr` cut at `cuts` (sorted positions); returns the command's bytes and the end.
    fn feed(stderr: &[u8], cuts: &[usize]) -> (Vec<u8>, CallEnd) {
        let mut splitter = NonceSplitter::new(&nonce());
        let mut command = Vec::new();
        let mut at = 0;
        for &cut in cuts.iter().chain(std::iter::once(&stderr.len())) {
            let cut = cut.clamp(at, stderr.len());
            command.extend(splitter.push(&stderr[at..cut]));
            at = cut;
        }
        (command, splitter.read_end(ExitKind::Exited(0)))
    }

    /// The model: the first occurrence of the nonce followed by `\n` or by a marker word.
    fn model(stderr: &[u8]) -> (Vec<u8>, CallEnd) {
        let n = NONCE.as_bytes();
        for at in 0..stderr.len() {
            if !stderr[at..].starts_with(n) {
                continue;
            }
            let rest = &stderr[at + n.len()..];
            if rest.first() == Some(&b'\n') {
                return (rest[1..].to_vec(), CallEnd::Ran { status: 0 });
            }
            if rest.first() == Some(&b'-') {
                let word: Vec<u8> = rest[1..]
                    .iter()
                    .copied()
                    .take_while(u8::is_ascii_lowercase)
                    .collect();
                if (1..=MAX_MARKER_WORD).contains(&word.len())
                    && rest.get(1 + word.len()) == Some(&b'\n')
                {
                    let after = &rest[2 + word.len()..];
                    let word = String::from_utf8(word).unwrap();
                    return (
                        Vec::new(),
                        CallEnd::Marker {
                            word,
                            status: 0,
                            message: after[..after.len().min(NO_CWD_REASON_BYTES)].to_vec(),
                            stderr_tail: tail(stderr),
                        },
                    );
                }
            }
        }
        (
            Vec::new(),
            CallEnd::NoNonce {
                status: 0,
                stderr_tail: tail(stderr),
            },
        )
    }

    fn tail(stderr: &[u8]) -> Vec<u8> {
        stderr[stderr.len().saturating_sub(STDERR_TAIL_BYTES)..].to_vec()
    }

    #[test]
    fn the_nonce_line_split_at_every_byte_boundary() {
        let lines: [&[u8]; 4] = [
            b"0123456789abcdef01234567\n",
            b"0123456789abcdef01234567-unmounted\n",
            b"0123456789abcdef01234567-nocwd\n",
            b"0123456789abcdef01234567-x\n",
        ];
        for line in lines {
            let mut stderr = b"warning: noise 0123\n".to_vec();
            stderr.extend_from_slice(line);
            stderr.extend_from_slice(b"sh: cd: can't cd\n0123456789abcdef01234567\n");
            for first in 0..=stderr.len() {
                for second in first..=stderr.len() {
                    assert_eq!(
                        feed(&stderr, &[first, second]),
                        model(&stderr),
                        "cuts at {first} and {second} of {:?}",
                        String::from_utf8_lossy(&stderr)
                    );
                }
            }
        }
    }

    #[test]
    fn near_misses_are_noise() {
        for stderr in [
            &b"0123456789abcdef01234567"[..],
            b"0123456789abcdef01234567-\n",
            b"0123456789abcdef01234567-Bad\n",
            b"0123456789abcdef01234567 \n",
            b"ffffffffffffffffffffffff\n",
        ] {
            assert!(matches!(feed(stderr, &[]).1, CallEnd::NoNonce { .. }));
        }
        let long = format!("{NONCE}-{}\n", "a".repeat(MAX_MARKER_WORD + 1));
        assert!(matches!(
            feed(long.as_bytes(), &[]).1,
            CallEnd::NoNonce { .. }
        ));
        // A word too long is refused at once, never held waiting: the real line after it counts.
        let then_started = format!("{long}{NONCE}\nout");
        let (command, end) = feed(then_started.as_bytes(), &[]);
        assert_eq!(
            (command, end),
            (b"out".to_vec(), CallEnd::Ran { status: 0 })
        );
        let longest = format!("{NONCE}-{}\n", "a".repeat(MAX_MARKER_WORD));
        assert!(matches!(
            feed(longest.as_bytes(), &[]).1,
            CallEnd::Marker { .. }
        ));
    }

    #[test]
    fn memory_stays_bounded_without_a_nonce() {
        let mut splitter = NonceSplitter::new(&nonce());
        for _ in 0..1000 {
            assert!(splitter.push(&[b'0'; 4096]).is_empty());
            assert!(splitter.pending.len() < NONCE_HEX_LEN);
            assert!(splitter.tail.len() <= STDERR_TAIL_BYTES);
        }
        let mut held = splitter.clone();
        held.push(format!("{NONCE}-unmou").as_bytes());
        assert!(held.pending.len() <= NONCE_HEX_LEN + 1 + MAX_MARKER_WORD);
        assert_eq!(held.phase(), &StderrPhase::Searching);
    }

    #[test]
    fn noise_is_noted_once_and_only_when_there_is_some() {
        let mut clean = NonceSplitter::new(&nonce());
        clean.push(format!("{NONCE}\nout").as_bytes());
        assert!(!clean.noise, "a nonce line first is no noise");
        let mut held = NonceSplitter::new(&nonce());
        held.push(&NONCE.as_bytes()[..5]);
        assert!(!held.noise, "the start of a nonce line is no noise");
        for first in [&b"noise\n"[..], b"x"] {
            let mut noisy = NonceSplitter::new(&nonce());
            noisy.push(first);
            noisy.push(format!("{NONCE}\nout").as_bytes());
            assert!(noisy.noise, "{first:?}");
        }
        // Noise longer than a nonce is noted before any nonce comes.
        let mut long_noise = NonceSplitter::new(&nonce());
        long_noise.push(b"a line of transport noise longer than a nonce\n");
        assert!(long_noise.noise);
        // Noise before a nonce whose line end has not come is noted at once, and only the nonce
        // is held: what is held never grows with the noise before it.
        let mut before_a_nonce = NonceSplitter::new(&nonce());
        let mut chunk = vec![b'n'; 4096];
        chunk.extend_from_slice(NONCE.as_bytes());
        assert!(before_a_nonce.push(&chunk).is_empty());
        assert!(
            before_a_nonce.noise,
            "the noise before a held nonce is noted"
        );
        assert_eq!(before_a_nonce.pending, NONCE.as_bytes());
        assert_eq!(before_a_nonce.push(b"\nout"), b"out");
    }

    #[test]
    fn the_marker_message_and_the_tail_are_bounded() {
        let mut splitter = NonceSplitter::new(&nonce());
        splitter.push(format!("{NONCE}-nocwd\n").as_bytes());
        for _ in 0..4 {
            splitter.push(&[b'm'; NO_CWD_REASON_BYTES]);
        }
        assert_eq!(splitter.stderr_tail().len(), STDERR_TAIL_BYTES);
        assert!(splitter.stderr_tail().iter().all(|&b| b == b'm'));
        let CallEnd::Marker { message, .. } = splitter.read_end(ExitKind::Exited(125)) else {
            panic!("a marker line came first");
        };
        assert_eq!(message, vec![b'm'; NO_CWD_REASON_BYTES]);
    }

    #[test]
    fn finish_reads_the_end_as_an_outcome_without_the_bytes() {
        let mut ran = NonceSplitter::new(&nonce());
        assert_eq!(ran.push(format!("noise\n{NONCE}\nerr").as_bytes()), b"err");
        assert_eq!(
            ran.finish(ExitKind::Exited(3)),
            WrapperOutcome::Ran(crate::WrapperOutput {
                stdout: Vec::new(),
                stderr: Vec::new(),
                status: 3,
            })
        );
        let mut no_cwd = NonceSplitter::new(&nonce());
        no_cwd.push(format!("{NONCE}-nocwd\nsh: cd: /x: No such file\n").as_bytes());
        assert_eq!(
            no_cwd.finish(ExitKind::Exited(125)),
            WrapperOutcome::NoWorkingDirectory {
                reason: "sh: cd: /x: No such file".to_owned()
            }
        );
        let mut unmounted = NonceSplitter::new(&nonce());
        unmounted.push(format!("{NONCE}-unmounted\n").as_bytes());
        assert_eq!(
            unmounted.finish(ExitKind::Exited(125)),
            WrapperOutcome::Unmounted
        );
    }

    #[test]
    fn a_signalled_client_keeps_the_tail() {
        let mut splitter = NonceSplitter::new(&nonce());
        splitter.push(b"transport noise\n");
        assert!(!splitter.started());
        splitter.push(format!("{NONCE}\nboom").as_bytes());
        assert!(splitter.started());
        assert_eq!(
            splitter.read_end(ExitKind::Signaled(9)),
            CallEnd::ClientKilled {
                signal: 9,
                stderr_tail: format!("transport noise\n{NONCE}\nboom").into_bytes()
            }
        );
    }

    fn piece() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(NONCE.as_bytes().to_vec()),
            Just(NONCE.as_bytes()[..10].to_vec()),
            Just(NONCE.as_bytes()[10..].to_vec()),
            Just(b"\n".to_vec()),
            Just(b"-".to_vec()),
            Just(b"unmounted".to_vec()),
            Just(b"nocwd".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..8),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn any_chunking_agrees_with_the_model(
            pieces in proptest::collection::vec(piece(), 0..24),
            cuts in proptest::collection::vec(0usize..400, 0..12),
        ) {
            let stderr: Vec<u8> = pieces.concat();
            let mut cuts = cuts;
            cuts.sort_unstable();
            prop_assert_eq!(feed(&stderr, &cuts), model(&stderr));
        }
    }
}
