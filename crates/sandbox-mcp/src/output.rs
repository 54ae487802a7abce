//! A bounded head-and-tail collector for a command's output.
//!
//! A guest may print without end; the server keeps at most a fixed number of bytes per stream
//! whatever it prints: the first half of the budget as it arrives, and the last half in a ring
//! that forgets the oldest bytes. The bytes between are counted, never held.
//!
//! What it hands back as text is safe to show on a terminal: a guest's output may carry
//! terminal control sequences (a window title or clipboard write, a screen clear, a bare `\r`
//! that hides what came before on the line), and a model's host may show the text to a person.
//! Every control character other than `\n` and `\t` is written as a visible `\xNN` escape, and
//! the caller is told whether any was ([`escape_controls`]).

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

    /// The kept bytes as text (invalid UTF-8 replaced, control characters escaped as
    /// [`escape_controls`] does). When bytes were dropped, a marker saying how many stands
    /// between the head and the tail.
    pub fn text(&self) -> String {
        self.escaped_text().0
    }

    /// [`text`](Self::text), and whether a control character was escaped in it.
    pub fn escaped_text(&self) -> (String, bool) {
        let (head, head_escaped) = escape_controls(&String::from_utf8_lossy(&self.head));
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        let (tail, tail_escaped) = escape_controls(&String::from_utf8_lossy(&tail));
        let text = if self.truncated() {
            let dropped = self.total - (self.head.len() + self.tail.len()) as u64;
            format!("{head}\n[... {dropped} bytes omitted ...]\n{tail}")
        } else {
            format!("{head}{tail}")
        };
        (text, head_escaped || tail_escaped)
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
        (!line.is_empty()).then(|| {
            escape_controls(String::from_utf8_lossy(line).trim_end())
                .0
                .trim_end()
                .to_owned()
        })
    }
}

/// `text` with every control character (Unicode `Cc`: C0, DEL and C1) other than `\n` and `\t`
/// written as `\xNN`, and whether there was one. A backslash already in the text is left as it
/// is: the escape makes the text harmless to display, not reversible.
pub fn escape_controls(text: &str) -> (String, bool) {
    if !text.chars().any(is_escaped) {
        return (text.to_owned(), false);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_escaped(c) {
            out.push_str(&format!("\\x{:02x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    (out, true)
}

fn is_escaped(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
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
    fn terminal_control_sequences_are_escaped_and_flagged() {
        // An OSC title, an OSC 52 clipboard write, a screen clear, a bare carriage return, a
        // C1 CSI and DEL; newlines and tabs stay as they are.
        let raw = "a\x1b]0;title\x07b\x1b]52;c;aGk=\x1b\\c\x1b[2J\x1b[Hd\rover\u{9b}31me\x7f\tf\n";
        let mut c = HeadTail::new(1024);
        c.push(raw.as_bytes());
        let (text, escaped) = c.escaped_text();
        assert!(escaped);
        assert!(!text.chars().any(is_escaped), "{text:?}");
        assert_eq!(
            text,
            "a\\x1b]0;title\\x07b\\x1b]52;c;aGk=\\x1b\\c\\x1b[2J\\x1b[Hd\\x0dover\\x9b31me\\x7f\tf\n"
        );
        let mut plain = HeadTail::new(1024);
        plain.push("tabs\tand\nlines, é\n".as_bytes());
        assert_eq!(
            plain.escaped_text(),
            ("tabs\tand\nlines, é\n".to_owned(), false)
        );
        // Both halves of a truncated stream are escaped.
        let mut cut = HeadTail::new(4);
        cut.push(b"\x1bxxxxxxxx\x1b");
        let (text, escaped) = cut.escaped_text();
        assert!(escaped && !text.contains('\x1b'), "{text:?}");
        // Progress lines too.
        let mut l = LastLine::default();
        l.push(b"50%\r\x1b[2K60%");
        assert_eq!(l.latest().as_deref(), Some("50%\\x0d\\x1b[2K60%"));
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
