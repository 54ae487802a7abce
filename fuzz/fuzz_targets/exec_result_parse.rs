//! Fuzz the host's reading of a wrapper call: arbitrary client stdout, stderr, status and nonce.
//!
//! Properties: parsing never panics; `Ran` only when the nonce line is present, with the
//! command's stderr exactly the bytes after its first occurrence; `Unmounted` only when the
//! unmounted line is present and the nonce line is not; `NoWorkingDirectory` only on exit 125
//! with the no-cwd line present and the nonce line not, with a bounded, non-empty reason; a
//! signalled client is never a result.
#![no_main]

use arbitrary::Arbitrary;
use bounded_process::ExitKind;
use exec_wrapper::outcome::{parse_result, NO_CWD_REASON_BYTES, STDERR_TAIL_BYTES};
use exec_wrapper::{Nonce, WrapperOutcome};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    nonce: [u8; 12],
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// Splice a line into stderr at this offset: the nonce line, the unmounted line or the
    /// no-cwd line (the second field modulo 3).
    splice: Option<(u16, u8)>,
    signalled: bool,
    code: i32,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fuzz_target!(|input: Input| {
    let hex: String = input.nonce.iter().map(|b| format!("{b:02x}")).collect();
    let nonce = Nonce::parse(&hex).expect("24 lowercase hex");
    let mut stderr = input.stderr;
    if let Some((offset, which)) = input.splice {
        let at = usize::from(offset).min(stderr.len());
        let line = match which % 3 {
            0 => nonce.line(),
            1 => nonce.unmounted_line(),
            _ => nonce.no_cwd_line(),
        };
        stderr.splice(at..at, line);
    }
    let status = if input.signalled {
        ExitKind::Signaled(input.code)
    } else {
        ExitKind::Exited(input.code)
    };
    let outcome = parse_result(input.stdout.clone(), &stderr, status, &nonce);
    let nonce_at = find(&stderr, &nonce.line());
    match outcome {
        WrapperOutcome::Ran(output) => {
            assert!(!input.signalled);
            let at = nonce_at.expect("Ran without a nonce line");
            assert_eq!(output.stderr, &stderr[at + 25..]);
            assert_eq!(output.stdout, input.stdout);
            assert_eq!(output.status, input.code);
        }
        WrapperOutcome::Unmounted => {
            assert!(!input.signalled && nonce_at.is_none());
            assert!(find(&stderr, &nonce.unmounted_line()).is_some());
        }
        WrapperOutcome::NoWorkingDirectory { reason } => {
            assert!(!input.signalled && nonce_at.is_none());
            assert_eq!(input.code, 125);
            assert!(find(&stderr, &nonce.no_cwd_line()).is_some());
            assert!(!reason.is_empty());
            assert!(reason.chars().count() <= NO_CWD_REASON_BYTES);
        }
        WrapperOutcome::NoNonce {
            status,
            stderr_tail,
        } => {
            assert!(!input.signalled && nonce_at.is_none());
            assert_eq!(status, input.code);
            assert!(stderr_tail.len() <= STDERR_TAIL_BYTES);
            assert!(stderr.ends_with(&stderr_tail));
        }
        WrapperOutcome::ClientKilled {
            signal,
            stderr_tail,
        } => {
            assert!(input.signalled);
            assert_eq!(signal, input.code);
            assert!(stderr.ends_with(&stderr_tail));
        }
    }
});
