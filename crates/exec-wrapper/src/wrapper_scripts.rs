//! The guest-side `sh` scripts, written for this project, and the argv that carries them.
//!
//! Every script is plain POSIX `sh` and is checked under dash, BusyBox `sh` and bash. Each is
//! passed as an `sh -c` body; the wrapper is also passed as `$1`, so the sbx stages can re-run it
//! under a new `unshare`. Positionals (after `$0 = maf-sbx`):
//!
//! | # | value |
//! |---|---|
//! | 1 | the script itself |
//! | 2 | stage: `enter`, `bind` or `run` |
//! | 3 | nonce |
//! | 4 | pid file |
//! | 5 | parent (where the workspace is bound), or `-` |
//! | 6 | guest mount (where sbx mounted the workspace), or `-` |
//! | 7 | marker name, or `-` |
//! | 8 | env file path under the parent, or `-` |
//! | 9 | encoded working directory |
//! | 10… | encoded argv |

use crate::argv_encoding::{EncodedInvocation, RawInvocation};
use crate::bounded_runner::ExitKind;
use crate::call_identity::{pid_file, sbx_env_file_name, Nonce};
use crate::error::{Error, Result};

/// `$0` of every script this crate runs in a guest.
pub const SCRIPT_NAME: &str = "maf-sbx";

/// The marker file the sbx `bind` stage looks for at `<parent>/<marker>`.
pub const WORKSPACE_MARKER: &str = ".maf-sbx-workspace";

/// Exit status of every wrapper failure before the command could start (decode, bind, uid map,
/// unknown stage, `cd`). Only a failed `cd` says so on stderr, with the `<nonce>-nocwd` line.
pub const WRAPPER_FAILURE_EXIT: i32 = 125;

// The `run` stage, shared by both shapes. In order:
//  1. decode the working directory, the env file (when $8 is not `-`) and the argv; any failure
//     exits 125 before the nonce. The decoded values are rebuilt in the positionals as
//     `ENV… - PIDFILE ARGV…`, so no shell variable is read after the env entries are
//     exported (a caller's `p=…` could not redirect the pid file).
//  2. cd to the working directory as soon as it is decoded, before the nonce and before any guest
//     entry is exported (a `CDPATH` entry cannot steer it). On failure: the `<nonce>-nocwd`
//     marker line, then the shell's own message (the `cd` again, unsilenced), exit 125. The
//     marker comes before any nonce line, so no command can forge it.
//  3. print the nonce on stderr: from here on every stderr byte is the command's.
//  4. export the env entries (`export "$1"`: no eval, no word splitting).
//  5. run `setsid sh -c INNER sh PIDFILE ARGV…` as a forked child (never exec: a forked child of
//     a non-interactive shell is not a group leader, so setsid makes the session in place, and
//     the wait below covers the command). INNER records its pid (= the new group id), then runs
//     the command only if no cancel file exists.
//  6. remove the pid and cancel files and exit with the command's status.
macro_rules! run_stage {
    () => {
        r#"d() {
  case $1 in x*) ;; *) return 1 ;; esac
  v=$(printf '%s' "${1#x}" | base64 -d && printf x) || return 1
  v=${v%x}
}
n=$3 p=$4 e=$8
shift 8
[ "$#" -ge 2 ] || exit 125
k=$#
if [ "$e" != - ]; then
  [ -f "$e" ] || exit 125
  while IFS= read -r l || [ -n "$l" ]; do
    d "$l" || { rm -f -- "$e"; exit 125; }
    case $v in *=*) ;; *) rm -f -- "$e"; exit 125 ;; esac
    set -- "$@" "$v"
  done <"$e"
  rm -f -- "$e"
fi
set -- "$@" -
i=0
for a do
  [ "$i" -lt "$k" ] || break
  d "$a" || exit 125
  if [ "$i" -eq 0 ]; then
    cd -- "$v" 2>/dev/null || {
      printf '%s-nocwd\n' "$n" >&2
      cd -- "$v"
      exit 125
    }
    set -- "$@" "$p"
  else
    set -- "$@" "$v"
  fi
  i=$((i + 1))
done
shift "$k"
printf '%s\n' "$n" >&2
while [ "$1" != - ]; do
  export "$1"
  shift
done
shift
setsid sh -c 'printf "%s\n" "$$" >"$1" || exit 125
if [ -e "$1.cancel" ] || [ -L "$1.cancel" ]; then exit 125; fi
shift
exec "$@"' sh "$@"
r=$?
rm -f -- "$1" "$1.cancel"
exit "$r"
"#
    };
}

/// The Docker shape of the wrapper: the `run` stage only (the engine sets the guest env itself
/// from `--env-file`; positionals 5 to 8 are `-`).
pub const DOCKER_WRAPPER: &str =
    concat!("case $2 in\nrun) ;;\n*) exit 125 ;;\nesac\n", run_stage!());

/// The sbx shape of the wrapper: `enter` (a private user and mount namespace in which the caller
/// is root), `bind` (the workspace bound at the parent, the marker checked, the outer uid and gid
/// read), then `run` under the caller's own uid and gid inside that mount namespace.
pub const SBX_WRAPPER: &str = concat!(
    r#"s=$1
case $2 in
enter)
  shift 2
  exec unshare --user --mount --map-root-user -- sh -c "$s" maf-sbx "$s" bind "$@"
  ;;
enter-pid)
  shift 2
  exec unshare --user --mount --pid --fork --kill-child=KILL --map-root-user -- env -u "maf-sbx-$1" sh -c "$s" maf-sbx "$s" bind "$@"
  ;;
bind)
  mount --bind -- "$6" "$5" || exit 125
  if [ ! -e "$5/$7" ]; then
    printf '%s-unmounted\n' "$3" >&2
    exit 1
  fi
  read -r _ u _ </proc/self/uid_map || exit 125
  read -r _ g _ </proc/self/gid_map || exit 125
  case $u in ''|*[!0-9]*) exit 125 ;; esac
  case $g in ''|*[!0-9]*) exit 125 ;; esac
  shift 2
  exec unshare --user --map-user="$u" --map-group="$g" -- sh -c "$s" maf-sbx "$s" run "$@"
  ;;
run) ;;
*) exit 125 ;;
esac
"#,
    run_stage!()
);

// The group kill, shared by `KILL_SCRIPT` and, as their fallback, by the exact kills below. It
// reads the pid file named by `$1`.
macro_rules! group_kill {
    () => {
        r#"p=$1
[ -n "$p" ] || exit 3
printf '' >"$p.cancel" || exit 5
[ -e "$p" ] || exit 4
t=0
until IFS= read -r g <"$p"; do
  [ -e "$p" ] || exit 4
  t=$((t + 1))
  [ "$t" -le 10 ] || exit 3
  sleep 0.1
done
case $g in ''|0*|*[!0-9]*) exit 3 ;; esac
[ "${#g}" -le 7 ] || exit 3
[ "$g" -gt 1 ] && [ "$g" -le 4194304 ] || exit 3
kill -KILL -"$g" 2>/dev/null
t=0
while :; do
  kill -0 -"$g" 2>/dev/null
  case $? in
  1) break ;;
  0) ;;
  *) exit 6 ;;
  esac
  t=$((t + 1))
  [ "$t" -lt 30 ] || exit 6
  sleep 0.1
done
rm -f -- "$p"
exit 0
"#
    };
}

/// Where every `--init` container has the engine's init (tini).
pub const DOCKER_INIT_PATH: &str = "/sbin/docker-init";

/// The Docker shape under the engine's init in subreaper mode: `/sbin/docker-init -s -- sh -c
/// DOCKER_INIT_WRAPPER maf-sbx <nonce> <mask> <cwd> <argv>…`.
///
/// One line on purpose: the exact kill recognises the init by the first line of its
/// `/proc/<pid>/cmdline`, which must reach the nonce. Positionals: `$1` nonce, `$2` the mask (one
/// `r` for a raw value or `x` for an `x`-base64 one, per value), then the working directory and
/// the argv. In order: the mask must match the values; a cancel file means the kill came first
/// (exit 125, no nonce); only `x` values are decoded (any failure: 125, no nonce); `cd` (failure:
/// the `<nonce>-nocwd` line, the shell's message, 125, no nonce); the nonce line; then the shell
/// replaces itself with the command, so the call costs the init and one shell. The init puts the command in its own process group and
/// stays its subreaper: whatever the command starts, even in a new session, stays in its tree.
pub const DOCKER_INIT_WRAPPER: &str = concat!(
    r#"n=$1 m=$2;shift 2;[ "${#m}" -eq "$#" ]||exit 125;"#,
    r#"if [ -e "/tmp/maf-sbx-$n.pgid.cancel" ]||[ -L "/tmp/maf-sbx-$n.pgid.cancel" ];then exit 125;fi;"#,
    r#"case $m in *[!rx]*) exit 125;;*x*) k=$#;for a do c=${m%"${m#?}"};m=${m#?};"#,
    r#"if [ "$c" = x ];then case $a in x*) ;;*) exit 125;;esac;"#,
    r#"a=$(printf '%s' "${a#x}"|base64 -d&&printf x)||exit 125;a=${a%x};fi;"#,
    r#"set -- "$@" "$a";done;shift "$k";;esac;"#,
    r#"cd -- "$1" 2>/dev/null||{ printf '%s-nocwd\n' "$n" >&2;cd -- "$1";exit 125;};"#,
    r#"printf '%s\n' "$n" >&2;shift;exec "$@""#
);

// The start of the exact kills: check the nonce, create the cancel file first (the start race
// is closed as for the group kill: a wrapper checks it only after its init or namespace exists).
macro_rules! exact_kill_start {
    () => {
        r#"n=$1
case $n in ''|*[!0-9a-f]*) exit 3 ;; esac
[ "${#n}" -eq 24 ] || exit 3
printf '' >"/tmp/maf-sbx-$n.pgid.cancel" || exit 5
"#
    };
}

// Hands over to the group kill of the same call when no exact target exists.
macro_rules! exact_kill_fallback {
    () => {
        r#"set -- "/tmp/maf-sbx-$n.pgid"
"#
    };
}

/// The exact kill for the Docker shape: `sh -c TREE_KILL_SCRIPT maf-sbx <nonce>`.
///
/// It finds the call's init: a process whose parent is outside the container (`PPid` 0, which
/// only the engine can start: no process in the container can create one) and whose command
/// line is `/sbin/docker-init -s -- sh -c <wrapper> maf-sbx <nonce> …`. It stops the init, so it
/// can neither reap nor exit and every orphan of the tree is re-parented to it; then, until the
/// tree holds no live process, it collects every descendant from `/proc`, stops them all (so
/// none forks between the scan and the kill) and kills them all; then it kills the init. It
/// starts no process of its own on that path (only `read`, `kill` and `case`, builtins in dash,
/// BusyBox and bash), so a command that exhausts the container's pids limit cannot make it fail
/// half-way (a failed fork ends dash and BusyBox `sh`). Exit 10: killed; 6: the tree was not
/// empty after 200 rounds (a process the kill may not signal). No
/// such init: the group kill of the same call runs instead (a wrapper without the init), so a
/// call whose init is gone reads as "never started" (exit 4), which the host turns into a kill
/// that did not land once it has seen the nonce line ([`crate::KillReport::after_start`]).
pub const TREE_KILL_SCRIPT: &str = concat!(
    exact_kill_start!(),
    r#"r=
for d in /proc/[0-9]*; do
  s=
  read -r s 2>/dev/null <"$d/stat" || continue
  s=${s##*) }
  s=${s#* }
  [ "${s%% *}" = 0 ] || continue
  c=
  IFS= read -r c 2>/dev/null <"$d/cmdline"
  case $c in "/sbin/docker-init-s--sh-c"*"maf-sbx$n"*) r="$r ${d#/proc/}" ;; esac
done
if [ -n "$r" ]; then
  kill -STOP $r 2>/dev/null
  t=0
  while :; do
    a=" $r "
    l=
    g=1
    while [ "$g" = 1 ]; do
      g=0
      for d in /proc/[0-9]*; do
        q=${d#/proc/}
        case $a in *" $q "*) continue ;; esac
        s=
        read -r s 2>/dev/null <"$d/stat" || continue
        s=${s##*) }
        e=${s%% *}
        s=${s#* }
        case $a in *" ${s%% *} "*)
          a="$a$q "
          g=1
          [ "$e" = Z ] || l="$l $q"
          ;;
        esac
      done
    done
    [ -n "$l" ] || break
    t=$((t + 1))
    [ "$t" -le 200 ] || exit 6
    kill -STOP $l 2>/dev/null
    kill -KILL $l 2>/dev/null
  done
  kill -KILL $r 2>/dev/null
  exit 10
fi
"#,
    exact_kill_fallback!(),
    group_kill!()
);

/// The exact kill for the sbx shape: `sh -c NAMESPACE_KILL_SCRIPT maf-sbx <nonce>`.
///
/// It finds the call's outer `unshare`: a process in the kill's own PID namespace (every process
/// a command starts lives in the command's own, nested namespace, so none can pass for it) whose
/// command line is `unshare --user --mount --pid --fork --kill-child=KILL --map-root-user -- env
/// -u maf-sbx-<nonce> …`. It kills that process and its child, the namespace's first process;
/// the kernel then kills every process in the namespace. Exit 11 once both are gone (the pid
/// file the namespace's wrapper wrote is removed; the cancel file stays, in case the `unshare`
/// was caught between its fork and its child's parent-death signal); 6 if either is still alive
/// after 30 polls. No such `unshare`: the group kill of the same call runs
/// instead (a wrapper entered without a PID namespace), with the same reading of "never started"
/// as [`TREE_KILL_SCRIPT`].
pub const NAMESPACE_KILL_SCRIPT: &str = concat!(
    exact_kill_start!(),
    r#"r=
for d in /proc/[0-9]*; do
  c=
  IFS= read -r c 2>/dev/null <"$d/cmdline"
  case $c in "unshare--user--mount--pid--fork--kill-child=KILL--map-root-user--env-umaf-sbx-$n"*) ;; *) continue ;; esac
  [ "$d/ns/pid" -ef "/proc/$$/ns/pid" ] || continue
  r="$r ${d#/proc/}"
done
if [ -n "$r" ]; then
  a=" $r "
  l=$r
  for d in /proc/[0-9]*; do
    s=
    read -r s 2>/dev/null <"$d/stat" || continue
    s=${s##*) }
    s=${s#* }
    case $a in *" ${s%% *} "*) l="$l ${d#/proc/}" ;; esac
  done
  kill -KILL $l 2>/dev/null
  t=0
  while :; do
    v=
    for q in $l; do
      s=
      read -r s 2>/dev/null <"/proc/$q/stat" || continue
      s=${s##*) }
      [ "${s%% *}" = Z ] || v=1
    done
    if [ -z "$v" ]; then
      rm -f -- "/tmp/maf-sbx-$n.pgid"
      exit 11
    fi
    t=$((t + 1))
    [ "$t" -lt 30 ] || exit 6
    sleep 0.1
  done
fi
"#,
    exact_kill_fallback!(),
    group_kill!()
);

/// The kill script, run as a second, separate exec: `sh -c KILL_SCRIPT maf-sbx <pid file>`.
///
/// Exit statuses: 0 killed, 4 never started (or already finished), 3 bad record, 5 cannot write
/// the cancel file, 6 a group member survived or `kill` was not understood. The cancel file is
/// created **before** the pid file is read, and the wrapper writes the pid file **before** it
/// checks for the cancel file, which closes the start race. A record must be a complete line of
/// digits without a leading zero naming a group from 2 to 4,194,304 (the kernel's largest pid):
/// 0 would be the kill script's own group, 1 every process of the user, and a longer number could
/// wrap in a shell's arithmetic. `kill -KILL -"$g"`, never `kill -KILL -- -N`: dash refuses the
/// latter as an illegal number without signalling anything.
pub const KILL_SCRIPT: &str = group_kill!();

/// The argv after `docker exec … <container id>`: `sh -c <wrapper> maf-sbx <wrapper> run <nonce>
/// <pid file> - - - - x<cwd> x<arg>…`.
///
/// The docker backend puts `docker --context <ctx> exec [-i] [--env-file <file>] -w / <id>` in
/// front. The guest env travels in the env file, never here.
pub fn docker_wrapper_argv(nonce: &Nonce, invocation: &EncodedInvocation) -> Vec<String> {
    wrapper_argv(
        DOCKER_WRAPPER,
        "run",
        nonce,
        ["-", "-", "-", "-"].map(str::to_owned),
        invocation,
    )
}

/// Where sbx put the workspace and where the wrapper binds it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SbxMount {
    /// The storage base's parent, e.g. `/maf-sandbox`: where the `bind` stage mounts the workspace.
    pub parent: String,
    /// Where sbx mounted the workspace in the guest (`pwd -P` at create).
    pub guest_mount: String,
}

/// The argv after `sbx exec <name>`: `sh -c <wrapper> maf-sbx <wrapper> enter <nonce> <pid file>
/// <parent> <guest mount> .maf-sbx-workspace <env file|-> x<cwd> x<arg>…`.
///
/// With `with_env_file`, the env file is `<parent>/.maf-sbx-env-<nonce>`, which the host must have
/// written (see [`crate::encode_env_file`] and [`sbx_env_file_name`]) before the call.
///
/// # Errors
///
/// [`Error::Nul`] when the parent or the guest mount contains NUL.
pub fn sbx_wrapper_argv(
    nonce: &Nonce,
    mount: &SbxMount,
    with_env_file: bool,
    invocation: &EncodedInvocation,
) -> Result<Vec<String>> {
    sbx_argv_at("enter", nonce, mount, with_env_file, invocation)
}

/// As [`sbx_wrapper_argv`], entering at stage `enter-pid`: the outer `unshare` also makes a PID
/// namespace (`--pid --fork --kill-child=KILL`) whose first process is the rest of the wrapper,
/// so [`namespace_kill_argv`] ends every process the command starts. Use it once
/// [`pid_namespace_probe_argv`] has passed in the sandbox; otherwise [`sbx_wrapper_argv`] and the
/// group kill.
///
/// # Errors
///
/// [`Error::Nul`] when the parent or the guest mount contains NUL.
pub fn sbx_pid_namespace_wrapper_argv(
    nonce: &Nonce,
    mount: &SbxMount,
    with_env_file: bool,
    invocation: &EncodedInvocation,
) -> Result<Vec<String>> {
    sbx_argv_at("enter-pid", nonce, mount, with_env_file, invocation)
}

fn sbx_argv_at(
    stage: &str,
    nonce: &Nonce,
    mount: &SbxMount,
    with_env_file: bool,
    invocation: &EncodedInvocation,
) -> Result<Vec<String>> {
    if mount.parent.contains('\0') {
        return Err(Error::nul("the workspace parent"));
    }
    if mount.guest_mount.contains('\0') {
        return Err(Error::nul("the guest mount"));
    }
    let env_file = if with_env_file {
        format!(
            "{}/{}",
            mount.parent.trim_end_matches('/'),
            sbx_env_file_name(nonce)
        )
    } else {
        "-".to_owned()
    };
    Ok(wrapper_argv(
        SBX_WRAPPER,
        stage,
        nonce,
        [
            mount.parent.clone(),
            mount.guest_mount.clone(),
            WORKSPACE_MARKER.to_owned(),
            env_file,
        ],
        invocation,
    ))
}

/// The argv after `docker exec <container id>` (or the Engine API's `Cmd`) for the Docker shape
/// under the engine's init: `/sbin/docker-init -s -- sh -c <DOCKER_INIT_WRAPPER> maf-sbx <nonce>
/// <mask> <cwd> <argv>…`, every value raw unless it is not UTF-8 (see [`RawInvocation`]).
///
/// Use it once [`docker_init_probe_argv`] has passed in the container; the kill is then
/// [`tree_kill_argv`]. The guest env travels through the engine, never here.
pub fn docker_init_wrapper_argv(nonce: &Nonce, invocation: &RawInvocation) -> Vec<String> {
    let mut argv = Vec::with_capacity(9 + invocation.argv().len());
    argv.extend(
        [
            DOCKER_INIT_PATH,
            "-s",
            "--",
            "sh",
            "-c",
            DOCKER_INIT_WRAPPER,
            SCRIPT_NAME,
            nonce.as_str(),
            invocation.mask(),
            invocation.cwd(),
        ]
        .map(str::to_owned),
    );
    argv.extend(invocation.argv().iter().cloned());
    argv
}

/// The exact kill of a call made with [`docker_init_wrapper_argv`]: `sh -c TREE_KILL_SCRIPT
/// maf-sbx <nonce>`, run as a second exec. It falls back to the group kill of the same nonce.
pub fn tree_kill_argv(nonce: &Nonce) -> Vec<String> {
    ["sh", "-c", TREE_KILL_SCRIPT, SCRIPT_NAME, nonce.as_str()]
        .map(str::to_owned)
        .to_vec()
}

/// The exact kill of a call made with [`sbx_pid_namespace_wrapper_argv`]: `sh -c
/// NAMESPACE_KILL_SCRIPT maf-sbx <nonce>`, run as a second `sbx exec`, outside the wrapper's
/// namespaces. It falls back to the group kill of the same nonce.
pub fn namespace_kill_argv(nonce: &Nonce) -> Vec<String> {
    [
        "sh",
        "-c",
        NAMESPACE_KILL_SCRIPT,
        SCRIPT_NAME,
        nonce.as_str(),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Once per container, before the first call: does the engine's init run as a subreaper here?
/// `sh -c '/sbin/docker-init -s -- true'`; read it with [`read_kill_mode_probe`].
pub fn docker_init_probe_argv() -> Vec<String> {
    [
        "sh",
        "-c",
        r#""$1" -s -- true"#,
        "maf-probe",
        DOCKER_INIT_PATH,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Once per sandbox, before the first call: can the wrapper's `enter-pid` stage make its
/// namespaces here? Runs the same `unshare` and `env` as the stage, with `true` as the command;
/// read it with [`read_kill_mode_probe`].
pub fn pid_namespace_probe_argv() -> Vec<String> {
    [
        "sh",
        "-c",
        "exec unshare --user --mount --pid --fork --kill-child=KILL --map-root-user -- env -u maf-sbx-probe true",
        "maf-probe",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Reads either kill-mode probe: exit 0 means the exact kill is available. Anything else (the
/// init missing or not executable, no user or PID namespaces, a signal) means the group kill.
pub fn read_kill_mode_probe(status: ExitKind) -> bool {
    status == ExitKind::Exited(0)
}

fn wrapper_argv(
    script: &str,
    stage: &str,
    nonce: &Nonce,
    placement: [String; 4],
    invocation: &EncodedInvocation,
) -> Vec<String> {
    let mut argv = Vec::with_capacity(10 + invocation.argv().len());
    argv.extend(
        [
            "sh",
            "-c",
            script,
            SCRIPT_NAME,
            script,
            stage,
            nonce.as_str(),
        ]
        .map(str::to_owned),
    );
    argv.push(pid_file(nonce));
    argv.extend(placement);
    argv.push(invocation.cwd().to_owned());
    argv.extend(invocation.argv().iter().cloned());
    argv
}

/// The argv of the kill call after `docker exec <id>` or `sbx exec <name>`: `sh -c <kill script>
/// maf-sbx <pid file>`.
pub fn kill_argv(pid_file: &str) -> Vec<String> {
    ["sh", "-c", KILL_SCRIPT, SCRIPT_NAME, pid_file]
        .map(str::to_owned)
        .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argv_encoding::encode_invocation;

    #[test]
    fn docker_argv_has_the_documented_layout() {
        let nonce = Nonce::parse("00112233445566778899aabb").unwrap();
        let inv = encode_invocation(b"/w", &[b"echo".as_slice(), b""]).unwrap();
        let argv = docker_wrapper_argv(&nonce, &inv);
        assert_eq!(argv[..2], ["sh", "-c"]);
        assert_eq!(argv[2], DOCKER_WRAPPER);
        assert_eq!(argv[3], "maf-sbx");
        assert_eq!(argv[4], DOCKER_WRAPPER);
        assert_eq!(
            argv[5..],
            [
                "run",
                "00112233445566778899aabb",
                "/tmp/maf-sbx-00112233445566778899aabb.pgid",
                "-",
                "-",
                "-",
                "-",
                "xL3c=",
                "xZWNobw==",
                "x"
            ]
        );
    }

    #[test]
    fn sbx_argv_names_the_env_file_under_the_parent() {
        let nonce = Nonce::parse("00112233445566778899aabb").unwrap();
        let inv = encode_invocation(b"/", &[b"true"]).unwrap();
        let mount = SbxMount {
            parent: "/maf-sandbox/".into(),
            guest_mount: "/home/agent/ws".into(),
        };
        let argv = sbx_wrapper_argv(&nonce, &mount, true, &inv).unwrap();
        assert_eq!(argv[4], SBX_WRAPPER);
        assert_eq!(argv[5], "enter");
        assert_eq!(argv[8..10], ["/maf-sandbox/", "/home/agent/ws"]);
        assert_eq!(argv[10], ".maf-sbx-workspace");
        assert_eq!(
            argv[11],
            "/maf-sandbox/.maf-sbx-env-00112233445566778899aabb"
        );
        let argv = sbx_wrapper_argv(&nonce, &mount, false, &inv).unwrap();
        assert_eq!(argv[11], "-");
        let bad = SbxMount {
            parent: "/a\0".into(),
            guest_mount: "/b".into(),
        };
        assert!(matches!(
            sbx_wrapper_argv(&nonce, &bad, false, &inv),
            Err(Error::Nul { .. })
        ));
    }

    #[test]
    fn kill_argv_passes_the_pid_file_alone() {
        assert_eq!(
            kill_argv("/tmp/p.pgid"),
            ["sh", "-c", KILL_SCRIPT, "maf-sbx", "/tmp/p.pgid"]
        );
    }

    #[test]
    fn scripts_never_use_the_double_dash_kill_form() {
        for script in [DOCKER_WRAPPER, SBX_WRAPPER, KILL_SCRIPT] {
            assert!(!script.contains("kill -KILL --"));
            assert!(!script.contains("eval"));
        }
    }
}
