//! The control layer: one tunnel for each [`Connection`] of the cluster,
//! run as the gateway's own `tunnel` subcommand in a child process, and
//! the status each one reports.
//!
//! - **Keys**: the gateway makes its WireGuard key pair on its first start,
//!   keeps the private key in the Secret `liqo-gateway-key` of its own
//!   namespace (it never leaves the cluster: children get it on standard
//!   input) and publishes the public key in the ConfigMap `liqo-gateway`,
//!   where `liqoctl` reads it to hand it to peers.
//! - **Decisions** ([`plan`], pure): where the cluster sees each peer's
//!   pods (remapped from the pool when the peer's pod CIDR overlaps the
//!   local pod or service CIDR, a network of the node, or where another
//!   peer is seen), and the UDP port each listening side takes from the
//!   configured range. A decision already in a status is kept while it
//!   stays valid, so restarts change nothing; everything else is decided
//!   again from the API, since the gateway keeps no state of its own.
//! - **Tunnels**: a child process each, so that one tunnel's failure or
//!   reconfiguration touches no other, and stopping one (SIGTERM) removes
//!   its route and NAT table. Children die with the agent
//!   (`PR_SET_PDEATHSIG`); a new agent starts them again.
//! - **Status**: every child prints its counters once a second; the
//!   status is written when a condition or decision changes, and the
//!   counters at most every [`COUNTERS_EVERY`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt as _};
use liqo_api::ClusterIdentity;
use liqo_api::names::{self, labels};
use liqo_api::networking::{
    Connection, ConnectionStatus, GatewayServiceType, conditions, device_name, overlap,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

use crate::tunnel::{Key, Stats};

/// The most often counters alone are written to a status.
pub const COUNTERS_EVERY: Duration = Duration::from_secs(10);
/// A session is good for this long after its handshake (WireGuard's
/// REJECT_AFTER_TIME): later, the tunnel is not established.
const SESSION: Duration = Duration::from_secs(180);
/// The least time between two starts of one tunnel's process.
const RESTART_BACKOFF: Duration = Duration::from_secs(5);
/// What a tunnel process writes before it exits on an error (one line,
/// the whole chain of causes), so that the agent can say why it ended.
pub const TUNNEL_FAILED: &str = "tunnel failed: ";
/// The field manager of what the gateway writes.
const MANAGER: &str = "liqo-gateway";
/// Keepalive of both sides: keeps NAT mappings on the way open, lets the
/// listening side learn the dialer's endpoint before any traffic, and
/// lets each side tell that the other is alive ([`HEARD_WITHIN`]).
const KEEPALIVE_SECONDS: u16 = 10;
/// A tunnel is established while the peer was heard from this recently
/// (three keepalives) and its session is current.
const HEARD_WITHIN: Duration = Duration::from_secs(30);

/// How the agent runs tunnels: from its flags.
#[derive(Debug, Clone)]
pub struct Settings {
    /// What sets this gateway's tunnel devices apart from another's on
    /// the same host: its public key.
    pub instance: String,
    /// The gateway's namespace: connections there dial their provider;
    /// connections anywhere else (tenant namespaces) listen.
    pub namespace: String,
    /// The host peers dial (an address or a DNS name), published with the
    /// port in the status of listening connections.
    pub endpoint_host: Option<String>,
    /// The Service in front of the listening tunnels, if any: the
    /// published endpoint comes from it (see [`published_endpoint`]).
    pub exposed_by: Option<GatewayServiceType>,
    /// Where tunnels bind: the endpoint's address when it is one of the
    /// node's (so that answers leave from the address peers dial, on a
    /// node with several), else every address.
    pub listen_address: std::net::IpAddr,
    /// The UDP ports listening connections take, one each.
    pub ports: std::ops::RangeInclusive<u16>,
    pub remap_pool: Vec<IpNet>,
    /// The tunnel devices' MTU.
    pub mtu: u16,
    /// The network namespace the tunnels (their devices, sockets, routes
    /// and tables) live in, when not the agent's own.
    pub netns: Option<std::path::PathBuf>,
}

/// A tunnel's counters, as its process prints them (one JSON object a
/// line) and the agent reads them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub since_handshake_ms: Option<u64>,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub dropped: u64,
    pub endpoint: Option<SocketAddr>,
    pub handshake_rtt_ms: Option<u64>,
    #[serde(default)]
    pub since_heard_ms: Option<u64>,
    /// The last probe's round trip through the tunnel, in milliseconds.
    #[serde(default)]
    pub probe_rtt_ms: Option<f64>,
}

impl Report {
    fn of(stats: &Stats) -> Self {
        Self {
            since_handshake_ms: stats.since_last_handshake.map(|d| d.as_millis() as u64),
            tx_bytes: stats.tx_bytes,
            rx_bytes: stats.rx_bytes,
            dropped: stats.dropped,
            endpoint: stats.endpoint,
            handshake_rtt_ms: stats.handshake_rtt.map(|d| d.as_millis() as u64),
            since_heard_ms: stats.since_heard.map(|d| d.as_millis() as u64),
            probe_rtt_ms: stats.probe_rtt.map(|d| d.as_secs_f64() * 1000.0),
        }
    }

    /// What `tunnel --report` calls every tick: prints a line about once
    /// a second.
    pub fn printer() -> impl FnMut(&Stats) + Send {
        use std::io::Write as _;
        let mut last: Option<Instant> = None;
        move |stats| {
            if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
                return;
            }
            last = Some(Instant::now());
            let line = serde_json::to_string(&Report::of(stats)).unwrap_or_default();
            let mut out = std::io::stdout().lock();
            // The agent reading it is gone: nothing to tell anyone.
            let _ = writeln!(out, "{line}").and_then(|()| out.flush());
        }
    }

    pub fn established(&self) -> bool {
        let within = |ms: Option<u64>, limit: Duration| {
            ms.is_some_and(|ms| Duration::from_millis(ms) < limit)
        };
        within(self.since_handshake_ms, SESSION) && within(self.since_heard_ms, HEARD_WITHIN)
    }
}

/// Makes the gateway's key pair unless its Secret holds one, and
/// publishes the public key. Refuses a Secret or ConfigMap of that name
/// that is not ours.
pub async fn ensure_key(client: &kube::Client, namespace: &str) -> anyhow::Result<Key> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = match secrets.get_opt(names::GATEWAY_KEY_SECRET).await? {
        Some(secret) => secret,
        None => {
            let key = Key::generate();
            let secret = Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(names::GATEWAY_KEY_SECRET.to_owned()),
                    labels: Some(our_labels()),
                    ..Default::default()
                },
                type_: Some(names::GATEWAY_KEY_SECRET_TYPE.to_owned()),
                string_data: Some(BTreeMap::from([(
                    names::GATEWAY_PRIVATE_KEY.to_owned(),
                    key.expose(),
                )])),
                ..Default::default()
            };
            match secrets.create(&PostParams::default(), &secret).await {
                Ok(created) => created,
                // Another gateway made it first: use that one.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    secrets.get(names::GATEWAY_KEY_SECRET).await?
                }
                Err(e) => return Err(e).context("creating the gateway's key Secret"),
            }
        }
    };
    anyhow::ensure!(
        is_ours(secret.labels()),
        "the Secret {namespace}/{} exists and is not liqo's: remove or rename it",
        names::GATEWAY_KEY_SECRET
    );
    let key: Key = secret
        .data
        .as_ref()
        .and_then(|d| d.get(names::GATEWAY_PRIVATE_KEY))
        .and_then(|v| std::str::from_utf8(&v.0).ok())
        .ok_or_else(|| anyhow::anyhow!("the gateway's key Secret holds no private key"))?
        .parse()
        .map_err(|e| anyhow::anyhow!("the gateway's key Secret is damaged: {e}"))?;

    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    if let Some(map) = maps.get_opt(names::GATEWAY_CONFIGMAP).await? {
        anyhow::ensure!(
            is_ours(map.labels()),
            "the ConfigMap {namespace}/{} exists and is not liqo's: remove or rename it",
            names::GATEWAY_CONFIGMAP
        );
    }
    let map = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": names::GATEWAY_CONFIGMAP, "labels": our_labels() },
        "data": { names::GATEWAY_PUBLIC_KEY: key.public_of_private() },
    });
    maps.patch(
        names::GATEWAY_CONFIGMAP,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(map),
    )
    .await
    .context("publishing the gateway's public key")?;
    Ok(key)
}

pub(crate) fn our_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        ),
        (labels::COMPONENT.to_owned(), "gateway".to_owned()),
    ])
}

pub(crate) fn is_ours(l: &BTreeMap<String, String>) -> bool {
    l.get(labels::MANAGED_BY).map(String::as_str) == Some(labels::MANAGED_BY_VALUE)
}

/// What the gateway decided for one connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub object: ObjectRef<Connection>,
    pub peer_id: String,
    /// The tunnel, or why it cannot run.
    pub tunnel: Result<TunnelPlan, String>,
}

/// One tunnel as its process runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelPlan {
    pub device: String,
    pub peer_public_key: String,
    /// Where to dial (the dialing side); none on the listening side.
    pub endpoint: Option<String>,
    /// The UDP port to listen on: 0 (any) when dialing.
    pub port: u16,
    pub peer_cidr: IpNet,
    /// Where this cluster sees the peer's pods.
    pub seen_as: IpNet,
    /// This cluster's pod CIDR (round-trip probes go from its network
    /// address to the peer's).
    pub local_cidr: Option<IpNet>,
}

/// The local networks a peer's pods must not be seen in.
#[derive(Debug, Clone, Default)]
pub struct Local {
    pub pod_cidr: Option<IpNet>,
    pub service_cidr: Option<IpNet>,
    /// The node's own networks (its interfaces').
    pub node: Vec<IpNet>,
}

impl Local {
    pub fn of(identity: &ClusterIdentity, node: Vec<IpNet>) -> Self {
        Self {
            pod_cidr: Some(identity.pod_cidr),
            service_cidr: Some(identity.service_cidr),
            node,
        }
    }
}

/// Decides, for every connection, the port it listens on and where the
/// peer's pods are seen. Pure: the same objects give the same plan.
/// Connections are taken oldest first, so a newer one never takes what
/// an older one holds, and a decision in a status is kept while valid.
pub fn plan(local: &Local, connections: &[Arc<Connection>], settings: &Settings) -> Vec<Planned> {
    let mut sorted: Vec<&Arc<Connection>> = connections
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .collect();
    sorted.sort_by_key(|c| {
        (
            c.metadata.creation_timestamp.clone().map(|t| t.0),
            c.namespace(),
            c.name_any(),
        )
    });
    // What a peer may not be seen in: ours, then each planned peer's view.
    let mut taken: Vec<IpNet> = local
        .service_cidr
        .iter()
        .chain(&local.node)
        .copied()
        .collect();
    let mut ports: BTreeSet<u16> = BTreeSet::new();
    let mut devices: BTreeSet<String> = BTreeSet::new();
    // Listening sides keep their port first, so that a newer connection
    // never takes a port an older one held but had not been seen with.
    // (Statuses written before `listenPort` existed have it in the
    // endpoint, which had no Service in front then.)
    let kept_port = |c: &Connection| -> Option<u16> {
        let status = c.status.as_ref()?;
        status
            .listen_port
            .or_else(|| status.endpoint.as_deref()?.rsplit_once(':')?.1.parse().ok())
            .filter(|p| settings.ports.contains(p))
    };
    sorted
        .into_iter()
        .map(|c| {
            let object = ObjectRef::from_obj(c.as_ref());
            let peer_id = c.spec.cluster_id.to_string();
            let tunnel = (|| {
                let namespace = c.namespace().unwrap_or_default();
                let device = device_name(&settings.instance, &namespace, &c.spec.cluster_id);
                if !devices.insert(device.clone()) {
                    return Err(format!(
                        "an older connection in {namespace} stands for the same peer: \
                         one tunnel per peer"
                    ));
                }
                // Only connections our administrator wrote dial out: a
                // tenant's connection never makes the provider send anywhere.
                let endpoint = c
                    .spec
                    .endpoint
                    .clone()
                    .filter(|_| namespace == settings.namespace);
                let peer_cidr =
                    liqo_api::networking::parse_cidr("the peer's pod CIDR", &c.spec.pod_cidr)?;
                if let Some(what) = liqo_api::networking::reserved_overlap(&peer_cidr) {
                    return Err(format!("the peer's pod CIDR {peer_cidr} overlaps {what}"));
                }
                let ours: Vec<IpNet> = local.pod_cidr.iter().chain(&taken).copied().collect();
                let free = |net: &IpNet| !ours.iter().any(|n| overlap(n, net));
                let kept = c
                    .status
                    .as_ref()
                    .and_then(|s| s.peer_seen_as.as_deref())
                    .and_then(|s| s.parse::<IpNet>().ok())
                    .filter(|s| {
                        s.prefix_len() == peer_cidr.prefix_len()
                            && (*s == peer_cidr || !overlap(s, &peer_cidr))
                            && free(s)
                    });
                let seen_as = match kept {
                    Some(kept) => kept,
                    None => match local.pod_cidr {
                        Some(pod_cidr) => liqo_api::networking::remap(
                            pod_cidr,
                            peer_cidr,
                            &settings.remap_pool,
                            &taken,
                        )
                        .map_err(|e| e.to_string())?
                        .unwrap_or(peer_cidr),
                        None => return Err("the cluster's identity is not known".into()),
                    },
                };
                let port = match &endpoint {
                    Some(_) => 0,
                    None => {
                        let port = kept_port(c)
                            .filter(|p| !ports.contains(p))
                            .or_else(|| settings.ports.clone().find(|p| !ports.contains(p)))
                            .ok_or_else(|| {
                                format!(
                                    "every port of {}-{} is taken: widen --tunnel-ports",
                                    settings.ports.start(),
                                    settings.ports.end()
                                )
                            })?;
                        ports.insert(port);
                        port
                    }
                };
                taken.push(seen_as);
                Ok(TunnelPlan {
                    device,
                    peer_public_key: c.spec.public_key.clone(),
                    endpoint,
                    port,
                    peer_cidr,
                    seen_as,
                    local_cidr: local.pod_cidr,
                })
            })();
            Planned {
                object,
                peer_id,
                tunnel,
            }
        })
        .collect()
}

/// One running tunnel process.
struct Child {
    plan: TunnelPlan,
    process: tokio::process::Child,
    reports: watch::Receiver<Option<Report>>,
    /// The error the process wrote before exiting, if it did.
    failure: watch::Receiver<Option<String>>,
}

/// What the agent shares with its metrics endpoint: each connection's
/// last report.
pub type Observed = Arc<RwLock<BTreeMap<String, (Planned, Option<Report>)>>>;

/// The tunnels the connections ask for, and what was written of them:
/// [`Tunnels::converge`] is called whenever the connections or the
/// identity change, and every second (counters, exited processes).
pub struct Tunnels {
    client: kube::Client,
    settings: Settings,
    key: Key,
    children: HashMap<ObjectRef<Connection>, Child>,
    /// When each tunnel last started, for the back-off.
    started: HashMap<ObjectRef<Connection>, Instant>,
    /// What was last written to each status, and when counters were.
    written: HashMap<ObjectRef<Connection>, (ConnectionStatus, Instant)>,
    /// Why each tunnel's last process ended, until one runs and reports.
    ended: HashMap<ObjectRef<Connection>, String>,
    pub observed: Observed,
}

impl Tunnels {
    pub fn new(client: kube::Client, settings: Settings, key: Key) -> Self {
        Self {
            client,
            settings,
            key,
            children: HashMap::new(),
            started: HashMap::new(),
            written: HashMap::new(),
            ended: HashMap::new(),
            observed: Observed::default(),
        }
    }

    /// Converges the running tunnels on `planned`, then writes statuses.
    /// `service` is the Service in front of the listening tunnels, as
    /// last seen (when the settings say there is one).
    pub async fn converge(
        &mut self,
        local: &Local,
        connections: &[Arc<Connection>],
        service: Option<&Service>,
    ) {
        let planned = plan(local, connections, &self.settings);
        let wanted: HashMap<_, _> = planned
            .iter()
            .filter_map(|p| Some((p.object.clone(), p.tunnel.clone().ok()?)))
            .collect();
        // Stop what is no longer wanted as it runs (removed, changed,
        // exited), then start what is missing.
        let mut ended = Vec::new();
        let stale: Vec<_> = self
            .children
            .iter_mut()
            .filter_map(|(key, child)| {
                let exited = child.process.try_wait().ok().flatten();
                if let Some(status) = exited {
                    let why = child
                        .failure
                        .borrow()
                        .clone()
                        .unwrap_or_else(|| format!("it exited ({status})"));
                    tracing::warn!(connection = %key, %status, error = %why, "a tunnel process ended");
                    ended.push((key.clone(), why));
                }
                (wanted.get(key) != Some(&child.plan) || exited.is_some()).then_some((key, child))
            })
            .map(|(key, _)| key.clone())
            .collect();
        self.ended.extend(ended);
        for key in stale {
            if let Some(child) = self.children.remove(&key) {
                stop(child).await;
            }
        }
        for (key, tunnel) in &wanted {
            if self.children.contains_key(key)
                || self
                    .started
                    .get(key)
                    .is_some_and(|t| t.elapsed() < RESTART_BACKOFF)
            {
                continue;
            }
            self.started.insert(key.clone(), Instant::now());
            match self.start(tunnel).await {
                Ok(child) => {
                    tracing::info!(connection = %key, device = %tunnel.device, port = tunnel.port, seen_as = %tunnel.seen_as, "tunnel started");
                    self.children.insert(key.clone(), child);
                }
                Err(e) => {
                    tracing::warn!(connection = %key, error = %format!("{e:#}"), "cannot start the tunnel")
                }
            }
        }
        self.started.retain(|key, _| wanted.contains_key(key));
        self.ended.retain(|key, _| wanted.contains_key(key));
        self.written
            .retain(|key, _| planned.iter().any(|p| &p.object == key));
        let local_cidr = local.pod_cidr.map(|c| c.to_string());
        let mut observed = BTreeMap::new();
        for p in &planned {
            let report = self
                .children
                .get(&p.object)
                .and_then(|c| c.reports.borrow().clone());
            let running = self.children.contains_key(&p.object);
            if report.is_some() {
                self.ended.remove(&p.object);
            }
            let ended = self.ended.get(&p.object).cloned();
            let status = self.status_of(
                p,
                (running, ended.as_deref()),
                report.as_ref(),
                local_cidr.clone(),
                service,
            );
            self.write_status(&p.object, status).await;
            let key = format!(
                "{}/{}",
                p.object.namespace.as_deref().unwrap_or_default(),
                p.object.name
            );
            observed.insert(key, (p.clone(), report));
        }
        *self.observed.write().unwrap_or_else(|e| e.into_inner()) = observed;
    }

    /// Stops every tunnel (their processes remove their routes and tables).
    pub async fn stop_all(&mut self) {
        for (_, child) in self.children.drain() {
            stop(child).await;
        }
    }

    async fn start(&self, plan: &TunnelPlan) -> anyhow::Result<Child> {
        let exe = std::env::current_exe().context("finding the gateway's own binary")?;
        let mut command = tokio::process::Command::new(exe);
        command
            .arg("tunnel")
            .arg(format!("--interface={}", plan.device))
            .arg(format!("--mtu={}", self.settings.mtu))
            .arg(format!(
                "--listen={}",
                SocketAddr::new(self.settings.listen_address, plan.port)
            ))
            .arg("--private-key-file=-")
            .arg(format!("--peer-public-key={}", plan.peer_public_key))
            .arg(format!("--peer-cidr={}", plan.peer_cidr))
            .arg("--report");
        if plan.seen_as != plan.peer_cidr {
            command.arg(format!("--peer-remapped-cidr={}", plan.seen_as));
        }
        if let Some(local) = plan.local_cidr {
            command.arg(format!("--local-cidr={local}"));
        }
        if let Some(endpoint) = &plan.endpoint {
            let resolved = tokio::net::lookup_host(endpoint)
                .await
                .with_context(|| format!("resolving the peer's endpoint {endpoint}"))?
                .next()
                .ok_or_else(|| {
                    anyhow::anyhow!("the peer's endpoint {endpoint} resolves to nothing")
                })?;
            command
                .arg(format!("--peer-endpoint={resolved}"))
                .arg(format!("--persistent-keepalive={KEEPALIVE_SECONDS}"));
        }
        command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let netns = match &self.settings.netns {
            Some(path) => Some(
                std::fs::File::open(path)
                    .with_context(|| format!("opening the network namespace {}", path.display()))?,
            ),
            None => None,
        };
        before_exec(&mut command, netns);
        let mut process = command.spawn().context("starting a tunnel process")?;
        let mut stdin = process
            .stdin
            .take()
            .context("the tunnel's standard input")?;
        stdin.write_all(self.key.expose().as_bytes()).await?;
        drop(stdin);
        let stdout = process
            .stdout
            .take()
            .context("the tunnel's standard output")?;
        let (tell, reports) = watch::channel(None);
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Report>(&line) {
                    Ok(report) => {
                        tell.send_replace(Some(report));
                    }
                    Err(e) => tracing::debug!(error = %e, "an unreadable report"),
                }
            }
        });
        let stderr = process
            .stderr
            .take()
            .context("the tunnel's standard error")?;
        let (tell_failure, failure) = watch::channel(None);
        tokio::spawn(async move {
            // Its log goes on into ours; its last word is kept.
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("{line}");
                if let Some(why) = line.strip_prefix(TUNNEL_FAILED) {
                    tell_failure.send_replace(Some(why.to_owned()));
                }
            }
        });
        Ok(Child {
            plan: plan.clone(),
            process,
            reports,
            failure,
        })
    }

    /// `process`: whether a process runs, and why the last one ended if
    /// none has reported since.
    fn status_of(
        &self,
        p: &Planned,
        process: (bool, Option<&str>),
        report: Option<&Report>,
        pod_cidr: Option<String>,
        service: Option<&Service>,
    ) -> ConnectionStatus {
        let previous = self
            .written
            .get(&p.object)
            .map(|(s, _)| s.conditions.clone())
            .unwrap_or_default();
        let now = Time(Timestamp::now());
        let mut status = ConnectionStatus {
            public_key: Some(self.key.public_of_private()),
            pod_cidr,
            ..Default::default()
        };
        let (configured, established) = match &p.tunnel {
            Err(why) => (
                ("False", "Refused", why.clone()),
                ("False", "NotConfigured", "the tunnel cannot run".to_owned()),
            ),
            Ok(tunnel) => {
                status.peer_seen_as = Some(tunnel.seen_as.to_string());
                status.interface = Some(tunnel.device.clone());
                let mut exposure = Ok(());
                if tunnel.endpoint.is_none() {
                    status.listen_port = Some(tunnel.port);
                    match published_endpoint(
                        self.settings.endpoint_host.as_deref(),
                        self.settings.exposed_by.map(|t| (t, service)),
                        tunnel.port,
                    ) {
                        Ok(endpoint) => status.endpoint = endpoint,
                        Err(why) => exposure = Err(why),
                    }
                }
                let (running, ended) = process;
                let configured = if let Err(why) = exposure {
                    ("False", "NotExposed", why)
                } else if let Some(why) = ended {
                    (
                        "False",
                        conditions::FAILING,
                        format!(
                            "the tunnel's process ended: {why}; it is started again every {}s",
                            RESTART_BACKOFF.as_secs()
                        ),
                    )
                } else if running {
                    (
                        "True",
                        "Running",
                        format!("the tunnel runs on {}", tunnel.device),
                    )
                } else {
                    (
                        "False",
                        "NotRunning",
                        "the tunnel's process is not running (see the gateway's log); \
                         it is started again"
                            .to_owned(),
                    )
                };
                let established = match report {
                    Some(r) if r.established() => (
                        "True",
                        "Handshake",
                        "a session with the peer is live".to_owned(),
                    ),
                    _ => (
                        "False",
                        "NoHandshake",
                        match &tunnel.endpoint {
                            Some(e) => format!("no handshake with the peer's gateway at {e}"),
                            None => "waiting for the peer's gateway to dial".to_owned(),
                        },
                    ),
                };
                if let Some(r) = report {
                    status.tx_bytes = r.tx_bytes;
                    status.rx_bytes = r.rx_bytes;
                    // The probes' when there are any, else the handshake's.
                    status.rtt_ms = r
                        .probe_rtt_ms
                        .map(|ms| (ms * 1000.0).round() / 1000.0)
                        .or(r.handshake_rtt_ms.map(|ms| ms as f64));
                    status.last_handshake = r.since_handshake_ms.map(|ms| {
                        // Whole seconds: a report's age jitters by its tick.
                        let at = Timestamp::now().as_second() - (ms / 1000) as i64;
                        Timestamp::from_second(at)
                            .map(|t| t.to_string())
                            .unwrap_or_default()
                    });
                }
                (configured, established)
            }
        };
        for (type_, (state, reason, message)) in [
            (conditions::CONFIGURED, configured),
            (conditions::ESTABLISHED, established),
        ] {
            let transition = previous
                .iter()
                .find(|c| c.type_ == type_ && c.status == state)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            status.conditions.push(Condition {
                type_: type_.to_owned(),
                status: state.to_owned(),
                reason: reason.to_owned(),
                message,
                last_transition_time: transition,
                observed_generation: None,
            });
        }
        status
    }

    /// Writes `status` when something other than counters changed, or
    /// counters changed and were last written [`COUNTERS_EVERY`] ago.
    async fn write_status(&mut self, object: &ObjectRef<Connection>, status: ConnectionStatus) {
        let due = match self.written.get(object) {
            None => true,
            Some((last, at)) => {
                let decisions = |s: &ConnectionStatus| {
                    let mut s = s.clone();
                    (s.tx_bytes, s.rx_bytes, s.rtt_ms, s.last_handshake) = (0, 0, None, None);
                    for c in &mut s.conditions {
                        c.last_transition_time = Time(Timestamp::UNIX_EPOCH);
                    }
                    s
                };
                decisions(last) != decisions(&status)
                    || (last != &status && at.elapsed() >= COUNTERS_EVERY)
            }
        };
        if !due {
            return;
        }
        let Some(namespace) = object.namespace.as_deref() else {
            return;
        };
        let api: Api<Connection> = Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({ "status": status });
        match api
            .patch_status(&object.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {
                self.written
                    .insert(object.clone(), (status, Instant::now()));
            }
            // Deleted meanwhile: the next pass forgets it.
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!(connection = %object, error = %e, "cannot write the status"),
        }
    }
}

/// Where peers dial a listening tunnel on `port`: `host` at that port, or,
/// with a Service in front (`exposed`), at the node port it maps the port
/// to (NodePort), or at the load balancer's address unless `host` names
/// one (LoadBalancer). `None` when there is no host to publish; an error
/// says what the Service lacks.
pub fn published_endpoint(
    host: Option<&str>,
    exposed: Option<(GatewayServiceType, Option<&Service>)>,
    port: u16,
) -> Result<Option<String>, String> {
    let Some((kind, service)) = exposed else {
        return Ok(host.map(|h| join_host_port(h, port)));
    };
    let name = format!("Service {}", liqo_api::names::GATEWAY);
    let service = service.ok_or_else(|| format!("{name} does not exist: install again"))?;
    let spec = service.spec.as_ref();
    let actual = spec.and_then(|s| s.type_.as_deref()).unwrap_or("ClusterIP");
    if actual != kind.as_str() {
        return Err(format!(
            "{name} is of type {actual}, not {}: install again",
            kind.as_str()
        ));
    }
    let entry = spec
        .and_then(|s| s.ports.as_ref())
        .and_then(|ports| {
            ports.iter().find(|p| {
                p.port == i32::from(port) && p.protocol.as_deref().unwrap_or("TCP") == "UDP"
            })
        })
        .ok_or_else(|| {
            format!("{name} has no UDP port {port}: install again with the same --tunnel-ports")
        })?;
    match kind {
        GatewayServiceType::NodePort => {
            let node_port = entry
                .node_port
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| format!("{name} has no node port for {port} yet"))?;
            Ok(host.map(|h| join_host_port(h, node_port)))
        }
        GatewayServiceType::LoadBalancer => {
            if let Some(host) = host {
                return Ok(Some(join_host_port(host, port)));
            }
            let ingress = service
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .and_then(|i| i.first())
                .and_then(|i| i.ip.clone().or_else(|| i.hostname.clone()))
                .ok_or_else(|| {
                    format!("waiting for {name}'s load balancer to be given an address")
                })?;
            Ok(Some(join_host_port(&ingress, port)))
        }
    }
}

/// Where tunnels bind for an endpoint host (see
/// [`Settings::listen_address`]): the host itself when it is an address
/// this node can bind.
pub fn listen_address(endpoint_host: Option<&str>) -> std::net::IpAddr {
    endpoint_host
        .and_then(|h| h.parse::<std::net::IpAddr>().ok())
        .filter(|ip| std::net::UdpSocket::bind((*ip, 0)).is_ok())
        .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into())
}

/// `host:port`, with an IPv6 address in brackets.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The child gets SIGTERM when the agent ends, however it ends: a tunnel
/// never outlives the agent that decided it (and SIGTERM lets it remove
/// its route and table). With `netns`, it runs in that network namespace.
#[allow(unsafe_code)]
fn before_exec(command: &mut tokio::process::Command, netns: Option<std::fs::File>) {
    // SAFETY: the closure runs between fork and exec, where only
    // async-signal-safe calls are allowed: prctl and setns are system
    // calls, and nothing is allocated (the file was opened before fork).
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)?;
            if let Some(netns) = &netns {
                nix::sched::setns(netns, nix::sched::CloneFlags::CLONE_NEWNET)?;
            }
            Ok(())
        });
    }
}

/// Asks a tunnel process to stop (it removes its route and table), and
/// kills it after a few seconds.
async fn stop(mut child: Child) {
    if let Some(pid) = child.process.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if tokio::time::timeout(Duration::from_secs(5), child.process.wait())
        .await
        .is_err()
    {
        let _ = child.process.kill().await;
    }
    tracing::info!(device = %child.plan.device, "tunnel stopped");
}

/// The networks of the node's interfaces, but the tunnels' own and
/// loopback: a peer's pods seen there would shadow the node's neighbours.
pub fn node_networks() -> Vec<IpNet> {
    let Ok(interfaces) = if_addrs::get_if_addrs() else {
        return Vec::new();
    };
    interfaces
        .into_iter()
        .filter(|i| !i.is_loopback() && !i.name.starts_with("liqo-"))
        .filter_map(|i| match i.addr {
            if_addrs::IfAddr::V4(a) => ipnet::Ipv4Net::with_netmask(a.ip, a.netmask)
                .ok()
                .map(|n| IpNet::V4(n.trunc())),
            if_addrs::IfAddr::V6(a) => ipnet::Ipv6Net::with_netmask(a.ip, a.netmask)
                .ok()
                .map(|n| IpNet::V6(n.trunc())),
        })
        .filter(|n| liqo_api::networking::reserved_overlap(n).is_none())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use liqo_api::networking::ConnectionSpec;

    fn service(kind: &str, node_port: Option<i32>, ingress: Option<&str>) -> Service {
        use k8s_openapi::api::core::v1::{
            LoadBalancerIngress, LoadBalancerStatus, ServicePort, ServiceSpec, ServiceStatus,
        };
        Service {
            spec: Some(ServiceSpec {
                type_: Some(kind.into()),
                ports: Some(vec![ServicePort {
                    port: 51820,
                    protocol: Some("UDP".into()),
                    node_port,
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: ingress.map(|ip| ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(vec![LoadBalancerIngress {
                        ip: Some(ip.into()),
                        ..Default::default()
                    }]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Host, Service in front, port, and the endpoint or error expected.
    type Case<'a> = (
        Option<&'a str>,
        Option<(GatewayServiceType, Option<&'a Service>)>,
        u16,
        Result<Option<&'a str>, &'a str>,
    );

    #[test]
    fn the_published_endpoint_follows_the_service_in_front() {
        use GatewayServiceType::{LoadBalancer, NodePort};
        let node_port = service("NodePort", Some(31000), None);
        let balanced = service("LoadBalancer", Some(31000), Some("203.0.113.7"));
        let pending = service("LoadBalancer", None, None);
        let cases: [Case; 9] = [
            (Some("192.0.2.1"), None, 51820, Ok(Some("192.0.2.1:51820"))),
            (None, None, 51820, Ok(None)),
            (Some("fd00::1"), None, 51820, Ok(Some("[fd00::1]:51820"))),
            (
                Some("192.0.2.1"),
                Some((NodePort, Some(&node_port))),
                51820,
                Ok(Some("192.0.2.1:31000")),
            ),
            (
                None,
                Some((LoadBalancer, Some(&balanced))),
                51820,
                Ok(Some("203.0.113.7:51820")),
            ),
            // An address given by the administrator wins over the ingress.
            (
                Some("gw.example.com"),
                Some((LoadBalancer, Some(&balanced))),
                51820,
                Ok(Some("gw.example.com:51820")),
            ),
            (
                None,
                Some((LoadBalancer, Some(&pending))),
                51820,
                Err("waiting for Service liqo-gateway's load balancer to be given an address"),
            ),
            (
                Some("192.0.2.1"),
                Some((NodePort, Some(&node_port))),
                51821,
                Err(
                    "Service liqo-gateway has no UDP port 51821: install again with the same --tunnel-ports",
                ),
            ),
            (
                Some("192.0.2.1"),
                Some((NodePort, None)),
                51820,
                Err("Service liqo-gateway does not exist: install again"),
            ),
        ];
        for (host, exposed, port, want) in cases {
            let got = published_endpoint(host, exposed, port);
            assert_eq!(
                got.as_ref().map(|e| e.as_deref()).map_err(String::as_str),
                want,
                "{host:?} {:?} {port}",
                exposed.map(|(k, _)| k)
            );
        }
        let wrong = published_endpoint(Some("h"), Some((LoadBalancer, Some(&node_port))), 51820);
        assert_eq!(
            wrong,
            Err("Service liqo-gateway is of type NodePort, not LoadBalancer: install again".into())
        );
    }

    fn settings() -> Settings {
        Settings {
            endpoint_host: Some("192.0.2.1".into()),
            exposed_by: None,
            listen_address: std::net::Ipv4Addr::UNSPECIFIED.into(),
            instance: "test".into(),
            namespace: "liqo".into(),
            ports: 51820..=51821,
            remap_pool: vec!["100.64.0.0/10".parse().expect("cidr")],
            mtu: 1420,
            netns: None,
        }
    }

    fn local() -> Local {
        Local {
            pod_cidr: Some("10.200.0.0/16".parse().expect("cidr")),
            service_cidr: Some("10.100.0.0/16".parse().expect("cidr")),
            node: vec!["192.168.1.0/24".parse().expect("cidr")],
        }
    }

    fn connection(
        peer: &str,
        age: i64,
        pod_cidr: &str,
        endpoint: Option<&str>,
        status: Option<ConnectionStatus>,
    ) -> Arc<Connection> {
        let mut c = Connection::new(
            peer,
            ConnectionSpec {
                cluster_id: liqo_api::ClusterId::new(peer).expect("id"),
                cluster_name: peer.into(),
                public_key: "29QfL/gCYN3ASZ39Gf7A/UOqE+SFK1jbHwKLwaTgVhs=".into(),
                endpoint: endpoint.map(str::to_owned),
                pod_cidr: pod_cidr.into(),
            },
        );
        // A provider's (listening) connections are in tenant namespaces.
        c.metadata.namespace = Some(match endpoint {
            Some(_) => "liqo".into(),
            None => format!("liqo-tenant-{peer}"),
        });
        c.metadata.creation_timestamp = Some(Time(
            Timestamp::from_second(1_700_000_000 + age).expect("time"),
        ));
        c.status = status;
        Arc::new(c)
    }

    fn net(s: &str) -> IpNet {
        s.parse().expect("cidr")
    }

    fn tunnels(planned: &[Planned]) -> Vec<Result<(u16, IpNet), String>> {
        planned
            .iter()
            .map(|p| p.tunnel.clone().map(|t| (t.port, t.seen_as)))
            .collect()
    }

    #[test]
    fn overlapping_peers_are_remapped_oldest_first_and_ports_taken_in_order() {
        let conns = vec![
            // Created later, listed first: still planned second.
            connection("b", 2, "10.200.0.0/16", None, None),
            connection("a", 1, "10.200.0.0/16", None, None),
            connection("c", 3, "10.201.0.0/16", Some("192.0.2.9:51820"), None),
            connection("d", 4, "10.202.0.0/16", None, None),
        ];
        let planned = plan(&local(), &conns, &settings());
        let ids: Vec<_> = planned.iter().map(|p| p.peer_id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c", "d"]);
        assert_eq!(
            tunnels(&planned),
            vec![
                Ok((51820, net("100.64.0.0/16"))),
                Ok((51821, net("100.65.0.0/16"))),
                // Dialing: any port; disjoint: seen as it is.
                Ok((0, net("10.201.0.0/16"))),
                Err("every port of 51820-51821 is taken: widen --tunnel-ports".into()),
            ]
        );
    }

    #[test]
    fn decisions_in_a_status_are_kept_while_valid() {
        let kept = ConnectionStatus {
            endpoint: Some("192.0.2.1:51821".into()),
            peer_seen_as: Some("100.70.0.0/16".into()),
            ..Default::default()
        };
        let planned = plan(
            &local(),
            &[connection("a", 1, "10.200.0.0/16", None, Some(kept))],
            &settings(),
        );
        assert_eq!(tunnels(&planned), vec![Ok((51821, net("100.70.0.0/16")))]);
        // Behind a NodePort the endpoint's port is the node port: the port
        // kept is the one the tunnel listened on.
        let behind_a_service = ConnectionStatus {
            endpoint: Some("192.0.2.1:31007".into()),
            listen_port: Some(51821),
            peer_seen_as: Some("100.70.0.0/16".into()),
            ..Default::default()
        };
        let planned = plan(
            &local(),
            &[connection(
                "a",
                1,
                "10.200.0.0/16",
                None,
                Some(behind_a_service),
            )],
            &settings(),
        );
        assert_eq!(tunnels(&planned), vec![Ok((51821, net("100.70.0.0/16")))]);
        // A kept view that now clashes with ours is decided again.
        let clashing = ConnectionStatus {
            peer_seen_as: Some("10.100.0.0/16".into()),
            ..Default::default()
        };
        let planned = plan(
            &local(),
            &[connection("a", 1, "10.200.0.0/16", None, Some(clashing))],
            &settings(),
        );
        assert_eq!(tunnels(&planned), vec![Ok((51820, net("100.64.0.0/16")))]);
    }

    #[test]
    fn a_tenant_cannot_make_the_provider_dial_nor_take_two_tunnels() {
        let mut dialing = connection("a", 1, "10.1.0.0/16", Some("192.0.2.9:1"), None);
        Arc::make_mut(&mut dialing).metadata.namespace = Some("liqo-tenant-a".into());
        let mut second = connection("b", 2, "10.2.0.0/16", None, None);
        Arc::make_mut(&mut second).metadata.namespace = Some("liqo-tenant-a".into());
        let planned = plan(&local(), &[dialing, second], &settings());
        let first = planned[0].tunnel.clone().expect("runs");
        assert_eq!((first.endpoint, first.port), (None, 51820));
        assert!(
            planned[1]
                .tunnel
                .as_ref()
                .is_err_and(|e| e.contains("one tunnel per peer")),
            "{:?}",
            planned[1].tunnel
        );
    }

    #[test]
    fn a_peer_cannot_claim_our_networks_or_everything() {
        let planned = plan(
            &local(),
            &[
                // The node's LAN: remapped, never routed as it is.
                connection("a", 1, "192.168.1.0/24", None, None),
                connection("b", 2, "0.0.0.0/0", None, None),
                connection("c", 3, "not a cidr", None, None),
            ],
            &settings(),
        );
        assert_eq!(tunnels(&planned)[0], Ok((51820, net("100.64.0.0/24"))));
        assert!(planned[1].tunnel.is_err(), "{:?}", planned[1].tunnel);
        assert!(planned[2].tunnel.is_err(), "{:?}", planned[2].tunnel);
    }

    #[test]
    fn reports_round_trip_and_tell_a_live_session() {
        let report = Report {
            since_handshake_ms: Some(1_000),
            tx_bytes: 10,
            rx_bytes: 20,
            dropped: 0,
            endpoint: Some("127.0.0.1:51820".parse().expect("addr")),
            handshake_rtt_ms: Some(3),
            since_heard_ms: Some(500),
            probe_rtt_ms: Some(0.25),
        };
        let line = serde_json::to_string(&report).expect("json");
        assert_eq!(serde_json::from_str::<Report>(&line).expect("back"), report);
        assert!(report.established());
        let old = Report {
            since_handshake_ms: Some(181_000),
            ..report.clone()
        };
        assert!(!old.established());
        let silent = Report {
            since_heard_ms: Some(31_000),
            ..report
        };
        assert!(!silent.established(), "a peer not heard from for 30 s");
        assert!(!Report::default().established());
    }

    #[test]
    fn ipv6_hosts_are_bracketed() {
        assert_eq!(join_host_port("192.0.2.1", 5), "192.0.2.1:5");
        assert_eq!(join_host_port("2001:db8::1", 5), "[2001:db8::1]:5");
        assert_eq!(join_host_port("gw.example.com", 5), "gw.example.com:5");
    }
}
