//! The tunnel processes: one child process per tunnel, the gateway's own
//! `tunnel` subcommand, so that one tunnel's failure or reconfiguration
//! touches no other, and stopping one (SIGTERM) removes its route and NAT
//! table. Children die with the agent (`PR_SET_PDEATHSIG`); a new agent
//! starts them again.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::runtime::reflector::ObjectRef;
use liqo_agent_runtime::follow::Followed;
use liqo_api::ClusterIdentity;
use liqo_api::networking::{Connection, ConnectionStatus};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
use tokio::sync::{Notify, watch};

use super::Settings;
use super::pins::Pins;
use super::plan::{LocalNetworks, Planned, TunnelPlan, node_networks, plan};
use crate::flags::TunnelArgs;
use crate::tunnel::{Counters, Key};
use liqo_agent_runtime::error_chain as chain;

/// The least time between two starts of one tunnel's process.
pub(super) const RESTART_BACKOFF: Duration = Duration::from_secs(5);
/// What a tunnel process writes before it exits on an error (one line,
/// the whole chain of causes), so that the agent can say why it ended.
pub const TUNNEL_FAILED: &str = "tunnel failed: ";
/// Keepalive of both sides: keeps NAT mappings on the way open, lets the
/// listening side learn the dialer's endpoint before any traffic, and
/// lets each side tell that the other is alive (see [`super::status`]).
const KEEPALIVE_SECONDS: u16 = 10;

/// Why a tunnel process could not be started. Where an error alone said
/// it, it still does (`transparent`).
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("finding the gateway's own binary")]
    OwnBinary(#[source] std::io::Error),
    #[error("resolving the peer's endpoint {endpoint}")]
    Resolve {
        endpoint: String,
        #[source]
        error: std::io::Error,
    },
    #[error("the peer's endpoint {0} resolves to nothing")]
    Unresolved(String),
    #[error("opening the network namespace {path}")]
    OpenNetns {
        path: String,
        #[source]
        error: std::io::Error,
    },
    #[error("starting a tunnel process")]
    Spawn(#[source] std::io::Error),
    #[error("the tunnel's standard {0}")]
    NoPipe(&'static str),
    #[error(transparent)]
    HandKey(std::io::Error),
}

/// One running tunnel process.
struct Child {
    plan: TunnelPlan,
    process: tokio::process::Child,
    reports: watch::Receiver<Option<Counters>>,
    /// The error the process wrote before exiting, if it did.
    failure: watch::Receiver<Option<String>>,
}

/// What the agent shares with its metrics endpoint: each connection's
/// last report.
pub type Observed = Arc<RwLock<BTreeMap<String, (Planned, Option<Counters>)>>>;

/// The tunnels the connections ask for, and what was written of them:
/// [`Tunnels::converge`] is called whenever the connections or the
/// identity change, and every second (counters, exited processes).
pub struct Tunnels {
    pub(super) client: kube::Client,
    pub(super) settings: Settings,
    pub(super) key: Key,
    children: HashMap<ObjectRef<Connection>, Child>,
    /// When each tunnel last started, for the back-off.
    started: HashMap<ObjectRef<Connection>, Instant>,
    /// What was last written to each status, and when counters were.
    pub(super) written: HashMap<ObjectRef<Connection>, (ConnectionStatus, Instant)>,
    /// Why each tunnel's last process ended, until one runs and reports.
    ended: HashMap<ObjectRef<Connection>, String>,
    pub observed: Observed,
    /// The pod CIDR each tenant's Connection must name.
    pins: Pins,
    /// Told when a tunnel's report says it came up or went down, so that
    /// its status is written at once rather than at the next second.
    came_up_or_down: Arc<Notify>,
}

impl Tunnels {
    pub fn new(client: kube::Client, settings: Settings, key: Key) -> Self {
        Self {
            pins: Pins::new(client.clone()),
            client,
            settings,
            key,
            children: HashMap::new(),
            started: HashMap::new(),
            written: HashMap::new(),
            ended: HashMap::new(),
            observed: Observed::default(),
            came_up_or_down: Arc::new(Notify::new()),
        }
    }

    /// Converges the running tunnels on `planned`, then writes statuses.
    /// `service` is the Service in front of the listening tunnels, as
    /// last seen (when the settings say there is one).
    pub async fn converge(
        &mut self,
        local: &LocalNetworks,
        connections: &[Arc<Connection>],
        service: Option<&Service>,
    ) {
        let pinned = self.pins.of(connections).await;
        let planned = plan(local, connections, &pinned, &self.settings);
        let wanted: HashMap<_, _> = planned
            .iter()
            .filter_map(|p| Some((p.object.clone(), p.tunnel.clone().ok()?)))
            .collect();
        // Stop what is no longer wanted as it runs (removed, changed,
        // exited), then start what is missing.
        let mut exited = Vec::new();
        let stale: Vec<_> = self
            .children
            .iter_mut()
            .filter_map(|(key, child)| {
                let status = child.process.try_wait().ok().flatten();
                if let Some(status) = status {
                    exited.push((key.clone(), status));
                }
                (wanted.get(key) != Some(&child.plan) || status.is_some()).then(|| key.clone())
            })
            .collect();
        let mut ended = Vec::new();
        for (key, status) in exited {
            let Some(child) = self.children.get_mut(&key) else {
                continue;
            };
            let why = last_word(&mut child.failure)
                .await
                .unwrap_or_else(|| format!("it exited ({status})"));
            tracing::warn!(connection = %key, %status, error = %why, "a tunnel process ended");
            ended.push((key, why));
        }
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
                    tracing::warn!(connection = %key, error = %chain(&e), "cannot start the tunnel")
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

    async fn start(&self, plan: &TunnelPlan) -> Result<Child, StartError> {
        let exe = std::env::current_exe().map_err(StartError::OwnBinary)?;
        // The key is handed over on standard input, never in a flag.
        let mut args = TunnelArgs::new(
            plan.device.clone(),
            "-".into(),
            plan.peer_public_key.clone(),
        );
        args.mtu = self.settings.mtu;
        args.listen = SocketAddr::new(self.settings.listen_address, plan.port);
        args.peer_cidr = Some(plan.peer_cidr);
        args.local_cidr = plan.local_cidr;
        args.peer_remapped_cidr = Some(plan.seen_as).filter(|seen_as| *seen_as != plan.peer_cidr);
        args.report = true;
        if let Some(endpoint) = &plan.endpoint {
            let resolved = tokio::net::lookup_host(endpoint)
                .await
                .map_err(|error| StartError::Resolve {
                    endpoint: endpoint.clone(),
                    error,
                })?
                .next()
                .ok_or_else(|| StartError::Unresolved(endpoint.clone()))?;
            args.peer_endpoint = Some(resolved);
            args.persistent_keepalive = Some(KEEPALIVE_SECONDS);
        }
        let mut command = tokio::process::Command::new(exe);
        command.arg("tunnel").args(args.to_args());
        command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let netns = match &self.settings.netns {
            Some(path) => {
                Some(
                    std::fs::File::open(path).map_err(|error| StartError::OpenNetns {
                        path: path.display().to_string(),
                        error,
                    })?,
                )
            }
            None => None,
        };
        before_exec(&mut command, netns);
        let mut process = command.spawn().map_err(StartError::Spawn)?;
        let mut stdin = process.stdin.take().ok_or(StartError::NoPipe("input"))?;
        stdin
            .write_all(self.key.expose().as_bytes())
            .await
            .map_err(StartError::HandKey)?;
        drop(stdin);
        let stdout = process.stdout.take().ok_or(StartError::NoPipe("output"))?;
        let (tell, reports) = watch::channel(None);
        let came_up_or_down = self.came_up_or_down.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            let mut was_established = false;
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Counters>(&line) {
                    Ok(report) => {
                        if report.established() != was_established {
                            was_established = report.established();
                            came_up_or_down.notify_one();
                        }
                        tell.send_replace(Some(report));
                    }
                    Err(e) => tracing::debug!(error = %e, "an unreadable report"),
                }
            }
        });
        let stderr = process.stderr.take().ok_or(StartError::NoPipe("error"))?;
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
}

/// The error an exited process wrote last. Its error output is read by
/// a task of its own, which may not have reached the end of the pipe when
/// the exit is seen: it is given a moment to.
async fn last_word(failure: &mut watch::Receiver<Option<String>>) -> Option<String> {
    let drained = async { while failure.changed().await.is_ok() {} };
    let _ = tokio::time::timeout(Duration::from_secs(1), drained).await;
    failure.borrow().clone()
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

/// Keeps one tunnel running for each Connection, from the identity and
/// the Connections, until `stop` says so; then stops them all.
pub async fn run_tunnels(
    mut tunnels: Tunnels,
    identity: Followed<ConfigMap>,
    identity_ref: ObjectRef<ConfigMap>,
    mut connections: Followed<Connection>,
    service: Option<Followed<Service>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut identity_state = identity.state.clone();
    let mut service_state = service.as_ref().map(|s| s.state.clone());
    let came_up_or_down = tunnels.came_up_or_down.clone();
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
                .map(|id| LocalNetworks::of(&id, node_networks()))
                .unwrap_or_default();
            let exposure = service
                .as_ref()
                .and_then(|s| s.store.state().into_iter().next());
            tunnels
                .converge(&local, &connections.store.state(), exposure.as_deref())
                .await;
        }
        // Counters and exited processes are looked at every second too,
        // and at once when a tunnel comes up or goes down.
        tokio::select! {
            _ = stop.changed() => break,
            () = came_up_or_down.notified() => {}
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
