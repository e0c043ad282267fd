//! `liqo-gateway`: links the pod networks of peered clusters over a
//! userspace WireGuard tunnel.
//!
//! What runs today: the gateway follows the cluster's identity and the
//! peers (ForeignClusters) with reflectors, under the RBAC `liqoctl
//! install` gives it, and is ready exactly while both are known and
//! current: not while the API cannot be followed, not once the identity is
//! deleted or damaged. It keeps no state of its own: everything comes from
//! the API.
//!
//! The data plane ([`tunnel`]: the sans-IO WireGuard peer on boringtun;
//! [`io`]: the TUN device and UDP socket around it; [`nat`]: the route
//! of the peer's pods and the nftables table that remaps an overlapping
//! pod CIDR) also runs alone, as `liqo-gateway tunnel`, configured by
//! flags like `wg` and `ip` would configure a WireGuard interface: that is
//! how the tests and the benchmark run it against standard WireGuard.
//!
//! With `--announce` (`liqoctl install --announce`), the agent also
//! announces the cluster on the node's LAN with mDNS ([`announce`]),
//! following the identity; `liqo-gateway announce` runs the same
//! announcer from flags, without a cluster (docs/discovery.md).

mod announce;
mod control;
mod io;
mod metrics;
mod nat;
mod netcheck;
mod shares;
mod tunnel;

use std::net::SocketAddr;

use anyhow::Context as _;
use clap::Parser;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use liqo_agent_runtime::Readiness;
use liqo_agent_runtime::follow::{Followed, follow};
use liqo_api::ClusterIdentity;
use liqo_api::core::ForeignCluster;
use liqo_api::discovery::{ApiAddress, ClusterRecord};
use liqo_api::names;
use liqo_api::networking::Connection;
use tokio::sync::watch;

#[derive(Parser, Debug)]
#[command(version = liqo_api::VERSION, about = "The liqo-rs network gateway")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    agent: Args,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Runs one WireGuard tunnel configured by flags, without a cluster.
    Tunnel(TunnelArgs),
    /// Announces one cluster on the LAN with mDNS, configured by flags,
    /// without a cluster; until stopped, then says goodbye.
    Announce(AnnounceArgs),
    /// The pods of `liqoctl test network`: a server that says who called,
    /// and a prober that reports what answered.
    #[command(subcommand)]
    Netcheck(netcheck::Command),
}

#[derive(clap::Args, Debug)]
struct AnnounceArgs {
    /// The cluster ID to announce.
    #[arg(long)]
    cluster_id: String,
    /// The cluster name to announce (the mDNS instance name).
    #[arg(long)]
    cluster_name: String,
    /// A cluster label to announce, KEY=VALUE (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// The URL of the cluster's API server, as peers should reach it.
    #[arg(long, value_name = "URL")]
    api_address: String,
    /// Announce on this interface only (default: every interface).
    #[arg(long, value_name = "IFACE")]
    interface: Option<String>,
}

#[derive(clap::Args, Debug)]
struct TunnelArgs {
    /// The TUN device to create.
    #[arg(long, default_value = "liqo0")]
    interface: String,
    /// The device's address and prefix (the prefix's route goes through
    /// the tunnel); none by default: the peer's pods are routed by
    /// --peer-cidr.
    #[arg(long)]
    address: Option<ipnet::Ipv4Net>,
    /// The device's MTU: the link's less WireGuard's overhead.
    #[arg(long, default_value_t = 1500 - tunnel::OVERHEAD_V6)]
    mtu: u16,
    /// The UDP address to listen on.
    #[arg(long, default_value = "0.0.0.0:51820")]
    listen: SocketAddr,
    /// A file holding this side's private key (as `wg genkey` writes it);
    /// `-` reads it from standard input.
    #[arg(long)]
    private_key_file: std::path::PathBuf,
    /// The peer's public key.
    #[arg(long)]
    peer_public_key: tunnel::Key,
    /// Where the peer listens; without it, wait to be contacted.
    #[arg(long)]
    peer_endpoint: Option<SocketAddr>,
    /// Addresses the peer may send from and that are sent to it (the
    /// peer's pod CIDR, given with --peer-cidr, is added).
    #[arg(long, value_delimiter = ',')]
    allowed_ips: Vec<ipnet::IpNet>,
    /// The peer's pod CIDR, as the peer knows it: routed into the tunnel
    /// (or its remapped CIDR is), and allowed from and to the peer.
    #[arg(long)]
    peer_cidr: Option<ipnet::IpNet>,
    /// This cluster's pod CIDR: when the peer's overlaps it, the peer's
    /// pods are seen under a remapped CIDR taken from --remap-pool.
    #[arg(long, requires = "peer_cidr")]
    local_cidr: Option<ipnet::IpNet>,
    /// Other networks of this cluster that the peer's pod CIDR must not
    /// overlap either, and that a remapped CIDR must avoid (the service
    /// CIDR, other peers' CIDRs as seen here).
    #[arg(long, value_delimiter = ',', requires = "local_cidr")]
    avoid: Vec<ipnet::IpNet>,
    /// Where this cluster sees the peer's pods, instead of choosing from
    /// --remap-pool: the gateway translates with nftables (host part kept).
    #[arg(long, requires = "peer_cidr")]
    peer_remapped_cidr: Option<ipnet::IpNet>,
    /// Where remapped CIDRs are taken from.
    #[arg(long, value_delimiter = ',', default_value = liqo_api::networking::DEFAULT_REMAP_POOL)]
    remap_pool: Vec<ipnet::IpNet>,
    /// Seconds between keepalives (none by default).
    #[arg(long)]
    persistent_keepalive: Option<u16>,
    /// Do not ask the kernel for TUN offloads (GSO/GRO).
    #[arg(long)]
    no_offload: bool,
    /// Print the tunnel's counters on standard output every second, one
    /// JSON object a line (how the agent follows the tunnels it runs).
    #[arg(long)]
    report: bool,
}

#[derive(clap::Args, Debug)]
struct Args {
    /// Where to serve /healthz and /readyz.
    #[arg(long, env = "LIQO_HEALTH_ADDR", default_value = "0.0.0.0:8081")]
    health_addr: SocketAddr,
    /// The namespace of liqo-rs's objects (the pod's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = names::NAMESPACE)]
    namespace: String,
    /// Announce the cluster on the LAN with mDNS (off unless given:
    /// announcing multicasts on the node's networks).
    #[arg(long, requires = "advertise_address")]
    announce: bool,
    /// The URL of the API server that peers should use, announced with
    /// --announce.
    #[arg(long, value_name = "URL")]
    advertise_address: Option<String>,
    /// The host (address or DNS name) peers dial to reach this gateway's
    /// tunnels; without it, a listening connection publishes no endpoint.
    #[arg(long, value_name = "HOST")]
    endpoint_address: Option<String>,
    /// The tunnels are exposed by the Service `liqo-gateway` of this type
    /// in the agent's namespace: the endpoint published to peers is its
    /// node port (NodePort) or its load balancer's address (LoadBalancer,
    /// unless --endpoint-address names one).
    #[arg(long, value_name = "NodePort|LoadBalancer")]
    expose: Option<liqo_api::networking::GatewayServiceType>,
    /// The UDP ports the tunnels of incoming peerings listen on, one each.
    #[arg(long, value_name = "FIRST-LAST", default_value = "51820-51899", value_parser = parse_ports)]
    tunnel_ports: std::ops::RangeInclusive<u16>,
    /// Where the CIDRs that overlapping peers are seen under are taken from.
    #[arg(long, value_delimiter = ',', default_value = liqo_api::networking::DEFAULT_REMAP_POOL)]
    remap_pool: Vec<ipnet::IpNet>,
    /// The tunnel devices' MTU: the node network's less WireGuard's overhead.
    #[arg(long, default_value_t = 1500 - tunnel::OVERHEAD_V6)]
    mtu: u16,
    /// Run the tunnels (devices, sockets, routes, NAT tables) in this
    /// network namespace (a path such as /run/netns/NAME) rather than the
    /// agent's: to keep the peers' traffic in a namespace of its own, as
    /// the tests do with one namespace per simulated node.
    #[arg(long, value_name = "PATH")]
    tunnel_netns: Option<std::path::PathBuf>,
}

fn parse_ports(value: &str) -> Result<std::ops::RangeInclusive<u16>, String> {
    let (first, last) = value.split_once('-').unwrap_or((value, value));
    let port = |p: &str| {
        p.trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{p:?} is not a port (1-65535)"))
    };
    let (first, last) = (port(first)?, port(last)?);
    if first > last {
        return Err(format!(
            "{first}-{last} is empty: give FIRST-LAST, FIRST <= LAST"
        ));
    }
    Ok(first..=last)
}

impl Args {
    /// Where the API server is said to be when the agent announces; `None`
    /// when it does not.
    fn announcement(&self) -> anyhow::Result<Option<ApiAddress>> {
        if !self.announce {
            return Ok(None);
        }
        let url = self.advertise_address.as_deref().unwrap_or_default();
        Ok(Some(ApiAddress::parse(url)?))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    liqo_agent_runtime::init_logging();
    let cli = Cli::parse();
    let done = match cli.command {
        Some(Command::Tunnel(args)) => {
            // One line, which the agent that started it keeps as the
            // reason it ended (in the Connection's status).
            return Ok(match run_tunnel(args).await {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{}{e:#}", control::TUNNEL_FAILED);
                    std::process::ExitCode::FAILURE
                }
            });
        }
        Some(Command::Announce(args)) => run_announce(args).await,
        // Blocking, and alone in its process.
        Some(Command::Netcheck(command)) => {
            return tokio::task::spawn_blocking(move || netcheck::run(command)).await?;
        }
        None => run_agent(cli.agent).await,
    };
    done.map(|()| std::process::ExitCode::SUCCESS)
}

async fn run_tunnel(args: TunnelArgs) -> anyhow::Result<()> {
    let private_key: tunnel::Key = read_key(&args.private_key_file)
        .with_context(|| format!("reading {}", args.private_key_file.display()))?
        .parse()
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.private_key_file.display()))?;
    let peering = peering(&args)?;
    let mut allowed_ips = args.allowed_ips.clone();
    // Real addresses cross the tunnel: the peer's own pod CIDR.
    allowed_ips.extend(peering.as_ref().map(|p| p.peer));
    anyhow::ensure!(
        !allowed_ips.is_empty(),
        "give --allowed-ips, --peer-cidr or both: the peer would be allowed nothing"
    );
    let config = tunnel::PeerConfig {
        private_key,
        peer_public_key: args.peer_public_key,
        endpoint: args.peer_endpoint,
        allowed_ips,
        persistent_keepalive: args.persistent_keepalive,
    };
    let mut device = tun_rs::DeviceBuilder::new().name(&args.interface);
    if let Some(address) = args.address {
        device = device.ipv4(address.addr(), address.prefix_len(), None);
    }
    let device = device
        .mtu(args.mtu)
        .offload(!args.no_offload)
        .build_sync()
        .with_context(|| format!("creating the TUN device {}", args.interface))?;
    let socket = std::net::UdpSocket::bind(args.listen)
        .with_context(|| format!("listening on {}", args.listen))?;
    tracing::info!(
        interface = %args.interface,
        address = ?args.address,
        listen = %socket.local_addr()?,
        public_key = %config.private_key.public_of_private(),
        offload = !args.no_offload,
        "tunnel up"
    );
    // Before traffic flows: the table (or the removal of one an earlier
    // run left), then the route. The route goes with the device.
    let _nat = match peering {
        None => None,
        Some(peering) => {
            let routed = peering.routed();
            let installed =
                nat::Installed::install(peering.clone()).context("installing the NAT table")?;
            nat::route(routed, &args.interface).context("routing the peer's pods")?;
            tracing::info!(
                peer_cidr = %peering.peer,
                seen_as = %routed,
                table = %peering.seen_as.map(|_| peering.table()).unwrap_or_else(|| "none".into()),
                "routed into the tunnel"
            );
            Some(installed)
        }
    };
    let mut peer = tunnel::Peer::new(&config, 0);
    // Round-trip probes between the two pod CIDRs' network addresses.
    if let (Some(ipnet::IpNet::V4(local)), Some(ipnet::IpNet::V4(theirs))) =
        (args.local_cidr, args.peer_cidr)
    {
        peer = peer.with_probes(local.network(), theirs.network());
    }
    let report: io::Report = if args.report {
        Box::new(control::Report::printer())
    } else {
        Box::new(|_: &tunnel::Stats| {})
    };
    // The data plane runs on threads of its own; this one waits for a
    // signal or for them to fail.
    // (Not the runtime's blocking pool: the runtime would wait for them
    // at exit.)
    let (done, tunnel) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("tunnel".into())
        .spawn(move || {
            let _ = done.send(io::run(device, socket, peer, report));
        })
        .context("starting the tunnel's threads")?;
    tokio::select! {
        result = tunnel => result.context("the tunnel's threads ended")?.context("tunnel IO")?,
        () = liqo_agent_runtime::shutdown_signal() => {}
    }
    Ok(())
}

/// The key file's text, or standard input's for `-`.
fn read_key(path: &std::path::Path) -> std::io::Result<String> {
    if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    }
}

async fn run_announce(args: AnnounceArgs) -> anyhow::Result<()> {
    use liqo_api::discovery::txt_keys;
    // Checked as a browser would check it: what is announced can be read.
    let mut txt = vec![
        (txt_keys::ID.to_owned(), args.cluster_id),
        (txt_keys::NAME.to_owned(), args.cluster_name),
        (txt_keys::API.to_owned(), args.api_address),
        (txt_keys::VERSION.to_owned(), liqo_api::VERSION.to_owned()),
    ];
    for label in &args.labels {
        let (key, value) = label
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--label {label:?} is not KEY=VALUE"))?;
        txt.push((format!("{}{key}", txt_keys::LABEL_PREFIX), value.to_owned()));
    }
    let record = ClusterRecord::from_txt(txt)?;
    let (_keep, records) = watch::channel(Some(record));
    announce::announce(
        args.interface.as_deref(),
        records,
        liqo_agent_runtime::shutdown_signal(),
    )
    .await
}

/// What the flags say about the peer's pods: where they are, and where
/// this cluster sees them.
fn peering(args: &TunnelArgs) -> anyhow::Result<Option<nat::Peering>> {
    use liqo_api::networking::{overlap, remap};
    let Some(peer) = args.peer_cidr.map(|c| c.trunc()) else {
        return Ok(None);
    };
    let seen_as = match (args.peer_remapped_cidr, args.local_cidr) {
        (Some(remapped), local) => {
            let remapped = remapped.trunc();
            anyhow::ensure!(
                remapped.prefix_len() == peer.prefix_len()
                    && remapped.max_prefix_len() == peer.max_prefix_len(),
                "--peer-remapped-cidr {remapped} must be of the family and length of \
                 --peer-cidr {peer}: the host part is kept"
            );
            if let Some(clash) = local
                .iter()
                .chain(&args.avoid)
                .find(|n| overlap(n, &remapped))
            {
                anyhow::bail!(
                    "--peer-remapped-cidr {remapped} overlaps {clash}, which this cluster uses: \
                     choose another"
                );
            }
            Some(remapped)
        }
        (None, Some(local)) => remap(local, peer, &args.remap_pool, &args.avoid)?,
        (None, None) => None,
    };
    Ok(Some(nat::Peering {
        device: args.interface.clone(),
        peer,
        seen_as,
    }))
}

async fn run_agent(args: Args) -> anyhow::Result<()> {
    let announcement = args.announcement()?;
    let readiness = Readiness::default();
    let listener = liqo_agent_runtime::bind_health(args.health_addr).await?;
    tracing::info!(version = liqo_api::VERSION, health = %args.health_addr, "gateway starting");
    // KUBECONFIG when set, else the pod's service account.
    let client = liqo_agent_runtime::client::client(kube::Config::infer().await?)?;

    // The RBAC grants this one ConfigMap by name, so the watch must name it.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
    let (identity, follow_identity) = follow(
        maps,
        watcher::Config::default().fields(&format!("metadata.name={}", names::IDENTITY_CONFIGMAP)),
        "identity",
    );
    let (peers, follow_peers) = follow(
        Api::<ForeignCluster>::all(client.clone()),
        watcher::Config::default(),
        "peers",
    );
    let (connections, follow_connections) = follow(
        Api::<Connection>::all(client.clone()),
        watcher::Config::default(),
        "connections",
    );
    // The Service in front of the tunnels, when there is one; the RBAC
    // grants it by name.
    let (service, follow_service) = args
        .expose
        .map(|_| {
            follow(
                Api::<Service>::namespaced(client.clone(), &args.namespace),
                watcher::Config::default().fields(&format!("metadata.name={}", names::GATEWAY)),
                "service",
            )
        })
        .unzip();
    let key = control::ensure_key(&client, &args.namespace)
        .await
        .context("the gateway's key")?;
    tracing::info!(public_key = %key.public_of_private(), "key pair ready");
    // On a provider: the tenants' grants, split across their namespaces.
    let keep_shares = shares::keep(client.clone());
    let tunnels = control::Tunnels::new(
        client,
        control::Settings {
            instance: key.public_of_private(),
            namespace: args.namespace.clone(),
            endpoint_host: args.endpoint_address.clone(),
            exposed_by: args.expose,
            listen_address: control::listen_address(args.endpoint_address.as_deref()),
            ports: args.tunnel_ports.clone(),
            remap_pool: args.remap_pool.clone(),
            mtu: args.mtu,
            netns: args.tunnel_netns.clone(),
        },
        key,
    );
    let observed = tunnels.observed.clone();
    let metrics = liqo_agent_runtime::axum::Router::new().route(
        "/metrics",
        liqo_agent_runtime::axum::routing::get(move || {
            let text = metrics::render(&observed);
            async move {
                (
                    [(
                        "content-type",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    text,
                )
            }
        }),
    );
    let (records, announced) = watch::channel(None);
    let (stop_tunnels, tunnels_stop) = watch::channel(false);
    let run_tunnels = tokio::spawn(run_tunnels(
        tunnels,
        identity.clone(),
        ObjectRef::new(names::IDENTITY_CONFIGMAP).within(&args.namespace),
        connections.clone(),
        service,
        tunnels_stop,
    ));
    let state = State {
        identity,
        identity_ref: ObjectRef::new(names::IDENTITY_CONFIGMAP).within(&args.namespace),
        peers,
        connections,
        announcement: announcement.clone().map(|api| (api, records)),
    };
    // Without --announce nothing is sent on the LAN: no responder starts.
    // With it, the announcer is told to stop when the agent stops, so
    // that it says goodbye.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut announcing = announcement.is_some().then(|| {
        tokio::spawn(announce::announce(None, announced, async {
            let _ = stopped.await;
        }))
    });
    let announcer_failed = async {
        match announcing.as_mut() {
            Some(task) => task.await,
            None => std::future::pending().await,
        }
    };
    let result = run_until_stopped(
        listener,
        metrics,
        readiness,
        async move {
            let follow_service = async {
                if let Some(task) = follow_service {
                    task.await;
                }
            };
            tokio::join!(
                follow_identity,
                follow_peers,
                follow_connections,
                follow_service,
                keep_shares
            );
        },
        state,
        announcer_failed,
    )
    .await;
    let _ = stop.send(());
    // The tunnels' processes remove their routes and tables.
    stop_tunnels.send_replace(true);
    let _ = run_tunnels.await;
    if let Some(task) = announcing
        && !task.is_finished()
    {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(3), task).await;
    }
    result
}

async fn run_until_stopped(
    listener: tokio::net::TcpListener,
    more_routes: liqo_agent_runtime::axum::Router,
    readiness: Readiness,
    following: impl Future<Output = ()>,
    state: State,
    announcer: impl Future<Output = Result<anyhow::Result<()>, tokio::task::JoinError>>,
) -> anyhow::Result<()> {
    tokio::select! {
        result = liqo_agent_runtime::serve_health_with(listener, readiness.clone(), more_routes) => result?,
        result = announcer => result.map_err(anyhow::Error::from).and_then(|r| r).context("announcing on the LAN")?,
        () = following => {}
        () = state.keep_readiness(&readiness) => {}
        () = liqo_agent_runtime::shutdown_signal() => {}
    }
    Ok(())
}

/// Keeps one tunnel running for each Connection, from the identity and
/// the Connections, until `stop` says so; then stops them all.
async fn run_tunnels(
    mut tunnels: control::Tunnels,
    identity: Followed<ConfigMap>,
    identity_ref: ObjectRef<ConfigMap>,
    mut connections: Followed<Connection>,
    service: Option<Followed<Service>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut identity_state = identity.state.clone();
    let mut service_state = service.as_ref().map(|s| s.state.clone());
    loop {
        // Only from a complete list: a tunnel is never stopped because
        // the store has not seen its Connection yet.
        if connections.is_current() {
            let local = identity
                .store
                .get(
                    identity_ref.namespace.as_deref().unwrap_or_default(),
                    &identity_ref.name,
                )
                .and_then(|map| {
                    ClusterIdentity::from_data(&map.data.clone().unwrap_or_default()).ok()
                })
                .map(|id| control::Local::of(&id, control::node_networks()))
                .unwrap_or_default();
            let exposure = service
                .as_ref()
                .and_then(|s| s.store.state().into_iter().next());
            tunnels
                .converge(&local, &connections.store.state(), exposure.as_deref())
                .await;
        }
        // Counters and exited processes are looked at every second too.
        tokio::select! {
            _ = stop.changed() => break,
            _ = connections.state.changed() => {}
            _ = identity_state.changed() => {}
            Some(_) = async {
                match service_state.as_mut() {
                    Some(state) => Some(state.changed().await),
                    None => std::future::pending().await,
                }
            } => {}
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
    tunnels.stop_all().await;
}

/// What the gateway follows.
struct State {
    identity: Followed<ConfigMap>,
    identity_ref: ObjectRef<ConfigMap>,
    peers: Followed<ForeignCluster>,
    connections: Followed<Connection>,
    /// With --announce: the API address, and where to send the record to
    /// announce whenever the identity changes.
    announcement: Option<(ApiAddress, watch::Sender<Option<ClusterRecord>>)>,
}

/// What the gateway knows, as it logs it when it changes.
#[derive(Debug, PartialEq)]
struct Known {
    identity: Result<ClusterIdentity, String>,
    peers: Vec<(String, String)>,
}

impl State {
    /// Re-evaluates readiness whenever either store changes: ready when
    /// both stores are current and the identity is present and valid.
    async fn keep_readiness(mut self, readiness: &Readiness) {
        let mut last: Option<Known> = None;
        loop {
            let known = self.known();
            if last.as_ref() != Some(&known) {
                match &known.identity {
                    Ok(id) => {
                        tracing::info!(cluster_id = %id.cluster_id, name = %id.cluster_name, "identity")
                    }
                    Err(why) => tracing::warn!(%why, "no usable identity"),
                }
                tracing::info!(peers = ?known.peers, "peers");
                if let Some((api, records)) = &self.announcement {
                    // A damaged or deleted identity is no longer announced.
                    let record = known
                        .identity
                        .as_ref()
                        .ok()
                        .map(|id| ClusterRecord::of(id, api.clone()));
                    records.send_replace(record);
                }
            }
            readiness.set(
                self.identity.is_current()
                    && self.peers.is_current()
                    && self.connections.is_current()
                    && known.identity.is_ok(),
            );
            last = Some(known);
            tokio::select! {
                changed = self.identity.state.changed() => if changed.is_err() { return },
                changed = self.peers.state.changed() => if changed.is_err() { return },
                changed = self.connections.state.changed() => if changed.is_err() { return },
            }
        }
    }

    fn known(&self) -> Known {
        let identity = match self.identity.store.get(
            self.identity_ref.namespace.as_deref().unwrap_or_default(),
            &self.identity_ref.name,
        ) {
            None => Err(format!(
                "the ConfigMap {} does not exist",
                names::IDENTITY_CONFIGMAP
            )),
            Some(map) => {
                ClusterIdentity::from_data(&map.data.clone().unwrap_or_default()).map_err(|e| {
                    format!(
                        "the ConfigMap {} is damaged: {e}",
                        names::IDENTITY_CONFIGMAP
                    )
                })
            }
        };
        let mut peers: Vec<(String, String)> = self
            .peers
            .store
            .state()
            .iter()
            .map(|fc| (fc.spec.cluster_name.clone(), fc.spec.cluster_id.to_string()))
            .collect();
        peers.sort();
        Known { identity, peers }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Announcing is off by default: the agent starts no mDNS responder
    /// unless `liqoctl install --announce` gave it the flag.
    #[test]
    fn the_agent_announces_only_with_announce() {
        let cli = Cli::try_parse_from(["liqo-gateway"]).expect("no flags");
        assert_eq!(cli.agent.announcement().expect("valid"), None);
        let cli =
            Cli::try_parse_from(["liqo-gateway", "--advertise-address=https://10.0.0.1:6443"])
                .expect("an address alone");
        assert_eq!(cli.agent.announcement().expect("valid"), None);
        let cli = Cli::try_parse_from([
            "liqo-gateway",
            "--announce",
            "--advertise-address=https://10.0.0.1:6443",
        ])
        .expect("both");
        let api = cli.agent.announcement().expect("valid").expect("announces");
        assert_eq!(api.port(), 6443);
        assert!(Cli::try_parse_from(["liqo-gateway", "--announce"]).is_err());
    }

    /// What `liqo-gateway tunnel` with these flags routes, and under what.
    fn peering_of(extra: &[&str]) -> anyhow::Result<Option<nat::Peering>> {
        let base = [
            "liqo-gateway",
            "tunnel",
            "--address",
            "10.99.0.1/24",
            "--private-key-file",
            "k",
            "--peer-public-key",
            "29QfL/gCYN3ASZ39Gf7A/UOqE+SFK1jbHwKLwaTgVhs=",
        ];
        let cli = Cli::try_parse_from(base.iter().chain(extra))?;
        let Some(Command::Tunnel(args)) = cli.command else {
            anyhow::bail!("not the tunnel command");
        };
        peering(&args)
    }

    fn net(s: &str) -> ipnet::IpNet {
        s.parse().expect("cidr")
    }

    #[test]
    fn the_peer_is_remapped_only_when_it_overlaps_something_of_ours() -> anyhow::Result<()> {
        assert_eq!(peering_of(&[])?, None);
        let p = |extra: &[&str]| -> anyhow::Result<(ipnet::IpNet, Option<ipnet::IpNet>)> {
            let p = peering_of(extra)?.expect("a peering");
            assert_eq!(p.device, "liqo0");
            Ok((p.peer, p.seen_as))
        };
        let local = ["--local-cidr", "10.200.0.0/16"];
        // Disjoint, or nothing known of ours: seen as it is.
        assert_eq!(
            p(&["--peer-cidr", "10.201.0.0/16", local[0], local[1]])?,
            (net("10.201.0.0/16"), None)
        );
        assert_eq!(
            p(&["--peer-cidr", "10.200.0.0/16"])?,
            (net("10.200.0.0/16"), None)
        );
        // Identical: the default pool's first /16; the service CIDR too.
        assert_eq!(
            p(&["--peer-cidr", "10.200.0.0/16", local[0], local[1]])?,
            (net("10.200.0.0/16"), Some(net("100.64.0.0/16")))
        );
        assert_eq!(
            p(&[
                "--peer-cidr",
                "10.96.0.0/16",
                local[0],
                local[1],
                "--avoid",
                "10.96.0.0/12,100.64.0.0/16"
            ])?,
            (net("10.96.0.0/16"), Some(net("100.65.0.0/16")))
        );
        // Given: taken as it is, even without overlap.
        assert_eq!(
            p(&[
                "--peer-cidr",
                "10.201.0.0/16",
                "--peer-remapped-cidr",
                "10.202.9.9/16"
            ])?,
            (net("10.201.0.0/16"), Some(net("10.202.0.0/16")))
        );
        // Flags that mean nothing alone.
        assert!(peering_of(&local).is_err());
        assert!(peering_of(&["--peer-remapped-cidr", "10.202.0.0/16"]).is_err());
        Ok(())
    }
}
