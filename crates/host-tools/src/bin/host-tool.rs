//! `host-tool`: the guest's side of host tools.
//!
//! ```text
//! host-tool NAME [JSON]        call NAME with JSON arguments (stdin when absent)
//! host-tool --json NAME [JSON] print the result as JSON even when it is a string
//! host-tool relay [--max-frame BYTES]   started by the host for a run; not for users
//! ```
//!
//! A string result prints as its bytes, anything else as one line of JSON. Exit status: 0 on a
//! result, 1 when the tool or the host refused (`host-tool: CODE: MESSAGE` on stderr), 2 on a
//! usage error, 3 when the run's relay cannot be reached.

#[cfg(unix)]
fn main() -> std::process::ExitCode {
    unix::main()
}

#[cfg(not(unix))]
fn main() -> std::process::ExitCode {
    eprintln!("host-tool: Unix only");
    std::process::ExitCode::from(2)
}

#[cfg(unix)]
mod unix {
    use std::io::{Read as _, Write as _};
    use std::process::ExitCode;

    use host_tools::frame::DEFAULT_MAX_PAYLOAD;
    use host_tools::relay::{self, CallOutcome, SOCKET_ENV};

    /// The largest arguments read from stdin.
    const MAX_STDIN: u64 = 64 * 1024 * 1024;

    fn usage(reason: &str) -> ExitCode {
        eprintln!("host-tool: {reason}\nusage: host-tool [--json] NAME [JSON]");
        ExitCode::from(2)
    }

    pub(super) fn main() -> ExitCode {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                eprintln!("host-tool: {error}");
                return ExitCode::from(3);
            }
        };
        if args.first().map(String::as_str) == Some("relay") {
            return runtime.block_on(relay_main(&args[1..]));
        }
        runtime.block_on(call_main(args))
    }

    async fn relay_main(args: &[String]) -> ExitCode {
        let max_frame = match args {
            [] => DEFAULT_MAX_PAYLOAD,
            [flag, value] if flag == "--max-frame" => match value.parse() {
                Ok(value) => value,
                Err(_) => return usage("--max-frame takes a byte count"),
            },
            _ => return usage("relay takes only --max-frame BYTES"),
        };
        let parent = std::env::temp_dir();
        match relay::run_relay(&parent, max_frame, tokio::io::stdin(), tokio::io::stdout()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("host-tool relay: {error}");
                ExitCode::from(3)
            }
        }
    }

    async fn call_main(mut args: Vec<String>) -> ExitCode {
        let json = args.first().map(String::as_str) == Some("--json");
        if json {
            args.remove(0);
        }
        let (name, arguments) = match args.as_slice() {
            [name] => {
                let mut text = Vec::new();
                if let Err(error) = std::io::stdin().take(MAX_STDIN).read_to_end(&mut text) {
                    return usage(&format!("reading the arguments from stdin: {error}"));
                }
                (name.clone(), text)
            }
            [name, text] => (name.clone(), text.clone().into_bytes()),
            _ => return usage("a tool name and at most one JSON argument"),
        };
        let arguments = if arguments.iter().all(u8::is_ascii_whitespace) {
            serde_json::json!({})
        } else {
            match serde_json::from_slice(&arguments) {
                Ok(value) => value,
                Err(error) => return usage(&format!("the arguments are not JSON: {error}")),
            }
        };
        let Some(socket) = std::env::var_os(SOCKET_ENV) else {
            eprintln!(
                "host-tool: {SOCKET_ENV} is not set: this command runs in a run with host tools"
            );
            return ExitCode::from(3);
        };
        let outcome = relay::call(
            std::path::Path::new(&socket),
            &name,
            arguments,
            64 * 1024 * 1024,
        )
        .await;
        match outcome {
            Ok(CallOutcome::Result(value)) => {
                let mut stdout = std::io::stdout().lock();
                let written = match value {
                    serde_json::Value::String(text) if !json => stdout.write_all(text.as_bytes()),
                    other => writeln!(stdout, "{other}"),
                };
                match written.and_then(|()| stdout.flush()) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(_) => ExitCode::from(1),
                }
            }
            Ok(CallOutcome::Failure(code, message)) => {
                eprintln!("host-tool: {code}: {message}");
                ExitCode::from(1)
            }
            Err(error) => {
                eprintln!("host-tool: the run's relay: {error}");
                ExitCode::from(3)
            }
        }
    }
}
