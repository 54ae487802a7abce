//! The small `sh` scripts the backend runs as the image user: the listing through the exec
//! wrapper, and the one plain call of an acquire (the tool probe and the storage base). Each takes
//! its paths as positionals, never spliced into its text.
//! Checked in dash, BusyBox `sh` and bash.

/// `list_dir`: one level, NUL-terminated records `<kind> <size> <name>`.
/// `$1` is the directory; exit 3 when it cannot be entered. A file's size comes from `stat`, else
/// from GNU `find`: under gVisor's release 2022-12-19, Debian 12's coreutils `stat` fails (its
/// `statx` call is refused with EINVAL), which skipped every file of a listing.
pub(crate) const LIST_SCRIPT: &str = r#"cd -- "$1" || exit 3
for f in * .[!.]* ..?*; do
  if [ -L "$f" ]; then k=l; s=-
  elif [ -d "$f" ]; then k=d; s=-
  elif [ -f "$f" ]; then k=f; s=$(stat -c %s -- "$f" 2>/dev/null || find "./$f" -maxdepth 0 -printf %s) || continue
  elif [ -e "$f" ]; then k=o; s=-
  else continue
  fi
  printf '%s %s %s\0' "$k" "$s" "$f"
done
"#;

/// Exit of [`LIST_SCRIPT`] when the directory cannot be entered.
pub(crate) const LIST_EXIT_CANNOT_ENTER: i32 = 3;

/// The one guest call of an acquire, a plain `sh -c` and not through the wrapper (it probes the
/// tools the wrapper needs): `$1` is the storage base (empty: none needed), `$2` who makes it
/// (`guest` or `host`), the tools follow as positionals. One `missing <tool>` line per tool
/// `command -v` does not find (the tool probe, docs/wrapper-protocol.md#the-tool-probe); then,
/// with a base, `ids <uid> <gid>` (the guest user, for the files the engine writes on its
/// behalf). With `guest`, `mkdir -p` of the base as the guest, so the guest owns it. Exit 0 when
/// the base is there and writable. With `host`, or when the guest cannot create it, a `fallback`
/// line asks the host to create the missing suffix engine-side, owned by the ids, and the script
/// waits for the host's `go` line on stdin before its `test -w`; anything else (end of file: the
/// host did not write it) is [`PREPARE_EXIT_FALLBACK`]. [`PREPARE_EXIT_UNWRITABLE`]: the base is
/// there but not writable; [`PREPARE_EXIT_NO_IDS`]: the host's part needs ids `id` did not give.
/// The variables are cleared first: the exec inherits the image's environment.
pub(crate) const PREPARE_SCRIPT: &str = r#"maf_u= maf_g= maf_go= maf_b=$1 maf_h=$2
shift 2
for t do command -v "$t" >/dev/null || printf 'missing %s\n' "$t"; done
[ -n "$maf_b" ] || exit 0
maf_u=$(id -u) && maf_g=$(id -g) && printf 'ids %s %s\n' "$maf_u" "$maf_g"
if [ "$maf_h" = host ] || ! mkdir -p -- "$maf_b" 2>/dev/null; then
  [ -n "$maf_g" ] || exit 11
  echo fallback
  read -r maf_go && [ "$maf_go" = go ] || exit 10
fi
test -w "$maf_b" && exit 0
exit 12
"#;

/// Exit of [`PREPARE_SCRIPT`] when it asked for the engine-side fallback and the host did not
/// answer `go`.
pub(crate) const PREPARE_EXIT_FALLBACK: i32 = 10;

/// Exit of [`PREPARE_SCRIPT`] when the fallback is needed but `id` gave no ids.
pub(crate) const PREPARE_EXIT_NO_IDS: i32 = 11;

/// Exit of [`PREPARE_SCRIPT`] when the base is there but the guest cannot write it.
pub(crate) const PREPARE_EXIT_UNWRITABLE: i32 = 12;

/// What [`PREPARE_SCRIPT`] printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PrepareAnswer {
    /// The tools `command -v` did not find, in order.
    pub(crate) missing: Vec<String>,
    /// The guest user's uid and gid, when a base was asked for and `id` answered.
    pub(crate) ids: Option<(u64, u64)>,
    /// Whether the script asked for the engine-side fallback.
    pub(crate) fallback: bool,
}

/// Parses [`PREPARE_SCRIPT`]'s stdout (all of it, or what came up to its `fallback` line). `Err`
/// for a line that is no record, an `ids` or `fallback` line twice, or ids that are not decimal.
pub(crate) fn parse_prepare(stdout: &[u8]) -> Result<PrepareAnswer, String> {
    let mut answer = PrepareAnswer::default();
    for line in stdout.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        if let Some(tool) = line.strip_prefix(b"missing ") {
            answer
                .missing
                .push(String::from_utf8_lossy(tool).into_owned());
        } else if let Some(ids) = line.strip_prefix(b"ids ") {
            let text = std::str::from_utf8(ids).map_err(|_| "the ids are not text".to_owned())?;
            let mut numbers = text.split(' ').map(str::parse::<u64>);
            let (Some(Ok(uid)), Some(Ok(gid)), None) =
                (numbers.next(), numbers.next(), numbers.next())
            else {
                return Err(format!("the guest's ids are not two numbers: {text:?}"));
            };
            if answer.ids.replace((uid, gid)).is_some() {
                return Err("the guest's ids were printed twice".to_owned());
            }
        } else if line == b"fallback" && !answer.fallback {
            answer.fallback = true;
        } else {
            return Err(format!(
                "an unexpected line: {:?}",
                String::from_utf8_lossy(&line[..line.len().min(80)])
            ));
        }
    }
    Ok(answer)
}

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

    /// The scripts run in the guest: any change to their text shows up here and is reviewed (the
    /// `.snap` files are committed).
    #[test]
    fn scripts_are_stable() {
        insta::assert_snapshot!("list", LIST_SCRIPT);
        insta::assert_snapshot!("prepare", PREPARE_SCRIPT);
        insta::assert_snapshot!("egress_probe", crate::egress_preflight::PROBE_SCRIPT);
    }

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

    /// [`PREPARE_SCRIPT`] in one shell, under `root`.
    fn check_prepare(shell: &[&str], root: &str) {
        let ids = |out: &[u8]| parse_prepare(out).unwrap().ids;
        let own = {
            use std::os::unix::fs::MetadataExt as _;
            let meta = std::fs::metadata(root).unwrap();
            (u64::from(meta.uid()), u64::from(meta.gid()))
        };
        // Every tool present, no base: nothing printed.
        let (code, out) = run(shell, PREPARE_SCRIPT, &["", "guest", "sh", "mkdir"], b"").unwrap();
        assert_eq!((code, out), (0, Vec::new()), "{shell:?}");
        // Missing tools are named in order; the base is still prepared.
        let base = format!("{root}/base/work");
        let (code, out) = run(
            shell,
            PREPARE_SCRIPT,
            &[&base, "guest", "no-such-tool-1", "mkdir", "no such tool 2"],
            b"",
        )
        .unwrap();
        assert_eq!(code, 0, "{shell:?}");
        let answer = parse_prepare(&out).unwrap();
        assert_eq!(answer.missing, ["no-such-tool-1", "no such tool 2"]);
        assert_eq!(answer.ids, Some(own));
        assert!(std::path::Path::new(&base).is_dir());
        // Already there: the same answer, nothing changed.
        let (code, out) = run(shell, PREPARE_SCRIPT, &[&base, "guest"], b"").unwrap();
        assert_eq!((code, ids(&out)), (0, Some(own)), "{shell:?}");
        // The host makes the base: the script asks right after its ids, creates nothing, and
        // checks after `go` (here the base exists: 0; a missing one stays missing: 12).
        let (code, out) = run(shell, PREPARE_SCRIPT, &[&base, "host"], b"go\n").unwrap();
        let answer = parse_prepare(&out).unwrap();
        assert_eq!(
            (code, answer.ids, answer.fallback),
            (0, Some(own), true),
            "{shell:?}"
        );
        let absent = format!("{root}/base/absent");
        for (stdin, want) in [
            (&b"go\n"[..], PREPARE_EXIT_UNWRITABLE),
            (b"", PREPARE_EXIT_FALLBACK),
        ] {
            let (code, out) = run(shell, PREPARE_SCRIPT, &[&absent, "host"], stdin).unwrap();
            assert_eq!(
                (code, parse_prepare(&out).unwrap().fallback),
                (want, true),
                "{shell:?} {stdin:?}"
            );
            assert!(!std::path::Path::new(&absent).exists(), "{shell:?}");
        }
        // The guest cannot create it (a parent that is a file): the fallback, with the ids; no
        // `go` from the host is exit 10, whatever else stdin says.
        std::fs::write(format!("{root}/plain"), b"x").unwrap();
        let plain = format!("{root}/plain/work");
        for stdin in [&b""[..], b"no\n", b"going\n"] {
            let (code, out) = run(shell, PREPARE_SCRIPT, &[&plain, "guest"], stdin).unwrap();
            let answer = parse_prepare(&out).unwrap();
            assert_eq!(
                (code, answer.ids, answer.fallback),
                (PREPARE_EXIT_FALLBACK, Some(own), true),
                "{shell:?} {stdin:?}"
            );
        }
        // After `go` the script checks what the host made (the live tests cover a base made
        // engine-side); here the host made nothing, so the check fails.
        let (code, out) = run(shell, PREPARE_SCRIPT, &[&plain, "guest"], b"go\n").unwrap();
        assert_eq!(
            (code, parse_prepare(&out).unwrap().fallback),
            (PREPARE_EXIT_UNWRITABLE, true),
            "{shell:?}"
        );
        // A failing `id` leaves no ids, whatever the environment holds under the script's names.
        // (A BusyBox shell built to prefer its applets would run its own `id`.)
        if shell[0] != "busybox" {
            let bin = format!("{root}/bin");
            std::fs::create_dir(&bin).unwrap();
            let fake = format!("{bin}/id");
            std::fs::write(&fake, "#!/bin/sh\nexit 1\n").unwrap();
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
            let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
            let out = Command::new(shell[0])
                .args(&shell[1..])
                .arg("-c")
                .arg(PREPARE_SCRIPT)
                .arg("probe")
                .arg(format!("{root}/plain/work"))
                .arg("guest")
                .env("PATH", path)
                .env("maf_u", "7")
                .env("maf_g", "7")
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(PREPARE_EXIT_NO_IDS), "{shell:?}");
            assert_eq!(ids(&out.stdout), None, "{shell:?}");
        }
    }

    #[test]
    fn prepare_answers_parse() {
        assert_eq!(parse_prepare(b"").unwrap(), PrepareAnswer::default());
        assert_eq!(
            parse_prepare(b"missing base64\nmissing /sbin/docker-init\nids 1000 100\nfallback\n")
                .unwrap(),
            PrepareAnswer {
                missing: vec!["base64".into(), "/sbin/docker-init".into()],
                ids: Some((1000, 100)),
                fallback: true,
            }
        );
        for bad in [
            &b"base64\n"[..],
            b"ids 1\n",
            b"ids 1 2 3\n",
            b"ids -1 2\n",
            b"ids 1 2\nids 1 2\n",
            b"ids a b\n",
            b"fallback\nfallback\n",
        ] {
            assert!(
                parse_prepare(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_listing_sizes_files_when_stat_fails() {
        // gVisor's release 2022-12-19 refuses coreutils' `statx`: a `stat` that fails must not
        // drop a file from the listing. (A BusyBox shell built to prefer its applets would run
        // its own `stat`, which works there.)
        for shell in shells().into_iter().filter(|shell| shell[0] != "busybox") {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().to_str().unwrap();
            let bin = format!("{root}/bin");
            std::fs::create_dir(&bin).unwrap();
            let fake = format!("{bin}/stat");
            std::fs::write(
                &fake,
                "#!/bin/sh\necho 'stat: cannot statx: Invalid argument' >&2\nexit 1\n",
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
            let listed = format!("{root}/listed");
            std::fs::create_dir(&listed).unwrap();
            for (name, bytes) in [("value", &b"second"[..]), ("-lead", b"12"), ("empty", b"")] {
                std::fs::write(format!("{listed}/{name}"), bytes).unwrap();
            }
            std::fs::create_dir(format!("{listed}/dir")).unwrap();
            let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
            let out = Command::new(shell[0])
                .args(&shell[1..])
                .arg("-c")
                .arg(LIST_SCRIPT)
                .arg("list")
                .arg(&listed)
                .env("PATH", path)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(0), "{shell:?}");
            let mut records: Vec<(u8, Option<u64>, Vec<u8>)> = parse_list_records(&out.stdout)
                .unwrap()
                .into_iter()
                .map(|r| (r.kind, r.size, r.name.to_vec()))
                .collect();
            records.sort();
            assert_eq!(
                records,
                [
                    (b'd', None, b"dir".to_vec()),
                    (b'f', Some(0), b"empty".to_vec()),
                    (b'f', Some(2), b"-lead".to_vec()),
                    (b'f', Some(6), b"value".to_vec()),
                ],
                "{shell:?}"
            );
        }
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

            check_prepare(&shell, root);
        }
    }
}
