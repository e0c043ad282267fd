//! One pod on the host node: its containers' processes, their restarts and
//! probes, its credentials, its network namespace (in the pod-network
//! mode), its containers' termination messages, its termination, the status
//! the API should show for it and the events worth telling. Knows nothing
//! of other pods.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::probe::{Dialer, ExecContext, GRPC_UNSUPPORTED, Prober};
use super::volume::{self, Volumes};
use super::{HostNodeConfig, StartError, env};
use crate::podnet::PodNet;
use crate::podnet::relay::Relay;
use crate::process::{self, BindMount, Process};

/// First wait before restarting a container that exited.
const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Longest wait before restarting a container that keeps exiting.
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A container that ran this long is restarted with the initial back-off.
const BACKOFF_RESET: Duration = Duration::from_secs(20);
/// Longest grace between SIGTERM and SIGKILL, whatever the pod asks for.
const GRACE_MAX: Duration = Duration::from_secs(10);
/// How often a pod's service-account token is replaced, well within its life.
const TOKEN_REFRESH: Duration = Duration::from_secs(20 * 60);
/// Where a container's termination message is when its spec does not say.
const TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";
/// How much of the termination message file a kubelet reads.
const TERMINATION_MESSAGE_MAX: usize = 4096;
/// How much of its log a failed container's message falls back to
/// (`FallbackToLogsOnError`), as with a kubelet.
const FALLBACK_LOG_LINES: usize = 80;
const FALLBACK_LOG_MAX: usize = 2048;

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

/// A pod's service-account token file and the kubeconfig that reads it.
#[derive(Debug)]
struct Credentials {
    token: PathBuf,
    kubeconfig: PathBuf,
    refreshed: Instant,
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

/// Where a container's termination message comes from.
#[derive(Debug)]
struct MessageSource {
    /// The host's file bound at the container's `terminationMessagePath`.
    file: PathBuf,
    /// `terminationMessagePolicy: FallbackToLogsOnError`.
    fallback_to_logs: bool,
    /// The container's log, and where this run of it starts there.
    log: PathBuf,
    log_start: u64,
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

    /// A fresh, empty file for the termination message of a container
    /// about to start, as a kubelet makes one per container start.
    fn termination_message_file(
        &self,
        config: &HostNodeConfig,
        spec: &Container,
    ) -> Result<PathBuf, StartError> {
        let path = self
            .dir(config)
            .join(format!("{}.termination-log", spec.name));
        std::fs::write(&path, "").map_err(|source| StartError::Write {
            path: path.clone(),
            source,
        })?;
        Ok(path)
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

    /// The kubeconfig of the pod's service account, made on first use.
    async fn credentials(&mut self, pod: &Pod, ctx: &Context<'_>) -> Result<PathBuf, StartError> {
        if let Some(c) = &self.credentials {
            return Ok(c.kubeconfig.clone());
        }
        let dir = self.dir(ctx.config);
        let token = dir.join("token");
        let kubeconfig = dir.join("kubeconfig");
        std::fs::create_dir_all(&dir).map_err(|source| StartError::Write {
            path: dir.clone(),
            source,
        })?;
        let token_value = env::request_token(ctx.client, pod, &[], env::TOKEN_SECONDS).await?;
        write_atomically(&token, &token_value)?;
        let user = format!(
            "system:serviceaccount:{}:{}",
            self.namespace,
            env::service_account(pod)
        );
        let yaml = env::token_kubeconfig(
            &ctx.config.cluster,
            &ctx.config.server,
            &ctx.config.ca_pem,
            &user,
            &self.namespace,
            &token,
        );
        write_atomically(&kubeconfig, &yaml)?;
        self.credentials = Some(Credentials {
            token,
            kubeconfig: kubeconfig.clone(),
            refreshed: Instant::now(),
        });
        Ok(kubeconfig)
    }

    /// Replaces the token before it expires; clients re-read the file.
    async fn refresh_credentials(&mut self, pod: &Pod, ctx: &Context<'_>) {
        let Some(c) = self.credentials.as_mut() else {
            return;
        };
        if c.refreshed.elapsed() < TOKEN_REFRESH {
            return;
        }
        let written = match env::request_token(ctx.client, pod, &[], env::TOKEN_SECONDS).await {
            Ok(token) => write_atomically(&c.token, &token),
            Err(e) => Err(e),
        };
        match written {
            Ok(()) => c.refreshed = Instant::now(),
            Err(e) => tracing::warn!(
                pod = %format!("{}/{}", self.namespace, self.name),
                "refreshing the token: {}",
                chain(&e)
            ),
        }
    }

    /// Runs the probes that are due, all at once, and acts on the verdicts:
    /// readiness and liveness wait for the startup probe; a container that
    /// fails its startup or liveness probe is stopped, to be restarted.
    async fn probe(&mut self, dialer: &Dialer) {
        let now = Instant::now();
        let mut due = Vec::new();
        for (i, c) in self.containers.iter().enumerate() {
            let Some(running) = c.running.as_ref().filter(|r| r.kill_at.is_none()) else {
                continue;
            };
            let started = c.startup.as_ref().is_none_or(Prober::healthy);
            let probers = [
                (Kind::Startup, c.startup.as_ref().filter(|_| !started)),
                (Kind::Readiness, c.readiness.as_ref().filter(|_| started)),
                (Kind::Liveness, c.liveness.as_ref().filter(|_| started)),
            ];
            for (kind, prober) in probers {
                if let Some(p) = prober.filter(|p| p.due(now)) {
                    due.push((i, kind, p, &running.exec));
                }
            }
        }
        if due.is_empty() {
            return;
        }
        let outcomes =
            futures::future::join_all(due.iter().map(|(_, _, p, exec)| p.run(dialer, exec))).await;
        let due: Vec<(usize, Kind)> = due.into_iter().map(|(i, k, _, _)| (i, k)).collect();
        for ((i, kind), outcome) in due.into_iter().zip(outcomes) {
            let label = self.label(&self.containers[i].spec.name);
            let grace = self.grace;
            let c = &mut self.containers[i];
            let Some(prober) = (match kind {
                Kind::Startup => c.startup.as_mut(),
                Kind::Readiness => c.readiness.as_mut(),
                Kind::Liveness => c.liveness.as_mut(),
            }) else {
                continue;
            };
            let healthy = prober.record(now, outcome.is_ok());
            if let Some(why) = prober.report(&outcome) {
                tracing::info!(container = %label, "{} probe failed: {why}", kind.name());
                let message = format!("{} probe failed: {why}", kind.name());
                self.events
                    .push(Event::warning(c.spec.name.clone(), "Unhealthy", message));
            }
            let kills = matches!(kind, Kind::Startup | Kind::Liveness);
            if kills
                && !healthy
                && prober.failed_out()
                && let Some(running) = c.running.as_mut()
            {
                tracing::info!(container = %label, "{} probe failed; restarting", kind.name());
                let message = format!(
                    "Container {} failed {} probe, will be restarted",
                    c.spec.name,
                    kind.name().to_ascii_lowercase()
                );
                self.events
                    .push(Event::normal(c.spec.name.clone(), "Killing", message));
                running.process.terminate();
                running.kill_at = Some(now + grace);
            }
        }
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

    /// The status to write, if it differs from the one last written.
    pub(super) fn status_if_changed(&mut self, pod: &Pod) -> Option<PodStatus> {
        let status = self.status(pod);
        (self.posted.as_ref() != Some(&status)).then_some(status)
    }

    /// Notes that `status` is what the API now shows.
    pub(super) fn posted(&mut self, status: PodStatus) {
        self.posted = Some(status);
    }

    fn status(&mut self, pod: &Pod) -> PodStatus {
        let containers: Vec<ContainerStatus> = self
            .containers
            .iter()
            .map(ContainerRuntime::status)
            .collect();
        let ready = containers.iter().all(|c| c.ready);
        let scheduled = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
            .cloned();
        // As a kubelet says it, and why, when this node knows better.
        let unready: Vec<&str> = (self.containers.iter())
            .filter(|c| !c.ready())
            .map(|c| c.spec.name.as_str())
            .collect();
        let why = (self.containers.iter())
            .find_map(|c| c.never_ready)
            .map(|why| format!(" ({why})"))
            .unwrap_or_default();
        let not_ready = (!ready).then(|| {
            (
                "ContainersNotReady",
                format!(
                    "containers with unready status: [{}]{why}",
                    unready.join(" ")
                ),
            )
        });
        let mut ready_condition = |type_| {
            let mut c = self.condition(type_, ready);
            if let Some((reason, message)) = &not_ready {
                c.reason = Some((*reason).to_owned());
                c.message = Some(message.clone());
            }
            c
        };
        let containers_ready = ready_condition("ContainersReady");
        let ready_condition = ready_condition("Ready");
        let conditions = vec![
            scheduled.unwrap_or_else(|| self.condition("PodScheduled", true)),
            self.condition("Initialized", true),
            containers_ready,
            ready_condition,
        ];
        let host = self.network.host_ip.to_string();
        PodStatus {
            phase: Some(self.phase().to_owned()),
            conditions: Some(conditions),
            container_statuses: Some(containers),
            host_ip: Some(host.clone()),
            host_ips: Some(vec![HostIP { ip: host }]),
            pod_ip: Some(self.ip.to_string()),
            pod_ips: Some(vec![PodIP {
                ip: self.ip.to_string(),
            }]),
            start_time: Some(Time(self.start_time)),
            ..Default::default()
        }
    }

    fn condition(&mut self, type_: &'static str, ok: bool) -> PodCondition {
        let (_, since) = self
            .transitions
            .entry(type_)
            .and_modify(|(was, since)| {
                if *was != ok {
                    *was = ok;
                    *since = Timestamp::now();
                }
            })
            .or_insert_with(|| (ok, Timestamp::now()));
        PodCondition {
            type_: type_.to_owned(),
            status: if ok { "True" } else { "False" }.to_owned(),
            last_transition_time: Some(Time(*since)),
            ..Default::default()
        }
    }

    fn phase(&self) -> &'static str {
        let policy = self.restart_policy;
        let finished = |c: &ContainerRuntime| {
            c.running.is_none()
                && c.last
                    .as_ref()
                    .is_some_and(|t| !c.may_restart(policy, t.exit_code))
        };
        if self.containers.iter().all(finished) && !self.containers.is_empty() {
            let succeeded = self
                .containers
                .iter()
                .all(|c| c.last.as_ref().is_some_and(|t| t.exit_code == 0));
            return if succeeded { "Succeeded" } else { "Failed" };
        }
        if self.containers.iter().all(|c| c.started_once) {
            "Running"
        } else {
            "Pending"
        }
    }
}

/// Which probe.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Startup,
    Readiness,
    Liveness,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Startup => "Startup",
            Self::Readiness => "Readiness",
            Self::Liveness => "Liveness",
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

    fn ready(&self) -> bool {
        self.running.is_some()
            && self.never_ready.is_none()
            && self.startup.as_ref().is_none_or(Prober::healthy)
            && self.readiness.as_ref().is_none_or(Prober::healthy)
    }

    fn status(&self) -> ContainerStatus {
        let running = |started_at: &Timestamp| ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(*started_at)),
            }),
            ..Default::default()
        };
        let terminated = |t: &ContainerStateTerminated| ContainerState {
            terminated: Some(t.clone()),
            ..Default::default()
        };
        let (state, last_state) = match (&self.running, &self.waiting, &self.last) {
            (Some(r), _, last) => (running(&r.started_at), last.as_ref().map(terminated)),
            (None, Some((reason, message)), last) => (
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some((*reason).to_owned()),
                        message: Some(message.clone()),
                    }),
                    ..Default::default()
                },
                last.as_ref().map(terminated),
            ),
            (None, None, Some(last)) => (terminated(last), None),
            (None, None, None) => (
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some("ContainerCreating".to_owned()),
                        message: None,
                    }),
                    ..Default::default()
                },
                None,
            ),
        };
        ContainerStatus {
            name: self.spec.name.clone(),
            image: self.spec.image.clone().unwrap_or_default(),
            image_id: match &self.image {
                Image::Binary(b) => format!("hostprocess://{}", b.display()),
                Image::Unpullable(_) => String::new(),
            },
            container_id: self
                .running
                .as_ref()
                .map(|r| r.id.clone())
                .or_else(|| self.last.as_ref().and_then(|t| t.container_id.clone())),
            ready: self.ready(),
            started: Some(self.running.is_some()),
            restart_count: self.restart_count,
            state: Some(state),
            last_state,
            ..Default::default()
        }
    }
}

impl MessageSource {
    /// The message of a container that exited, `failed` or not.
    fn read(&self, failed: bool) -> Option<String> {
        use std::io::{Read as _, Seek as _};
        let mut file = Vec::new();
        if let Ok(f) = std::fs::File::open(&self.file) {
            // Bounded: a container may write a huge file.
            let _ = f
                .take(TERMINATION_MESSAGE_MAX as u64)
                .read_to_end(&mut file);
        }
        let log = || {
            let mut log = Vec::new();
            if let Ok(mut f) = std::fs::File::open(&self.log)
                && f.seek(std::io::SeekFrom::Start(self.log_start)).is_ok()
            {
                let _ = f.read_to_end(&mut log);
            }
            log
        };
        termination_message(&file, self.fallback_to_logs && failed, log)
    }
}

/// A container's termination message as a kubelet makes it: what it wrote
/// to its file (at most [`TERMINATION_MESSAGE_MAX`] bytes); if nothing and
/// `fall_back` (a failed container with `FallbackToLogsOnError`), the end
/// of its log: the last [`FALLBACK_LOG_LINES`] lines, of which the last
/// [`FALLBACK_LOG_MAX`] bytes.
fn termination_message(
    file: &[u8],
    fall_back: bool,
    log: impl FnOnce() -> Vec<u8>,
) -> Option<String> {
    let file = &file[..file.len().min(TERMINATION_MESSAGE_MAX)];
    if !file.is_empty() {
        return Some(String::from_utf8_lossy(file).into_owned());
    }
    if !fall_back {
        return None;
    }
    let log = log();
    let body = log.strip_suffix(b"\n").unwrap_or(&log);
    let start = body
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, b)| **b == b'\n')
        .nth(FALLBACK_LOG_LINES - 1)
        .map_or(0, |(i, _)| i + 1);
    let lines = &log[start..];
    let tail = &lines[lines.len().saturating_sub(FALLBACK_LOG_MAX)..];
    (!tail.is_empty()).then(|| String::from_utf8_lossy(tail).into_owned())
}

/// How a process ended, as the kubelet reports it: a signal shows as exit
/// code 128 + signal.
fn terminated(status: ExitStatus, running: &Running) -> ContainerStateTerminated {
    use std::os::unix::process::ExitStatusExt;
    let exit_code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1);
    ContainerStateTerminated {
        exit_code,
        signal: status.signal(),
        reason: Some(if exit_code == 0 { "Completed" } else { "Error" }.to_owned()),
        started_at: Some(Time(running.started_at)),
        finished_at: Some(Time(Timestamp::now())),
        container_id: Some(running.id.clone()),
        message: None,
    }
}

/// Writes a private file whole: readers (clients re-reading a token) never
/// see half of it, and nobody else reads it.
fn write_atomically(path: &std::path::Path, contents: &str) -> Result<(), StartError> {
    let tmp = path.with_extension("tmp");
    crate::write_private(&tmp, contents)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| StartError::Write {
            path: path.to_owned(),
            source,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize) -> Vec<u8> {
        (1..=n)
            .map(|i| format!("line {i}\n"))
            .collect::<String>()
            .into_bytes()
    }

    #[test]
    fn the_termination_message_is_the_file_then_the_log_of_a_failure() {
        let no_log = || panic!("the log is read only to fall back on");
        assert_eq!(
            termination_message(b"bye", true, no_log).as_deref(),
            Some("bye")
        );
        let big = vec![b'x'; 5000];
        assert_eq!(
            termination_message(&big, false, no_log).map(|m| m.len()),
            Some(TERMINATION_MESSAGE_MAX)
        );
        // Empty file: nothing, unless the policy falls back and it failed.
        assert_eq!(termination_message(b"", false, no_log), None);
        assert_eq!(
            termination_message(b"", true, || b"oops\n".to_vec()).as_deref(),
            Some("oops\n")
        );
        assert_eq!(termination_message(b"", true, Vec::new), None);
        // The last 80 lines…
        let message = termination_message(b"", true, || lines(100)).expect("message");
        assert!(message.starts_with("line 21\n"), "{message}");
        assert!(message.ends_with("line 100\n"), "{message}");
        // … of which the last 2048 bytes.
        let long: Vec<u8> = (0..100)
            .flat_map(|i| format!("{i:0>99}\n").into_bytes())
            .collect();
        let message = termination_message(b"", true, || long.clone()).expect("message");
        assert_eq!(message.len(), FALLBACK_LOG_MAX);
        assert!(message.ends_with(&format!("{:0>99}\n", 99)));
    }
}
