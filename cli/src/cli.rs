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
    /// Install liqo-rs on the cluster, or update an installation.
    #[command(
        long_about = "Install liqo-rs on the cluster, or update an installation.\n\n\
        Creates the liqo namespace, the CRDs, the RBAC and the gateway agent, and gives the \
        cluster its liqo identity: a cluster ID that never changes, a name, and labels that \
        peers put on the virtual node standing for this cluster. Running it again with the \
        same flags changes nothing."
    )]
    Install(InstallArgs),
    /// Remove liqo-rs from the cluster.
    #[command(long_about = "Remove liqo-rs from the cluster.\n\n\
        Refuses while peerings or offloaded namespaces exist. Keeps the CRDs unless --purge \
        is given.")]
    Uninstall(UninstallArgs),
    /// Peer with a provider: the local cluster (the consumer) gets a virtual node
    /// standing for the resources the provider grants.
    #[command(
        long_about = "Peer with a provider: the local cluster (the consumer) gets a virtual \
        node standing for the resources the provider grants.\n\n\
        With --remote-kubeconfig, liqoctl does the provider's side itself with those credentials: \
        a tenant namespace, least-privilege RBAC and a ResourceQuota for the consumer's x509 \
        identity (its key never leaves the consumer), and a Tenant record. The grant follows the \
        provider's sharing policy. Each step can be re-run; a failed run removes what it created.\n\n\
        With --token-file, the consumer peers with its own kubeconfig only (see `liqoctl generate \
        peering-token`). Where neither is possible at once, `peer request`, `peer accept` and \
        `peer complete` exchange files instead.",
        args_conflicts_with_subcommands = true
    )]
    Peer(PeerArgs),
    /// End a peering: remove the virtual node and everything the peering made on both clusters.
    Unpeer(UnpeerArgs),
    /// Link or unlink the pod networks of an existing outgoing peering.
    #[command(
        subcommand,
        long_about = "Link or unlink the pod networks of an existing outgoing peering         (docs/network.md).

        Run on the consumer. The provider is reached with the peering's own identity, so only         the local kubeconfig is needed, however the peering was made. `connect` writes both ends         of the tunnel (Connections) and waits for the gateways' handshake; `disconnect` removes         them, and the gateways tear the tunnel down."
    )]
    Network(NetworkCommand),
    /// Show the cluster's liqo identity, agents, peerings and offloaded namespaces.
    #[command(
        long_about = "Show the cluster's liqo identity, agents, peerings and offloaded \
        namespaces.\n\n\
        Outgoing peerings are the providers this cluster consumes (its ForeignClusters): their \
        virtual node's readiness and why, the grant, its cost, the certificate's expiry and the \
        tenant namespace. Incoming peerings are the consumers of this cluster (its Tenants). \
        `info peer NAME` shows one peering in detail."
    )]
    Info(InfoArgs),
    /// Offload namespaces: their pods may run on the providers of outgoing peerings.
    #[command(
        subcommand,
        long_about = "Offload namespaces: their pods may run on the providers of outgoing \
        peerings.\n\n\
        Creates a NamespaceOffloading in each namespace and labels the namespace for placement. \
        Each selected provider's virtual kubelet creates the twin namespace there and reports \
        it in the offloading's status (see `liqoctl info`). With -o, prints the \
        NamespaceOffloadings and applies nothing (for GitOps)."
    )]
    Offload(OffloadCommand),
    /// Stop offloading namespaces: their twin namespaces and remote pods are removed.
    #[command(subcommand)]
    Unoffload(UnoffloadCommand),
    /// Set, show or delete the sharing policy: what this cluster offers its consumers.
    #[command(
        subcommand,
        long_about = "Set, show or delete the sharing policy: what this cluster, as a \
        provider, offers its consumers.\n\n\
        `liqoctl peer` reads the SharingPolicy named by the consumer's cluster ID, else the one \
        named `default`, else the built-in default (accept new peers, offer 50% of the free \
        capacity of each resource). Run these commands on the provider."
    )]
    SharingPolicy(SharingPolicyCommand),
    /// List the clusters that can be found on the LAN (mDNS) or in DNS.
    #[command(
        long_about = "List the clusters that can be found on the LAN (mDNS) or in DNS.\n\n\
        --lan browses for `_liqo._tcp.local.` announcements (clusters installed with \
        `liqoctl install --announce`) for --timeout; --domain reads the DNS-SD records \
        (`liqoctl generate dns-records`) of a domain. With neither, --lan. A cluster found by \
        several means is listed once.\n\n\
        Discovery does not authenticate: anyone can announce anything. To peer with a cluster \
        found here, get a peering token from its administrator."
    )]
    Discover(DiscoverArgs),
    /// Check that a peering works end to end.
    #[command(subcommand)]
    Test(TestCommand),
    /// Make what is handed to others: peering tokens, DNS records.
    #[command(subcommand)]
    Generate(GenerateCommand),
    /// Take back what was handed over: peering tokens not yet used.
    #[command(subcommand)]
    Revoke(RevokeCommand),
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
pub struct InstallArgs {
    /// The cluster's ID (a DNS label); random at first install, kept afterwards.
    #[arg(long, value_name = "ID")]
    pub cluster_id: Option<String>,
    /// A human name for the cluster (a DNS label); defaults to the kubeconfig context's name.
    #[arg(long, value_name = "NAME")]
    pub cluster_name: Option<String>,
    /// Labels for the virtual nodes that peers make for this cluster (repeatable).
    #[arg(
        long = "cluster-labels",
        value_name = "KEY=VALUE[,KEY=VALUE]",
        value_delimiter = ','
    )]
    pub cluster_labels: Vec<String>,
    /// The pod CIDR; found from the controller-manager, kube-proxy or the nodes when not given.
    #[arg(long, value_name = "CIDR")]
    pub pod_cidr: Option<String>,
    /// The service CIDR; found from the ServiceCIDR API when not given.
    #[arg(long, value_name = "CIDR")]
    pub service_cidr: Option<String>,
    /// Run the agents only on nodes with these labels (repeatable); kept from the
    /// installation when not given, cleared by an empty value.
    #[arg(
        long = "node-selector",
        value_name = "KEY=VALUE[,KEY=VALUE]",
        value_delimiter = ','
    )]
    pub node_selector: Vec<String>,
    /// Let the agents run on nodes with this taint: KEY[=VALUE][:EFFECT], as
    /// `kubectl taint` writes it (repeatable); kept from the installation when
    /// not given, cleared by an empty value.
    #[arg(long = "toleration", value_name = "KEY[=VALUE][:EFFECT]")]
    pub tolerations: Vec<String>,
    /// Announce the cluster on the nodes' LAN with mDNS, from the gateway
    /// (docs/discovery.md); kept from the installation when not given,
    /// stopped by --announce=false.
    #[arg(
        long,
        value_name = "true|false",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub announce: Option<bool>,
    /// The URL of the API server that peers should use, announced with
    /// --announce; kept from the installation when not given, else the
    /// kubeconfig's server URL.
    #[arg(long, value_name = "URL")]
    pub advertise_address: Option<String>,
    /// The host (address or DNS name) peers' gateways dial to reach this
    /// cluster's tunnels; kept from the installation when not given, else
    /// the address of the gateway's node.
    #[arg(long, value_name = "HOST")]
    pub gateway_address: Option<String>,
    /// The UDP ports of the tunnels of incoming peerings, one each:
    /// FIRST-LAST; kept from the installation when not given (default
    /// 51820-51899).
    #[arg(long, value_name = "FIRST-LAST")]
    pub tunnel_ports: Option<String>,
    /// Put a Service of this type in front of the tunnels: peers then dial
    /// the node port (NodePort) or the load balancer's address
    /// (LoadBalancer) instead of the node's address at the tunnel's port;
    /// `None` removes it. Kept from the installation when not given
    /// (default None).
    #[arg(long, value_name = "NodePort|LoadBalancer|None")]
    pub gateway_service_type: Option<String>,
    /// Where the CIDRs of peers whose pod CIDR overlaps one of this
    /// cluster's networks are taken from: CIDR[,CIDR...]; kept from the
    /// installation when not given (default 100.64.0.0/10).
    #[arg(long, value_name = "CIDR[,CIDR...]")]
    pub remap_pool: Option<String>,
    /// The registry the nodes pull the agents' images from
    /// (REGISTRY/liqo-gateway:TAG, REGISTRY/liqo-virtual-kubelet:TAG); kept
    /// from the installation when not given (default ghcr.io/liqo-rs).
    #[arg(long, value_name = "HOST[:PORT][/PATH]")]
    pub image_registry: Option<String>,
    /// The agents' images' tag; kept from the installation when not given
    /// (default: this liqoctl's version).
    #[arg(long, value_name = "TAG")]
    pub image_tag: Option<String>,
    /// When the nodes pull the agents' images; kept from the installation
    /// when not given (default IfNotPresent, which uses an image loaded
    /// into the nodes by hand).
    #[arg(long, value_name = "Always|IfNotPresent|Never")]
    pub image_pull_policy: Option<String>,
    /// How long to wait for the agents to be ready, in seconds.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub timeout: u64,
    /// Print what would be applied (YAML unless -o json) and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Debug)]
pub struct UninstallArgs {
    /// Also remove the CRDs (and so every liqo-rs object left in the cluster).
    #[arg(long)]
    pub purge: bool,
    /// How long to wait for everything to be gone, in seconds.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub timeout: u64,
}

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

#[derive(Subcommand, Debug)]
pub enum TestCommand {
    /// Check that traffic crosses between the pods of peered clusters:
    /// pod to pod and pod to Service, both ways.
    #[command(
        long_about = "Check that traffic crosses between the pods of peered clusters: pod \
        to pod and pod to Service, both ways.\n\n\
        Run on the consumer. For each outgoing peering whose networks are linked (or those \
        named by --cluster-id), liqoctl makes a namespace offloaded to the providers, a \
        server pod and a Service on each side, and a client pod on each side that connects to \
        the other side's pod and Service; then it reports what answered, under which address \
        each side saw the other, and for what failed, which cluster, which hop, which \
        address and port. Everything it made is removed afterwards (--keep leaves it for \
        debugging). The pods run the gateway's image, on the nodes where the gateway runs \
        unless --node-selector or --toleration say otherwise.\n\n\
        Exits 0 when everything answered, 9 when a check failed."
    )]
    Network(TestNetworkArgs),
}

#[derive(Args, Debug)]
pub struct TestNetworkArgs {
    /// Check only the peering with this provider (repeatable); by default
    /// every outgoing peering.
    #[arg(long = "cluster-id", value_name = "ID")]
    pub cluster_ids: Vec<String>,
    /// Run the local test pods on nodes with these labels (repeatable); by
    /// default where the gateway runs.
    #[arg(
        long = "node-selector",
        value_name = "KEY=VALUE[,KEY=VALUE]",
        value_delimiter = ','
    )]
    pub node_selector: Vec<String>,
    /// Let the test pods run on nodes with this taint, KEY[=VALUE][:EFFECT]
    /// (repeatable; the providers' pods get it too); by default the
    /// gateway's tolerations.
    #[arg(long = "toleration", value_name = "KEY[=VALUE][:EFFECT]")]
    pub tolerations: Vec<String>,
    /// The image of the test pods: one with `liqo-gateway netcheck`.
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// How long the whole check may take, in seconds.
    #[arg(long, default_value_t = 180, value_name = "SECONDS")]
    pub timeout: u64,
    /// Leave the test namespace (and its twins) in place, for debugging.
    #[arg(long)]
    pub keep: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

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
    /// How long to wait for the twin namespaces to be gone, in seconds.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub timeout: u64,
}

#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(subcommand)]
    pub command: Option<InfoCommand>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Subcommand, Debug)]
pub enum InfoCommand {
    /// Show one peering in detail, outgoing or incoming.
    Peer(InfoPeerArgs),
}

#[derive(Args, Debug)]
pub struct InfoPeerArgs {
    /// The peer's cluster ID or cluster name.
    pub name: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Subcommand, Debug)]
pub enum SharingPolicyCommand {
    /// Create or update a sharing policy; what is not given is kept.
    #[command(
        long_about = "Create or update a sharing policy; what is not given is kept.\n\n\
        A new policy starts from the one that applies now: a consumer's from the `default` \
        policy (or the built-in default), `default` from the built-in default. Amounts are \
        absolute quantities or a share of the free allocatable capacity (`50%`). What the policy \
        admits beyond the amounts (--pod-security and the flags after it) applies at once to the \
        consumers it governs, and their provider's API server enforces it. Every value is \
        checked before anything is written."
    )]
    Set(Box<SharingPolicySetArgs>),
    /// Show the policy that applies, where it comes from, and what it offers now.
    Show(SharingPolicyShowArgs),
    /// Delete a sharing policy liqoctl set; peers then get the default.
    Delete(SharingPolicyPeerArg),
}

#[derive(Args, Debug)]
pub struct SharingPolicyPeerArg {
    /// The consumer's cluster ID, for its own policy; `default` when not given.
    #[arg(long, value_name = "CLUSTER_ID")]
    pub peer: Option<String>,
}

#[derive(Args, Debug)]
pub struct SharingPolicySetArgs {
    #[command(flatten)]
    pub peer: SharingPolicyPeerArg,
    /// CPU to offer: a quantity (4, 500m) or a share of the free CPU (50%).
    #[arg(long, value_name = "QUANTITY|N%")]
    pub cpu: Option<String>,
    /// Memory to offer: a quantity (8Gi) or a share of the free memory (50%).
    #[arg(long, value_name = "QUANTITY|N%")]
    pub memory: Option<String>,
    /// Pods to offer: a count (110) or a share of the free pod slots (50%).
    #[arg(long, value_name = "COUNT|N%")]
    pub pods: Option<String>,
    /// Price of one CPU for one hour (e.g. 0.02).
    #[arg(long, value_name = "PRICE")]
    pub cost_cpu_hour: Option<String>,
    /// Price of one GiB of memory for one hour (e.g. 0.005).
    #[arg(long, value_name = "PRICE")]
    pub cost_memory_gib_hour: Option<String>,
    /// The currency of the prices (e.g. EUR).
    #[arg(long, value_name = "CODE")]
    pub currency: Option<String>,
    /// Whether consumers that do not peer with this cluster yet may peer.
    #[arg(long, value_name = "true|false")]
    pub accept_new_peers: Option<bool>,
    /// The Pod Security level of the peer's namespaces on this cluster.
    #[arg(long, value_name = "restricted|baseline|privileged")]
    pub pod_security: Option<String>,
    /// The PriorityClasses the peer's pods may name, comma-separated
    /// ("" for none, the default).
    #[arg(long, value_name = "NAME,...")]
    pub priority_classes: Option<String>,
    /// The keys of this cluster's taints the peer's pods may tolerate,
    /// comma-separated ("" for none, the default).
    #[arg(long, value_name = "KEY,...")]
    pub tolerations: Option<String>,
    /// Node labels every pod of the peer must select, so that they run only
    /// on those nodes ("" for any node, the default).
    #[arg(long, value_name = "KEY=VALUE,...")]
    pub node_selector: Option<String>,
    /// The RuntimeClass every pod of the peer must use ("" for any, the
    /// default).
    #[arg(long, value_name = "NAME")]
    pub runtime_class: Option<String>,
    /// How many node ports the peer's Services may hold in each of its
    /// namespaces (0, the default, refuses NodePort Services).
    #[arg(long, value_name = "COUNT")]
    pub node_ports: Option<u32>,
    /// How many LoadBalancer Services the peer may hold in each of its
    /// namespaces (0, the default, refuses them).
    #[arg(long, value_name = "COUNT")]
    pub load_balancers: Option<u32>,
}

#[derive(Args, Debug)]
pub struct SharingPolicyShowArgs {
    #[command(flatten)]
    pub peer: SharingPolicyPeerArg,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Debug)]
pub struct DiscoverArgs {
    /// Browse the LAN with mDNS (the default without --domain).
    #[arg(long)]
    pub lan: bool,
    /// Read the DNS-SD records of this domain (repeatable).
    #[arg(long = "domain", value_name = "DOMAIN")]
    pub domains: Vec<String>,
    /// The DNS server to ask for --domain (default: the system's resolvers).
    #[arg(long, value_name = "ADDR[:PORT]")]
    pub dns_server: Option<String>,
    /// How long to browse the LAN, and to wait for each DNS answer: 3s, 500ms, 1m.
    #[arg(long, default_value = "3s", value_name = "DURATION")]
    pub timeout: String,
    /// Stop browsing the LAN as soon as this many clusters are found; fewer
    /// found within --timeout is a failure (exit 8).
    #[arg(long, value_name = "N")]
    pub expect: Option<usize>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Debug)]
pub struct DnsRecordsArgs {
    /// The domain the records go in.
    #[arg(long, value_name = "DOMAIN")]
    pub domain: String,
    /// The URL of the API server that peers should use (default: the
    /// installation's --advertise-address, else the kubeconfig's server URL).
    #[arg(long, value_name = "URL")]
    pub api_address: Option<String>,
    /// The records' time to live, in seconds.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub ttl: u32,
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

/// The CLI reference in docs/ is generated from these types; a test fails
/// when it drifts. Set LIQO_UPDATE_DOCS=1 to rewrite it.
#[cfg(test)]
mod reference {
    use clap::CommandFactory;

    fn render(cmd: &mut clap::Command, path: &str, out: &mut String) {
        let help = cmd.render_long_help().to_string();
        out.push_str(&format!(
            "## {path}\n\n```text\n{}\n```\n\n",
            help.trim_end()
        ));
        for sub in cmd.get_subcommands_mut() {
            if sub.is_hide_set() || sub.get_name() == "help" {
                continue;
            }
            let sub_path = format!("{path} {}", sub.get_name());
            render(sub, &sub_path, out);
        }
    }

    #[test]
    fn docs_cli_reference_matches_clap() {
        let mut cmd = super::Cli::command().term_width(100);
        cmd.build();
        let mut want = String::from(
            "# liqoctl command reference\n\n\
             Generated from liqoctl's clap definitions by its tests: do not edit.\n\
             Exit codes are described in [cli.md](cli.md).\n\n",
        );
        render(&mut cmd, "liqoctl", &mut want);
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli-reference.md");
        if std::env::var_os("LIQO_UPDATE_DOCS").is_some() {
            std::fs::write(&path, want.trim_end().to_owned() + "\n").expect("write the reference");
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want.trim_end().to_owned() + "\n",
            "docs/cli-reference.md differs from the CLI; run LIQO_UPDATE_DOCS=1 cargo test -p liqoctl reference"
        );
    }
}
