//! The guest agent binary: the initramfs's `/init`, then the protocol server (`docs/vm.md`).
//!
//! Linux only; elsewhere it prints that and exits 2.
#![deny(missing_docs)]
#![deny(unsafe_code)]

#[cfg(target_os = "linux")]
mod agent;

#[cfg(target_os = "linux")]
fn main() -> std::process::ExitCode {
    agent::main()
}

#[cfg(not(target_os = "linux"))]
fn main() -> std::process::ExitCode {
    eprintln!("vm-agent runs only inside a Linux guest");
    std::process::ExitCode::from(2)
}
