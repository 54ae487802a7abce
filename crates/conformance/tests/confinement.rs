//! CONFINEMENT against an in-memory sandbox whose every residue the test controls: the probe passes a
//! clean call and fails a call that leaves a file, a process or an environment variable behind; it
//! skips without a fingerprint, and fails on an incomplete or drifting view.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conformance::isolation::{assert_confinement, AcquireOutcome, Fingerprint, HardeningHooks};
use conformance::run::ProbeOutcome;
use conformance::suites::{CONFINEMENT, CONFINEMENT_CALL_SCRIPT};
use conformance::{ConformanceError, ConformanceReport, PosixGuestSubject};
use sandbox_core::{
    Capability, ErrorKind, ExecOutput, ExecRequest, GuestCleanup, Sandbox, SandboxError,
    SandboxKey, SandboxSpec,
};

/// What the standard call leaves behind in this sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leak {
    Nothing,
    File,
    Process,
    Environment,
}

#[derive(Debug, Default)]
struct State {
    files: BTreeMap<String, Vec<u8>>,
    programs: BTreeMap<String, usize>,
    environment: Vec<(String, Vec<u8>)>,
}

/// A sandbox whose files, programs and environment are plain data, and whose standard call leaks
/// what `leak` says.
#[derive(Debug)]
struct Residues {
    state: Arc<Mutex<State>>,
    leak: Leak,
}

fn output(code: i32, stdout: &[u8]) -> ExecOutput {
    ExecOutput::exited(stdout.to_vec(), Vec::new(), code)
}

fn join(wd: &str, path: &str) -> String {
    if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{}/{path}", wd.trim_end_matches('/'))
    }
}

#[async_trait]
impl Sandbox for Residues {
    fn instance_id(&self) -> &str {
        "residues"
    }
    fn freshly_created(&self) -> bool {
        true
    }
    fn storage_base(&self) -> &str {
        "/work"
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecOutput, SandboxError> {
        let argv: Vec<String> = request
            .command()
            .to_argv()
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let wd = request.working_dir().to_owned();
        let mut state = self.state.lock().unwrap();
        match argv
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice()
        {
            ["true"] => Ok(output(0, b"")),
            ["test", "-e" | "-L", path] => {
                let present = state
                    .files
                    .keys()
                    .any(|f| f == path || f.starts_with(&format!("{path}/")));
                Ok(output(if present { 0 } else { 1 }, b""))
            }
            ["cat", file] => match state.files.get(&join(&wd, file)) {
                Some(bytes) => Ok(output(0, &bytes.clone())),
                None => Ok(output(1, b"")),
            },
            ["env", "-0"] => {
                let mut listing = b"PATH=/bin\0".to_vec();
                for (name, value) in &state.environment {
                    listing.extend_from_slice(name.as_bytes());
                    listing.push(b'=');
                    listing.extend_from_slice(value);
                    listing.push(0);
                }
                Ok(output(0, &listing))
            }
            ["sh", "-c", script] if *script == CONFINEMENT_CALL_SCRIPT => {
                state.files.insert(join(&wd, "output.txt"), b"out".to_vec());
                state
                    .files
                    .insert(join(&wd, "nested/deeper/file.txt"), b"deep".to_vec());
                match self.leak {
                    Leak::Nothing => {}
                    Leak::File => {
                        state.files.insert("/dev/shm/leak".into(), b"x".to_vec());
                    }
                    Leak::Process => {
                        *state.programs.entry("agent sleep 3182".into()).or_insert(0) += 1
                    }
                    Leak::Environment => {
                        for (name, value) in request.guest_env().entries() {
                            state.environment.push((name.clone(), value.clone()));
                        }
                    }
                }
                Err(SandboxError::Timeout {
                    operation: "command".into(),
                    bound: request.timeout_bound(),
                    cleanup: Some(GuestCleanup::Killed),
                })
            }
            other => panic!("the double does not understand {other:?}"),
        }
    }

    async fn write_file(&self, path: &str, content: &[u8], wd: &str) -> Result<(), SandboxError> {
        self.state
            .lock()
            .unwrap()
            .files
            .insert(join(wd, path), content.to_vec());
        Ok(())
    }

    async fn stat_file(
        &self,
        _path: &str,
        _wd: &str,
    ) -> Result<Option<sandbox_core::SandboxEntry>, SandboxError> {
        Ok(None)
    }

    async fn read_file(&self, path: &str, wd: &str, _max: u64) -> Result<Vec<u8>, SandboxError> {
        let state = self.state.lock().unwrap();
        state
            .files
            .get(&join(wd, path))
            .cloned()
            .ok_or_else(|| SandboxError::NotFound {
                path: path.to_owned(),
            })
    }

    async fn remove(&self, path: &str, wd: &str, _recursive: bool) -> Result<(), SandboxError> {
        self.state.lock().unwrap().files.remove(&join(wd, path));
        Ok(())
    }

    async fn reclaim(&self, directory: &str, wd: &str, _t: Duration) -> Result<(), SandboxError> {
        let prefix = format!("{}/", join(wd, directory));
        self.state
            .lock()
            .unwrap()
            .files
            .retain(|path, _| !path.starts_with(&prefix));
        Ok(())
    }
}

/// How the fingerprint hook answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum View {
    /// From the sandbox's state, whole.
    Whole,
    /// None: the test module takes no fingerprint.
    Unsupported,
    /// From the state, with a path it could not read.
    Incomplete,
    /// From the state, plus a path that changes on every look.
    Drifting,
}

struct Hooks {
    state: Arc<Mutex<State>>,
    view: View,
    looks: Mutex<usize>,
}

#[async_trait]
impl HardeningHooks for Hooks {
    async fn remove_behind_the_handle(&self, _: &dyn Sandbox) -> Result<(), ConformanceError> {
        unreachable!("not a HARDENING run")
    }
    async fn engine_instances_for(
        &self,
        _: &SandboxKey,
        _: &SandboxSpec,
    ) -> Result<usize, ConformanceError> {
        unreachable!("not a HARDENING run")
    }
    async fn acquire_in_child_process(
        &self,
        _: &SandboxKey,
        _: &SandboxSpec,
        _: usize,
    ) -> Result<Vec<Result<AcquireOutcome, ErrorKind>>, ConformanceError> {
        unreachable!("not a HARDENING run")
    }
    async fn routable_host_address(&self) -> Result<IpAddr, ConformanceError> {
        unreachable!("not a HARDENING run")
    }

    async fn fingerprint(&self, _: &dyn Sandbox) -> Result<Option<Fingerprint>, ConformanceError> {
        let mut looks = self.looks.lock().unwrap();
        *looks += 1;
        if self.view == View::Unsupported {
            return Ok(None);
        }
        let state = self.state.lock().unwrap();
        let mut view = Fingerprint {
            changed_paths: state
                .files
                .iter()
                .map(|(path, bytes)| (path.clone(), format!("f {bytes:?}")))
                .collect(),
            running_programs: state.programs.clone(),
            unseen: Vec::new(),
        };
        view.running_programs.insert("root /sbin/init".into(), 1);
        match self.view {
            View::Incomplete => view.unseen.push("/home/agent: permission denied".into()),
            View::Drifting => {
                view.changed_paths
                    .insert("/var/log/clock".into(), format!("f {looks}"));
            }
            _ => {}
        }
        Ok(Some(view))
    }
}

async fn judge(leak: Leak, view: View) -> (Result<ConformanceReport, ConformanceError>, usize) {
    let state = Arc::new(Mutex::new(State::default()));
    let sandbox = Arc::new(Residues {
        state: Arc::clone(&state),
        leak,
    });
    let capabilities: BTreeSet<Capability> = [
        Capability::Exec,
        Capability::FilesIn,
        Capability::FilesOut,
        Capability::FilesDelete,
        Capability::Reclaim,
    ]
    .into_iter()
    .collect();
    let subject = PosixGuestSubject::in_storage_base(sandbox, capabilities).unwrap();
    let hooks = Hooks {
        state,
        view,
        looks: Mutex::new(0),
    };
    let result = assert_confinement(&subject, &hooks).await;
    let looks = *hooks.looks.lock().unwrap();
    (result, looks)
}

fn failure(result: &Result<ConformanceReport, ConformanceError>) -> String {
    let report = match result {
        Err(error) => error.report().expect("a probe failure, with its report"),
        Ok(report) => panic!("the probe passed:\n{report}"),
    };
    assert_eq!(report.probes().len(), 1, "{report}");
    assert_eq!(report.probes()[0].suite, CONFINEMENT);
    match &report.probes()[0].outcome {
        ProbeOutcome::Failed { why } => why.clone(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_call_that_cleans_up_after_itself_passes() {
    let (result, looks) = judge(Leak::Nothing, View::Whole).await;
    let report = result.expect("the probe passes");
    assert_eq!(report.passed(), 1, "{report}");
    assert_eq!(looks, 4, "fresh, baseline, control and after the call");
}

#[tokio::test]
async fn a_file_left_behind_fails() {
    let why = failure(&judge(Leak::File, View::Whole).await.0);
    assert!(why.contains("new path /dev/shm/leak"), "{why}");
}

#[tokio::test]
async fn a_process_left_behind_fails() {
    let why = failure(&judge(Leak::Process, View::Whole).await.0);
    assert!(
        why.contains("1 processes run \"agent sleep 3182\", 0 before"),
        "{why}"
    );
}

#[tokio::test]
async fn an_environment_residue_fails() {
    let why = failure(&judge(Leak::Environment, View::Whole).await.0);
    assert!(why.contains("MAF_CONFINEMENT_CALL"), "{why}");
}

#[tokio::test]
async fn no_fingerprint_is_a_skip_never_a_pass() {
    let (result, looks) = judge(Leak::Nothing, View::Unsupported).await;
    let report = result.expect("a skip is not a failure of the suite");
    assert_eq!(report.skipped(), 1, "{report}");
    assert_eq!(looks, 1, "nothing runs once the view is missing");
    assert!(
        report.assert_all_passed().is_err(),
        "a run refuses the skip"
    );
}

#[tokio::test]
async fn an_incomplete_view_fails() {
    let why = failure(&judge(Leak::Nothing, View::Incomplete).await.0);
    assert!(why.contains("incomplete"), "{why}");
    assert!(why.contains("permission denied"), "{why}");
}

#[tokio::test]
async fn a_view_that_drifts_without_a_call_is_not_pristine() {
    let why = failure(&judge(Leak::Nothing, View::Drifting).await.0);
    assert!(why.contains("not pristine"), "{why}");
    assert!(why.contains("/var/log/clock"), "{why}");
}
