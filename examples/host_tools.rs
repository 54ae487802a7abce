//! Host tools: code in a Docker sandbox calls two tools written in Rust on the host, a key-value
//! store and an adder, with `host-tool` (docs/host-tools.md).
//!
//! Needs a Docker engine and the default image (`cargo xtask images sandbox-base:local`).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backend_docker::{DockerBackend, DockerConfig};
use host_tools::{HostTool, Registry, RunBounds, ToolError};
use sandbox_core::host_tool_run::run_with_host_tools;
use sandbox_core::{
    Command, DisposeSelector, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec,
};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let mut registry = Registry::new();
    registry.register(HostTool::new(
        "add",
        "adds two integers",
        json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
               "required": ["a", "b"], "additionalProperties": false}),
        |arguments| async move {
            let (a, b) = (arguments["a"].as_i64(), arguments["b"].as_i64());
            match (a, b) {
                (Some(a), Some(b)) => a
                    .checked_add(b)
                    .map(|sum| json!(sum))
                    .ok_or_else(|| ToolError::new("the sum overflows")),
                _ => Err(ToolError::new("two integers, please")),
            }
        },
    )?)?;
    registry.register(HostTool::new(
        "remember",
        "stores a value under a key on the host",
        json!({"type": "object", "properties": {"key": {"type": "string", "maxLength": 64},
               "value": {"type": "string", "maxLength": 1024}}, "required": ["key", "value"]}),
        {
            let store = store.clone();
            move |arguments| {
                let store = store.clone();
                async move {
                    let key = arguments["key"].as_str().unwrap_or_default().to_owned();
                    let value = arguments["value"].as_str().unwrap_or_default().to_owned();
                    store
                        .lock()
                        .map_err(|_| ToolError::new("the store failed"))?
                        .insert(key, value);
                    Ok(json!("stored"))
                }
            }
        },
    )?)?;

    let backend = DockerBackend::connect(DockerConfig::default()).await?;
    let key = SandboxKey::conversation(
        "examples",
        format!("host-tools-{}", std::process::id()),
        "agent",
    );
    let sandbox = backend
        .acquire(&key, &SandboxSpec::builder("agent").build()?)
        .await?;
    // A program the model might have written: it calls the host's tools like any command.
    let program = r#"
        sum=$(host-tool add '{"a": 40, "b": 2}')
        host-tool remember "{\"key\": \"answer\", \"value\": \"$sum\"}" > /dev/null
        host-tool add '{"a": "forty"}' 2>&1 || true
        echo "the sum is $sum"
    "#;
    let request =
        ExecRequest::new(Command::argv(["sh", "-c", program])).timeout(Duration::from_secs(60));
    let run = run_with_host_tools(
        &*sandbox,
        request,
        &registry.for_run(["add", "remember"])?,
        &RunBounds::default(),
    )
    .await?;
    print!("{}", run.output.stdout_text());
    println!("host-tool calls: {:?}", run.report);
    let remembered = store
        .lock()
        .map_err(|_| "the store failed")?
        .get("answer")
        .cloned();
    assert_eq!(
        remembered.as_deref(),
        Some("42"),
        "the guest's call reached the host"
    );
    assert!(run.output.stdout_text().contains("invalid_arguments"));
    assert_eq!((run.report.answered, run.report.refused), (2, 1));

    if let Some(failure) = backend.dispose(&key, DisposeSelector::all()).await {
        return Err(format!("disposal did not land: {failure}").into());
    }
    Ok(())
}
