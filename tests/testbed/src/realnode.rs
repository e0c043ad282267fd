//! The real-node mode (`ClusterSpec::real_node`): the cluster's node
//! namespace (see `crate::podnet`) runs a real kubelet with Debian's
//! containerd, runc and CNI plugins, as a cluster's node does, instead of
//! the host-process node; kube-proxy serves its Services there.
//!
//! - Isolation from the machine and from other nodes: containerd and the
//!   kubelet run in a PID and mount namespace of their own
//!   (`unshare --pid --mount --fork --kill-child`), inside the node's
//!   network namespace. When the node stops, or the process that started
//!   it dies however it dies, the kernel kills every process of that PID
//!   namespace (containerd's shims and the containers too) and drops
//!   every mount of it (overlays, volumes, pinned pod namespaces). What
//!   is left is removed by the node ([`RealNode`]'s drop) or by the next
//!   testbed of the machine ([`reap_stale`]): its cgroups, named after
//!   the process that made them. Its files live in its cluster's folder.
//! - The kubelet has its own cgroup root, root folder, log folder and
//!   node address; containerd its own root, state and socket; the CNI
//!   network its own folders. The kubelet sets the kernel tunables a
//!   kubelet sets (`vm.overcommit_memory`, `kernel.panic`, …), which are
//!   the machine's.
//! - Images: nothing is pulled. The node holds the pause image, a
//!   toolbox for the tests' workloads (busybox, curl), CoreDNS's image
//!   (the cluster's DNS, [`crate::dns`]), local-path-provisioner's and a
//!   busybox for its pods (the cluster's storage, [`crate::storage`]), and
//!   the agents' images made from the agent folder's binaries ([`images`]).
//! - The ways in and out: pods reach the API servers on the host's
//!   loopback through a relay the CNI network puts in each of them
//!   ([`cni`]); the API server reaches the kubelet and pods (logs, exec,
//!   port-forward, webhooks) through an HTTP CONNECT proxy that dials from
//!   the node's namespace ([`egress`]).

mod cni;
pub(crate) mod config;
mod egress;
mod images;

pub use cni::protocol;
pub use config::TOOLBOX_IMAGE;

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::Error;
use crate::podnet::relay::{ApiService, Relay};
use crate::process::{self, Process};

/// The CNI plugin that gives pods their relay: a program of the agent
/// folder (`liqo-testbed-cni`), linked into the node's CNI folder.
pub(crate) const CNI_PLUGIN: &str = "liqo-testbed-cni";

/// Debian's CNI plugins.
const CNI_PLUGINS_DIR: &str = "/usr/lib/cni";
const CNI_PLUGINS: [&str; 3] = ["ptp", "host-local", "loopback"];

/// The cgroup hierarchies a kubelet needs (cgroup v1), and the ones it
/// uses when mounted.
const CGROUP_CONTROLLERS: [&str; 9] = [
    "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd",
];
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// What starts a real node.
#[derive(Debug, Clone)]
pub(crate) struct RealNodeConfig {
    pub(crate) cluster: String,
    pub(crate) node_name: String,
    /// The node's folder, in its cluster's.
    pub(crate) dir: PathBuf,
    /// The node's network namespace, and its address there.
    pub(crate) netns: PathBuf,
    pub(crate) address: Ipv4Addr,
    pub(crate) kubelet: PathBuf,
    pub(crate) kubeconfig: PathBuf,
    pub(crate) ca_crt: PathBuf,
    /// Where the agents' binaries are, for their images and the CNI plugin.
    pub(crate) agent_bin_dir: PathBuf,
    /// The shipped images' archives, imported instead of images made from
    /// `agent_bin_dir` ([`crate::ClusterSpec::agent_images`]).
    pub(crate) agent_images: Option<PathBuf>,
    /// The `kubernetes` Service, which pods are carried to.
    pub(crate) service: ApiService,
    /// The socket of the API server's egress selection.
    pub(crate) egress_socket: PathBuf,
    /// Names the node's cgroup: unique on the machine while it runs.
    pub(crate) api_port: u16,
    /// Hide `/dev/net/tun` from the node.
    pub(crate) without_tun: bool,
    /// The cluster's DNS: the `kube-dns` Service's address.
    pub(crate) cluster_dns: Ipv4Addr,
    /// The toolchain's binaries the add-ons' images are made of.
    pub(crate) add_ons: AddOns,
}

/// The binaries of the cluster's add-ons that run on the node, from the
/// toolchain: CoreDNS ([`crate::dns`]) and local-path-provisioner
/// ([`crate::storage`]).
#[derive(Debug, Clone)]
pub(crate) struct AddOns {
    pub(crate) coredns: PathBuf,
    pub(crate) local_path_provisioner: PathBuf,
}

/// A running real node. Dropping it stops everything it started.
#[derive(Debug)]
pub(crate) struct RealNode {
    name: String,
    dir: PathBuf,
    cgroup: String,
    daemons: Option<Process>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RealNode {
    /// Starts containerd and the kubelet, and imports the images; returns
    /// once containerd holds them (the kubelet registers the node on its
    /// own: the caller waits for it to be Ready).
    pub(crate) fn start(config: RealNodeConfig) -> Result<Self, Error> {
        reap_stale();
        raise_inotify_limits();
        let dir = std::path::absolute(&config.dir).map_err(crate::io_error(&config.dir))?;
        for sub in ["cni/bin", "cni/net.d", "cni/ipam", "pod-logs", "kubelet"] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(crate::io_error(&path))?;
        }
        let plugin = config.agent_bin_dir.join(CNI_PLUGIN);
        if !plugin.exists() {
            return Err(Error::Spec(format!(
                "the real node needs {} (cargo build -p liqo-testbed)",
                plugin.display()
            )));
        }
        for (name, from) in CNI_PLUGINS
            .iter()
            .map(|p| (*p, Path::new(CNI_PLUGINS_DIR).join(p)))
            .chain([(CNI_PLUGIN, plugin)])
        {
            if !from.exists() {
                return Err(Error::Spec(format!(
                    "the real node needs the CNI plugin {} (Debian's containernetworking-plugins: tests/setup.sh)",
                    from.display()
                )));
            }
            let link = dir.join("cni/bin").join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&from, &link).map_err(crate::io_error(&link))?;
        }
        let write = |name: &str, text: String| -> Result<PathBuf, Error> {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(crate::io_error(&path))?;
            Ok(path)
        };
        let relay_socket = dir.join("cni.sock");
        // A node started again in the same folder: the sockets of the
        // last start are stale (the kubelet would dial containerd's
        // before the new one listens, and fail).
        let containerd_socket = crate::containerd::socket_in(&dir);
        for stale in [
            relay_socket.clone(),
            config.egress_socket.clone(),
            containerd_socket.with_extension("sock.ttrpc"),
            containerd_socket,
        ] {
            let _ = std::fs::remove_file(stale);
        }
        let containerd_config = write("containerd.toml", config::containerd(&dir, config.address))?;
        write(
            "cni/template.json",
            config::cni_template(&dir, &relay_socket),
        )?;
        let cgroup = cgroup_name(config.api_port);
        make_cgroup(&cgroup)?;
        let kubelet_config = write(
            "kubelet.json",
            config::kubelet(&config::Kubelet {
                dir: &dir,
                ca_crt: &config.ca_crt,
                address: config.address,
                cgroup_root: &format!("/{cgroup}"),
                cluster_dns: config.cluster_dns,
            }),
        )?;

        // The node's tasks: the CNI plugin's server and the API server's
        // egress proxy, on a thread of their own.
        let netns = File::open(&config.netns).map_err(crate::io_error(&config.netns))?;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let node_netns = config.netns.clone();
        let service = config.service;
        let egress_socket = config.egress_socket.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let thread = std::thread::Builder::new()
            .name(config.node_name.clone())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    // The node namespace's own relay, for host-network pods
                    // and the daemons.
                    let relay = match start_relay(&node_netns, service).await {
                        Ok(relay) => relay,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                    let cni = tokio::spawn(cni::serve(relay_socket, service));
                    let egress = tokio::spawn(egress::serve(egress_socket, netns));
                    let _ = ready_tx.send(Ok(()));
                    let _ = stop_rx.await;
                    cni.abort();
                    egress.abort();
                    drop(relay);
                });
            })
            .map_err(crate::io_error(&dir))?;
        let mut node = Self {
            name: config.node_name.clone(),
            dir: dir.clone(),
            cgroup,
            daemons: None,
            stop: Some(stop_tx),
            thread: Some(thread),
        };
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Error::Spec(format!("real node {}: {e}", node.name))),
            Err(_) => {
                return Err(Error::Spec(format!(
                    "real node {}: its thread ended",
                    node.name
                )));
            }
        }

        let socket = crate::containerd::socket_in(&dir);
        // Over /dev/net, in the node's mount namespace only.
        let hide_tun = if config.without_tun {
            "mount -t tmpfs -o size=4k,mode=755 no-tun /dev/net\n"
        } else {
            ""
        };
        let script = format!(
            "{hide_tun}containerd --config '{containerd}' >>'{containerd_log}' 2>&1 &\n\
             while [ ! -S '{socket}' ]; do sleep 0.1; done\n\
             '{kubelet}' --config='{kubelet_config}' --kubeconfig='{kubeconfig}' \
             --root-dir='{root}' --cert-dir='{root}/pki' --hostname-override='{name}' --node-ip='{address}' \
             --v=2 >>'{kubelet_log}' 2>&1 &\n\
             wait\n",
            containerd = containerd_config.display(),
            containerd_log = dir.join("containerd.log").display(),
            socket = socket.display(),
            kubelet = config.kubelet.display(),
            kubelet_config = kubelet_config.display(),
            kubeconfig = config.kubeconfig.display(),
            root = dir.join("kubelet").display(),
            name = config.node_name,
            address = config.address,
            kubelet_log = dir.join("kubelet.log").display(),
        );
        let mut cmd = std::process::Command::new("unshare");
        cmd.args([
            "--pid",
            "--mount",
            "--fork",
            "--mount-proc",
            "--kill-child=SIGKILL",
            "--",
            "/bin/sh",
            "-c",
            &script,
        ]);
        process::with_netns(&mut cmd, Some(&config.netns))
            .map_err(crate::io_error(&config.netns))?;
        let log = dir.join("node.log");
        node.daemons =
            Some(Process::spawn_command("real node", cmd, &log).map_err(crate::io_error(&log))?);

        let containerd = crate::Containerd::attach(&socket);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !containerd.answers() {
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    cluster: config.cluster.clone(),
                    what: "the real node's containerd".into(),
                    log: process::tail(&dir.join("containerd.log"), 20),
                });
            }
            node.ensure_running()?;
            std::thread::sleep(Duration::from_millis(100));
        }
        let agents_from_binaries = match &config.agent_images {
            Some(_) => None,
            None => Some(config.agent_bin_dir.as_path()),
        };
        for archive in
            images::write_all(&dir.join("images"), agents_from_binaries, &config.add_ons)?
        {
            containerd
                .import(&archive)
                .map_err(|e| Error::Spec(format!("real node {}: {e}", node.name)))?;
            let _ = std::fs::remove_file(&archive);
        }
        if let Some(folder) = &config.agent_images {
            for archive in images::shipped(folder)? {
                containerd
                    .import(&archive)
                    .map_err(|e| Error::Spec(format!("real node {}: {e}", node.name)))?;
            }
        }
        Ok(node)
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The node's containerd.
    pub(crate) fn containerd(&self) -> crate::Containerd {
        crate::Containerd::attach(&crate::containerd::socket_in(&self.dir))
    }

    /// An error if containerd and the kubelet are no longer running.
    pub(crate) fn ensure_running(&mut self) -> Result<(), Error> {
        match self.daemons.as_mut().and_then(Process::exited) {
            Some(status) => Err(Error::Exited {
                cluster: self.name.clone(),
                process: "real node (containerd, kubelet)".into(),
                status: status.to_string(),
                log: self.log_tail(10),
            }),
            None => Ok(()),
        }
    }

    /// The last `lines` of containerd's and the kubelet's logs.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        format!(
            "containerd:\n{}\nkubelet:\n{}",
            process::tail(&self.dir.join("containerd.log"), lines),
            process::tail(&self.dir.join("kubelet.log"), lines)
        )
    }

    /// The pid of the node's daemons' parent (`unshare`).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.daemons.as_ref().map(Process::pid)
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        // Every process of the node's PID namespace dies with it, and its
        // mounts with them.
        if let Some(mut daemons) = self.daemons.take() {
            daemons.kill();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        remove_cgroup(&self.cgroup, Duration::from_secs(10));
    }
}

/// The node's cgroup (in each hierarchy): after the process that owns it,
/// as the namespaces of `crate::podnet` are, so that [`reap_stale`] knows
/// an orphan.
fn cgroup_name(api_port: u16) -> String {
    format!("lqtb-{}-{api_port}-node", std::process::id())
}

/// Makes the node's cgroup in each hierarchy; cpuset's needs the CPUs and
/// memory nodes of its parent before anything can join it.
fn make_cgroup(name: &str) -> Result<(), Error> {
    for controller in CGROUP_CONTROLLERS {
        let hierarchy = Path::new(CGROUP_ROOT).join(controller);
        if !hierarchy.exists() {
            continue;
        }
        let path = hierarchy.join(name);
        std::fs::create_dir_all(&path).map_err(crate::io_error(&path))?;
        if controller == "cpuset" {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let value = std::fs::read_to_string(hierarchy.join(file))
                    .map_err(crate::io_error(&hierarchy.join(file)))?;
                std::fs::write(path.join(file), value.trim())
                    .map_err(crate::io_error(&path.join(file)))?;
            }
        }
    }
    Ok(())
}

/// Each kubelet and containerd takes inotify instances (their file
/// watchers, cadvisor's); with several clusters on the machine the
/// default 128 per user ran out, and a kubelet then stalled or failed
/// ("error creating fsnotify watcher: too many open files"). Raised, as
/// the kubelet raises the machine's other tunables; never lowered.
fn raise_inotify_limits() {
    for (file, want) in [
        ("/proc/sys/fs/inotify/max_user_instances", 8192u64),
        ("/proc/sys/fs/inotify/max_user_watches", 524_288),
    ] {
        let now: u64 = std::fs::read_to_string(file)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if now < want
            && let Err(e) = std::fs::write(file, want.to_string())
        {
            tracing::warn!(%file, error = %e, "cannot raise an inotify limit");
        }
    }
}

/// The node namespace's relay; a node started again in the same
/// namespace may find the last one's port not yet released: tried again
/// for a few seconds.
async fn start_relay(netns: &Path, service: ApiService) -> std::io::Result<Relay> {
    let mut tries = 0;
    loop {
        match File::open(netns).and_then(|ns| Relay::start_with(ns, "node", Some(service))) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries < 20 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            other => return other,
        }
    }
}

/// Removes the cgroup `name` and those under it, in every hierarchy,
/// waiting up to `patience` for the processes in them to be gone.
fn remove_cgroup(name: &str, patience: Duration) {
    let deadline = Instant::now() + patience;
    for controller in CGROUP_CONTROLLERS {
        let top = Path::new(CGROUP_ROOT).join(controller).join(name);
        if !top.exists() {
            continue;
        }
        let mut folders = Vec::new();
        collect_folders(&top, &mut folders);
        // The deepest first.
        folders.sort_by_key(|f| std::cmp::Reverse(f.components().count()));
        for folder in folders {
            while std::fs::remove_dir(&folder).is_err() && folder.exists() {
                if Instant::now() > deadline {
                    tracing::warn!(cgroup = %folder.display(), "could not remove a cgroup of a real node");
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn collect_folders(dir: &Path, into: &mut Vec<PathBuf>) {
    into.push(dir.to_owned());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_folders(&entry.path(), into);
            }
        }
    }
}

/// Removes the cgroups of real nodes whose testbed process is gone (one
/// killed with SIGKILL could not).
pub(crate) fn reap_stale() {
    let Ok(entries) = std::fs::read_dir(Path::new(CGROUP_ROOT).join("pids")) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("lqtb-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && crate::process::is_gone(pid) {
            tracing::info!(cgroup = %name, "removing the cgroup of a real node whose testbed is gone");
            remove_cgroup(&name, Duration::from_secs(5));
        }
    }
}

/// The cgroups of real nodes that the process `pid` made and that are
/// still there, by hierarchy and name (for tests of the clean-up).
pub fn cgroups_of(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("lqtb-{pid}-");
    CGROUP_CONTROLLERS
        .iter()
        .filter_map(|c| std::fs::read_dir(Path::new(CGROUP_ROOT).join(c)).ok())
        .flat_map(|entries| entries.flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}
