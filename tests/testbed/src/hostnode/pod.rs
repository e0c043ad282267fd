//! One pod on the host node: its containers' processes (or their fakes),
//! their restarts and probes, its credentials, its termination, and the
//! status the API should show for it. Knows nothing of other pods.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::probe::Prober;
use super::{HostNodeConfig, StartError, env};
use crate::process::Process;

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

/// What a pod's host node gives it to work with.
pub(super) struct Context<'a> {
    pub(super) client: &'a kube::Client,
    pub(super) http: &'a reqwest::Client,
    pub(super) config: &'a HostNodeConfig,
}

/// The runtime state of one pod, keyed by its UID on the node.
#[derive(Debug)]
pub(super) struct PodRuntime {
    namespace: String,
    name: String,
    ip: Ipv4Addr,
    restart_policy: RestartPolicy,
    grace: Duration,
    start_time: Timestamp,
    containers: Vec<ContainerRuntime>,
    credentials: Option<Credentials>,
    /// When the pod is being stopped: the instant its processes get SIGKILL.
    stopping: Option<Instant>,
    /// Each condition's last status and when it took it.
    transitions: BTreeMap<&'static str, (bool, Timestamp)>,
    /// The status last written to the API.
    posted: Option<PodStatus>,
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

#[derive(Debug)]
struct ContainerRuntime {
    spec: Container,
    /// The binary the image names; `None` for a faked container.
    binary: Option<PathBuf>,
    readiness: Option<Prober>,
    liveness: Option<Prober>,
    running: Option<Running>,
    last: Option<ContainerStateTerminated>,
    /// Why the container is not running, when it should be.
    waiting: Option<(&'static str, String)>,
    restart_count: i32,
    started_once: bool,
    next_start: Instant,
    backoff: Duration,
}

#[derive(Debug)]
struct Running {
    process: Process,
    id: String,
    started_at: Timestamp,
    since: Instant,
    /// Set once the process was asked to stop: when it gets SIGKILL.
    kill_at: Option<Instant>,
}

impl PodRuntime {
    /// The runtime of a pod just seen on the node, with address `ip`.
    pub(super) fn new(pod: &Pod, ip: Ipv4Addr, config: &HostNodeConfig) -> Self {
        let spec = pod.spec.clone().unwrap_or_default();
        let now = Instant::now();
        let containers = spec
            .containers
            .iter()
            .map(|c| {
                let image = c.image.as_deref().unwrap_or_default();
                let binary = env::executable(&config.bin_dir, env::image_binary(image));
                ContainerRuntime {
                    readiness: (c.readiness_probe.as_ref()).map(|p| Prober::readiness(p, c, ip)),
                    liveness: (c.liveness_probe.as_ref()).map(|p| Prober::liveness(p, c, ip)),
                    started_once: binary.is_none(),
                    binary,
                    spec: c.clone(),
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
            restart_policy: match spec.restart_policy.as_deref() {
                Some("Never") => RestartPolicy::Never,
                Some("OnFailure") => RestartPolicy::OnFailure,
                _ => RestartPolicy::Always,
            },
            grace,
            start_time: Timestamp::now(),
            containers,
            credentials: None,
            stopping: None,
            transitions: BTreeMap::new(),
            posted: None,
        }
    }

    pub(super) fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// Whether every container is faked: such a pod has nothing to stop.
    pub(super) fn is_fake(&self) -> bool {
        self.containers.iter().all(|c| c.binary.is_none())
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
            }
        }
        if self.stopping.is_none() {
            self.probe(ctx.http).await;
            self.refresh_credentials(pod, ctx).await;
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
        let terminated = terminated(status, running);
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
            && c.binary.is_some()
            && c.running.is_none()
            && now >= c.next_start
            && c.last
                .as_ref()
                .is_none_or(|t| c.may_restart(self.restart_policy, t.exit_code))
    }

    async fn start(&mut self, i: usize, pod: &Pod, ctx: &Context<'_>, now: Instant) {
        let label = self.label(&self.containers[i].spec.name);
        match self.spawn(i, pod, ctx).await {
            Ok(process) => {
                let pid = process.pid();
                tracing::info!(container = %label, pid, "started");
                let c = &mut self.containers[i];
                if c.started_once {
                    c.restart_count += 1;
                }
                c.started_once = true;
                c.waiting = None;
                for prober in [&mut c.readiness, &mut c.liveness].into_iter().flatten() {
                    prober.reset(now);
                }
                c.running = Some(Running {
                    process,
                    id: format!("hostprocess://{pid}"),
                    started_at: Timestamp::now(),
                    since: now,
                    kill_at: None,
                });
            }
            Err(e) => {
                let message = chain(&e);
                let c = &mut self.containers[i];
                if c.waiting.as_ref().is_none_or(|(_, m)| *m != message) {
                    tracing::warn!(container = %label, "cannot start: {message}");
                }
                c.waiting = Some((e.reason(), message));
                c.next_start = now + c.backoff;
                c.backoff = (c.backoff * 2).min(BACKOFF_MAX);
            }
        }
    }

    async fn spawn(
        &mut self,
        i: usize,
        pod: &Pod,
        ctx: &Context<'_>,
    ) -> Result<Process, StartError> {
        let spec = self.containers[i].spec.clone();
        let binary = self.containers[i]
            .binary
            .clone()
            .expect("invariant: only containers with a binary are started");
        let kubeconfig = self.credentials(pod, ctx).await?;
        let vars = env::container_env(ctx.client, pod, &spec, self.ip, &kubeconfig).await?;
        let (program, args) = env::command_line(&ctx.config.bin_dir, &binary, &spec, &vars)?;
        let dir = self.dir(ctx.config);
        let mut cmd = Command::new(&program);
        cmd.args(&args).env_clear().envs(&vars).current_dir(&dir);
        let log = ctx.config.pods_dir.join(format!(
            "{}_{}_{}.log",
            self.namespace, self.name, spec.name
        ));
        Process::spawn_command(&self.label(&spec.name), cmd, &log).map_err(|source| {
            StartError::Spawn {
                program: program.clone(),
                source,
            }
        })
    }

    /// The pod's own folder: its credentials, and its processes' working
    /// folder.
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
        write_atomically(&token, &env::request_token(ctx.client, pod).await?)?;
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
        let written = match env::request_token(ctx.client, pod).await {
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

    /// Runs the probes that are due, all at once, and acts on the verdicts.
    async fn probe(&mut self, http: &reqwest::Client) {
        let now = Instant::now();
        let mut due = Vec::new();
        for (i, c) in self.containers.iter().enumerate() {
            if c.running.as_ref().is_none_or(|r| r.kill_at.is_some()) {
                continue;
            }
            for (liveness, prober) in [(false, &c.readiness), (true, &c.liveness)] {
                if let Some(p) = prober.as_ref().filter(|p| p.due(now)) {
                    due.push((i, liveness, p));
                }
            }
        }
        if due.is_empty() {
            return;
        }
        let passed = futures::future::join_all(due.iter().map(|(_, _, p)| p.run(http))).await;
        let due: Vec<(usize, bool)> = due.into_iter().map(|(i, l, _)| (i, l)).collect();
        for ((i, liveness), passed) in due.into_iter().zip(passed) {
            let label = self.label(&self.containers[i].spec.name);
            let grace = self.grace;
            let c = &mut self.containers[i];
            let prober = if liveness {
                &mut c.liveness
            } else {
                &mut c.readiness
            };
            let Some(prober) = prober.as_mut() else {
                continue;
            };
            let healthy = prober.record(now, passed);
            if liveness
                && !healthy
                && let Some(running) = c.running.as_mut()
            {
                tracing::info!(container = %label, "liveness probe failed; restarting");
                running.process.terminate();
                running.kill_at = Some(now + grace);
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
            .map(|c| c.status(&self.start_time))
            .collect();
        let ready = containers.iter().all(|c| c.ready);
        let scheduled = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
            .cloned();
        let conditions = vec![
            scheduled.unwrap_or_else(|| self.condition("PodScheduled", true)),
            self.condition("Initialized", true),
            self.condition("ContainersReady", ready),
            self.condition("Ready", ready),
        ];
        let host = "127.0.0.1".to_owned();
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

impl ContainerRuntime {
    fn may_restart(&self, policy: RestartPolicy, exit_code: i32) -> bool {
        match policy {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Never => false,
        }
    }

    fn ready(&self) -> bool {
        match &self.binary {
            None => true,
            Some(_) => {
                self.running.is_some() && self.readiness.as_ref().is_none_or(Prober::healthy)
            }
        }
    }

    fn status(&self, pod_start: &Timestamp) -> ContainerStatus {
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
        let (state, last_state) = match (&self.binary, &self.running, &self.waiting, &self.last) {
            (None, ..) => (running(pod_start), None),
            (_, Some(r), _, last) => (running(&r.started_at), last.as_ref().map(terminated)),
            (_, None, Some((reason, message)), last) => (
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some((*reason).to_owned()),
                        message: Some(message.clone()),
                    }),
                    ..Default::default()
                },
                last.as_ref().map(terminated),
            ),
            (_, None, None, Some(last)) => (terminated(last), None),
            (_, None, None, None) => (
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
            image_id: self
                .binary
                .as_ref()
                .map(|b| format!("hostprocess://{}", b.display()))
                .unwrap_or_default(),
            container_id: self
                .running
                .as_ref()
                .map(|r| r.id.clone())
                .or_else(|| self.last.as_ref().and_then(|t| t.container_id.clone())),
            ready: self.ready(),
            started: Some(self.binary.is_none() || self.running.is_some()),
            restart_count: self.restart_count,
            state: Some(state),
            last_state,
            ..Default::default()
        }
    }
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
fn chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
