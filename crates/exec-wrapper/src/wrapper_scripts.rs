//! The guest-side `sh` scripts, written for this project, and the argv that carries them.
//!
//! Every script is plain POSIX `sh` and is checked under dash, BusyBox `sh` and bash. Each is
//! passed as an `sh -c` body; the wrapper is also passed as `$1`, so the sbx `bind` stage can
//! re-run it under a new `unshare`. Positionals (after `$0 = maf-sbx`):
//!
//! | # | value |
//! |---|---|
//! | 1 | the script itself |
//! | 2 | stage: `bind` or `run` |
//! | 3 | nonce |
//! | 4 | pid file |
//! | 5 | parent (where the workspace is bound), or `-` |
//! | 6 | guest mount (where sbx mounted the workspace), or `-` |
//! | 7 | marker name, or `-` |
//! | 8 | env file path under the parent, or `-` |
//! | 9 | working directory, `r<value>` or `x<base64>` |
//! | 10… | argv, each `r<value>` or `x<base64>` |

use crate::argv_encoding::{EncodedInvocation, RawInvocation};
use crate::call_identity::{pid_file, sbx_env_file_name, Nonce};
use crate::error::{Error, Result};
use bounded_process::ExitKind;

/// `$0` of every script this crate runs in a guest.
pub const SCRIPT_NAME: &str = "maf-sbx";

/// The marker file the sbx `bind` stage looks for at `<parent>/<marker>`.
pub const WORKSPACE_MARKER: &str = ".maf-sbx-workspace";

/// Exit status of every wrapper failure before the command could start (decode, bind, uid map,
/// unknown stage, `cd`). Only a failed `cd` says so on stderr, with the `<nonce>-nocwd` line.
pub(crate) const WRAPPER_FAILURE_EXIT: i32 = 125;

// The `run` stage, shared by both shapes. In order:
//  1. decode the working directory, the env file (when $8 is not `-`) and the argv: an `r` value
//     is taken as it is (no process), an `x` one through `base64 -d`; any failure exits 125
//     before the nonce. The decoded values are rebuilt in the positionals as
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
// With `-` as the pid file (the sbx call in a PID namespace of its own, which the namespace kill
// ends whole: no group record to write), the cancel file `/tmp/maf-sbx-<nonce>.pgid.cancel` is
// checked before the nonce line (exit 125 when it exists) and step 5 is `setsid -- ARGV…`, still
// a forked child (this shell is the namespace's first process and waits; a command run as that
// first process would be immune to its own signals), with nothing to remove after it.
macro_rules! run_stage {
    () => {
        r#"d() {
  case $1 in
  r*) v=${1#r} ;;
  x*)
    v=$(printf '%s' "${1#x}" | base64 -d && printf x) || return 1
    v=${v%x}
    ;;
  *) return 1 ;;
  esac
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
if [ "$p" = - ]; then
  if [ -e "/tmp/maf-sbx-$n.pgid.cancel" ] || [ -L "/tmp/maf-sbx-$n.pgid.cancel" ]; then exit 125; fi
fi
printf '%s\n' "$n" >&2
while [ "$1" != - ]; do
  export "$1"
  shift
done
shift
if [ "$1" = - ]; then
  shift
  setsid -- "$@"
  exit "$?"
fi
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

/// The sbx shape of the wrapper: `bind` (the workspace bound at the parent, the marker checked,
/// the outer uid and gid read), then `run` under the caller's own uid and gid inside that mount
/// namespace. The call's argv starts with `unshare` itself ([`sbx_wrapper_argv`],
/// [`sbx_pid_namespace_wrapper_argv`]): the private user and mount namespace in which the caller
/// is root (and, with the PID namespace, its first process) exists before the first `sh` starts.
///
/// `run` gets the caller's ids back from a nested user namespace mapping them (a second
/// `unshare`, which starts `run` in a second `sh`). A caller whose outer uid and gid are both 0
/// is root already in the first namespace, which maps 0 to 0: the nested one would map 0 to 0
/// again, so `run` goes on in the same `sh`, two program starts fewer.
pub const SBX_WRAPPER: &str = concat!(
    r#"s=$1
case $2 in
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
  if [ "$u" != 0 ] || [ "$g" != 0 ]; then
    exec unshare --user --map-user="$u" --map-group="$g" -- sh -c "$s" maf-sbx "$s" run "$@"
  fi
  set -- "$s" run "$@"
  ;;
run) ;;
*) exit 125 ;;
esac
"#,
    run_stage!()
);

/// The `unshare` an sbx call starts with when it has no PID namespace: a private user and mount
/// namespace in which the caller is root, without any root grant from sbx.
const SBX_ENTER: [&str; 5] = ["unshare", "--user", "--mount", "--map-root-user", "--"];

/// The `unshare` an sbx call starts with in its own PID namespace, whose first process is the
/// rest of the call; [`NAMESPACE_KILL_SCRIPT`] recognises it by these words and the `sh -c
/// #maf-sbx-<nonce>` after them (the script's first line, a comment naming the call).
const SBX_ENTER_PID: [&str; 8] = [
    "unshare",
    "--user",
    "--mount",
    "--pid",
    "--fork",
    "--kill-child=KILL",
    "--map-root-user",
    "--",
];

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

// One literal for the path, so the tree kill's pattern is built from the same text.
macro_rules! exec_init_path {
    () => {
        "/usr/local/libexec/sandbox-exec-init"
    };
}

/// Where an image carries the exec init (`sandbox-exec-init`, static): the project's Debian
/// images do. Where it is, a call runs as [`exec_init_argv`], two program starts fewer than
/// [`docker_init_wrapper_argv`], with the same protocol and the same exact kill.
pub const EXEC_INIT_PATH: &str = exec_init_path!();

/// The Docker shape under the engine's init in subreaper mode: `/sbin/docker-init -s -- sh -c
/// DOCKER_INIT_WRAPPER maf-sbx <nonce> <mask> <cwd> <argv>…`.
///
/// One line on purpose: the exact kill recognises the init by the first line of its
/// `/proc/<pid>/cmdline`, which must reach the nonce. Positionals: `$1` nonce, `$2` the mask (one
/// `r` for a raw value or `x` for an `x`-base64 one, per value), then the working directory and
/// the argv. In order: the mask must match the values; a cancel file means the kill came first
/// (exit 125, no nonce); only `x` values are decoded (any failure: 125, no nonce); `cd` (failure:
/// the `<nonce>-nocwd` line, the shell's message, 125, no nonce); the nonce line; then the
/// command runs in a subshell that replaces itself with it (`(exec "$@")`: exactly the argv, never
/// a shell builtin), while the wrapper waits. A signal-shaped status ([`SIGNAL_STATUSES`]) is
/// written to `/tmp/maf-sbx-<nonce>.status` and the wrapper exits [`RECORDED_STATUS`] instead:
/// an exec of this shape that ends with a signal-shaped status therefore always means its init
/// or wrapper was killed, whatever a command wrote (see [`init_status_argv`]). The init puts the wrapper in
/// its own process group and stays the subreaper: whatever the command starts, even in a new
/// session, stays in its tree.
pub const DOCKER_INIT_WRAPPER: &str = concat!(
    r#"n=$1 m=$2;shift 2;[ "${#m}" -eq "$#" ]||exit 125;"#,
    r#"if [ -e "/tmp/maf-sbx-$n.pgid.cancel" ]||[ -L "/tmp/maf-sbx-$n.pgid.cancel" ];then exit 125;fi;"#,
    r#"case $m in *[!rx]*) exit 125;;*x*) k=$#;for a do c=${m%"${m#?}"};m=${m#?};"#,
    r#"if [ "$c" = x ];then case $a in x*) ;;*) exit 125;;esac;"#,
    r#"a=$(printf '%s' "${a#x}"|base64 -d&&printf x)||exit 125;a=${a%x};fi;"#,
    r#"set -- "$@" "$a";done;shift "$k";;esac;"#,
    r#"cd -- "$1" 2>/dev/null||{ printf '%s-nocwd\n' "$n" >&2;cd -- "$1";exit 125;};"#,
    r#"printf '%s\n' "$n" >&2;shift;(exec "$@");s=$?;"#,
    r#"if [ "$s" -gt 128 ]&&[ "$s" -le 192 ];then printf '%s' "$s" >"/tmp/maf-sbx-$n.status";s=255;fi;exit "$s""#
);

/// After a call in the Docker init shape ended with [`RECORDED_STATUS`]: `sh -c
/// INIT_STATUS_SCRIPT maf-sbx <nonce>` prints the signal-shaped status its wrapper recorded (and
/// removes the record), or `none` when there is none: then the command exited with
/// [`RECORDED_STATUS`] itself. A missing nonce or one not of 24 lowercase hex digits: exit 3.
pub const INIT_STATUS_SCRIPT: &str = r#"n=$1
case $n in ''|*[!0-9a-f]*) exit 3 ;; esac
[ "${#n}" -eq 24 ] || exit 3
f="/tmp/maf-sbx-$n.status"
if [ -f "$f" ] && [ ! -L "$f" ]; then
  s=
  read -r s <"$f"
  rm -f -- "$f"
  printf '%s\n' "$s"
else
  echo none
fi
"#;

/// The argv of [`INIT_STATUS_SCRIPT`] for `nonce`, run as a second exec.
pub fn init_status_argv(nonce: &Nonce) -> Vec<String> {
    ["sh", "-c", INIT_STATUS_SCRIPT, SCRIPT_NAME, nonce.as_str()]
        .map(str::to_owned)
        .to_vec()
}

/// The exit statuses of a process killed by a signal: 128 plus the signal's number (1 to 64).
/// An init-shape call's exec never ends with one of them unless its init or wrapper was killed:
/// the wrapper turns a command's signal-shaped status into [`RECORDED_STATUS`] and a record.
pub const SIGNAL_STATUSES: std::ops::RangeInclusive<i32> = 129..=192;

/// What an init-shape wrapper exits with when the command's status was signal-shaped (and
/// recorded), or when the command itself exited with it: [`recorded_status`] tells which.
pub const RECORDED_STATUS: i32 = 255;

/// The command's status after its init-shape call ended with [`RECORDED_STATUS`], from the
/// status check's exit and output: the record when it holds a signal-shaped status, else
/// [`RECORDED_STATUS`] (no record, or one the command wrote that no wrapper would). `None` when
/// the check itself failed.
///
/// A command can write a record of its own and exit 255: it then chooses which of its own
/// statuses is reported, which it could have done by exiting with it.
pub fn recorded_status(check_status: ExitKind, stdout: &[u8]) -> Option<i32> {
    if check_status != ExitKind::Exited(0) {
        return None;
    }
    let text = String::from_utf8_lossy(stdout);
    Some(
        text.trim_end()
            .parse::<i32>()
            .ok()
            .filter(|status| SIGNAL_STATUSES.contains(status))
            .unwrap_or(RECORDED_STATUS),
    )
}

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
/// line is `/sbin/docker-init -s -- sh -c <wrapper> maf-sbx <nonce> …` or `sandbox-exec-init
/// <nonce> …` at [`EXEC_INIT_PATH`]. It stops the init, so it
/// can neither reap nor exit and every orphan of the tree is re-parented to it; then, until the
/// tree holds no live process, it collects every descendant from `/proc`, stops them all (so
/// none forks between the scan and the kill) and kills them all; then it kills the init and
/// removes the cancel file (nothing of the call is left to read it, and a kill leaves nothing
/// behind in a reused sandbox). `rm` is the one process it starts, and only once the container's
/// pids controller shows room for it (polled up to 2,000 times while the killed tree's zombies are
/// reaped): a failed fork would end the shell before its exit status; without that room, or without
/// a readable controller, the empty cancel file stays. It
/// starts no process of its own on that path (only `read`, `kill` and `case`, builtins in dash,
/// BusyBox and bash), so a command that exhausts the container's pids limit cannot make it fail
/// half-way (a failed fork ends dash and BusyBox `sh`). Exit 10: killed; 6: the tree was not
/// empty after 200 rounds (a process the kill may not signal). No
/// such init: the group kill of the same call runs instead (a wrapper without the init), so a
/// call whose init is gone reads as "never started" (exit 4), which the host turns into a kill
/// that did not land once it has seen the nonce line ([`crate::kill::KillReport::after_start`]).
pub const TREE_KILL_SCRIPT: &str = concat!(
    exact_kill_start!(),
    r#"f=/sys/fs/cgroup
[ -r "$f/pids.max" ] || f=/sys/fs/cgroup/pids
r=
for d in /proc/[0-9]*; do
  s=
  read -r s 2>/dev/null <"$d/stat" || continue
  s=${s##*) }
  s=${s#* }
  [ "${s%% *}" = 0 ] || continue
  c=
  IFS= read -r c 2>/dev/null <"$d/cmdline"
  case $c in "/sbin/docker-init-s--sh-c"*"maf-sbx$n"*|""#,
    exec_init_path!(),
    r#"$n"*) r="$r ${d#/proc/}" ;; esac
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
  i=0
  while [ "$i" -lt 2000 ]; do
    m=
    c=
    { read -r m <"$f/pids.max" && read -r c <"$f/pids.current"; } 2>/dev/null || break
    [ "$m" = max ] && m=$((c + 64))
    case $m$c in ''|*[!0-9]*) break ;; esac
    if [ $((c + 16)) -lt "$m" ]; then
      rm -f -- "/tmp/maf-sbx-$n.pgid.cancel"
      break
    fi
    i=$((i + 1))
  done
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
/// command line is `unshare --user --mount --pid --fork --kill-child=KILL --map-root-user -- sh
/// -c #maf-sbx-<nonce>…`. It kills that process and its child, the namespace's first process;
/// the kernel then kills every process in the namespace. Exit 11 once both are gone (the cancel
/// file is removed unless a process whose command line carries the nonce is still alive: an
/// `unshare` caught between its fork and its child's parent-death signal leaves such a child,
/// which must still find the file and stop. Every process of the call carries the nonce in its
/// first line, the script's comment, from that fork until the wrapper's check, and no new one can
/// appear once the `unshare` is dead); 6 if either is still alive after 30 polls. No such `unshare`: the group kill of the same call runs
/// instead (a wrapper entered without a PID namespace), with the same reading of "never started"
/// as [`TREE_KILL_SCRIPT`].
pub const NAMESPACE_KILL_SCRIPT: &str = concat!(
    exact_kill_start!(),
    r#"r=
for d in /proc/[0-9]*; do
  c=
  IFS= read -r c 2>/dev/null <"$d/cmdline"
  case $c in "unshare--user--mount--pid--fork--kill-child=KILL--map-root-user--sh-c#maf-sbx-$n") ;; *) continue ;; esac
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
      w=
      for d in /proc/[0-9]*; do
        [ "${d#/proc/}" = "$$" ] && continue
        c=
        IFS= read -r c 2>/dev/null <"$d/cmdline"
        case $c in *"$n"*) w=1 ;; esac
      done
      [ -n "$w" ] || rm -f -- "/tmp/maf-sbx-$n.pgid.cancel"
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
        Vec::new(),
        DOCKER_WRAPPER,
        "run",
        nonce,
        &pid_file(nonce),
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

/// The argv after `sbx exec <name>`: `unshare --user --mount --map-root-user -- sh -c <wrapper>
/// maf-sbx <wrapper> bind <nonce> <pid file> <parent> <guest mount> .maf-sbx-workspace <env
/// file|-> <cwd> <arg>…`, each value as [`crate::encoding::plain_invocation`] or
/// [`crate::encoding::encode_invocation`] carries it.
///
/// `unshare` is the call's first process: it makes the namespaces and starts the wrapper's
/// `bind` stage in them. With `with_env_file`, the env file is `<parent>/.maf-sbx-env-<nonce>`,
/// which the host must have written (see [`crate::encoding::encode_env_file`] and
/// [`sbx_env_file_name`]) before the call.
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
    let enter = SBX_ENTER.map(str::to_owned).to_vec();
    sbx_argv(
        enter,
        SBX_WRAPPER,
        nonce,
        &pid_file(nonce),
        mount,
        with_env_file,
        invocation,
    )
}

/// As [`sbx_wrapper_argv`], in a PID namespace of the call's own: `unshare --user --mount --pid
/// --fork --kill-child=KILL --map-root-user -- sh -c <#maf-sbx-<nonce>, newline, wrapper>
/// maf-sbx <the same> bind <nonce> - …`. The rest of the call is the namespace's first process,
/// so [`namespace_kill_argv`] ends every process the command starts. The script's first line is
/// a comment naming the call: it puts the nonce in the `unshare`'s command line, and in every
/// stage's, before any newline, where the kill looks for it. The pid file positional is `-`: the
/// namespace kill needs no group record, so the `run` stage writes none and starts the command
/// with `setsid` directly (checking the cancel file before its nonce line). Use it once
/// [`pid_namespace_probe_argv`] has passed in the sandbox; otherwise [`sbx_wrapper_argv`] and
/// the group kill.
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
    let enter = SBX_ENTER_PID.map(str::to_owned).to_vec();
    let script = format!("#{SCRIPT_NAME}-{nonce}\n{SBX_WRAPPER}");
    sbx_argv(enter, &script, nonce, "-", mount, with_env_file, invocation)
}

fn sbx_argv(
    enter: Vec<String>,
    script: &str,
    nonce: &Nonce,
    pid_file: &str,
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
        enter,
        script,
        "bind",
        nonce,
        pid_file,
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
    raw_call_argv(
        &[
            DOCKER_INIT_PATH,
            "-s",
            "--",
            "sh",
            "-c",
            DOCKER_INIT_WRAPPER,
            SCRIPT_NAME,
        ],
        nonce,
        invocation,
    )
}

/// The argv after `docker exec <container id>` (or the Engine API's `Cmd`) for the Docker shape
/// under the exec init: `/usr/local/libexec/sandbox-exec-init <nonce> <mask> <cwd> <argv>…`, the
/// same values as [`docker_init_wrapper_argv`] after its script.
///
/// Use it once a probe found [`EXEC_INIT_PATH`] in the container; the kill is [`tree_kill_argv`]
/// and a signal-shaped status is checked with [`init_status_argv`], as for the init wrapper.
pub fn exec_init_argv(nonce: &Nonce, invocation: &RawInvocation) -> Vec<String> {
    raw_call_argv(&[EXEC_INIT_PATH], nonce, invocation)
}

/// `program` (the init and what it starts), then the nonce, the mask, the working directory and
/// the argv of a raw invocation: the values both init shapes take.
fn raw_call_argv(program: &[&str], nonce: &Nonce, invocation: &RawInvocation) -> Vec<String> {
    let mut argv = Vec::with_capacity(program.len() + 3 + invocation.argv().len());
    argv.extend(program.iter().map(|part| (*part).to_owned()));
    argv.extend([nonce.as_str(), invocation.mask(), invocation.cwd()].map(str::to_owned));
    argv.extend(invocation.argv().iter().cloned());
    argv
}

/// The exact kill of a call made with [`docker_init_wrapper_argv`] or [`exec_init_argv`]: `sh -c TREE_KILL_SCRIPT
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

/// Once per sandbox, before the first call: can [`sbx_pid_namespace_wrapper_argv`]'s `unshare`
/// make its namespaces here? Runs the same `unshare` (from `sh`, so a guest without `unshare`
/// answers 127 like any missing tool) starting `sh -c :` in them; read it with
/// [`read_kill_mode_probe`].
pub fn pid_namespace_probe_argv() -> Vec<String> {
    [
        "sh",
        "-c",
        "exec unshare --user --mount --pid --fork --kill-child=KILL --map-root-user -- sh -c :",
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

/// `prefix`, then `sh -c <script> maf-sbx <script> <stage> <nonce> <pid file> <placement…>
/// <cwd> <argv…>`.
fn wrapper_argv(
    mut argv: Vec<String>,
    script: &str,
    stage: &str,
    nonce: &Nonce,
    pid_file: &str,
    placement: [String; 4],
    invocation: &EncodedInvocation,
) -> Vec<String> {
    argv.reserve(10 + invocation.argv().len());
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
    argv.push(pid_file.to_owned());
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

    /// Runs the init shape's wrapper under `sh` (no init: the test is its parent) with `argv`
    /// raw, then the status check: (the wrapper's status, what the check printed).
    fn wrapper_then_status_check(argv: &[&str]) -> (i32, String) {
        let nonce = crate::new_nonce().unwrap();
        let mask = "r".repeat(argv.len() + 1);
        let ran = std::process::Command::new("sh")
            .args([
                "-c",
                DOCKER_INIT_WRAPPER,
                SCRIPT_NAME,
                nonce.as_str(),
                &mask,
                "/",
            ])
            .args(argv)
            .output()
            .unwrap();
        assert!(
            crate::nonce_result::nonce_line_seen(&ran.stderr, &nonce),
            "{ran:?}"
        );
        let status = ran.status.code().unwrap_or_else(|| {
            128 + std::os::unix::process::ExitStatusExt::signal(&ran.status).unwrap()
        });
        let check = std::process::Command::new("sh")
            .args(&init_status_argv(&nonce)[1..])
            .output()
            .unwrap();
        assert_eq!(check.status.code(), Some(0));
        let printed = String::from_utf8(check.stdout).unwrap();
        let read = recorded_status(ExitKind::Exited(0), printed.as_bytes());
        assert_eq!(
            read.is_some_and(|r| r != RECORDED_STATUS),
            printed.trim_end() != "none"
        );
        // The record is read once: a second check finds none.
        let again = std::process::Command::new("sh")
            .args(&init_status_argv(&nonce)[1..])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&again.stdout), "none\n");
        (status, printed.trim_end().to_owned())
    }

    #[test]
    fn the_init_shape_records_a_signal_status_and_not_a_killed_wrapper() {
        // Plain statuses leave no record; a command killed by a signal leaves its status, and
        // the wrapper exits with the one status that says so.
        assert_eq!(wrapper_then_status_check(&["true"]), (0, "none".to_owned()));
        assert_eq!(
            wrapper_then_status_check(&["sh", "-c", "exit 7"]),
            (7, "none".to_owned())
        );
        assert_eq!(
            wrapper_then_status_check(&["sh", "-c", "kill -KILL $$"]),
            (RECORDED_STATUS, "137".to_owned())
        );
        // A command's own signal-shaped exit is recorded alike; 255 and 193 pass as they are.
        assert_eq!(
            wrapper_then_status_check(&["sh", "-c", "exit 192"]),
            (RECORDED_STATUS, "192".to_owned())
        );
        assert_eq!(
            wrapper_then_status_check(&["sh", "-c", "exit 193"]),
            (193, "none".to_owned())
        );
        assert_eq!(
            wrapper_then_status_check(&["sh", "-c", "exit 255"]),
            (RECORDED_STATUS, "none".to_owned())
        );
        // The command is exactly its argv, never a shell builtin.
        assert_eq!(wrapper_then_status_check(&["exit", "3"]).0, 127);
        // A command that kills the process waiting for it: the exec's status is signal-shaped,
        // which no wrapper exits with; a record the command forged changes nothing of that.
        assert_eq!(
            wrapper_then_status_check(&["sh", "-c", "kill -KILL $PPID; sleep 0.2"]),
            (137, "none".to_owned())
        );
        assert!(SIGNAL_STATUSES.contains(&137));
        assert_eq!(recorded_status(ExitKind::Exited(0), b"none\n"), Some(255));
        assert_eq!(recorded_status(ExitKind::Exited(0), b"137\n"), Some(137));
        assert_eq!(recorded_status(ExitKind::Exited(0), b"129"), Some(129));
        assert_eq!(recorded_status(ExitKind::Exited(0), b"192"), Some(192));
        // What no wrapper records reads as the command's own 255.
        for forged in [&b"0"[..], b"128", b"193", b"255", b"-1", b"\xff\xfe", b""] {
            assert_eq!(recorded_status(ExitKind::Exited(0), forged), Some(255));
        }
        assert_eq!(recorded_status(ExitKind::Exited(3), b"137\n"), None);
        assert_eq!(recorded_status(ExitKind::Signaled(9), b""), None);
    }
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
        let inv = crate::argv_encoding::plain_invocation(b"/", &[b"true"]).unwrap();
        let mount = SbxMount {
            parent: "/maf-sandbox/".into(),
            guest_mount: "/home/agent/ws".into(),
        };
        let argv = sbx_wrapper_argv(&nonce, &mount, true, &inv).unwrap();
        // `unshare` is the call's first process, and starts the wrapper at `bind`.
        assert_eq!(argv[..5], SBX_ENTER);
        let argv = &argv[5..];
        assert_eq!(argv[..4], ["sh", "-c", SBX_WRAPPER, "maf-sbx"]);
        assert_eq!(argv[4], SBX_WRAPPER);
        assert_eq!(argv[5], "bind");
        assert_eq!(argv[8..10], ["/maf-sandbox/", "/home/agent/ws"]);
        assert_eq!(argv[10], ".maf-sbx-workspace");
        assert_eq!(
            argv[11],
            "/maf-sandbox/.maf-sbx-env-00112233445566778899aabb"
        );
        assert_eq!(argv[12..], ["r/", "rtrue"]);
        let argv = sbx_wrapper_argv(&nonce, &mount, false, &inv).unwrap();
        assert_eq!(argv[5 + 11], "-");
        let bad = SbxMount {
            parent: "/a\0".into(),
            guest_mount: "/b".into(),
        };
        assert!(matches!(
            sbx_wrapper_argv(&nonce, &bad, false, &inv),
            Err(Error::Nul { .. })
        ));
        assert!(matches!(
            sbx_pid_namespace_wrapper_argv(&nonce, &bad, false, &inv),
            Err(Error::Nul { .. })
        ));
    }

    #[test]
    fn the_pid_namespace_argv_puts_the_nonce_before_the_first_newline() {
        let nonce = Nonce::parse("00112233445566778899aabb").unwrap();
        let inv = crate::argv_encoding::plain_invocation(b"/", &[b"true"]).unwrap();
        let mount = SbxMount {
            parent: "/maf-sandbox".into(),
            guest_mount: "/home/agent/ws".into(),
        };
        let argv = sbx_pid_namespace_wrapper_argv(&nonce, &mount, false, &inv).unwrap();
        assert_eq!(argv[..8], SBX_ENTER_PID);
        // The script's first line names the call; the rest is the wrapper, passed on as `$1`
        // with the same first line, so every stage's command line names the call too.
        let script = format!("#maf-sbx-00112233445566778899aabb\n{SBX_WRAPPER}");
        assert_eq!(argv[8..11], ["sh", "-c", script.as_str()]);
        assert_eq!(argv[11..13], ["maf-sbx", script.as_str()]);
        assert_eq!(argv[13..15], ["bind", "00112233445566778899aabb"]);
        // No group record in a PID namespace: the pid file positional is `-`.
        assert_eq!(argv[15], "-");
        assert_eq!(
            argv[16..],
            [
                "/maf-sandbox",
                "/home/agent/ws",
                WORKSPACE_MARKER,
                "-",
                "r/",
                "rtrue"
            ]
        );
        // The command line as the namespace kill reads it: NULs dropped, up to the first newline.
        let joined: String = argv.concat();
        let first_line = joined.split('\n').next().unwrap();
        assert_eq!(
            first_line,
            "unshare--user--mount--pid--fork--kill-child=KILL--map-root-user--sh-c#maf-sbx-00112233445566778899aabb"
        );
        assert!(NAMESPACE_KILL_SCRIPT.contains(
            r#""unshare--user--mount--pid--fork--kill-child=KILL--map-root-user--sh-c#maf-sbx-$n")"#
        ));
        // Without a PID namespace the group record is written as before.
        let argv = sbx_wrapper_argv(&nonce, &mount, false, &inv).unwrap();
        assert_eq!(argv[5..8], ["sh", "-c", SBX_WRAPPER]);
        assert_eq!(argv[12], "/tmp/maf-sbx-00112233445566778899aabb.pgid");
    }

    #[test]
    fn kill_argv_passes_the_pid_file_alone() {
        assert_eq!(
            kill_argv("/tmp/p.pgid"),
            ["sh", "-c", KILL_SCRIPT, "maf-sbx", "/tmp/p.pgid"]
        );
    }

    #[test]
    fn only_a_clean_exit_of_a_probe_means_the_exact_kill() {
        assert!(read_kill_mode_probe(ExitKind::Exited(0)));
        // A failing init or `unshare`, a refused exec (126), a missing tool (127), a wrapper-like
        // 125, a status no shell gives, and every death by signal: the group kill.
        for status in [
            ExitKind::Exited(1),
            ExitKind::Exited(2),
            ExitKind::Exited(125),
            ExitKind::Exited(126),
            ExitKind::Exited(127),
            ExitKind::Exited(255),
            ExitKind::Exited(-1),
            ExitKind::Exited(i32::MIN),
            ExitKind::Signaled(0),
            ExitKind::Signaled(9),
            ExitKind::Signaled(15),
        ] {
            assert!(!read_kill_mode_probe(status), "{status:?}");
        }
    }

    #[test]
    fn scripts_never_use_the_double_dash_kill_form() {
        for script in [DOCKER_WRAPPER, SBX_WRAPPER, KILL_SCRIPT] {
            assert!(!script.contains("kill -KILL --"));
            assert!(!script.contains("eval"));
        }
    }
}

/// The kill-mode probes run on this host's `sh` against stand-ins for the guest's init and
/// `unshare`, each of which records its arguments and answers with a chosen status.
#[cfg(all(test, unix))]
mod probe_runs {
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use super::*;
    use crate::argv_encoding::encode_invocation;
    use bounded_process::BoundedCommand;

    const SYSTEM_PATH: &str = "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

    /// Writes `dir/name`, an executable that records its arguments one per line in
    /// `dir/name.args` and exits with `status`. A separate shell writes it, so no write handle
    /// of this process can leak into a concurrent test's child and keep the file busy.
    fn stand_in(dir: &Path, name: &str, status: i32) -> PathBuf {
        let path = dir.join(name);
        let body = format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" >'{}.args'\nexit {status}\n",
            path.display()
        );
        let written = std::process::Command::new("/bin/sh")
            .args(["-c", r#"printf '%s' "$1" >"$2" && chmod 755 "$2""#, "sh"])
            .arg(&body)
            .arg(&path)
            .status()
            .unwrap();
        assert!(written.success(), "writing {}", path.display());
        path
    }

    /// What the stand-in at `path` was called with, or `None` if it never ran.
    fn recorded(path: &Path) -> Option<Vec<String>> {
        let text = std::fs::read_to_string(format!("{}.args", path.display())).ok()?;
        Some(text.lines().map(str::to_owned).collect())
    }

    fn run(argv: &[String], path: &str) -> ExitKind {
        assert_eq!(argv[0], "sh", "a probe starts with sh");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(
                BoundedCommand::new(&argv[0], Duration::from_secs(10))
                    .args(&argv[1..])
                    .env("PATH", path)
                    .run(),
            )
            .unwrap()
            .status
    }

    /// The init probe's argv, with the init it names replaced by `init`.
    fn init_probe_with(init: &Path) -> Vec<String> {
        let argv = docker_init_probe_argv();
        assert_eq!(
            argv.iter().filter(|arg| *arg == DOCKER_INIT_PATH).count(),
            1,
            "the probe names the engine's init once: {argv:?}"
        );
        argv.into_iter()
            .map(|arg| {
                if arg == DOCKER_INIT_PATH {
                    init.display().to_string()
                } else {
                    arg
                }
            })
            .collect()
    }

    #[test]
    fn the_init_probe_runs_the_init_as_a_subreaper_and_reads_its_status() {
        let dir = tempfile::tempdir().unwrap();
        for (status, exact) in [(0, true), (1, false), (2, false)] {
            let init = stand_in(dir.path(), &format!("init-{status}"), status);
            let answer = run(&init_probe_with(&init), SYSTEM_PATH);
            assert_eq!(answer, ExitKind::Exited(status));
            assert_eq!(read_kill_mode_probe(answer), exact, "init exits {status}");
            assert_eq!(
                recorded(&init).as_deref(),
                Some(["-s", "--", "true"].map(str::to_owned).as_slice()),
                "the init runs `true` as a subreaper"
            );
        }
    }

    #[test]
    fn without_a_runnable_init_the_probe_says_group_kill() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-init");
        let answer = run(&init_probe_with(&missing), SYSTEM_PATH);
        assert_eq!(answer, ExitKind::Exited(127));
        assert!(!read_kill_mode_probe(answer));

        let not_executable = dir.path().join("not-executable");
        std::fs::write(&not_executable, "#!/bin/sh\nexit 0\n").unwrap();
        let answer = run(&init_probe_with(&not_executable), SYSTEM_PATH);
        assert_eq!(answer, ExitKind::Exited(126));
        assert!(!read_kill_mode_probe(answer));

        // As this host is, when it has no init at that path (containers get it from the engine).
        if !Path::new(DOCKER_INIT_PATH).exists() {
            let answer = run(&docker_init_probe_argv(), SYSTEM_PATH);
            assert_eq!(answer, ExitKind::Exited(127));
            assert!(!read_kill_mode_probe(answer));
        }
    }

    #[test]
    fn the_namespace_probe_asks_unshare_for_what_the_pid_namespace_call_needs() {
        let dir = tempfile::tempdir().unwrap();
        let unshare = stand_in(dir.path(), "unshare", 0);
        let path = format!("{}:{SYSTEM_PATH}", dir.path().display());

        let answer = run(&pid_namespace_probe_argv(), &path);
        assert_eq!(answer, ExitKind::Exited(0));
        assert!(read_kill_mode_probe(answer));
        let probe = recorded(&unshare).expect("the probe runs unshare");
        std::fs::remove_file(format!("{}.args", unshare.display())).unwrap();

        let nonce = Nonce::parse("00112233445566778899aabb").unwrap();
        let mount = SbxMount {
            parent: "/maf-sandbox".into(),
            guest_mount: "/home/agent/ws".into(),
        };
        let invocation = encode_invocation(b"/", &[b"true"]).unwrap();
        let call = sbx_pid_namespace_wrapper_argv(&nonce, &mount, false, &invocation).unwrap();
        // The call starts with `unshare` itself (here the stand-in, by its path).
        assert_eq!(call[0], "unshare");
        let answer = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(
                BoundedCommand::new(&unshare, Duration::from_secs(10))
                    .args(&call[1..])
                    .env("PATH", &path)
                    .run(),
            )
            .unwrap()
            .status;
        assert_eq!(answer, ExitKind::Exited(0));
        let stage = recorded(&unshare).expect("the call runs unshare");

        // The same namespaces and the same `sh -c`, then `:` in place of the wrapper.
        assert_eq!(
            probe[..9],
            stage[..9],
            "probe {probe:?} and call {stage:?} disagree"
        );
        assert_eq!(probe[7..], ["sh", "-c", ":"]);
        // The stand-in records one argument a line: the script's first line names the call.
        assert_eq!(stage[9], "#maf-sbx-00112233445566778899aabb");
    }

    #[test]
    fn a_namespace_probe_that_fails_says_group_kill() {
        let dir = tempfile::tempdir().unwrap();
        let refused = dir.path().join("refused");
        std::fs::create_dir(&refused).unwrap();
        stand_in(&refused, "unshare", 1);
        let answer = run(
            &pid_namespace_probe_argv(),
            &format!("{}:{SYSTEM_PATH}", refused.display()),
        );
        assert_eq!(answer, ExitKind::Exited(1));
        assert!(!read_kill_mode_probe(answer));

        // A guest without `unshare`: only `sh` on the path.
        let bare = dir.path().join("bare");
        std::fs::create_dir(&bare).unwrap();
        std::os::unix::fs::symlink("/bin/sh", bare.join("sh")).unwrap();
        let answer = run(&pid_namespace_probe_argv(), &bare.display().to_string());
        assert_eq!(answer, ExitKind::Exited(127));
        assert!(!read_kill_mode_probe(answer));
    }
}
