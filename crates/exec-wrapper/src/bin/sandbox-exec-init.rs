//! `sandbox-exec-init <nonce> <mask> <cwd> <argv>…`: the Docker init shape's wrapper as one
//! static program (docs/wrapper-protocol.md#docker-the-exec-init). Linux only; elsewhere it says so and
//! exits 2.
#![deny(missing_docs)]
#![deny(unsafe_code)]

#[cfg(target_os = "linux")]
fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    std::process::ExitCode::from(exec_wrapper::init::run(&args))
}

#[cfg(not(target_os = "linux"))]
fn main() -> std::process::ExitCode {
    eprintln!("sandbox-exec-init runs only inside a Linux guest");
    std::process::ExitCode::from(2)
}
