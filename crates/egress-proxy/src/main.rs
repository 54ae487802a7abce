//! `egress-proxy`: the proxy, forwarder and test-server roles (see the library's docs).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    match egress_proxy::cli::run(egress_proxy::cli::Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("egress-proxy: {error}");
            ExitCode::FAILURE
        }
    }
}
