//! Base64 behind an `x`: how raw bytes cross every CLI between the host and the guest shell; and,
//! for the sbx shape, a plain value as itself behind an `r`.
//!
//! The `x` keeps every encoded value non-empty (sbx refuses empty arguments) and survives any CLI
//! that trims or re-quotes; base64 carries bytes that are not UTF-8 through CLIs that insist on
//! UTF-8 (the Docker CLI ships argv as JSON strings). The guest decodes with `base64 -d` and a
//! sentinel byte, so trailing newlines survive command substitution.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use crate::error::{Error, Result};

/// Encodes one value as `x` followed by standard, padded base64 of its raw bytes.
///
/// `what` names the value in the refusal (`argv[2]`, `working directory`, …).
///
/// # Errors
///
/// [`Error::Nul`] when the bytes contain NUL: no `execve` argument can carry it, and a value
/// silently cut at the NUL would run something other than what the caller asked for.
pub fn encode_arg(bytes: &[u8], what: &str) -> Result<String> {
    if bytes.contains(&0) {
        return Err(Error::nul(what));
    }
    let mut encoded = String::with_capacity(1 + bytes.len().div_ceil(3) * 4);
    encoded.push('x');
    STANDARD.encode_string(bytes, &mut encoded);
    Ok(encoded)
}

/// Decodes a value made by [`encode_arg`]; `None` for anything else.
///
/// The guest does this with `base64 -d`; the host needs it only to check round trips and to read
/// back what it sent.
pub fn decode_arg(encoded: &str) -> Option<Vec<u8>> {
    let body = encoded.strip_prefix('x')?;
    STANDARD.decode(body).ok()
}

/// Whether a value can travel as itself behind an `r` through a CLI that refuses empty arguments
/// and may trim them or insist on UTF-8 (sbx): no control character (no NUL, newline, DEL or C1
/// code) and not ending in whitespace. The `r` keeps it non-empty and its start intact.
fn is_plain(text: &str) -> bool {
    !text.chars().any(char::is_control)
        && !text.chars().next_back().is_some_and(char::is_whitespace)
}

/// Encodes one value as `r` followed by the value itself when it is plain (UTF-8, no control
/// character, not ending in whitespace), else as [`encode_arg`] does (`x` and base64).
///
/// The wrapper's run stage takes an `r` value as it is, with no decoding process, so a plain
/// argv starts no `base64` in the guest.
///
/// # Errors
///
/// [`Error::Nul`] when the bytes contain NUL.
pub fn encode_arg_plain(bytes: &[u8], what: &str) -> Result<String> {
    match std::str::from_utf8(bytes) {
        Ok(text) if is_plain(text) => Ok(format!("r{text}")),
        _ => encode_arg(bytes, what),
    }
}

/// A working directory and argv, checked and encoded for the wrapper's positionals 9 and up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedInvocation {
    cwd: String,
    argv: Vec<String>,
}

impl EncodedInvocation {
    /// The encoded working directory (positional 9).
    pub fn cwd(&self) -> &str {
        &self.cwd
    }

    /// The encoded argv, never empty (positionals 10 and up).
    pub fn argv(&self) -> &[String] {
        &self.argv
    }
}

/// Checks and encodes a working directory and an argv, before any process is started.
///
/// # Errors
///
/// [`Error::EmptyArgv`] for an empty argv; [`Error::Nul`] naming the first value with a NUL byte.
pub fn encode_invocation<A: AsRef<[u8]>>(cwd: &[u8], argv: &[A]) -> Result<EncodedInvocation> {
    if argv.is_empty() {
        return Err(Error::empty_argv());
    }
    let cwd = encode_arg(cwd, "working directory")?;
    let argv = argv
        .iter()
        .enumerate()
        .map(|(index, arg)| encode_arg(arg.as_ref(), &format!("argv[{index}]")))
        .collect::<Result<Vec<_>>>()?;
    Ok(EncodedInvocation { cwd, argv })
}

/// Checks a working directory and an argv and carries each value as [`encode_arg_plain`] does
/// (`r<value>` when plain, `x<base64>` otherwise), before any process is started: the sbx shape's
/// positionals, where a plain call decodes nothing in the guest.
///
/// # Errors
///
/// [`Error::EmptyArgv`] for an empty argv; [`Error::Nul`] naming the first value with a NUL byte.
pub fn plain_invocation<A: AsRef<[u8]>>(cwd: &[u8], argv: &[A]) -> Result<EncodedInvocation> {
    if argv.is_empty() {
        return Err(Error::empty_argv());
    }
    let cwd = encode_arg_plain(cwd, "working directory")?;
    let argv = argv
        .iter()
        .enumerate()
        .map(|(index, arg)| encode_arg_plain(arg.as_ref(), &format!("argv[{index}]")))
        .collect::<Result<Vec<_>>>()?;
    Ok(EncodedInvocation { cwd, argv })
}

/// A working directory and argv for a transport that carries strings exactly (Docker's exec
/// argv: the Engine API sends it as JSON strings): each value travels raw when it is UTF-8, and
/// as `x`-base64 ([`encode_arg`]) only when it is not.
///
/// The mask says which is which, one letter per value (working directory first): `r` raw, `x`
/// encoded. The guest decodes only the `x` values, so a call whose values are all UTF-8 starts no
/// decoding process at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawInvocation {
    mask: String,
    cwd: String,
    argv: Vec<String>,
}

impl RawInvocation {
    /// One letter per value, the working directory first: `r` raw, `x` encoded.
    pub fn mask(&self) -> &str {
        &self.mask
    }

    /// The working directory, raw or encoded as the mask's first letter says.
    pub fn cwd(&self) -> &str {
        &self.cwd
    }

    /// The argv, never empty, each raw or encoded as the mask says.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }
}

/// Checks a working directory and an argv and prepares them for an exact transport, before any
/// process is started.
///
/// # Errors
///
/// [`Error::EmptyArgv`] for an empty argv; [`Error::Nul`] naming the first value with a NUL byte.
pub fn raw_invocation<A: AsRef<[u8]>>(cwd: &[u8], argv: &[A]) -> Result<RawInvocation> {
    if argv.is_empty() {
        return Err(Error::empty_argv());
    }
    let mut mask = String::with_capacity(1 + argv.len());
    let cwd = carry(cwd, "working directory", &mut mask)?;
    let argv = argv
        .iter()
        .enumerate()
        .map(|(index, arg)| carry(arg.as_ref(), &format!("argv[{index}]"), &mut mask))
        .collect::<Result<Vec<_>>>()?;
    Ok(RawInvocation { mask, cwd, argv })
}

fn carry(bytes: &[u8], what: &str, mask: &mut String) -> Result<String> {
    if bytes.contains(&0) {
        return Err(Error::nul(what));
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            mask.push('r');
            Ok(text.to_owned())
        }
        Err(_) => {
            mask.push('x');
            encode_arg(bytes, what)
        }
    }
}

/// The sbx env file body: one `x<base64(NAME=VALUE)>` line per entry
/// (docs/wrapper-protocol.md#environment-delivery).
///
/// The wrapper exports each line with `export "NAME=VALUE"` semantics: no `eval`, no word
/// splitting. Names are expected to be validated by the caller already; this function refuses
/// only what the file cannot carry.
///
/// # Errors
///
/// [`Error::Nul`] naming the entry when a name or value contains NUL.
pub fn encode_env_file<N: AsRef<[u8]>, V: AsRef<[u8]>>(entries: &[(N, V)]) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    for (name, value) in entries {
        let name = name.as_ref();
        let mut entry = Vec::with_capacity(name.len() + 1 + value.as_ref().len());
        entry.extend_from_slice(name);
        entry.push(b'=');
        entry.extend_from_slice(value.as_ref());
        let line = encode_arg(
            &entry,
            &format!("env entry {}", String::from_utf8_lossy(name)),
        )?;
        body.extend_from_slice(line.as_bytes());
        body.push(b'\n');
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_value_is_a_lone_x() {
        assert_eq!(encode_arg(b"", "argv[0]").unwrap(), "x");
        assert_eq!(decode_arg("x").unwrap(), b"");
    }

    #[test]
    fn round_trips_newlines_every_byte_and_a_mebibyte() {
        let every_byte: Vec<u8> = (1..=255).collect();
        let mebibyte: Vec<u8> = (0..1 << 20).map(|i| (i % 255 + 1) as u8).collect();
        let cases: [&[u8]; 5] = [b"\n", b"\n\n\n", b"line\n\n", &every_byte, &mebibyte];
        for case in cases {
            let encoded = encode_arg(case, "v").unwrap();
            assert!(encoded.starts_with('x') && encoded.is_ascii());
            assert_eq!(decode_arg(&encoded).unwrap(), case);
        }
    }

    #[test]
    fn nul_is_refused_naming_the_value() {
        let err = encode_invocation(b"/w", &[b"echo".as_slice(), b"a\0b"]).unwrap_err();
        assert!(
            matches!(&err, Error::Nul { what } if what == "argv[1]"),
            "{err}"
        );
        let err = encode_invocation(b"/w\0", &[b"echo"]).unwrap_err();
        assert!(matches!(&err, Error::Nul { what } if what == "working directory"));
        let err = encode_env_file(&[("A", "1"), ("B", "x\0")]).unwrap_err();
        assert!(matches!(&err, Error::Nul { what } if what == "env entry B"));
    }

    #[test]
    fn empty_argv_is_refused() {
        let none: [&[u8]; 0] = [];
        assert!(matches!(
            encode_invocation(b"/", &none),
            Err(Error::EmptyArgv)
        ));
    }

    #[test]
    fn env_file_has_one_encoded_line_per_entry() {
        let body = encode_env_file(&[("A", "1 2"), ("B", "line\n")]).unwrap();
        let lines: Vec<&[u8]> = body.split(|b| *b == b'\n').collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[2].is_empty());
        assert_eq!(
            decode_arg(std::str::from_utf8(lines[0]).unwrap()).unwrap(),
            b"A=1 2"
        );
        assert_eq!(
            decode_arg(std::str::from_utf8(lines[1]).unwrap()).unwrap(),
            b"B=line\n"
        );
    }

    #[test]
    fn raw_invocation_encodes_only_what_is_not_utf8() {
        let inv = raw_invocation(
            b"/w d",
            &[b"printf".as_slice(), b"", b"x\n", &[0xff, b'a'], b"-"],
        )
        .unwrap();
        assert_eq!(inv.mask(), "rrrrxr");
        assert_eq!(inv.cwd(), "/w d");
        assert_eq!(inv.argv()[..3], ["printf", "", "x\n"]);
        assert_eq!(decode_arg(&inv.argv()[3]).unwrap(), [0xff, b'a']);
        assert_eq!(inv.argv()[4], "-");
        let inv = raw_invocation(&[0x80], &[b"true"]).unwrap();
        assert_eq!(inv.mask(), "xr");
        assert!(matches!(
            raw_invocation(b"/", &[b"a\0".as_slice()]),
            Err(Error::Nul { what }) if what == "argv[0]"
        ));
        let none: [&[u8]; 0] = [];
        assert!(matches!(raw_invocation(b"/", &none), Err(Error::EmptyArgv)));
    }

    #[test]
    fn plain_values_travel_behind_an_r_and_the_rest_encoded() {
        let inv = plain_invocation(
            b"/maf-sandbox/work",
            &[
                b"echo".as_slice(),
                b"",
                b"--",
                b"-u",
                b"two  words",
                b" leading",
                b"$(id) 'q' \"d\" \\ * ~",
                "é ü".as_bytes(),
            ],
        )
        .unwrap();
        assert_eq!(inv.cwd(), "r/maf-sandbox/work");
        assert_eq!(
            inv.argv(),
            [
                "recho",
                "r",
                "r--",
                "r-u",
                "rtwo  words",
                "r leading",
                "r$(id) 'q' \"d\" \\ * ~",
                "ré ü"
            ]
        );
        // Trailing whitespace (ASCII or not), control characters and bytes that are not UTF-8
        // are encoded.
        let encoded: [&[u8]; 8] = [
            b"trailing ",
            b"tab\t",
            "nbsp\u{a0}".as_bytes(),
            b"line\n",
            b"a\nb",
            b"del\x7f",
            "c1\u{85}x".as_bytes(),
            &[0xff, b'a'],
        ];
        for value in encoded {
            let carried = encode_arg_plain(value, "v").unwrap();
            assert!(carried.starts_with('x'), "{value:?} -> {carried:?}");
            assert_eq!(decode_arg(&carried).unwrap(), value);
        }
        assert!(matches!(
            plain_invocation(b"/", &[b"a\0".as_slice()]),
            Err(Error::Nul { what }) if what == "argv[0]"
        ));
        assert!(matches!(
            plain_invocation(b"/\0", &[b"true"]),
            Err(Error::Nul { what }) if what == "working directory"
        ));
        let none: [&[u8]; 0] = [];
        assert!(matches!(
            plain_invocation(b"/", &none),
            Err(Error::EmptyArgv)
        ));
    }

    #[test]
    fn decode_refuses_a_missing_prefix() {
        assert_eq!(decode_arg("aGk="), None);
    }
}
