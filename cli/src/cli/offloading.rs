//! The offloading commands' arguments.

use clap::{Args, Subcommand, ValueEnum};

use super::OutputArgs;

#[derive(Subcommand, Debug)]
pub enum OffloadCommand {
    /// Offload one or more namespaces.
    ///
    /// Writes each namespace's NamespaceOffloading and lets every outgoing peering's virtual
    /// kubelet read what it reflects there (a RoleBinding in that namespace only). With -o, prints
    /// the offloading instead; once applied by other means, run this command on the namespace
    /// too, or the virtual kubelets report AgentNotBound and offload nothing. On a cluster without
    /// MutatingAdmissionPolicy, the namespaces' pods are placed by the virtual kubelets' webhook:
    /// the command first waits (up to a minute) for one to serve it, so that no pod created right
    /// after it stays local unplaced.
    Namespace(OffloadNamespaceArgs),
}

#[derive(Subcommand, Debug)]
pub enum UnoffloadCommand {
    /// Stop offloading one or more namespaces; the local namespaces are left as they are.
    Namespace(UnoffloadNamespaceArgs),
}

/// How the twin namespaces are named, as `NamespaceOffloading` says it.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)] // Liqo's names, as users type them.
pub enum MappingStrategyArg {
    /// `<namespace>-<this cluster's name>`: cannot clash with the provider's namespaces.
    #[value(name = "DefaultName")]
    DefaultName,
    /// The local namespace's name (refused by a provider that has one of that name).
    #[value(name = "EnforceSameName")]
    EnforceSameName,
    /// The name given with --remote-namespace-name (one namespace only).
    #[value(name = "SelectedName")]
    SelectedName,
}

/// Where pods may run, as `NamespaceOffloading` says it.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodStrategyArg {
    /// On local nodes and on virtual nodes.
    #[value(name = "LocalAndRemote")]
    LocalAndRemote,
    /// On virtual nodes only.
    #[value(name = "Remote")]
    Remote,
    /// On local nodes only (other objects are still reflected).
    #[value(name = "Local")]
    Local,
}

#[derive(Args, Debug)]
pub struct OffloadNamespaceArgs {
    /// The namespaces to offload.
    #[arg(required = true, value_name = "NAME")]
    pub names: Vec<String>,
    /// How the twin namespaces on the providers are named.
    #[arg(long, value_enum, default_value = "DefaultName")]
    pub namespace_mapping_strategy: MappingStrategyArg,
    /// The twin namespace's name, with --namespace-mapping-strategy SelectedName.
    #[arg(long, value_name = "NAME")]
    pub remote_namespace_name: Option<String>,
    /// Where the namespaces' pods may run.
    #[arg(long, value_enum, default_value = "LocalAndRemote")]
    pub pod_offloading_strategy: PodStrategyArg,
    /// Offload only to the providers whose virtual node matches this label
    /// selector (kubectl syntax; repeatable, ORed). Default: every provider.
    #[arg(long = "selector", short = 'l', value_name = "SELECTOR")]
    pub selectors: Vec<String>,
    /// Wait until every selected provider reports its twin namespace ready.
    #[arg(long)]
    pub wait: bool,
    /// How long to wait, in seconds.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub timeout: u64,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Debug)]
pub struct UnoffloadNamespaceArgs {
    /// The namespaces to stop offloading.
    #[arg(required = true, value_name = "NAME")]
    pub names: Vec<String>,
    /// Leave the claims kept on the providers (with their data) in the twin
    /// namespaces, for a later offload of the same namespaces to find.
    #[arg(long, conflicts_with = "delete_remote_data")]
    pub keep_remote_data: bool,
    /// Delete the claims kept on the providers, and their data.
    #[arg(long)]
    pub delete_remote_data: bool,
    /// How long to wait for the twin namespaces to be gone, in seconds.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub timeout: u64,
}
