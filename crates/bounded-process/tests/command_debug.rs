//! What a `BoundedCommand` shows when logged: enough to tell which call it is, never an
//! environment value (those carry credentials) nor the stdin bytes.

use std::time::Duration;

use bounded_process::BoundedCommand;

#[test]
fn debug_output_names_the_call_but_no_secret() {
    let command = BoundedCommand::new("/usr/bin/docker", Duration::from_secs(7))
        .args(["exec", "box-1"])
        .env("DOCKER_AUTH_TOKEN", "s3cr3t-value")
        .stdin(b"stdin-secret".to_vec())
        .output_budget(1234)
        .stop_after(99);
    let shown = format!("{command:?}");
    for expected in [
        "BoundedCommand",
        "/usr/bin/docker",
        "\"exec\"",
        "\"box-1\"",
        "DOCKER_AUTH_TOKEN",
        "Some(12)",
        "1234",
        "7s",
        "Some(99)",
    ] {
        assert!(shown.contains(expected), "{expected} missing from {shown}");
    }
    for secret in ["s3cr3t-value", "stdin-secret"] {
        assert!(!shown.contains(secret), "{secret} leaked into {shown}");
    }
}
