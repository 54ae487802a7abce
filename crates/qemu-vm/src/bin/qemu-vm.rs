//! `qemu-vm`: a small operator tool over the driver, one VM directory per command.
//!
//! - `qemu-vm start IMAGE_DIR PARENT_DIR NAME`: starts a VM (accelerator by test boot) and
//!   exits, leaving it running; prints its directory;
//! - `qemu-vm exec VM_DIR PROGRAM [ARG…]`: attaches, runs the program, relays its output and
//!   exits with its code;
//! - `qemu-vm status VM_DIR`, `qemu-vm kill VM_DIR`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(target_os = "linux")]
fn main() -> std::process::ExitCode {
    use std::io::Write as _;
    use std::os::unix::ffi::OsStrExt as _;
    use std::path::PathBuf;
    use std::process::ExitCode;
    use std::time::Duration;

    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let usage = || {
        eprintln!("usage: qemu-vm start IMAGE_DIR PARENT_DIR NAME | exec VM_DIR PROGRAM [ARG…] | status VM_DIR | kill VM_DIR");
        ExitCode::from(2)
    };
    let Some(command) = args.first().and_then(|a| a.to_str()) else {
        return usage();
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("qemu-vm: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome: Result<ExitCode, qemu_vm::VmError> = runtime.block_on(async {
        match (command, args.len()) {
            ("start", 4) => {
                let image = qemu_vm::VmImage::load(&PathBuf::from(&args[1]))?;
                let mut config = qemu_vm::VmConfig::new(
                    image,
                    PathBuf::from(&args[2]),
                    args[3].to_string_lossy().into_owned(),
                );
                config.memory_mib = 384;
                let cache = PathBuf::from(&args[1]);
                config.accel = qemu_vm::probe_accel(&config, &cache).await?.accel;
                let vm = qemu_vm::Vm::start(&config).await?;
                println!("{}", vm.dir().display());
                Ok(ExitCode::SUCCESS)
            }
            ("exec", n) if n >= 3 => {
                let vm = qemu_vm::Vm::attach(&PathBuf::from(&args[1]))?;
                let agent = vm.agent(Duration::from_secs(120)).await?;
                let request = qemu_vm::ExecRequest {
                    argv: args[2..].iter().map(|a| a.as_bytes().to_vec()).collect(),
                    env: vec![(b"PATH".to_vec(), b"/usr/sbin:/usr/bin:/sbin:/bin".to_vec())],
                    workdir: Vec::new(),
                    stdin: false,
                    timeout_ms: 0,
                    user: None,
                };
                let out = agent
                    .run(request, None, qemu_vm::RunLimits::default())
                    .await?;
                let _ = std::io::stdout().write_all(&out.stdout);
                let _ = std::io::stderr().write_all(&out.stderr);
                Ok(ExitCode::from(out.status.code.unwrap_or(128) as u8))
            }
            ("status", 2) => {
                let vm = qemu_vm::Vm::attach(&PathBuf::from(&args[1]))?;
                let status = vm.status().await?;
                println!(
                    "{} pid {} accel {}",
                    status.status,
                    vm.pid(),
                    vm.accel().name()
                );
                Ok(ExitCode::SUCCESS)
            }
            ("kill", 2) => {
                qemu_vm::Vm::attach(&PathBuf::from(&args[1]))?
                    .kill()
                    .await?;
                Ok(ExitCode::SUCCESS)
            }
            _ => Ok(usage()),
        }
    });
    match outcome {
        Ok(code) => code,
        Err(error) => {
            eprintln!("qemu-vm: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn main() -> std::process::ExitCode {
    eprintln!("qemu-vm runs only on Linux hosts");
    std::process::ExitCode::from(2)
}
