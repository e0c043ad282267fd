//! `liqo-testbed`: starts, shows and stops local test clusters for people
//! (the demo) and scripts.
//!
//! `up` runs a supervisor in the background (`run` in the foreground is the
//! same thing) that owns every cluster process and records what it started
//! in `<dir>/state.json` and its pid in `<dir>/supervisor.pid`; `down` asks
//! it to stop with SIGTERM and waits until nothing it started is left.
//! `apiserver` asks it, over the Unix socket `<dir>/control.sock`, to stop,
//! start, pause or resume a cluster's kube-apiserver: only the supervisor
//! can, as the parent that reaps and restarts it.
//!
//! Every folder `up` makes holds the marker of [`liqo_testbed::dirs`];
//! `up` clears and `down` deletes only a folder that has it.

use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use liqo_testbed::{ApiServerState, ClusterSpec, ProcessInfo, Testbed, Toolchain, dirs};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Local Kubernetes clusters on loopback for liqo-rs's tests and demo"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Start clusters in the background and return once they are usable.
    Up(UpArgs),
    /// Start clusters and keep them until interrupted (Ctrl-C or SIGTERM).
    Run(UpArgs),
    /// Stop the clusters of a folder and remove it.
    Down {
        #[command(flatten)]
        dir: DirArg,
        /// Keep the folder (logs, PKI, etcd data) after stopping.
        #[arg(long)]
        keep: bool,
    },
    /// Show the running clusters, their processes and memory.
    Status {
        #[command(flatten)]
        dir: DirArg,
        /// Print the state as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print one fact of a running cluster, for scripts.
    Get {
        #[command(flatten)]
        dir: DirArg,
        /// The cluster's name.
        cluster: String,
        /// What to print.
        #[arg(value_enum)]
        field: Field,
    },
    /// Stop, start, restart, pause or resume one cluster's kube-apiserver.
    ///
    /// `stop` ends it (its port refuses connections), `start` starts it
    /// again on the same URL with the same certificates, so kubeconfigs
    /// keep working, and returns once it is ready; `pause` freezes it
    /// (SIGSTOP: connections hang), `resume` lets it run again.
    Apiserver {
        #[command(flatten)]
        dir: DirArg,
        #[arg(value_enum)]
        action: ApiServerAction,
        /// The cluster's name.
        cluster: String,
    },
    /// Build (or find in the cache) the control-plane binaries and print their folder.
    Toolchain,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum ApiServerAction {
    Stop,
    Start,
    Restart,
    Pause,
    Resume,
}

impl ApiServerAction {
    fn name(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Start => "start",
            Self::Restart => "restart",
            Self::Pause => "pause",
            Self::Resume => "resume",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        [
            Self::Stop,
            Self::Start,
            Self::Restart,
            Self::Pause,
            Self::Resume,
        ]
        .into_iter()
        .find(|a| a.name() == name)
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy)]
enum Field {
    Kubeconfig,
    Server,
    PodCidr,
    ServiceCidr,
    /// The node namespace (pod-network mode).
    NodeNetns,
    /// The node's address on the internet (pod-network mode).
    NodeAddress,
}

#[derive(Args, Debug)]
struct DirArg {
    /// Folder that holds the clusters' files and state.
    #[arg(long, default_value = ".liqo-testbed")]
    dir: PathBuf,
}

#[derive(Args, Debug)]
struct UpArgs {
    #[command(flatten)]
    dir: DirArg,
    /// Cluster names, one cluster each.
    #[arg(long = "cluster", short = 'c', default_values = ["cluster-1", "cluster-2"])]
    clusters: Vec<String>,
    /// Fake worker nodes per cluster.
    #[arg(long, default_value_t = 3)]
    nodes: u32,
    /// CPU capacity of each worker node.
    #[arg(long, default_value = "4")]
    node_cpu: String,
    /// Memory capacity of each worker node.
    #[arg(long, default_value = "16Gi")]
    node_memory: String,
    /// Pod capacity of each worker node.
    #[arg(long, default_value_t = 110)]
    node_pods: u32,
    /// Give every cluster the same pod CIDR (to exercise NAT between peers).
    #[arg(long)]
    same_pod_cidr: bool,
    /// Give pods real network namespaces: each cluster's host-process node
    /// gets a node namespace on a shared "internet" (192.168.100.N), its
    /// pods addresses of its pod CIDR, and kube-proxy serves Services
    /// (see docs/testbed.md). Needs root.
    #[arg(long)]
    pod_network: bool,
    /// Give each cluster a real node instead of the host-process node: a
    /// kubelet with containerd, runc and CNI in the node namespace, holding
    /// the agents' images made from the agent folder (see docs/testbed.md,
    /// "Real nodes"). Needs root.
    #[arg(long)]
    real_node: bool,
    /// With --real-node: import the agents' images from the archives in DIR,
    /// as `cargo run -p liqo-images` writes them (the shipped, static
    /// images), instead of making them from the agent folder's binaries.
    #[arg(long, value_name = "DIR", requires = "real_node")]
    agent_images: Option<PathBuf>,
    /// The controller-managers' client rate limit in requests per second
    /// (burst twice that) [default: theirs, 20 with a burst of 30].
    #[arg(long, value_name = "QPS", value_parser = clap::value_parser!(u32).range(1..))]
    controller_manager_qps: Option<u32>,
    /// Leave MutatingAdmissionPolicy off, as most 1.34 clusters have it:
    /// placement then goes through the virtual kubelets' webhook.
    #[arg(long)]
    without_mutating_admission_policy: bool,
    /// Serve the control plane's profiles (`/debug/pprof` of the API
    /// server, `--profiling`), for benchmarks that look into its CPU.
    #[arg(long)]
    profiling: bool,
    /// Folder of agent binaries (liqo-gateway, …) whose pods each cluster's
    /// host-process node runs as local processes [default: LIQO_AGENT_BIN_DIR,
    /// else the folder of this binary].
    #[arg(long)]
    agent_bin_dir: Option<PathBuf>,
    /// Adds an image to the host-process node's allow-list: pods of image
    /// repository REPOSITORY (no tag) run binary BINARY of the agent folder
    /// (repeatable; liqo-gateway and liqo-virtual-kubelet are always listed).
    #[arg(long = "host-image", value_name = "REPOSITORY=BINARY", value_parser = parse_host_image)]
    host_images: Vec<(String, String)>,
    /// Seconds to wait for the clusters (`up` only).
    #[arg(long, default_value_t = 180)]
    timeout: u64,
}

/// `REPOSITORY=BINARY` of `--host-image`.
fn parse_host_image(value: &str) -> Result<(String, String), String> {
    match value.split_once('=') {
        Some((repository, binary))
            if !repository.is_empty() && !binary.is_empty() && !repository.contains(['@', ' ']) =>
        {
            Ok((repository.to_owned(), binary.to_owned()))
        }
        _ => Err(format!("{value:?} is not REPOSITORY=BINARY")),
    }
}

impl UpArgs {
    fn agent_bin_dir(&self) -> Result<Option<PathBuf>> {
        match &self.agent_bin_dir {
            Some(dir) => Ok(Some(dir.clone())),
            None => Ok(liqo_testbed::default_agent_bin_dir()?),
        }
    }

    fn specs(&self) -> Result<Vec<ClusterSpec>> {
        let first = ClusterSpec::new("", 0);
        let agent_bin_dir = self.agent_bin_dir()?;
        Ok(self
            .clusters
            .iter()
            .zip(1u8..)
            .map(|(name, i)| {
                let mut spec = ClusterSpec::new(name, i);
                spec.nodes = self.nodes;
                spec.node_cpu.clone_from(&self.node_cpu);
                spec.node_memory.clone_from(&self.node_memory);
                spec.node_pods = self.node_pods;
                spec.agent_bin_dir.clone_from(&agent_bin_dir);
                spec.host_images.extend(self.host_images.iter().cloned());
                if self.same_pod_cidr {
                    spec.pod_cidr.clone_from(&first.pod_cidr);
                }
                spec.pod_network = self.pod_network;
                spec.real_node = self.real_node;
                spec.agent_images.clone_from(&self.agent_images);
                spec.controller_manager_qps = self.controller_manager_qps;
                spec.without_mutating_admission_policy = self.without_mutating_admission_policy;
                spec.profiling = self.profiling;
                spec
            })
            .collect())
    }
}

/// What a running supervisor records, for `status`, `down` and scripts.
#[derive(Serialize, Deserialize, Debug)]
struct State {
    supervisor_pid: u32,
    started_in_seconds: f64,
    clusters: Vec<ClusterState>,
}

#[derive(Serialize, Deserialize, Debug)]
struct ClusterState {
    name: String,
    server: String,
    kubeconfig: PathBuf,
    pod_cidr: String,
    service_cidr: String,
    /// The node that runs the agents (host-process or real), if any.
    host_node: Option<String>,
    /// The node namespace and the node's address, in the pod-network mode.
    #[serde(default)]
    node_netns: Option<String>,
    #[serde(default)]
    node_address: Option<std::net::Ipv4Addr>,
    /// What `liqo-testbed apiserver` has done to the kube-apiserver.
    #[serde(default)]
    apiserver: Option<ApiServerState>,
    processes: Vec<ProcessInfo>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "liqo_testbed=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Up(args) => up(&args),
        Cmd::Run(args) => run(&args),
        Cmd::Down { dir, keep } => down(&dir.dir, keep),
        Cmd::Status { dir, json } => status(&dir.dir, json),
        Cmd::Get {
            dir,
            cluster,
            field,
        } => get(&dir.dir, &cluster, field),
        Cmd::Apiserver {
            dir,
            action,
            cluster,
        } => apiserver(&dir.dir, action, &cluster),
        Cmd::Toolchain => Toolchain::locate()
            .map(|t| println!("{}", t.dir().display()))
            .map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn state_path(dir: &Path) -> PathBuf {
    dir.join("state.json")
}

fn control_path(dir: &Path) -> PathBuf {
    dir.join("control.sock")
}

/// The one line `up`, `run` and `down` answer for a folder they must not
/// touch.
fn not_ours(dir: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "{} exists and was not made by liqo-testbed; choose another --dir or remove it",
        dir.display()
    )
}

/// Fails with [`not_ours`] unless a testbed may use `dir`.
fn check_ours(dir: &Path) -> Result<()> {
    match dirs::may_use(dir) {
        Err(liqo_testbed::Error::NotMadeByTestbed { .. }) => Err(not_ours(dir)),
        other => Ok(other?),
    }
}

fn read_state(dir: &Path) -> Option<State> {
    let text = std::fs::read_to_string(state_path(dir)).ok()?;
    serde_json::from_str(&text).ok()
}

fn alive(pid: u32) -> bool {
    kill(Pid::from_raw(pid as i32), None).is_ok()
}

/// The pid of a supervisor still running for `dir`, if any.
fn running_supervisor(dir: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(dir.join("supervisor.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    // A recycled pid belongs to some other program: only ours counts.
    String::from_utf8_lossy(&cmdline)
        .contains("liqo-testbed")
        .then_some(pid)
}

fn up(args: &UpArgs) -> Result<()> {
    let dir = &args.dir.dir;
    if let Some(pid) = running_supervisor(dir) {
        bail!(
            "clusters are already running in {} (supervisor pid {pid}); run `liqo-testbed down --dir {}` first",
            dir.display(),
            dir.display()
        );
    }
    // Whatever a testbed left there is from a run that crashed: its
    // processes died with their supervisor, so the folder can be cleared.
    // Anything else is someone's, and stays as it is.
    check_ours(dir)?;
    dirs::make_fresh(dir)?;
    let dir = dir.canonicalize()?;

    // Build or find the binaries here, where a long first build shows its
    // progress, rather than in the silent background process.
    let toolchain = Toolchain::locate()?;
    let log_path = dir.join("testbed.log");
    let log = std::fs::File::create(&log_path)?;
    let mut child = {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg("run")
            .arg("--dir")
            .arg(&dir)
            .args(["--nodes", &args.nodes.to_string()])
            .args(["--node-cpu", &args.node_cpu])
            .args(["--node-memory", &args.node_memory])
            .args(["--node-pods", &args.node_pods.to_string()])
            .env("LIQO_TOOLCHAIN_DIR", toolchain.dir())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: a Ctrl-C meant for the caller's shell
            // does not reach the clusters.
            .process_group(0);
        for name in &args.clusters {
            cmd.args(["--cluster", name]);
        }
        if args.same_pod_cidr {
            cmd.arg("--same-pod-cidr");
        }
        if args.pod_network {
            cmd.arg("--pod-network");
        }
        if args.real_node {
            cmd.arg("--real-node");
        }
        if let Some(folder) = &args.agent_images {
            cmd.arg("--agent-images").arg(std::path::absolute(folder)?);
        }
        if let Some(qps) = args.controller_manager_qps {
            cmd.arg(format!("--controller-manager-qps={qps}"));
        }
        if args.without_mutating_admission_policy {
            cmd.arg("--without-mutating-admission-policy");
        }
        if args.profiling {
            cmd.arg("--profiling");
        }
        for (repository, binary) in &args.host_images {
            cmd.arg(format!("--host-image={repository}={binary}"));
        }
        // Resolved here: the default is this binary's folder, which the
        // supervisor (the same binary) would find too, but an explicit
        // path is what `status` and a reader of the log can check.
        if let Some(bin_dir) = args.agent_bin_dir()? {
            cmd.arg("--agent-bin-dir").arg(bin_dir);
        }
        cmd.spawn().context("starting the supervisor")?
    };

    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let state = loop {
        if let Some(state) = read_state(&dir) {
            break state;
        }
        if let Some(status) = child.try_wait()? {
            bail!(
                "the clusters did not start ({status}); the log ends with:\n{}",
                liqo_testbed::tail(&log_path, 30)
            );
        }
        if Instant::now() > deadline {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            bail!(
                "the clusters were not ready after {}s; the log ends with:\n{}",
                args.timeout,
                liqo_testbed::tail(&log_path, 30)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };

    println!(
        "{} cluster(s) ready in {:.1}s (folder {}):",
        state.clusters.len(),
        state.started_in_seconds,
        dir.display()
    );
    for c in &state.clusters {
        println!(
            "  {:<12} {}  pods {}  services {}",
            c.name, c.server, c.pod_cidr, c.service_cidr
        );
    }
    for c in &state.clusters {
        if let Some(node) = &c.host_node {
            println!("  {:<12} host-process node {node}", c.name);
        }
    }
    println!("\nReach them with kubectl:");
    for c in &state.clusters {
        println!(
            "  kubectl --kubeconfig {} get nodes",
            c.kubeconfig.display()
        );
    }
    println!("\nkubectl is in {}", toolchain.dir().display());
    println!("Stop them with: liqo-testbed down --dir {}", dir.display());
    Ok(())
}

fn run(args: &UpArgs) -> Result<()> {
    let dir = &args.dir.dir;
    // Not cleared: `up` has done that, and its log is already in there.
    check_ours(dir)?;
    dirs::claim(dir)?;
    let dir = dir.canonicalize()?;
    std::fs::write(dir.join("supervisor.pid"), std::process::id().to_string())?;
    // One thread only: the kernel ties each cluster process to the thread
    // that started it, and this one lives as long as the supervisor.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let started = Instant::now();
        let mut testbed = Testbed::start_in(&dir, args.specs()?).await?;
        let started_in_seconds = started.elapsed().as_secs_f64();
        // Bound before the state is written: once `up` returns, `apiserver`
        // commands work. A failure (a path too long for a socket) costs
        // only those commands, which then say so.
        let control = control_path(&dir);
        let _ = std::fs::remove_file(&control);
        let listener = tokio::net::UnixListener::bind(&control)
            .inspect_err(|e| {
                tracing::warn!("no control socket {}: {e}", control.display());
            })
            .ok();
        write_state(&dir, &testbed, started_in_seconds)?;
        tracing::info!("clusters ready in {started_in_seconds:.1}s");

        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut watch = tokio::time::interval(Duration::from_secs(2));
        loop {
            let accept = async {
                match &listener {
                    Some(listener) => listener.accept().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                _ = watch.tick() => {
                    for cluster in testbed.clusters_mut() {
                        if let Err(e) = cluster.ensure_running() {
                            tracing::error!("{e}");
                        }
                    }
                }
                accepted = accept => match accepted {
                    Ok((stream, _)) => {
                        serve_control(stream, &mut testbed, |testbed| {
                            write_state(&dir, testbed, started_in_seconds)
                        })
                        .await?;
                    }
                    Err(e) => tracing::warn!("accepting on the control socket: {e}"),
                },
            }
        }
        tracing::info!("stopping");
        let _ = std::fs::remove_file(state_path(&dir));
        let _ = std::fs::remove_file(&control);
        testbed.stop();
        Ok(())
    })
}

/// Records the clusters for `up`, `status`, `get` and `down`.
fn write_state(dir: &Path, testbed: &Testbed, started_in_seconds: f64) -> Result<()> {
    let state = State {
        supervisor_pid: std::process::id(),
        started_in_seconds,
        clusters: testbed
            .clusters()
            .iter()
            .map(|c| ClusterState {
                name: c.name().to_owned(),
                server: c.server().to_owned(),
                kubeconfig: c.kubeconfig_path().to_owned(),
                pod_cidr: c.spec().pod_cidr.clone(),
                service_cidr: c.spec().service_cidr.clone(),
                host_node: c.host_node_name().or(c.real_node_name()).map(str::to_owned),
                node_netns: c.node_netns().map(str::to_owned),
                node_address: c.node_address(),
                apiserver: Some(c.apiserver_state()),
                processes: c.processes(),
            })
            .collect(),
    };
    // Written whole, then renamed: `up` never reads half a file.
    let tmp = dir.join("state.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&state)?)?;
    std::fs::rename(&tmp, state_path(dir))?;
    Ok(())
}

/// Answers one request of `liqo-testbed apiserver` on the control socket:
/// a line `<action> <cluster>`, answered by `ok <state>` or `error
/// <message>`, after `record` has written the state down (a caller that
/// reads `state.json` once answered sees what it asked for). One at a
/// time: the supervisor's loop waits meanwhile.
async fn serve_control(
    stream: tokio::net::UnixStream,
    testbed: &mut Testbed,
    record: impl FnOnce(&Testbed) -> Result<()>,
) -> Result<()> {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut read = tokio::io::BufReader::new(read);
    let reply = match tokio::time::timeout(Duration::from_secs(5), read.read_line(&mut line)).await
    {
        Ok(Ok(_)) => match control(testbed, line.trim()).await {
            Ok(state) => format!("ok {state}\n"),
            // One line: the protocol is line-based.
            Err(e) => format!("error {}\n", format!("{e:#}").replace('\n', " ")),
        },
        Ok(Err(e)) => format!("error reading the request: {e}\n"),
        Err(_) => "error no request within 5s\n".to_owned(),
    };
    record(testbed)?;
    if let Err(e) = write.write_all(reply.as_bytes()).await {
        tracing::warn!("answering on the control socket: {e}");
    }
    Ok(())
}

async fn control(testbed: &mut Testbed, request: &str) -> Result<ApiServerState> {
    let (action, name) = request
        .split_once(' ')
        .with_context(|| format!("malformed request {request:?}"))?;
    let action =
        ApiServerAction::parse(action).with_context(|| format!("unknown action {action:?}"))?;
    let names: Vec<String> = testbed
        .clusters()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    let Some(cluster) = testbed.clusters_mut().iter_mut().find(|c| c.name() == name) else {
        bail!("no cluster {name:?}; there are {names:?}");
    };
    tracing::info!(cluster = %name, "kube-apiserver: {}", action.name());
    match action {
        ApiServerAction::Stop => cluster.stop_apiserver().await?,
        ApiServerAction::Start => cluster.start_apiserver().await?,
        ApiServerAction::Restart => cluster.restart_apiserver().await?,
        ApiServerAction::Pause => cluster.pause_apiserver()?,
        ApiServerAction::Resume => cluster.resume_apiserver()?,
    }
    Ok(cluster.apiserver_state())
}

/// `liqo-testbed apiserver`: asks the supervisor over its control socket.
fn apiserver(dir: &Path, action: ApiServerAction, name: &str) -> Result<()> {
    if running_supervisor(dir).is_none() {
        bail!("no clusters are running in {}", dir.display());
    }
    let path = control_path(dir);
    let mut stream = std::os::unix::net::UnixStream::connect(&path).with_context(|| {
        format!(
            "the supervisor does not listen on {} (see {})",
            path.display(),
            dir.join("testbed.log").display()
        )
    })?;
    // A start waits for readiness, at most 90 s in the supervisor.
    stream.set_read_timeout(Some(Duration::from_secs(150)))?;
    writeln!(stream, "{} {name}", action.name())?;
    let mut reply = String::new();
    std::io::BufReader::new(stream)
        .read_line(&mut reply)
        .context("waiting for the supervisor's answer")?;
    match reply.trim_end().split_once(' ') {
        Some(("ok", state)) => {
            println!("kube-apiserver of {name}: {state}");
            Ok(())
        }
        Some(("error", message)) => bail!("{message}"),
        _ => bail!("the supervisor answered {reply:?}"),
    }
}

fn down(dir: &Path, keep: bool) -> Result<()> {
    // Before anything is signalled or deleted: `--dir .` or a typo must
    // leave the folder, and whatever it names, alone.
    if dir.exists() && !dirs::made_by_testbed(dir) {
        return Err(not_ours(dir));
    }
    let state = read_state(dir);
    match running_supervisor(dir) {
        Some(pid) => {
            kill(Pid::from_raw(pid as i32), Signal::SIGTERM)?;
            let deadline = Instant::now() + Duration::from_secs(30);
            while alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if alive(pid) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
        None if !dir.exists() => {
            println!("nothing runs in {}", dir.display());
            return Ok(());
        }
        None => {}
    }
    // The cluster processes die with the supervisor; make sure of it.
    let leftovers: Vec<&ProcessInfo> = state
        .iter()
        .flat_map(|s| s.clusters.iter().flat_map(|c| &c.processes))
        .filter(|p| alive(p.pid))
        .collect();
    for p in &leftovers {
        let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGKILL);
    }
    // What a supervisor killed with SIGKILL could not remove: its node and
    // internet namespaces, its real nodes' cgroups.
    liqo_testbed::reap_stale();
    if !keep {
        dirs::remove(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    println!("stopped the clusters in {}", dir.display());
    Ok(())
}

fn get(dir: &Path, name: &str, field: Field) -> Result<()> {
    let Some(state) = read_state(dir).filter(|_| running_supervisor(dir).is_some()) else {
        bail!("no clusters are running in {}", dir.display());
    };
    let Some(cluster) = state.clusters.iter().find(|c| c.name == name) else {
        let names: Vec<&str> = state.clusters.iter().map(|c| c.name.as_str()).collect();
        bail!(
            "no cluster {name:?} in {}; there are {names:?}",
            dir.display()
        );
    };
    match field {
        Field::Kubeconfig => println!("{}", cluster.kubeconfig.display()),
        Field::Server => println!("{}", cluster.server),
        Field::PodCidr => println!("{}", cluster.pod_cidr),
        Field::ServiceCidr => println!("{}", cluster.service_cidr),
        Field::NodeNetns | Field::NodeAddress => {
            let value = match field {
                Field::NodeNetns => cluster.node_netns.clone(),
                _ => cluster.node_address.map(|a| a.to_string()),
            };
            let Some(value) = value else {
                bail!("cluster {name:?} has no pod network (start it with --pod-network)");
            };
            println!("{value}");
        }
    }
    Ok(())
}

fn status(dir: &Path, json: bool) -> Result<()> {
    let Some(mut state) = read_state(dir).filter(|_| running_supervisor(dir).is_some()) else {
        bail!("no clusters are running in {}", dir.display());
    };
    for cluster in &mut state.clusters {
        for p in &mut cluster.processes {
            p.resident_bytes = liqo_testbed::resident_bytes(p.pid);
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&state)?);
        return Ok(());
    }
    const MIB: f64 = 1024.0 * 1024.0;
    let line = |name: &str, p: &ProcessInfo| match p.resident_bytes {
        Some(b) => println!("  {name:<32} pid {:<8} {:>8.1} MiB", p.pid, b as f64 / MIB),
        None => println!("  {name:<32} pid {:<8} NOT RUNNING", p.pid),
    };
    for c in &state.clusters {
        let total: u64 = c.processes.iter().filter_map(|p| p.resident_bytes).sum();
        let apiserver = match c.apiserver {
            Some(state @ (ApiServerState::Paused | ApiServerState::Stopped)) => {
                format!("  kube-apiserver {state}")
            }
            _ => String::new(),
        };
        println!(
            "{}  {}  kubeconfig {}{apiserver}",
            c.name,
            c.server,
            c.kubeconfig.display()
        );
        for p in &c.processes {
            line(&p.name, p);
        }
        println!("  {:<32} {:>21.1} MiB", "control plane", total as f64 / MIB);
        // The host-process node's agents, found by their KUBECONFIG.
        let cluster_dir = c.kubeconfig.parent().unwrap_or(dir);
        for p in liqo_testbed::agent_processes(cluster_dir) {
            line(&format!("agent {}", p.name), &p);
        }
    }
    Ok(())
}
