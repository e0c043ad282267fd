//! `liqoctl completion`: shell completion scripts generated from the clap types.

use clap::CommandFactory;

use crate::cli::{Cli, CompletionArgs};

pub fn run(args: &CompletionArgs) {
    let mut command = Cli::command();
    // Generated whole first: clap_complete panics on a write error, and a
    // closed stdout (`| head`) must end quietly.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "liqoctl", &mut script);
    crate::printer::write_stdout(&script);
}
