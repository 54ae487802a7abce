//! The child's whole process tree, as the host can end it: a process group on Unix, a Job
//! object on Windows.
//!
//! [`ProcessTree::prepare`] sets the command up before the spawn, [`ProcessTree::attach`] takes
//! hold of the tree right after it, [`ProcessTree::kill`] ends every member, and
//! [`ProcessTree::release`] lets go once the child is reaped, after which the tree is never
//! killed: what the child left running on a normal exit keeps running, on both systems.
//! Dropping a tree that was not released kills nothing more on Unix; on Windows closing the job
//! kills what is left in it.

use std::io;

use tokio::process::{Child, Command};

#[cfg(unix)]
pub(crate) use unix::ProcessTree;
#[cfg(windows)]
pub(crate) use windows::ProcessTree;

#[cfg(unix)]
mod unix {
    use super::{io, Child, Command};
    use rustix::process::{kill_process_group, Pid, Signal};

    /// The child's process group: its pid, from `process_group(0)`. Held only while the child
    /// is unreaped, so the id cannot have been reused when it is signalled.
    pub(crate) struct ProcessTree {
        group: Option<Pid>,
    }

    impl ProcessTree {
        /// Starts the child in a process group of its own, so helpers it spawns share it.
        pub(crate) fn prepare(command: &mut Command) {
            command.process_group(0);
        }

        /// The group of a child started from a [`ProcessTree::prepare`]d command.
        pub(crate) fn attach(child: &mut Child) -> io::Result<ProcessTree> {
            let group = child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .and_then(Pid::from_raw);
            Ok(ProcessTree { group })
        }

        /// SIGKILL to the whole group.
        pub(crate) fn kill(&self) {
            if let Some(group) = self.group {
                // ESRCH (the group is already empty) is the expected case for a fast exit.
                let _ = kill_process_group(group, Signal::KILL);
            }
        }

        /// The child is reaped: its pid, and so the group id, may be reused from now on.
        pub(crate) fn release(self) {}
    }
}

// The Windows FFI is the crate's only unsafe code, and it is confined to this module.
#[cfg(windows)]
#[allow(unsafe_code)]
mod job_object;

#[cfg(windows)]
mod windows {
    use super::job_object::JobObject;
    use super::{io, Child, Command};

    /// The Job object the child was assigned to; its descendants join it as they start.
    pub(crate) struct ProcessTree {
        job: Option<JobObject>,
    }

    impl ProcessTree {
        /// Nothing to set before the spawn: the job is made and assigned after it.
        pub(crate) fn prepare(_command: &mut Command) {}

        /// A new job that kills its members when its last handle closes (so a host that dies
        /// mid-call takes the tree with it), with the child assigned to it.
        ///
        /// A child that has already exited cannot be assigned, and has no tree left to reach:
        /// that is not an error.
        pub(crate) fn attach(child: &mut Child) -> io::Result<ProcessTree> {
            let Some(process) = child.raw_handle() else {
                return Ok(ProcessTree { job: None });
            };
            let job = JobObject::kill_on_close()?;
            match job.assign(process) {
                Ok(()) => Ok(ProcessTree { job: Some(job) }),
                Err(_) if matches!(child.try_wait(), Ok(Some(_))) => Ok(ProcessTree { job: None }),
                Err(error) => Err(error),
            }
        }

        /// Terminates every process in the job.
        pub(crate) fn kill(&self) {
            if let Some(job) = &self.job {
                // Failure means the job is already empty or ending; closing it kills the rest.
                let _ = job.terminate();
            }
        }

        /// The child is reaped: what it left running keeps running, as on Unix, so the job
        /// stops killing on close before its handle closes.
        pub(crate) fn release(self) {
            if let Some(job) = self.job {
                let _ = job.keep_members_on_close();
            }
        }
    }
}
