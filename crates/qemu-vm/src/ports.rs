//! A VM's agent ports on the host, and which process holds which.
//!
//! A VM has `agent_ports` virtio-serial ports (`vm_agent::proto::port_name`), each carried by a
//! Unix socket QEMU listens on in the VM's directory (`agent.sock`, `agent-1.sock`, ...). QEMU's
//! socket chardev serves one client at a time (a second connect waits in the listen queue until
//! the first closes), and the agent serves every port at once, so a port is one host
//! connection's: a process takes a free one by the `flock` of its lock file (`agent.lock`,
//! `agent-1.lock`, ...) without waiting, and holds it for as long as its connection lives. The
//! kernel drops the lock with the process, so a crashed holder frees its port.
//!
//! Not here: the connection itself ([`crate::AgentClient`]).

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::VmError;

/// The agent ports a VM gets unless configured: as many host processes can use it at once.
pub const DEFAULT_AGENT_PORTS: u32 = 8;

/// The socket of port `index` in the VM's directory.
pub(crate) fn socket_path(dir: &Path, index: u32) -> PathBuf {
    dir.join(if index == 0 {
        "agent.sock".to_owned()
    } else {
        format!("agent-{index}.sock")
    })
}

/// The lock file of port `index` in the VM's directory.
pub(crate) fn lock_path(dir: &Path, index: u32) -> PathBuf {
    dir.join(if index == 0 {
        "agent.lock".to_owned()
    } else {
        format!("agent-{index}.lock")
    })
}

/// A port this process holds: its index, its socket, and the locked file that keeps every
/// other process (and every other lease of this one) off it until dropped.
#[derive(Debug)]
pub(crate) struct PortLease {
    pub(crate) index: u32,
    pub(crate) socket: PathBuf,
    pub(crate) lock: File,
}

/// Takes the lowest-numbered port of the VM in `dir` that nobody holds, without waiting; `None`
/// when every one of its `count` ports is held.
///
/// # Errors
/// Io when a lock file cannot be opened (the VM's directory is gone) or locked for a reason
/// other than another holder.
pub(crate) fn take_free_port(dir: &Path, count: u32) -> Result<Option<PortLease>, VmError> {
    for index in 0..count {
        let path = lock_path(dir, index);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| VmError::io("opening", &path, e))?;
        match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {
                return Ok(Some(PortLease {
                    index,
                    socket: socket_path(dir, index),
                    lock,
                }))
            }
            Err(rustix::io::Errno::WOULDBLOCK) => continue,
            Err(errno) => return Err(VmError::io("locking", &path, errno.into())),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_lease_takes_the_lowest_free_port_and_gives_it_back_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = take_free_port(dir.path(), 3).unwrap().expect("port 0");
        assert_eq!(first.index, 0);
        assert_eq!(first.socket, dir.path().join("agent.sock"));
        let second = take_free_port(dir.path(), 3).unwrap().expect("port 1");
        assert_eq!(second.index, 1);
        assert_eq!(second.socket, dir.path().join("agent-1.sock"));
        let third = take_free_port(dir.path(), 3).unwrap().expect("port 2");
        assert_eq!(third.index, 2);
        assert!(
            take_free_port(dir.path(), 3).unwrap().is_none(),
            "every port is held"
        );
        drop(second);
        let again = take_free_port(dir.path(), 3)
            .unwrap()
            .expect("port 1 again");
        assert_eq!(again.index, 1);
        assert!(take_free_port(dir.path(), 3).unwrap().is_none());
        drop((first, third, again));
        assert_eq!(take_free_port(dir.path(), 3).unwrap().unwrap().index, 0);
    }

    #[test]
    fn a_port_held_by_another_process_is_skipped_and_freed_by_its_exit() {
        let dir = tempfile::tempdir().unwrap();
        // `flock` is the lock a process's crash drops: a child holds port 0 until it exits.
        let lock = lock_path(dir.path(), 0);
        let mut holder = std::process::Command::new("/bin/sh")
            .args([
                "-c",
                "exec 9>\"$1\" && flock 9 && echo locked && exec sleep 30",
                "sh",
            ])
            .arg(&lock)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line, "locked\n");
        let lease = take_free_port(dir.path(), 2).unwrap().unwrap();
        assert_eq!(lease.index, 1, "port 0 is the other process's");
        assert!(take_free_port(dir.path(), 2).unwrap().is_none());
        holder.kill().unwrap();
        holder.wait().unwrap();
        let freed = take_free_port(dir.path(), 2)
            .unwrap()
            .expect("port 0 freed");
        assert_eq!(freed.index, 0);
        drop(lease);
    }

    #[test]
    fn a_vm_directory_that_is_gone_is_an_error_not_a_busy_vm() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        assert!(matches!(take_free_port(&gone, 2), Err(VmError::Io { .. })));
    }

    #[test]
    fn sockets_and_locks_have_distinct_names_per_port() {
        let dir = Path::new("/vm");
        let mut names: Vec<PathBuf> = (0..vm_agent::proto::MAX_PORTS)
            .flat_map(|i| [socket_path(dir, i), lock_path(dir, i)])
            .collect();
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count);
    }
}
