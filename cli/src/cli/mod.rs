//! The command line: clap types only, no behaviour.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

mod offloading;
mod peering;

pub use offloading::{
    MappingStrategyArg, OffloadCommand, OffloadNamespaceArgs, PodStrategyArg, UnoffloadCommand,
    UnoffloadNamespaceArgs,
};
pub use peering::{
    GenerateCommand, GeneratePeeringTokenArgs, NetworkArgs, NetworkCommand, PeerAcceptArgs,
    PeerArgs, PeerCompleteArgs, PeerExchange, PeerRequestArgs, RequestArgs, RevokeCommand,
    RevokePeeringTokenArgs, TetherArgs, UnpeerArgs, UntetherArgs,
};

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
    /// Hand this cluster's scheduling to one foreign cluster, its anchor.
    #[command(
        long_about = "Hand this cluster's scheduling to one foreign cluster, its anchor \
        (docs/tethering.md).\n\n\
        Peers the two clusters both ways, the anchor getting all this cluster's free capacity; \
        offloads every namespace of this cluster's workloads to the anchor alone (pods: \
        Remote); taints this cluster's own nodes so that its scheduler places nothing there \
        but what the anchor sends; and restarts the workloads' pods that run here, so that \
        they go through the anchor. Refused while this cluster provides for any other peer. A \
        failed run removes what it made; the same command resumes one that was stopped.\n\n\
        With a peering token of the anchor's (--token-file) instead of its kubeconfig, only \
        this cluster's side is made: it peers with the anchor through the token, and the \
        anchor's administrator peers back with a token of this cluster's to let the anchor's \
        pods run here (the command says how)."
    )]
    Tether(TetherArgs),
    /// Take this cluster's scheduling back from its anchor.
    #[command(long_about = "Take this cluster's scheduling back from its anchor \
        (docs/tethering.md).\n\n\
        Removes the taint from this cluster's nodes, ends the offloading of the namespaces the \
        tether offloaded (their pods on the anchor are deleted, and their controllers make them \
        again here), ends both peerings (the anchor's pods that ran here go back to the \
        anchor's own nodes), and puts back the sharing policy there was before. Namespaces and \
        workloads are kept; bare pods that ran through the anchor are not made again.\n\n\
        A tether made with a token is untethered without the anchor's kubeconfig: this \
        cluster's peering with the anchor ends with its own credential; a peering the anchor \
        made back with a token of this cluster's is left to the anchor's administrator (or \
        `liqoctl unpeer --tenant` here).")]
    Untether(UntetherArgs),
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

/// `--node-selector` and `--toleration`: the nodes a command's pods may
/// run on (parsed by `NodePlacementArgs::parse`). Each command that takes
/// them says what leaving them out means, with `mut_arg`.
#[derive(Args, Debug, Clone, Default)]
pub struct NodePlacementArgs {
    /// Run only on nodes with these labels (repeatable).
    #[arg(
        long = "node-selector",
        value_name = "KEY=VALUE[,KEY=VALUE]",
        value_delimiter = ','
    )]
    pub node_selector: Vec<String>,
    /// Tolerate this taint: KEY[=VALUE][:EFFECT], as `kubectl taint` writes
    /// it (repeatable).
    #[arg(long = "toleration", value_name = "KEY[=VALUE][:EFFECT]")]
    pub tolerations: Vec<String>,
}

#[derive(Args, Debug)]
#[command(
    mut_arg("node_selector", |a| a.help(
        "Run the agents only on nodes with these labels (repeatable); kept from the \
         installation when not given, cleared by an empty value"
    )),
    mut_arg("tolerations", |a| a.help(
        "Let the agents run on nodes with this taint: KEY[=VALUE][:EFFECT], as `kubectl taint` \
         writes it (repeatable); kept from the installation when not given, cleared by an \
         empty value"
    )),
)]
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
    /// The pod CIDR; found from the controller-manager, kubeadm, kube-proxy or the nodes when not given.
    #[arg(long, value_name = "CIDR")]
    pub pod_cidr: Option<String>,
    /// The service CIDR; found from the ServiceCIDR API when not given.
    #[arg(long, value_name = "CIDR")]
    pub service_cidr: Option<String>,
    #[command(flatten)]
    pub placement: NodePlacementArgs,
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
        the other side's pod and Service (the providers' also to the consumer's Service by \
        its clusterset name, which liqoctl exports); then it reports what answered, under \
        which address \
        each side saw the other, and for what failed, which cluster, which hop, which \
        address and port. Everything it made is removed afterwards (--keep leaves it for \
        debugging). The pods run the gateway's image, on the nodes where the gateway runs \
        unless --node-selector or --toleration say otherwise.\n\n\
        Exits 0 when everything answered, 9 when a check failed."
    )]
    Network(TestNetworkArgs),
}

#[derive(Args, Debug)]
#[command(
    mut_arg("node_selector", |a| a.help(
        "Run the local test pods on nodes with these labels (repeatable); by default where the \
         gateway runs"
    )),
    mut_arg("tolerations", |a| a.help(
        "Let the test pods run on nodes with this taint, KEY[=VALUE][:EFFECT] (repeatable; the \
         providers' pods get it too); by default the gateway's tolerations"
    )),
)]
pub struct TestNetworkArgs {
    /// Check only the peering with this provider (repeatable); by default
    /// every outgoing peering.
    #[arg(long = "cluster-id", value_name = "ID")]
    pub cluster_ids: Vec<String>,
    #[command(flatten)]
    pub placement: NodePlacementArgs,
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

#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(subcommand)]
    pub command: Option<InfoCommand>,
    #[command(flatten)]
    pub output: InfoOutputArgs,
}

#[derive(Args, Debug)]
pub struct InfoOutputArgs {
    /// Output format: `wide` adds columns to the tables (cluster IDs, cost,
    /// tenant namespaces, certificate expiry, offloading details), which
    /// otherwise fit the terminal.
    #[arg(long, short = 'o', value_enum)]
    pub output: Option<InfoFormat>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum InfoFormat {
    Wide,
    Json,
    Yaml,
}

impl InfoFormat {
    /// The structured format it names, if it is one.
    pub fn structured(self) -> Option<OutputFormat> {
        match self {
            Self::Wide => None,
            Self::Json => Some(OutputFormat::Json),
            Self::Yaml => Some(OutputFormat::Yaml),
        }
    }
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
    /// Persistent storage to offer, in all: a quantity (100Gi) or a share of
    /// the nodes' free ephemeral storage (20%); none by default. The peer
    /// claims it in the classes of --storage-classes.
    #[arg(long, value_name = "QUANTITY|N%")]
    pub storage: Option<String>,
    /// Claims to offer: a count (20) or a share of the free pod slots
    /// (10%); none by default.
    #[arg(long, value_name = "COUNT|N%")]
    pub claims: Option<String>,
    /// The least a grant is, whatever its share of the free capacity, e.g.
    /// cpu=1,memory=2Gi,pods=10 (each of cpu, memory, pods, storage, claims
    /// optional; "" for none).
    #[arg(long, value_name = "cpu=Q,memory=Q,pods=N")]
    pub floor: Option<String>,
    /// The most a grant is, whatever its share of the free capacity, e.g.
    /// cpu=8,memory=16Gi (each of cpu, memory, pods, storage, claims
    /// optional; "" for none).
    #[arg(long, value_name = "cpu=Q,memory=Q,pods=N")]
    pub ceiling: Option<String>,
    /// While a peering lasts, a grant given as shares follows the free
    /// capacity; a change smaller than this share of the grant is ignored
    /// (default 10%; "" for the default).
    #[arg(long, value_name = "N%")]
    pub change_threshold: Option<String>,
    /// The least time between two changes of one peer's grant, e.g. 30s or
    /// 5m (default 10s; "" for the default).
    #[arg(long, value_name = "DURATION")]
    pub min_change_interval: Option<String>,
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
    /// The Pod Security level of the peer's namespaces on this cluster
    /// (baseline by default).
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
    /// The StorageClasses the peer's claims may use, comma-separated, the
    /// first given to claims that name none ("" for none, the default:
    /// no claims).
    #[arg(long, value_name = "NAME,...")]
    pub storage_classes: Option<String>,
    /// How many node ports the peer's Services may hold in each of its
    /// namespaces (0, the default, refuses NodePort Services).
    #[arg(long, value_name = "COUNT")]
    pub node_ports: Option<u32>,
    /// How many LoadBalancer Services the peer may hold in each of its
    /// namespaces (0, the default, refuses them).
    #[arg(long, value_name = "COUNT")]
    pub load_balancers: Option<u32>,
    /// The local disk (ephemeral-storage) each container of the peer may
    /// use at most (4Gi by default).
    #[arg(long, value_name = "QUANTITY")]
    pub ephemeral_storage: Option<String>,
    /// How many objects of each kind (Services, ConfigMaps, Secrets,
    /// ReplicaSets, Jobs, EndpointSlices) the peer may hold in each of its
    /// namespaces (1000 by default).
    #[arg(long, value_name = "COUNT")]
    pub objects: Option<u32>,
    /// How many twin namespaces of the peer get a share of its grant, the
    /// oldest first (100 by default); one beyond holds nothing.
    #[arg(long, value_name = "COUNT")]
    pub namespaces: Option<u32>,
    /// Namespace names no peer may take beyond liqo, liqo-tenant-*, kube-*,
    /// default and *-system: those this cluster's installers will make
    /// (NAME, PREFIX* or *SUFFIX, comma-separated; "" for none).
    #[arg(long, value_name = "NAME,...")]
    pub reserved_namespaces: Option<String>,
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
