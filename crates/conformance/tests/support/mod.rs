//! A scripted `Sandbox` double: it records every call and answers from closures, so harness tests can
//! say exactly what the backend does and check what the harness asked.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use sandbox_core::{ExecOutput, ExecRequest, Sandbox, SandboxEntry, SandboxError};

type ExecAnswer = dyn Fn(&[String], &str) -> Result<ExecOutput, SandboxError> + Send + Sync;
type FileAnswer = dyn Fn(&str, &str, &str) -> Result<(), SandboxError> + Send + Sync;

/// A sandbox whose exec and file answers are closures; every call is recorded as `op path wd`.
pub struct ScriptedSandbox {
    calls: Mutex<Vec<String>>,
    exec: Box<ExecAnswer>,
    files: Box<FileAnswer>,
}

impl std::fmt::Debug for ScriptedSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScriptedSandbox")
    }
}

/// An output with `code` and `stdout`.
pub fn exited(code: i32, stdout: &[u8]) -> Result<ExecOutput, SandboxError> {
    Ok(ExecOutput::exited(stdout.to_vec(), Vec::new(), code))
}

impl ScriptedSandbox {
    /// Every exec exits 0 with no output; every file call succeeds (stat finds nothing).
    pub fn obliging() -> Arc<Self> {
        Self::new(|_, _| exited(0, b""), |_, _, _| Ok(()))
    }

    /// A double with the given answers. `files(op, path, wd)` answers write/stat/read/list/remove/reclaim.
    pub fn new(
        exec: impl Fn(&[String], &str) -> Result<ExecOutput, SandboxError> + Send + Sync + 'static,
        files: impl Fn(&str, &str, &str) -> Result<(), SandboxError> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(ScriptedSandbox {
            calls: Mutex::new(Vec::new()),
            exec: Box::new(exec),
            files: Box::new(files),
        })
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn file(&self, op: &str, path: &str, wd: &str) -> Result<(), SandboxError> {
        self.calls.lock().unwrap().push(format!("{op} {path} {wd}"));
        (self.files)(op, path, wd)
    }
}

#[async_trait]
impl Sandbox for ScriptedSandbox {
    fn instance_id(&self) -> &str {
        "scripted-1"
    }

    fn freshly_created(&self) -> bool {
        true
    }

    fn storage_base(&self) -> &str {
        "/base/work"
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecOutput, SandboxError> {
        request.validate()?;
        let argv: Vec<String> = request
            .command()
            .to_argv()
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        self.calls.lock().unwrap().push(format!(
            "exec {} {}",
            argv.join(" "),
            request.working_dir()
        ));
        (self.exec)(&argv, request.working_dir())
    }

    async fn write_file(&self, path: &str, _content: &[u8], wd: &str) -> Result<(), SandboxError> {
        self.file("write", path, wd)
    }

    async fn stat_file(&self, path: &str, wd: &str) -> Result<Option<SandboxEntry>, SandboxError> {
        self.file("stat", path, wd).map(|()| None)
    }

    async fn read_file(&self, path: &str, wd: &str, _max: u64) -> Result<Vec<u8>, SandboxError> {
        self.file("read", path, wd).map(|()| Vec::new())
    }

    async fn list_dir(&self, path: &str, wd: &str) -> Result<Vec<SandboxEntry>, SandboxError> {
        self.file("list", path, wd).map(|()| Vec::new())
    }

    async fn remove(&self, path: &str, wd: &str, _recursive: bool) -> Result<(), SandboxError> {
        self.file("remove", path, wd)
    }

    async fn reclaim(
        &self,
        directory: &str,
        wd: &str,
        _timeout: std::time::Duration,
    ) -> Result<(), SandboxError> {
        self.file("reclaim", directory, wd)
    }
}
