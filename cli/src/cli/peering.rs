//! The peering commands' arguments: peer (and its exchange of files),
//! peering tokens, unpeer, and the network of a peering.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::{DnsRecordsArgs, OutputArgs};

/// How to reach the provider.
#[derive(Args, Debug)]
pub struct RemoteArgs {
    /// Kubeconfig of the provider cluster.
    #[arg(long, value_name = "FILE")]
    pub remote_kubeconfig: Option<PathBuf>,
    /// The provider's kubeconfig context.
    #[arg(long, value_name = "NAME", requires = "remote_kubeconfig")]
    pub remote_context: Option<String>,
}

#[derive(Args, Debug)]
pub struct PeerArgs {
    #[command(subcommand)]
    pub exchange: Option<PeerExchange>,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// A peering token from the provider's administrator (`liqoctl generate
    /// peering-token` there): peer with the local kubeconfig only. Prefer
    /// --token-file: a command line is seen by every user of the machine.
    #[arg(long, value_name = "TOKEN", conflicts_with_all = ["remote_kubeconfig", "token_file", "bidirectional"])]
    pub token: Option<String>,
    /// A file holding the peering token (`-` reads standard input).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["remote_kubeconfig", "bidirectional"])]
    pub token_file: Option<PathBuf>,
    #[command(flatten)]
    pub request: RequestArgs,
    /// Issue a new certificate even if the current one is good for more than a
    /// third of its life (which is when `peer` renews it by itself).
    #[arg(long)]
    pub renew: bool,
    /// Ask the provider's signer for a certificate valid this many seconds (at
    /// least 600); by default the signer's own duration (a year on kubeadm).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(600..))]
    pub certificate_lifetime: Option<u64>,
    /// Also peer the other way: the provider consumes the local cluster's
    /// resources, with the same request.
    #[arg(long)]
    pub bidirectional: bool,
    /// Peer without linking the pod networks (no tunnel between the
    /// gateways); `liqoctl network connect` links them later.
    #[arg(long)]
    pub no_network: bool,
    /// How long to wait for the virtual node to be ready, in seconds.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub timeout: u64,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Peering through files, for administrators who cannot act at once
/// (docs/tokens.md, "Peering through files").
#[derive(Subcommand, Debug)]
pub enum PeerExchange {
    /// On the consumer: write a peering request (a certificate request for
    /// this cluster's identity; its key stays here) to hand to the provider.
    Request(PeerRequestArgs),
    /// On the provider: accept a request file: create the tenant, sign the
    /// consumer's certificate, and write the response to hand back.
    Accept(PeerAcceptArgs),
    /// On the consumer: complete the peering with the provider's response.
    Complete(PeerCompleteArgs),
}

#[derive(Args, Debug)]
pub struct PeerRequestArgs {
    /// Where to write the request (`-`: standard output).
    #[arg(long, short = 'f', value_name = "FILE", default_value = "-")]
    pub file: PathBuf,
    #[command(flatten)]
    pub request: RequestArgs,
    /// Ask for a certificate valid this many seconds (at least 600).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(600..))]
    pub certificate_lifetime: Option<u64>,
}

#[derive(Args, Debug)]
pub struct PeerAcceptArgs {
    /// The consumer's request file (`-`: standard input).
    #[arg(long, short = 'f', value_name = "FILE")]
    pub file: PathBuf,
    /// Where to write the response (`-`: standard output).
    #[arg(long, value_name = "FILE", default_value = "-")]
    pub response_file: PathBuf,
    /// The API server address the consumer reaches this cluster at; by
    /// default the kubeconfig's.
    #[arg(long, value_name = "URL")]
    pub api_server: Option<String>,
}

#[derive(Args, Debug)]
pub struct PeerCompleteArgs {
    /// The provider's response file (`-`: standard input).
    #[arg(long, short = 'f', value_name = "FILE")]
    pub file: PathBuf,
    /// Peer without linking the pod networks (no tunnel between the
    /// gateways); `liqoctl network connect` links them later.
    #[arg(long)]
    pub no_network: bool,
    /// How long to wait for the virtual node to be ready, in seconds.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub timeout: u64,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Subcommand, Debug)]
pub enum GenerateCommand {
    /// Make a peering token: a consumer peers with it using its own kubeconfig only.
    #[command(
        long_about = "Make a peering token: a consumer peers with it using its own \
        kubeconfig only (`liqoctl peer --token-file FILE` there).\n\n\
        Run on the provider. Creates, for each use, the consumer's tenant (namespace, RBAC, \
        quota for the grant) and an account that may act as that tenant only; and a bootstrap \
        credential that may only claim one of these tenants, once each, until the token expires \
        or is revoked. Prints the token on standard output; hand it over out of band, as a \
        password. The grant follows the sharing policy (of --for's cluster, else default)."
    )]
    PeeringToken(GeneratePeeringTokenArgs),
    /// Print the DNS-SD records that let others find this cluster with
    /// `liqoctl discover --domain`.
    #[command(
        long_about = "Print the DNS-SD records that let others find this cluster with \
        `liqoctl discover --domain`.\n\n\
        Zone-file lines (PTR, SRV, TXT) for the administrator of DOMAIN to publish; nothing \
        secret. They say who the cluster is and where its API server is."
    )]
    DnsRecords(DnsRecordsArgs),
}

#[derive(Args, Debug)]
pub struct GeneratePeeringTokenArgs {
    /// How long the token can be used: 10m to 7d (e.g. 30m, 1h, 2d).
    #[arg(long, default_value = "1h", value_name = "DURATION", value_parser = parse_expiry)]
    pub expires: std::time::Duration,
    /// How many consumers may peer with it, each once (1 to 20).
    #[arg(long, default_value_t = 1, value_name = "COUNT", value_parser = clap::value_parser!(u32).range(1..=20))]
    pub uses: u32,
    /// Only the cluster with this cluster ID may use it; its tenant is named after it.
    #[arg(long = "for", value_name = "CLUSTER_ID", conflicts_with = "uses")]
    pub for_cluster: Option<String>,
    #[command(flatten)]
    pub request: RequestArgs,
    /// The API server address consumers reach this cluster at; by default the
    /// kubeconfig's.
    #[arg(long, value_name = "URL")]
    pub api_server: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Subcommand, Debug)]
pub enum RevokeCommand {
    /// Revoke peering tokens: they stop working at once; their unclaimed tenants are removed.
    #[command(
        long_about = "Revoke peering tokens: they stop working at once, and their \
        tenants that no consumer claimed are removed. Peerings already made with them stay; \
        end those with `liqoctl unpeer --tenant`. Run on the provider."
    )]
    PeeringToken(RevokePeeringTokenArgs),
}

#[derive(Args, Debug)]
pub struct RevokePeeringTokenArgs {
    /// The IDs of the tokens (as `generate peering-token` and `info` print them).
    #[arg(value_name = "ID", required_unless_present_any = ["expired", "all"])]
    pub ids: Vec<String>,
    /// Remove every token that has expired, with its unclaimed tenants.
    #[arg(long, conflicts_with = "all")]
    pub expired: bool,
    /// Revoke every token.
    #[arg(long)]
    pub all: bool,
}

/// A token's life: a duration from 10 minutes (the API server's shortest
/// service account token) to 7 days.
fn parse_expiry(text: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| format!("{e} (e.g. 30m, 1h, 2d)"))?;
    let (min, max) = (
        std::time::Duration::from_secs(600),
        std::time::Duration::from_secs(7 * 24 * 3600),
    );
    if d < min || d > max {
        return Err("must be between 10m and 7d".to_owned());
    }
    Ok(d)
}

/// What a consumer asks of a provider (peer, peer request) or a provider
/// grants with a token: each by default what the sharing policy offers.
/// A peering request file carries them as given (`peer request`).
#[derive(Args, Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestArgs {
    /// CPU (e.g. 2, 500m); by default what the provider's sharing policy offers.
    #[arg(long, value_name = "QUANTITY")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Memory (e.g. 4Gi); by default what the provider's sharing policy offers.
    #[arg(long, value_name = "QUANTITY")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// Pods; by default what the provider's sharing policy offers.
    #[arg(long, value_name = "COUNT")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<String>,
    /// Persistent storage for claims, in all (e.g. 20Gi); by default what
    /// the provider's sharing policy offers.
    #[arg(long, value_name = "QUANTITY")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<String>,
    /// Claims; by default what the provider's sharing policy offers.
    #[arg(long, value_name = "COUNT")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<String>,
    /// Refuse when the policy offers less than asked, instead of taking what
    /// it offers.
    #[arg(long)]
    #[serde(default)]
    pub require_request: bool,
}

#[derive(Args, Debug)]
pub struct UnpeerArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// The provider's cluster ID, to clean only the local side when the
    /// provider is gone for good (with --force).
    #[arg(long, value_name = "ID", conflicts_with = "remote_kubeconfig")]
    pub cluster_id: Option<String>,
    /// Unpeer even while namespaces are offloaded to the provider; without a
    /// remote kubeconfig, clean the local side only.
    #[arg(long)]
    pub force: bool,
    /// Run on the provider: end the tenancy of the consumer with this cluster
    /// ID from the provider's side alone (its identity then authorizes
    /// nothing; its virtual node turns NotReady).
    #[arg(long, value_name = "CONSUMER_ID", conflicts_with_all = ["remote_kubeconfig", "cluster_id"])]
    pub tenant: Option<String>,
    /// Leave the claims kept on the provider (with their data) in their
    /// twin namespaces, for a later peering and offload of the same
    /// namespaces to find (unoffload them with --keep-remote-data first).
    #[arg(long, conflicts_with = "delete_remote_data")]
    pub keep_remote_data: bool,
    /// Delete the claims kept on the provider, and their data.
    #[arg(long)]
    pub delete_remote_data: bool,
    /// How long to wait for everything to be gone, in seconds.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub timeout: u64,
}

#[derive(Subcommand, Debug)]
pub enum NetworkCommand {
    /// Link the pod networks: a tunnel between the two clusters' gateways.
    Connect(NetworkArgs),
    /// Unlink them: remove both ends of the tunnel.
    Disconnect(NetworkArgs),
}

#[derive(Args, Debug)]
pub struct NetworkArgs {
    /// The provider's cluster ID (`liqoctl info` lists the peerings).
    #[arg(long, value_name = "ID")]
    pub cluster_id: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("anchor").required(true).args(["remote_kubeconfig", "token", "token_file"]))]
pub struct TetherArgs {
    /// Kubeconfig of the anchor: the cluster that schedules this one's
    /// workloads while the tether lasts.
    #[arg(long, value_name = "FILE")]
    pub remote_kubeconfig: Option<PathBuf>,
    /// The anchor's kubeconfig context.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["token", "token_file"])]
    pub remote_context: Option<String>,
    /// A peering token from the anchor's administrator (`liqoctl generate
    /// peering-token` there), instead of its kubeconfig: this cluster's
    /// side of the tether only (docs/tethering.md, "With a token").
    /// Prefer --token-file: a command line is seen by every user of the
    /// machine.
    #[arg(long, value_name = "TOKEN", conflicts_with_all = ["remote_kubeconfig", "token_file"])]
    pub token: Option<String>,
    /// A file holding the anchor's peering token (`-` reads standard
    /// input).
    #[arg(long, value_name = "FILE", conflicts_with = "remote_kubeconfig")]
    pub token_file: Option<PathBuf>,
    /// Tether without linking the pod networks.
    #[arg(long)]
    pub no_network: bool,
    /// How long to wait for each step (both peerings' virtual nodes, the
    /// twin namespaces), in seconds.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub timeout: u64,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Debug)]
pub struct UntetherArgs {
    /// Kubeconfig of the anchor this cluster is tethered to; not needed
    /// for a tether made with a token.
    #[arg(long, value_name = "FILE")]
    pub remote_kubeconfig: Option<PathBuf>,
    /// The anchor's kubeconfig context.
    #[arg(long, value_name = "NAME", requires = "remote_kubeconfig")]
    pub remote_context: Option<String>,
    /// How long to wait for each step (twin namespaces and peerings to be
    /// gone), in seconds.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub timeout: u64,
}
