//! `liqoctl`: installs liqo-rs, peers clusters and offloads namespaces.

mod cli;
mod commands;
#[expect(dead_code, reason = "the refusal kinds come with install and uninstall")]
mod error;
mod factory;
#[expect(dead_code, reason = "progress output comes with install")]
mod printer;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::printer::Printer;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.global.verbose);
    let printer = Printer::new(cli.global.quiet);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return error::report(&e.into()),
    };
    match runtime.block_on(run(cli, printer)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => error::report(&e),
    }
}

async fn run(cli: Cli, printer: Printer) -> anyhow::Result<()> {
    match &cli.command {
        Command::Version(args) => commands::version::run(args, &cli.global, printer).await,
        Command::Completion(args) => {
            commands::completion::run(args);
            Ok(())
        }
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "liqoctl=debug,info",
        _ => "debug",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LIQOCTL_LOG")
                .unwrap_or_else(|_| default.into()),
        )
        .with_writer(std::io::stderr)
        .without_time()
        .init();
}
