//! One pod on the host node: its containers' processes, their restarts and
//! probes, its credentials, its network namespace (in the pod-network
//! mode), its containers' termination messages, its termination, the status
//! the API should show for it and the events worth telling. Knows nothing
//! of other pods.
//!
//! Its parts: its credentials ([`credentials`]), its probes ([`probes`]),
//! its containers' termination messages ([`termination`]) and its status
//! ([`status`]).

mod credentials;
mod probes;
mod resolver;
mod status;
mod termination;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, ContainerStateTerminated, Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;

use super::probe::{Dialer, ExecContext, GRPC_UNSUPPORTED, Prober};
use super::volume::{self, Volumes};
use super::{HostNodeConfig, StartError, env};
use crate::podnet::PodNet;
use crate::podnet::relay::Relay;
use crate::process::{self, BindMount, Process};
use credentials::Credentials;
use termination::{MessageSource, TERMINATION_MESSAGE_PATH, terminated};

/// First wait before restarting a container that exited.
const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Longest wait before restarting a container that keeps exiting.
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A container that ran this long is restarted with the initial back-off.
const BACKOFF_RESET: Duration = Duration::from_secs(20);
/// Longest grace between SIGTERM and SIGKILL, whatever the pod asks for.
const GRACE_MAX: Duration = Duration::from_secs(10);

/// What a pod's host node gives it to work with.
pub(super) struct Context<'a> {
    pub(super) client: &'a kube::Client,
    pub(super) dialer: &'a Dialer,
    pub(super) config: &'a HostNodeConfig,
    /// The mount points the node made on the host, to remove once unused.
    pub(super) created: &'a std::cell::RefCell<Vec<PathBuf>>,
}

/// The runtime state of one pod, keyed by its UID on the node.
#[derive(Debug)]
pub(super) struct PodRuntime {
    namespace: String,
    name: String,
    ip: Ipv4Addr,
    network: Network,
    restart_policy: RestartPolicy,
    grace: Duration,
    start_time: Timestamp,
    containers: Vec<ContainerRuntime>,
    credentials: Option<Credentials>,
    volumes: Volumes,
    /// Why the pod's spec cannot run here, whatever its containers.
    refused: Option<String>,
    /// When the pod is being stopped: the instant its processes get SIGKILL.
    stopping: Option<Instant>,
    /// Each condition's last status and when it took it.
    transitions: BTreeMap<&'static str, (bool, Timestamp)>,
    /// The status last written to the API.
    posted: Option<PodStatus>,
    /// Events to post, oldest first.
    events: Vec<Event>,
}

/// Something worth telling about a container, as a kubelet tells it with an
/// Event of the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Event {
    pub(super) container: String,
    pub(super) warning: bool,
    pub(super) reason: &'static str,
    pub(super) message: String,
}

impl Event {
    fn warning(container: String, reason: &'static str, message: String) -> Self {
        Self {
            container,
            warning: true,
            reason,
            message,
        }
    }

    fn normal(container: String, reason: &'static str, message: String) -> Self {
        Self {
            container,
            warning: false,
            reason,
            message,
        }
    }
}

/// Where a pod's processes meet the network.
#[derive(Debug)]
pub(super) struct Network {
    /// Its node's address: its hostIP.
    pub(super) host_ip: Ipv4Addr,
    /// The network namespace its processes run in, if not the host's.
    pub(super) netns: Option<PathBuf>,
    /// The namespace the pod owns, and the relay of its loopback to the
    /// API servers; both go with the pod.
    pub(super) own: Option<(PodNet, Relay)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

/// What a container's image gives it to run.
#[derive(Debug)]
enum Image {
    /// The binary the allow-list gives for the image.
    Binary(PathBuf),
    /// Why the image cannot be "pulled": it is not on the allow-list, or
    /// its binary is not there.
    Unpullable(String),
}

#[derive(Debug)]
struct ContainerRuntime {
    spec: Container,
    image: Image,
    startup: Option<Prober>,
    readiness: Option<Prober>,
    liveness: Option<Prober>,
    /// Why the container can never be Ready here (a grpc probe).
    never_ready: Option<&'static str>,
    running: Option<Running>,
    last: Option<ContainerStateTerminated>,
    /// Why the container is not running, when it should be.
    waiting: Option<(&'static str, String)>,
    restart_count: i32,
    started_once: bool,
    next_start: Instant,
    backoff: Duration,
    /// The message of the last warning event about the container, so that
    /// a failure that repeats is told once.
    reported: Option<String>,
}

#[derive(Debug)]
struct Running {
    process: Process,
    /// What the process was started with, for exec probes.
    exec: ExecContext,
    id: String,
    started_at: Timestamp,
    since: Instant,
    /// Set once the process was asked to stop: when it gets SIGKILL.
    kill_at: Option<Instant>,
    /// What its termination message is read from when it exits.
    message: MessageSource,
}

impl PodRuntime {
    /// The runtime of a pod just seen on the node, with address `ip`.
    pub(super) fn new(pod: &Pod, ip: Ipv4Addr, network: Network, config: &HostNodeConfig) -> Self {
        let spec = pod.spec.clone().unwrap_or_default();
        let now = Instant::now();
        let containers = spec
            .containers
            .iter()
            .map(|c| {
                let grpc = [&c.startup_probe, &c.readiness_probe, &c.liveness_probe]
                    .into_iter()
                    .flatten()
                    .any(|p| p.grpc.is_some());
                ContainerRuntime {
                    startup: (c.startup_probe.as_ref()).map(|p| Prober::startup(p, c, ip)),
                    readiness: (c.readiness_probe.as_ref()).map(|p| Prober::readiness(p, c, ip)),
                    // Not checked, but the container is never Ready (a
                    // grpc liveness probe would only restart it in a loop).
                    liveness: (c.liveness_probe.as_ref())
                        .filter(|p| p.grpc.is_none())
                        .map(|p| Prober::liveness(p, c, ip)),
                    never_ready: grpc.then_some(GRPC_UNSUPPORTED),
                    started_once: false,
                    image: image(c, config),
                    spec: c.clone(),
                    reported: None,
                    running: None,
                    last: None,
                    waiting: None,
                    restart_count: 0,
                    next_start: now,
                    backoff: BACKOFF_INITIAL,
                }
            })
            .collect();
        let grace = spec
            .termination_grace_period_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(GRACE_MAX, |s| Duration::from_secs(s).min(GRACE_MAX));
        Self {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            ip,
            network,
            restart_policy: match spec.restart_policy.as_deref() {
                Some("Never") => RestartPolicy::Never,
                Some("OnFailure") => RestartPolicy::OnFailure,
                _ => RestartPolicy::Always,
            },
            grace,
            start_time: Timestamp::now(),
            containers,
            credentials: None,
            volumes: Volumes::new(&pod_dir(config, pod)),
            refused: refusal(&spec),
            stopping: None,
            transitions: BTreeMap::new(),
            posted: None,
            events: Vec::new(),
        }
    }

    pub(super) fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// Deletes the pod's own network namespace and veth, once its
    /// processes are gone.
    pub(super) fn release_network(&mut self) {
        self.network.own.take();
    }

    /// The events to post since the last call.
    pub(super) fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Brings the processes in line with the pod: notes exits, (re)starts
    /// what should run, probes what runs, and stops everything once the
    /// pod is being deleted.
    pub(super) async fn sync(&mut self, pod: &Pod, ctx: &Context<'_>) {
        if pod.metadata.deletion_timestamp.is_some() {
            self.stop(self.grace);
        }
        let now = Instant::now();
        for i in 0..self.containers.len() {
            self.reap(i, now);
            if self.should_start(i, now) {
                self.start(i, pod, ctx, now).await;
            } else {
                self.containers[i].back_off_pull();
            }
        }
        if self.stopping.is_none() {
            self.probe(ctx.dialer).await;
            self.refresh_credentials(pod, ctx).await;
            self.refresh_volumes(pod, ctx).await;
        }
    }

    /// Asks every process to stop, with SIGKILL after `grace`; nothing is
    /// restarted from then on.
    pub(super) fn stop(&mut self, grace: Duration) {
        if self.stopping.is_some() {
            return;
        }
        let kill_at = Instant::now() + grace;
        self.stopping = Some(kill_at);
        for running in self
            .containers
            .iter_mut()
            .filter_map(|c| c.running.as_mut())
        {
            running.process.terminate();
            running.kill_at = Some(kill_at);
        }
    }

    /// Notes the processes that exited and kills those past their grace.
    pub(super) fn reap_all(&mut self) {
        let now = Instant::now();
        for i in 0..self.containers.len() {
            self.reap(i, now);
        }
    }

    /// Whether no process of the pod runs any more.
    pub(super) fn is_stopped(&self) -> bool {
        self.containers.iter().all(|c| c.running.is_none())
    }

    /// The live processes, for a shutdown of the whole node.
    pub(super) fn processes_mut(&mut self) -> impl Iterator<Item = &mut Process> {
        self.containers
            .iter_mut()
            .filter_map(|c| c.running.as_mut().map(|r| &mut r.process))
    }

    fn label(&self, container: &str) -> String {
        format!("{}/{}/{container}", self.namespace, self.name)
    }

    fn reap(&mut self, i: usize, now: Instant) {
        let restarts = self.stopping.is_none();
        let policy = self.restart_policy;
        let label = self.label(&self.containers[i].spec.name);
        let c = &mut self.containers[i];
        let Some(running) = c.running.as_mut() else {
            return;
        };
        let Some(status) = running.process.exited() else {
            if running.kill_at.is_some_and(|at| now >= at) {
                tracing::info!(container = %label, pid = running.process.pid(), "killing after its grace period");
                running.process.kill();
            }
            return;
        };
        tracing::info!(container = %label, pid = running.process.pid(), %status, "exited");
        let ran = running.since.elapsed();
        let mut terminated = terminated(status, running);
        terminated.message = running.message.read(terminated.exit_code != 0);
        c.running = None;
        if ran >= BACKOFF_RESET {
            c.backoff = BACKOFF_INITIAL;
        }
        c.next_start = now + c.backoff;
        c.waiting = (restarts && c.may_restart(policy, terminated.exit_code)).then(|| {
            let message = format!(
                "back-off {}s restarting failed container {label}",
                c.backoff.as_secs()
            );
            ("CrashLoopBackOff", message)
        });
        c.backoff = (c.backoff * 2).min(BACKOFF_MAX);
        c.last = Some(terminated);
    }

    fn should_start(&self, i: usize, now: Instant) -> bool {
        let c = &self.containers[i];
        self.stopping.is_none()
            && c.running.is_none()
            && now >= c.next_start
            && c.last
                .as_ref()
                .is_none_or(|t| c.may_restart(self.restart_policy, t.exit_code))
    }

    async fn start(&mut self, i: usize, pod: &Pod, ctx: &Context<'_>, now: Instant) {
        let label = self.label(&self.containers[i].spec.name);
        match self.spawn(i, pod, ctx).await {
            Ok((process, exec, message)) => {
                let pid = process.pid();
                tracing::info!(container = %label, pid, "started");
                let c = &mut self.containers[i];
                if c.started_once {
                    c.restart_count += 1;
                }
                c.started_once = true;
                c.waiting = None;
                c.reported = None;
                for prober in [&mut c.startup, &mut c.readiness, &mut c.liveness]
                    .into_iter()
                    .flatten()
                {
                    prober.reset(now);
                }
                c.running = Some(Running {
                    process,
                    exec,
                    id: format!("hostprocess://{pid}"),
                    started_at: Timestamp::now(),
                    since: now,
                    kill_at: None,
                    message,
                });
            }
            Err(e) => {
                let message = chain(&e);
                let event = match &e {
                    StartError::Pull(_) => format!(
                        "Failed to pull image {:?}: {message}",
                        self.containers[i].spec.image.as_deref().unwrap_or_default()
                    ),
                    _ => format!("Error: {message}"),
                };
                let c = &mut self.containers[i];
                if c.reported.as_ref() != Some(&event) {
                    tracing::warn!(container = %label, "cannot start: {message}");
                    c.reported = Some(event.clone());
                    let name = c.spec.name.clone();
                    self.events.push(Event::warning(name, "Failed", event));
                }
                let c = &mut self.containers[i];
                c.waiting = Some((e.reason(), message));
                c.next_start = now + c.backoff;
                c.backoff = (c.backoff * 2).min(BACKOFF_MAX);
            }
        }
    }

    /// Starts container `i`'s process, in a mount namespace of its own
    /// with its volumes at their mount paths; returns it with what exec
    /// probes need to run as it does.
    async fn spawn(
        &mut self,
        i: usize,
        pod: &Pod,
        ctx: &Context<'_>,
    ) -> Result<(Process, ExecContext, MessageSource), StartError> {
        let spec = self.containers[i].spec.clone();
        // A pull is tried again after its back-off, as a kubelet does: an
        // image loaded (a binary built) meanwhile is found.
        if matches!(self.containers[i].image, Image::Unpullable(_)) {
            self.containers[i].image = image(&spec, ctx.config);
        }
        let binary = match &self.containers[i].image {
            Image::Binary(binary) => binary.clone(),
            Image::Unpullable(why) => return Err(StartError::Pull(why.clone())),
        };
        if let Some(why) = self.refused.clone().or_else(|| container_refusal(&spec)) {
            return Err(StartError::Unsupported(why));
        }
        let kubeconfig = self.credentials(pod, ctx).await?;
        let vars =
            env::container_env(ctx.client, pod, &spec, self.addresses(), &kubeconfig).await?;
        let (program, args) = env::command_line(&ctx.config.bin_dir, &binary, &spec, &vars)?;
        self.volumes.sync(ctx.client, pod, self.addresses()).await?;
        let mut mounts = self.volumes.mounts(&spec, &vars)?;
        let message = self.termination_message_file(ctx.config, &spec)?;
        mounts.push(BindMount {
            source: message.clone(),
            target: PathBuf::from(
                (spec.termination_message_path.as_deref())
                    .filter(|p| !p.is_empty())
                    .unwrap_or(TERMINATION_MESSAGE_PATH),
            ),
            read_only: false,
        });
        if let Some(pod_spec) = pod.spec.as_ref()
            && let Some(resolver) = self.resolver_file(ctx.config, pod_spec)?
        {
            mounts.push(BindMount {
                source: resolver,
                target: PathBuf::from(resolver::RESOLV_CONF),
                read_only: true,
            });
        }
        for m in &mounts {
            volume::ensure_target(&m.target, m.source.is_file(), &mut ctx.created.borrow_mut())
                .map_err(|source| StartError::Write {
                    path: m.target.clone(),
                    source,
                })?;
        }
        let dir = match spec.working_dir.as_deref().filter(|d| !d.is_empty()) {
            Some(dir) if Path::new(dir).is_dir() => PathBuf::from(dir),
            Some(dir) => {
                return Err(StartError::Unsupported(format!(
                    "workingDir {dir:?}, which is not a folder of the host"
                )));
            }
            None => pod_dir(ctx.config, pod),
        };
        let mut cmd = Command::new(&program);
        cmd.args(&args).env_clear().envs(&vars).current_dir(&dir);
        let spawn_error = |source| StartError::Spawn {
            program: program.clone(),
            source,
        };
        process::with_mounts(&mut cmd, &mounts).map_err(spawn_error)?;
        process::with_netns(&mut cmd, self.network.netns.as_deref()).map_err(spawn_error)?;
        let log = ctx.config.pods_dir.join(format!(
            "{}_{}_{}.log",
            self.namespace, self.name, spec.name
        ));
        let log_start = std::fs::metadata(&log).map_or(0, |m| m.len());
        let process =
            Process::spawn_command(&self.label(&spec.name), cmd, &log).map_err(spawn_error)?;
        let exec = ExecContext {
            env: vars,
            dir,
            mounts,
            netns: self.network.netns.clone(),
        };
        let message = MessageSource {
            file: message,
            fallback_to_logs: spec.termination_message_policy.as_deref()
                == Some("FallbackToLogsOnError"),
            log,
            log_start,
        };
        Ok((process, exec, message))
    }

    /// The pod's address and its node's, for the downward API.
    fn addresses(&self) -> env::Addresses {
        env::Addresses {
            pod: self.ip,
            host: self.network.host_ip,
        }
    }

    /// The mount points the pod's processes use, which must stay.
    pub(super) fn mount_targets(&self) -> impl Iterator<Item = &Path> {
        self.containers
            .iter()
            .filter_map(|c| c.running.as_ref())
            .flat_map(|r| r.exec.mounts.iter().map(|m| m.target.as_path()))
    }

    /// The pod's own folder: its credentials and volumes.
    fn dir(&self, config: &HostNodeConfig) -> PathBuf {
        config
            .pods_dir
            .join(format!("{}_{}", self.namespace, self.name))
    }

    /// Refreshes the volumes of a pod that runs; a failure keeps the files
    /// as they were, as with a kubelet, and is logged once.
    async fn refresh_volumes(&mut self, pod: &Pod, ctx: &Context<'_>) {
        if !self.volumes.due() || self.containers.iter().all(|c| c.running.is_none()) {
            return;
        }
        if let Err(e) = self.volumes.sync(ctx.client, pod, self.addresses()).await {
            let message = chain(&e);
            if self.volumes.failed(message.clone()) {
                tracing::warn!(pod = %format!("{}/{}", self.namespace, self.name), "refreshing the volumes: {message}");
            }
        }
    }
}

/// The pod's own folder: its credentials, its volumes, and its processes'
/// working folder.
fn pod_dir(config: &HostNodeConfig, pod: &Pod) -> PathBuf {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    config.pods_dir.join(format!("{namespace}_{name}"))
}

/// What of a pod's spec this node cannot do, and refuses rather than
/// ignores.
fn refusal(spec: &k8s_openapi::api::core::v1::PodSpec) -> Option<String> {
    if spec.init_containers.as_ref().is_some_and(|c| !c.is_empty()) {
        return Some("init containers".to_owned());
    }
    None
}

/// What of a container's spec this node cannot do.
fn container_refusal(container: &Container) -> Option<String> {
    let lifecycle = container.lifecycle.as_ref();
    if lifecycle.is_some_and(|l| l.post_start.is_some() || l.pre_stop.is_some()) {
        return Some("lifecycle hooks (postStart, preStop)".to_owned());
    }
    None
}

/// What a container's image gives it to run, from the node's allow-list.
fn image(container: &Container, config: &HostNodeConfig) -> Image {
    let image = container.image.as_deref().unwrap_or_default();
    match env::allowed_binary(&config.images, image) {
        None => {
            let allowed: Vec<&str> = config.images.keys().map(String::as_str).collect();
            Image::Unpullable(format!(
                "image {image:?} is not on the host-process node's allow-list ({})",
                allowed.join(", ")
            ))
        }
        Some(name) => match env::executable(&config.bin_dir, name) {
            Some(path) => Image::Binary(path),
            None => Image::Unpullable(format!(
                "image {image:?} stands for {name}, but {} has no executable {name} (not built?)",
                config.bin_dir.display()
            )),
        },
    }
}

impl ContainerRuntime {
    /// After a failed pull, the container waits in ImagePullBackOff until
    /// the next attempt, as with a kubelet.
    fn back_off_pull(&mut self) {
        if let Some((reason, message)) = self.waiting.as_mut()
            && *reason == "ErrImagePull"
        {
            let image = self.spec.image.as_deref().unwrap_or_default();
            *reason = "ImagePullBackOff";
            *message = format!("Back-off pulling image {image:?}: {message}");
        }
    }

    fn may_restart(&self, policy: RestartPolicy, exit_code: i32) -> bool {
        match policy {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Never => false,
        }
    }
}

/// An error and its causes on one line, for a status message.
pub(super) fn chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
