//! The small `sh` scripts the file methods that act as the guest run as the image user through
//! the exec wrapper (listing, removal, the storage base). Each takes its paths as positionals,
//! never spliced into its text.
//! Checked in dash, BusyBox `sh` and bash.

/// `list_dir`: one level, NUL-terminated records `<kind> <size> <name>`.
/// `$1` is the directory; exit 3 when it cannot be entered.
pub(crate) const LIST_SCRIPT: &str = r#"cd -- "$1" || exit 3
for f in * .[!.]* ..?*; do
  if [ -L "$f" ]; then k=l; s=-
  elif [ -d "$f" ]; then k=d; s=-
  elif [ -f "$f" ]; then k=f; s=$(stat -c %s -- "$f") || continue
  elif [ -e "$f" ]; then k=o; s=-
  else continue
  fi
  printf '%s %s %s\0' "$k" "$s" "$f"
done
"#;

/// Exit of [`LIST_SCRIPT`] when the directory cannot be entered.
pub(crate) const LIST_EXIT_CANNOT_ENTER: i32 = 3;

/// Storage base, first attempt as the guest: `mkdir -p` the base and check it
/// is writable (exit 0); when the guest cannot create it, print `id -u` and `id -g` and exit 10
/// so the host can create the missing suffix owned by the guest. Exit 12: created but not
/// writable; 11: no ids.
pub(crate) const BASE_SCRIPT: &str = r#"if mkdir -p -- "$1" 2>/dev/null; then
  test -w "$1" && exit 0
  exit 12
fi
id -u && id -g || exit 11
exit 10
"#;

/// Exit of [`BASE_SCRIPT`] asking for the engine-side fallback.
pub(crate) const BASE_EXIT_FALLBACK: i32 = 10;

/// The kind, size and name of one listing record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListRecord<'a> {
    pub(crate) kind: u8,
    pub(crate) size: Option<u64>,
    pub(crate) name: &'a [u8],
}

/// Parses the listing's NUL-terminated records. `Err` for a record that does not parse.
pub(crate) fn parse_list_records(stdout: &[u8]) -> Result<Vec<ListRecord<'_>>, String> {
    let mut records = Vec::new();
    let Some(body) = stdout.strip_suffix(b"\0") else {
        return if stdout.is_empty() {
            Ok(records)
        } else {
            Err("the listing does not end with a NUL".to_owned())
        };
    };
    for record in body.split(|b| *b == 0) {
        let mut parts = record.splitn(3, |b| *b == b' ');
        let (Some(kind), Some(size), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!(
                "a listing record has too few fields ({} bytes)",
                record.len()
            ));
        };
        let kind = match kind {
            [k @ (b'f' | b'd' | b'l' | b'o')] => *k,
            _ => return Err("a listing record has an unknown kind".to_owned()),
        };
        let size = match (kind, size) {
            (b'f', digits) if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) => Some(
                std::str::from_utf8(digits)
                    .ok()
                    .and_then(|d| d.parse().ok())
                    .ok_or("a listing size is out of range")?,
            ),
            (b'f', _) => return Err("a file's listing size is not decimal".to_owned()),
            (_, b"-") => None,
            _ => return Err("a non-file listing record carries a size".to_owned()),
        };
        if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
            return Err("a listing record names no single entry".to_owned());
        }
        records.push(ListRecord { kind, size, name });
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn records_parse() {
        let out =
            b"f 20 inside.txt\0d - dir with space\0l - link\0o - fifo\0f 0 name\nwith newline\0";
        let records = parse_list_records(out).unwrap();
        assert_eq!(records.len(), 5);
        assert_eq!(
            records[0],
            ListRecord {
                kind: b'f',
                size: Some(20),
                name: b"inside.txt"
            }
        );
        assert_eq!(records[1].name, b"dir with space");
        assert_eq!(records[4].name, b"name\nwith newline");
        assert!(parse_list_records(b"").unwrap().is_empty());
        for bad in [
            &b"f 20 x"[..],
            b"x - y\0",
            b"f - y\0",
            b"d 3 y\0",
            b"f 2\0",
            b"d - a/b\0",
            b"d - ..\0",
        ] {
            assert!(
                parse_list_records(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// Runs a script with the given shell, as the wrapper would (`sh -c SCRIPT name args…`).
    fn run(shell: &[&str], script: &str, args: &[&str], stdin: &[u8]) -> Option<(i32, Vec<u8>)> {
        use std::io::Write as _;
        let mut command = Command::new(shell[0]);
        command
            .args(&shell[1..])
            .arg("-c")
            .arg(script)
            .arg("probe")
            .args(args);
        command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        let mut child = command.spawn().ok()?;
        // A script that exits before reading its stdin closes the pipe: that is not a failure.
        let _ = child.stdin.take().unwrap().write_all(stdin);
        let out = child.wait_with_output().ok()?;
        Some((out.status.code().unwrap_or(-1), out.stdout))
    }

    fn shells() -> Vec<Vec<&'static str>> {
        let mut shells = Vec::new();
        for candidate in [&["dash"][..], &["busybox", "sh"], &["bash"]] {
            if Command::new(candidate[0])
                .args(&candidate[1..])
                .arg("-c")
                .arg("true")
                .output()
                .is_ok_and(|o| o.status.success())
            {
                shells.push(candidate.to_vec());
            }
        }
        shells
    }

    #[test]
    fn scripts_behave_alike_in_every_shell() {
        let shells = shells();
        assert!(
            !shells.is_empty(),
            "no POSIX shell found to check the scripts"
        );
        for shell in shells {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().to_str().unwrap();
            std::fs::create_dir_all(format!("{root}/new/deeper")).unwrap();
            std::fs::write(format!("{root}/new/deeper/file.txt"), b"bytes\n").unwrap();
            std::os::unix::fs::symlink("/etc/passwd", format!("{root}/link")).unwrap();

            for name in ["-lead", "with space", "a\nb", ".hidden", "..dots", "*"] {
                std::fs::write(format!("{root}/new/{name}"), b"12").unwrap();
            }
            let (code, out) = run(&shell, LIST_SCRIPT, &[&format!("{root}/new")], b"").unwrap();
            assert_eq!(code, 0);
            let mut names: Vec<Vec<u8>> = parse_list_records(&out)
                .unwrap()
                .into_iter()
                .map(|r| r.name.to_vec())
                .collect();
            names.sort();
            let mut want: Vec<Vec<u8>> = [
                "*",
                "-lead",
                "..dots",
                ".hidden",
                "a\nb",
                "deeper",
                "with space",
            ]
            .iter()
            .map(|n| n.as_bytes().to_vec())
            .collect();
            want.sort();
            assert_eq!(names, want, "{shell:?}");
            let records = parse_list_records(&out).unwrap();
            let deeper = records.iter().find(|r| r.name == b"deeper").unwrap();
            assert_eq!((deeper.kind, deeper.size), (b'd', None));
            let hidden = records.iter().find(|r| r.name == b".hidden").unwrap();
            assert_eq!((hidden.kind, hidden.size), (b'f', Some(2)));
            let (code, out) = run(&shell, LIST_SCRIPT, &[root], b"").unwrap();
            assert_eq!(code, 0);
            let link = parse_list_records(&out)
                .unwrap()
                .into_iter()
                .find(|r| r.name == b"link")
                .unwrap();
            assert_eq!(link.kind, b'l');
            let (code, _) = run(&shell, LIST_SCRIPT, &[&format!("{root}/absent")], b"").unwrap();
            assert_eq!(code, LIST_EXIT_CANNOT_ENTER);
            // An empty directory lists nothing: the literal patterns are dropped.
            std::fs::create_dir(format!("{root}/empty")).unwrap();
            let (code, out) = run(&shell, LIST_SCRIPT, &[&format!("{root}/empty")], b"").unwrap();
            assert_eq!((code, out), (0, Vec::new()));

            let (code, _) = run(&shell, BASE_SCRIPT, &[&format!("{root}/base/work")], b"").unwrap();
            assert_eq!(code, 0);
            assert!(std::path::Path::new(&format!("{root}/base/work")).is_dir());
        }
    }
}
