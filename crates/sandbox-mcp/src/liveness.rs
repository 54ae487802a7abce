//! Which server owns which sandboxes, and whether that server is still alive.
//!
//! Every server draws a random id at start and holds an exclusive lock on
//! `<state dir>/<id>.lock` for as long as it runs; the operating system drops the lock when the
//! process ends, however it ends. Each sandbox the server makes has a thread id of the form
//! `<id>-<n>`, so its owner can be read from the key the engine keeps. A starting server lists
//! its scope and disposes of the sandboxes whose owner's lock it can take (a server that
//! crashed); a live server's lock cannot be taken, so its sandboxes are never touched. Sandboxes
//! of the scope whose thread is not of that form (made by another host) are never touched
//! either.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use crate::handles::new_handle;

/// This server's id and the lock that says it is alive.
#[derive(Debug)]
pub struct Liveness {
    id: String,
    dir: PathBuf,
    // Held for the process's lifetime; the lock goes with the descriptor.
    _lock: File,
}

/// Why the liveness lock could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LivenessError {
    /// The state directory or the lock file could not be made or locked.
    #[error("the state directory {dir} cannot hold a liveness lock: {source}")]
    Io {
        /// The directory.
        dir: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
}

impl Liveness {
    /// Draws an id and locks `<dir>/<id>.lock` (the directory is made when missing).
    ///
    /// # Errors
    /// [`LivenessError::Io`] when the directory or the lock cannot be made.
    pub fn start(dir: &Path) -> Result<Self, LivenessError> {
        let io = |source| LivenessError::Io {
            dir: dir.to_owned(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let id = new_handle()[4..].to_owned();
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{id}.lock")))
            .map_err(io)?;
        file.try_lock().map_err(|e| io(e.into()))?;
        Ok(Liveness {
            id,
            dir: dir.to_owned(),
            _lock: file,
        })
    }

    /// This server's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The thread id of this server's `n`th sandbox.
    pub fn thread(&self, n: u64) -> String {
        format!("{}-{n}", self.id)
    }

    /// Whether the server that owns `thread` is gone: `thread` has this module's form, is not
    /// this server's, and its owner's lock file is absent or can be locked. Anything else
    /// (another host's thread, a live owner, a lock that cannot be judged) is "alive".
    pub fn owner_is_gone(&self, thread: &str) -> bool {
        let Some(owner) = owner_of(thread) else {
            return false;
        };
        if owner == self.id {
            return false;
        }
        let path = self.dir.join(format!("{owner}.lock"));
        match OpenOptions::new().write(true).open(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(_) => false,
            Ok(file) => file.try_lock().is_ok(),
        }
    }

    /// Removes a dead owner's lock file once its sandboxes are gone (best effort).
    pub fn forget(&self, thread: &str) {
        if let Some(owner) = owner_of(thread) {
            if owner != self.id {
                let _ = std::fs::remove_file(self.dir.join(format!("{owner}.lock")));
            }
        }
    }
}

/// The owner id of a thread made by [`Liveness::thread`], if it is one.
fn owner_of(thread: &str) -> Option<&str> {
    let (owner, n) = thread.split_once('-')?;
    let ok = owner.len() == 32
        && owner.chars().all(|c| c.is_ascii_hexdigit())
        && !n.is_empty()
        && n.chars().all(|c| c.is_ascii_digit());
    ok.then_some(owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_servers_sandboxes_are_not_gone_and_a_dead_ones_are() {
        let dir = tempfile::tempdir().unwrap();
        let me = Liveness::start(dir.path()).unwrap();
        let other = Liveness::start(dir.path()).unwrap();
        let theirs = other.thread(3);
        assert!(!me.owner_is_gone(&theirs), "a live server's lock is held");
        assert!(!me.owner_is_gone(&me.thread(1)), "never my own");
        drop(other);
        assert!(me.owner_is_gone(&theirs), "the lock went with the process");
        me.forget(&theirs);
        assert!(me.owner_is_gone(&theirs), "no lock file: gone");
        assert!(!me.owner_is_gone("some-thread"), "another host's thread");
        assert!(!me.owner_is_gone("0123"), "another host's thread");
    }
}
