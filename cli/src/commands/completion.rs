//! `liqoctl completion`: shell completion scripts generated from the clap types.

use clap::CommandFactory;

use crate::cli::{Cli, CompletionArgs};

pub fn run(args: &CompletionArgs) {
    let mut command = Cli::command();
    clap_complete::generate(args.shell, &mut command, "liqoctl", &mut std::io::stdout());
}
