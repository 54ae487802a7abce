//! The little shell the fake's `exec` understands: `true`, `false`, `echo`, `pwd`, `cat FILE...`, and
//! `exit N` in a `sh -c` line. Nothing else runs; an unknown program is exit code 127.

use crate::guest_path;

/// Runs one command line (an argv, or `sh -c LINE` split on whitespace) in `wd`, reading files
/// through `file` (the bytes of the regular file at a normal-form path, `None` for anything else):
/// the exit code, stdout and stderr.
pub(super) fn run_line<'f>(
    argv: Vec<String>,
    wd: &str,
    file: impl Fn(&str) -> Option<&'f [u8]>,
) -> (i32, Vec<u8>, Vec<u8>) {
    let words: Vec<String> = match argv.as_slice() {
        [sh, c, line] if sh == "sh" && c == "-c" => {
            line.split_whitespace().map(str::to_owned).collect()
        }
        _ => argv,
    };
    match words.as_slice() {
        [exit] if exit == "exit" => (0, Vec::new(), Vec::new()),
        [exit, n] if exit == "exit" => match n.parse::<i32>() {
            Ok(code) => (code, Vec::new(), Vec::new()),
            Err(_) => (2, Vec::new(), b"fake: exit: bad number\n".to_vec()),
        },
        _ => run(&words, wd, file),
    }
}

fn run<'f>(
    words: &[String],
    wd: &str,
    file: impl Fn(&str) -> Option<&'f [u8]>,
) -> (i32, Vec<u8>, Vec<u8>) {
    let Some((program, args)) = words.split_first() else {
        return (0, Vec::new(), Vec::new());
    };
    match program.as_str() {
        "true" => (0, Vec::new(), Vec::new()),
        "false" => (1, Vec::new(), Vec::new()),
        "echo" => (0, format!("{}\n", args.join(" ")).into_bytes(), Vec::new()),
        "pwd" => (0, format!("{wd}\n").into_bytes(), Vec::new()),
        "cat" => {
            let mut out = Vec::new();
            for arg in args {
                let resolved = guest_path::norm(&guest_path::join(wd, arg));
                match file(&resolved) {
                    Some(bytes) => out.extend_from_slice(bytes),
                    _ => {
                        return (
                            1,
                            out,
                            format!("cat: {arg}: No such file or directory\n").into_bytes(),
                        )
                    }
                }
            }
            (0, out, Vec::new())
        }
        other => (
            127,
            Vec::new(),
            format!("fake: {other}: command not found\n").into_bytes(),
        ),
    }
}
