//! The fake backend against the contract it stands in for.

use std::sync::Arc;

use super::FakeBackend;
use crate::{
    Command, DisposalCode, DisposeSelector, ErrorKind, ExecOutput, ExecRequest, Isolation, Sandbox,
    SandboxBackend, SandboxEntry, SandboxKey, SandboxSpec, ScopePurge, DEFAULT_WORK_DIR,
};

fn key() -> SandboxKey {
    SandboxKey::conversation("s", "t", "a")
}

async fn sandbox(fake: &FakeBackend) -> Arc<dyn Sandbox> {
    fake.acquire(&key(), &SandboxSpec::builder("k").build().unwrap())
        .await
        .unwrap()
}

async fn exec(sb: &Arc<dyn Sandbox>, command: Command) -> ExecOutput {
    sb.exec(ExecRequest::new(command)).await.unwrap()
}

#[tokio::test]
async fn acquire_is_get_or_create_and_warm_handles_are_not_fresh() {
    let fake = FakeBackend::new("f", Isolation::None);
    let first = sandbox(&fake).await;
    let second = sandbox(&fake).await;
    assert!(first.freshly_created());
    assert!(!second.freshly_created());
    assert_eq!(first.instance_id(), second.instance_id());
    assert_eq!(first.storage_base(), DEFAULT_WORK_DIR);
    assert_eq!(fake.acquire_calls(), 2);
    let changed = SandboxSpec::builder("k").image("other").build().unwrap();
    let err = fake.acquire(&key(), &changed).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::SpecMismatch);
    assert!(err.to_string().contains("image"), "{err}");
}

#[tokio::test]
async fn files_follow_the_contract_rules() {
    let fake = FakeBackend::new("f", Isolation::None);
    let sb = sandbox(&fake).await;
    sb.write_file("d/a.txt", b"abc", ".").await.unwrap();
    sb.write_file("d/a.txt", b"xy", ".").await.unwrap();
    assert_eq!(sb.read_file("d/a.txt", ".", 2).await.unwrap(), b"xy");
    let cap = sb.read_file("d/a.txt", ".", 1).await.unwrap_err();
    assert_eq!(cap.kind(), ErrorKind::TransferCapExceeded);
    assert_eq!(
        sb.read_file("missing", ".", 9).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        sb.read_file("d", ".", 9).await.unwrap_err().kind(),
        ErrorKind::IsADirectory
    );
    assert_eq!(
        sb.read_file("d/a.txt/x", ".", 9).await.unwrap_err().kind(),
        ErrorKind::NotADirectory
    );
    for escape in ["../x", "/etc/passwd", "a\\b"] {
        assert_eq!(
            sb.write_file(escape, b"", ".").await.unwrap_err().kind(),
            ErrorKind::Confinement,
            "{escape}"
        );
    }
    assert_eq!(
        sb.write_file(".", b"", ".").await.unwrap_err().kind(),
        ErrorKind::Confinement
    );
    assert_eq!(
        sb.stat_file("d/a.txt", ".").await.unwrap(),
        Some(SandboxEntry::file("d/a.txt", 2))
    );
    assert_eq!(sb.stat_file(".", "d").await.unwrap().unwrap().path(), ".");
    assert_eq!(sb.stat_file("nope", ".").await.unwrap(), None);

    sb.write_file("b", b"1", "d").await.unwrap();
    let listed = sb.list_dir("d", ".").await.unwrap();
    let paths: Vec<&str> = listed.iter().map(|e| e.path()).collect();
    assert_eq!(paths, ["d/a.txt", "d/b"]);

    assert_eq!(
        sb.remove("d", ".", false).await.unwrap_err().kind(),
        ErrorKind::IsADirectory
    );
    sb.remove("missing", ".", false).await.unwrap();
    sb.remove("d", ".", true).await.unwrap();
    assert_eq!(sb.stat_file("d/b", ".").await.unwrap(), None);
    assert!(sb.list_dir(".", ".").await.unwrap().is_empty());
}

#[tokio::test]
async fn exec_understands_a_few_words_and_nothing_more() {
    let fake = FakeBackend::new("f", Isolation::None);
    let sb = sandbox(&fake).await;
    let out = exec(&sb, Command::argv(["echo", "a", "b"])).await;
    assert_eq!((out.exit_code, out.stdout_text()), (0, "a b\n".to_owned()));
    assert_eq!(exec(&sb, Command::argv(["false"])).await.exit_code, 1);
    assert_eq!(exec(&sb, Command::shell("exit 7")).await.exit_code, 7);
    let out = exec(&sb, Command::argv(["pwd"])).await;
    assert_eq!(out.stdout_text(), format!("{DEFAULT_WORK_DIR}\n"));
    sb.write_file("f", b"bytes", ".").await.unwrap();
    assert_eq!(exec(&sb, Command::shell("cat f")).await.stdout, b"bytes");
    let out = exec(&sb, Command::argv(["python3"])).await;
    assert_eq!(out.exit_code, 127);
    assert!(out.stderr_text().contains("command not found"));
    let missing_wd = sb
        .exec(ExecRequest::new(Command::argv(["true"])).working_directory("nowhere"))
        .await
        .unwrap();
    assert_eq!(missing_wd.exit_code, 125);
    assert!(missing_wd.not_started.unwrap().contains("nowhere"));
    let escape = sb
        .exec(ExecRequest::new(Command::argv(["true"])).working_directory("../.."))
        .await
        .unwrap_err();
    assert_eq!(escape.kind(), ErrorKind::Confinement);
    let over = sb
        .exec(ExecRequest::new(Command::argv(["echo", "long"])).max_output_bytes(2))
        .await
        .unwrap_err();
    assert_eq!(over.kind(), ErrorKind::OutputLimitExceeded);

    let canned = ExecOutput::exited(b"canned".to_vec(), Vec::new(), 3);
    fake.update_faults(|f| f.exec_output = Some(canned.clone()));
    assert_eq!(exec(&sb, Command::argv(["true"])).await, canned);
}

#[tokio::test]
async fn disposal_removes_selected_instances_and_old_handles_are_gone() {
    let fake = FakeBackend::new("f", Isolation::None);
    let sb = sandbox(&fake).await;
    let id = sb.instance_id().to_owned();
    assert_eq!(
        fake.dispose(&key(), DisposeSelector::instance("k", "stale"))
            .await,
        None
    );
    assert_eq!(fake.instances().len(), 1, "a stale id is a no-op");
    assert_eq!(
        fake.dispose(&key(), DisposeSelector::instance("k", id.clone()))
            .await,
        None
    );
    assert!(fake.instances().is_empty());
    assert_eq!(
        sb.exec(ExecRequest::new(Command::argv(["true"])))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::SandboxGone
    );
    assert_eq!(fake.dispose_calls(), 2);
    assert_eq!(
        fake.disposals()[1],
        (key(), DisposeSelector::instance("k", id))
    );
}

#[tokio::test]
async fn scope_purge_counts_and_list_sorts() {
    let fake = FakeBackend::new("f", Isolation::None);
    let spec = SandboxSpec::builder("k").build().unwrap();
    for agent in ["b", "a"] {
        fake.acquire(&SandboxKey::conversation("s", "t", agent), &spec)
            .await
            .unwrap();
    }
    fake.acquire(&SandboxKey::conversation("s", "other", "a"), &spec)
        .await
        .unwrap();
    let listed = fake.list("s", Some("t")).await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|s| s.instance_id.as_str()).collect();
    assert_eq!(ids, ["f-1", "f-2"]);
    assert_eq!(fake.list("s", None).await.unwrap().len(), 3);
    let purge = fake.dispose_scope("s", "t").await;
    assert_eq!(
        purge,
        ScopePurge {
            disposed: 2,
            undisposed: None
        }
    );
    assert_eq!(fake.instances().len(), 1);
    assert!(fake
        .find(&SandboxKey::conversation("s", "other", "a"), "k")
        .await
        .unwrap()
        .is_some_and(|s| !s.freshly_created()));
}

#[tokio::test]
async fn injected_faults() {
    let fake = FakeBackend::new("f", Isolation::None);
    fake.update_faults(|f| f.acquire_failure = Some("down".into()));
    let spec = SandboxSpec::builder("k").build().unwrap();
    let err = fake.acquire(&key(), &spec).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BackendUnavailable);
    fake.update_faults(|f| {
        f.acquire_failure = None;
        f.empty_instance_ids = true;
        f.dispose_failure = Some(DisposalCode::Unreachable);
    });
    assert_eq!(fake.acquire(&key(), &spec).await.unwrap().instance_id(), "");
    let failure = fake.dispose(&key(), DisposeSelector::all()).await.unwrap();
    assert_eq!(failure.code, DisposalCode::Unreachable);
    assert_eq!(
        fake.instances().len(),
        1,
        "a failed disposal removes nothing"
    );
    let purge = fake.dispose_scope("s", "t").await;
    assert_eq!(purge.disposed, 0);
    assert!(purge.undisposed.is_some());

    let seeded = FakeBackend::new("g", Isolation::None);
    let id = seeded.seed_instance(&key(), "k");
    let sb = seeded.acquire(&key(), &spec).await.unwrap();
    assert_eq!(sb.instance_id(), id);
    assert!(!sb.freshly_created());
}

#[tokio::test]
async fn reset_and_fork_are_refused_where_snapshot_is_not_declared() {
    let fake = FakeBackend::new("f", Isolation::None);
    assert!(!fake.declarations().serves(crate::Capability::Snapshot));
    let sb = sandbox(&fake).await;
    let err = sb.reset().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CapabilityNotSupported, "{err}");
    let spec = SandboxSpec::builder("k").build().unwrap();
    let other = SandboxKey::conversation("s", "t2", "a");
    let err = fake.fork(&key(), &spec, &other).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CapabilityNotSupported, "{err}");
    assert!(err.to_string().contains("\"f\""), "{err}");
    // Nothing was made under the target key.
    assert!(fake.find(&other, "k").await.unwrap().is_none());
}
