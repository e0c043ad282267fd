//! The command line: clap types only, no behaviour.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "liqoctl",
    version = liqo_api::VERSION,
    about = "Peer Kubernetes clusters and run workloads on each other's resources",
    long_about = "liqoctl installs liqo-rs, peers clusters and offloads namespaces.\n\n\
                  It reads the cluster to act on like kubectl does: --kubeconfig, then KUBECONFIG, \
                  then ~/.kube/config, then the in-cluster service account.",
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Debug, Clone)]
pub struct GlobalArgs {
    /// Path to the kubeconfig file of the local cluster.
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context of the local cluster.
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// Answer yes to every question; never prompt.
    #[arg(long, short = 'y', global = true)]
    pub yes: bool,
    /// Print only errors and requested output.
    #[arg(long, short = 'q', global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Print debug logs (repeat for more).
    #[arg(long, short = 'v', global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the client version and, when installed, the cluster's.
    Version(VersionArgs),
    /// Print a shell completion script.
    #[command(long_about = "Print a shell completion script.\n\n\
                      bash: source <(liqoctl completion bash)\n\
                      zsh:  liqoctl completion zsh > \"${fpath[1]}/_liqoctl\"\n\
                      fish: liqoctl completion fish > ~/.config/fish/completions/liqoctl.fish")]
    Completion(CompletionArgs),
}

#[derive(Args, Debug)]
pub struct VersionArgs {
    /// Print only the client version; do not contact the cluster.
    #[arg(long)]
    pub client: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Debug)]
pub struct CompletionArgs {
    /// The shell to complete for.
    pub shell: clap_complete::Shell,
}

#[derive(Args, Debug, Clone, Copy)]
pub struct OutputArgs {
    /// Output format for what the command reports.
    #[arg(long, short = 'o', value_enum)]
    pub output: Option<OutputFormat>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Json,
    Yaml,
}
