//! `liqoctl`: installs liqo-rs, peers clusters and offloads namespaces.

mod cli;
mod commands;
mod error;
mod factory;
mod flags;
mod kube;
mod manifests;
mod peering;
mod printer;
mod show;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use crate::cli::{Cli, Command, GenerateCommand, NetworkCommand, RevokeCommand, TestCommand};
use crate::printer::Printer;

fn main() -> ExitCode {
    let cli = parse_args();
    init_logging(cli.global.verbose);
    let printer = Printer::new(cli.global.quiet).timed(cli.global.verbose > 0);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return error::report(&e.into()),
    };
    let started = std::time::Instant::now();
    match runtime.block_on(run(cli, printer)) {
        Ok(()) => {
            printer.total("done", started);
            ExitCode::SUCCESS
        }
        Err(e) => error::report(&e),
    }
}

async fn run(cli: Cli, printer: Printer) -> anyhow::Result<()> {
    match &cli.command {
        Command::Install(args) => commands::install::run(args, &cli.global, printer).await,
        Command::Uninstall(args) => commands::uninstall::run(args, &cli.global, printer).await,
        // `peer request|accept|complete` and `peer --token` are verbs of
        // their own that share `peer`'s flags.
        Command::Peer(args) => match &args.exchange {
            Some(exchange) => commands::exchange::run(exchange, &cli.global, printer).await,
            None if args.token.is_some() || args.token_file.is_some() => {
                commands::peering_token::peer(args, &cli.global, printer).await
            }
            None => commands::peer::run(args, &cli.global, printer).await,
        },
        Command::Unpeer(args) => commands::unpeer::run(args, &cli.global, printer).await,
        Command::Tether(args) => commands::tether::tether(args, &cli.global, printer).await,
        Command::Untether(args) => commands::tether::untether(args, &cli.global, printer).await,
        Command::Network(NetworkCommand::Connect(args)) => {
            commands::network::connect(args, &cli.global, printer).await
        }
        Command::Network(NetworkCommand::Disconnect(args)) => {
            commands::network::disconnect(args, &cli.global, printer).await
        }
        Command::Info(args) => commands::info::run(args, &cli.global, printer).await,
        Command::Offload(command) => {
            commands::offload::offload(command, &cli.global, printer).await
        }
        Command::Unoffload(command) => {
            commands::offload::unoffload(command, &cli.global, printer).await
        }
        Command::SharingPolicy(command) => {
            commands::sharing_policy::run(command, &cli.global, printer).await
        }
        Command::Discover(args) => commands::discover::run(args, printer).await,
        Command::Test(TestCommand::Network(args)) => {
            commands::test_network::run(args, &cli.global, printer).await
        }
        Command::Generate(GenerateCommand::PeeringToken(args)) => {
            commands::peering_token::generate(args, &cli.global, printer).await
        }
        Command::Generate(GenerateCommand::DnsRecords(args)) => {
            commands::generate_dns::run(args, &cli.global, printer).await
        }
        Command::Revoke(RevokeCommand::PeeringToken(args)) => {
            commands::peering_token::revoke(args, &cli.global, printer).await
        }
        Command::Version(args) => commands::version::run(args, &cli.global, printer).await,
        Command::Completion(args) => {
            commands::completion::run(args);
            Ok(())
        }
    }
}

/// Parses the arguments; run as `kubectl-liqo` (a kubectl plugin), help
/// and errors speak of `kubectl liqo`.
fn parse_args() -> Cli {
    let as_plugin = std::env::args_os()
        .next()
        .and_then(|arg0| {
            let name = std::path::Path::new(&arg0).file_name()?.to_owned();
            Some(name == "kubectl-liqo")
        })
        .unwrap_or(false);
    let mut command = Cli::command();
    if as_plugin {
        command = command.bin_name("kubectl liqo").name("kubectl liqo");
    }
    let matches = command.get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Logs go to stderr. By default only liqoctl's own warnings: a failure
/// reaches the user as the one `error:` line, not also as a library's log
/// line (kube's client logs every failed connection at ERROR). `-v` adds
/// liqoctl's debug lines and the libraries' warnings, `-vv` everything.
fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "off,liqoctl=warn",
        1 => "warn,liqoctl=debug",
        _ => "debug",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LIQOCTL_LOG")
                .unwrap_or_else(|_| default.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
        .init();
}
