//! The crate's one error type.

use std::path::PathBuf;
use std::time::Duration;

/// Everything this crate can fail with.
///
/// Each variant carries what an operator needs to act on it: the command, the missing
/// package, the path. Output quoted from a child process is a bounded tail, never all of it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DockerError {
    /// A host program the image recipe runs is not installed.
    #[error("`{program}` is not installed on this host; install Debian's `{package}` package (apt-get install {package})")]
    HostToolMissing {
        /// The program that was looked for.
        program: String,
        /// The Debian package that provides it.
        package: String,
    },

    /// A step of the image recipe needs root and this process is not root.
    #[error("{step} needs root (it creates device nodes and changes ownership); run the image build as root")]
    NeedsRoot {
        /// The step that needs root.
        step: String,
    },

    /// No Debian mirror for the image recipe's suite was found in the host's apt sources.
    #[error("no Debian mirror for `{suite}` found in {searched}; debootstrap needs a Debian mirror this machine can reach (add one to the apt sources or pass it explicitly)")]
    NoDebianMirror {
        /// The Debian suite the recipe wanted.
        suite: String,
        /// The files that were searched.
        searched: String,
    },

    /// A tag that is not one of the local images was asked for.
    #[error("`{tag}` is not a local image this recipe builds; known: {known}")]
    UnknownImage {
        /// The tag asked for.
        tag: String,
        /// The tags the recipe knows, comma separated.
        known: String,
    },

    /// A child process could not be started.
    #[error("could not start `{program}`: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why it could not start.
        #[source]
        source: std::io::Error,
    },

    /// A child process ran past its deadline; it was killed and reaped.
    #[error("`{command}` did not finish within {timeout:?}; it was killed")]
    CommandTimedOut {
        /// The command line, shortened.
        command: String,
        /// The deadline it was given.
        timeout: Duration,
    },

    /// A child process exited unsuccessfully.
    #[error("`{command}` failed ({status}): {output_tail}")]
    CommandFailed {
        /// The command line, shortened.
        command: String,
        /// Its exit status, as the OS reported it.
        status: String,
        /// The last part of its stderr (or stdout when stderr was empty).
        output_tail: String,
    },

    /// The Docker engine could not be reached.
    #[error("the Docker engine did not answer `{command}`: {detail}")]
    DaemonUnreachable {
        /// The command line, shortened.
        command: String,
        /// What the CLI said.
        detail: String,
    },

    /// A host file-system operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// The host's BusyBox binary cannot serve the BusyBox image.
    #[error("{} is not a static BusyBox ({reason}); install Debian's `busybox-static` package", path.display())]
    BusyboxNotStatic {
        /// The binary that was checked.
        path: PathBuf,
        /// Why it was refused.
        reason: String,
    },

    /// The egress proxy image needs a static `egress-proxy` binary and none was usable.
    #[error("no usable static `egress-proxy` binary for the egress proxy image ({reason}); `cargo xtask images` builds one, or point the recipe at one with `ImageRecipe::egress_proxy_binary`")]
    EgressProxyBinary {
        /// Why the binary looked for (or given) cannot serve.
        reason: String,
    },

    /// The Debian images that carry the exec init need a static `sandbox-exec-init` binary and
    /// none was usable.
    #[error("no usable static `sandbox-exec-init` binary for the Debian images that carry the exec init ({reason}); `cargo xtask images` builds one, or point the recipe at one with `ImageRecipe::exec_init_binary`")]
    ExecInitBinary {
        /// Why the binary looked for (or given) cannot serve.
        reason: String,
    },

    /// The Debian images that carry host tools need a static `host-tool` binary and the one
    /// named was not usable.
    #[error("no usable static `host-tool` binary for the Debian images that carry host tools ({reason}); `cargo xtask images` builds one, or point the recipe at one with `ImageRecipe::host_tool_binary`")]
    HostToolBinary {
        /// Why the binary looked for (or given) cannot serve.
        reason: String,
    },

    /// A scratch directory still had file systems mounted inside it, so it was left in place
    /// rather than deleting through a mount.
    #[error("scratch directory {} still has mounts inside it ({mounts}); left in place, unmount and remove it by hand", path.display())]
    ScratchMounted {
        /// The scratch directory.
        path: PathBuf,
        /// The mount points found inside it.
        mounts: String,
    },
}
