//! One test cluster: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, kwok with its fake worker nodes and, if asked for, a
//! host-process node (see [`crate::hostnode`]), all on loopback, and in the
//! pod-network mode its node namespace and kube-proxy (see
//! [`crate::podnet`]); all stopped when the [`Cluster`] is dropped.
//!
//! The cluster's parts are in files of their own: what a cluster should
//! look like ([`spec`]), its certificates and kubeconfigs
//! ([`credentials`]), how its processes are started ([`start`]), kwok and
//! its fake nodes ([`kwok`]), its other nodes ([`nodes`]) and the
//! kube-apiserver under a test's control ([`apiserver`]).

mod apiserver;
mod credentials;
mod kwok;
mod nodes;
mod spec;
mod start;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::hostnode::{self, HostNode};
use crate::podnet::{self, Internet, NodeNet};
use crate::process::{Process, resident_bytes};
use crate::realnode::RealNode;
use crate::toolchain::Toolchain;
use crate::{Error, io_error};
use apiserver::ApiServer;
pub use apiserver::ApiServerState;
pub(crate) use credentials::kubeconfig;
pub use credentials::{client_from_kubeconfig, kubeconfig_json};
pub use kwok::KWOK_ANNOTATION;
use kwok::KWOK_LOGS_FILE;
pub use spec::ClusterSpec;

/// How long each start-up phase may take before the start fails.
const PHASE_TIMEOUT: Duration = Duration::from_secs(90);

/// A process of a running cluster, as [`Cluster::processes`] reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub name: String,
    pub pid: u32,
    /// Resident memory in bytes, if the process is still running.
    pub resident_bytes: Option<u64>,
}

/// A pod-network cluster's place on its testbed's internet.
#[derive(Debug, Clone)]
pub(crate) struct Uplink {
    pub(crate) internet: Arc<Internet>,
    /// The last byte of the node's address there.
    pub(crate) place: u8,
}

/// A running cluster.
#[derive(Debug)]
pub struct Cluster {
    spec: ClusterSpec,
    dir: PathBuf,
    kubeconfig: PathBuf,
    server: String,
    /// In start order; stopped in reverse.
    processes: Vec<Process>,
    /// Set once the kube-apiserver has been started.
    apiserver: Option<ApiServer>,
    /// Stopped before the control plane, while the API still answers.
    host_node: Option<HostNode>,
    /// The real-node mode's node; stopped before the control plane.
    real_node: Option<RealNode>,
    /// The node namespace of the pod-network mode; deleted last.
    node_net: Option<NodeNet>,
}

impl Cluster {
    /// Starts a cluster whose files live in `dir` (created if missing), and
    /// returns once its API answers, its nodes (the host-process node too,
    /// if any) are Ready with a pod CIDR and its controllers have created
    /// the default service account.
    ///
    /// A pod-network cluster started alone has an internet of its own;
    /// [`crate::Testbed`] joins its clusters on one.
    pub async fn start(
        spec: ClusterSpec,
        dir: &Path,
        toolchain: &Toolchain,
    ) -> Result<Self, Error> {
        Self::start_with(spec, dir, toolchain, None).await
    }

    /// [`Cluster::start`], with the node of a pod-network cluster on
    /// `uplink`'s internet.
    pub(crate) async fn start_with(
        spec: ClusterSpec,
        dir: &Path,
        toolchain: &Toolchain,
        uplink: Option<Uplink>,
    ) -> Result<Self, Error> {
        if (spec.pod_network || spec.real_node) && spec.agent_bin_dir.is_none() {
            return Err(Error::Spec(format!(
                "cluster {}: the pod-network and real-node modes need an agent folder",
                spec.name
            )));
        }
        let uplink = match uplink {
            Some(uplink) => Some(uplink),
            None if spec.has_node_netns() => Some(Uplink {
                internet: Internet::new()?,
                place: 1,
            }),
            None => None,
        };
        // Ports are picked free but taken only later, so another process may
        // win one in between; that shows as an exit at start, and a new set
        // of ports fixes it.
        let mut attempt = 1;
        loop {
            match Self::start_once(spec.clone(), dir, toolchain, uplink.clone()).await {
                Err(Error::Exited { ref log, .. })
                    if attempt < 3 && log.contains("address already in use") =>
                {
                    attempt += 1;
                    tracing::warn!(cluster = %spec.name, "a port was taken meanwhile; starting again");
                }
                result => return result,
            }
        }
    }

    /// Polls `check` until it answers true, failing early if a process of
    /// the cluster exits, and after [`PHASE_TIMEOUT`].
    async fn wait_for<F, Fut>(&mut self, what: &str, check: F) -> Result<(), Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<bool, Error>>,
    {
        self.wait_within(what, PHASE_TIMEOUT, check).await
    }

    /// [`Cluster::wait_for`] with a time of its own. On timeout the error
    /// holds the log of the real node's kubelet if the cluster has one (it
    /// is what the wait is for), else the last process's.
    async fn wait_within<F, Fut>(
        &mut self,
        what: &str,
        patience: Duration,
        mut check: F,
    ) -> Result<(), Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<bool, Error>>,
    {
        let deadline = Instant::now() + patience;
        loop {
            self.ensure_running()?;
            if check().await? {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log = match &self.real_node {
                    Some(node) => node.log_tail(20),
                    None => self
                        .processes
                        .last()
                        .map(|p| format!("{}:\n{}", p.name(), p.log_tail(20)))
                        .unwrap_or_default(),
                };
                return Err(Error::Timeout {
                    cluster: self.spec.name.clone(),
                    what: what.to_owned(),
                    log,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Fails if any process of the cluster has exited, or the loop of its
    /// host-process node has; a kube-apiserver stopped with
    /// [`Cluster::stop_apiserver`] has not crashed, and does not count.
    pub fn ensure_running(&mut self) -> Result<(), Error> {
        if let Some(host) = &self.host_node {
            host.ensure_running()?;
        }
        if let Some(node) = &mut self.real_node {
            node.ensure_running()?;
        }
        let stopped_on_purpose = self
            .apiserver
            .as_ref()
            .filter(|a| a.state == ApiServerState::Stopped)
            .map(|a| a.index);
        for (i, process) in self.processes.iter_mut().enumerate() {
            if Some(i) == stopped_on_purpose {
                continue;
            }
            if let Some(status) = process.exited() {
                return Err(Error::Exited {
                    cluster: self.spec.name.clone(),
                    process: process.name().to_owned(),
                    status: status.to_string(),
                    log: process.log_tail(30),
                });
            }
        }
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// The folder with the cluster's PKI, logs and kubeconfig files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file whose lines every container of a kwok pod logs (`kubectl
    /// logs`, followed as lines are appended).
    pub fn kwok_logs_path(&self) -> PathBuf {
        self.dir.join(KWOK_LOGS_FILE)
    }

    /// An admin kubeconfig (a client certificate in `system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The cluster CA certificate (PEM), which also signs approved CSRs.
    pub fn ca_pem(&self) -> Result<String, Error> {
        let path = self.dir.join("pki").join("ca.crt");
        std::fs::read_to_string(&path).map_err(io_error(&path))
    }

    /// A client with the admin's rights.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// The node namespace's name, for a pod-network cluster: where its
    /// kube-proxy and host-network pods run (`ip netns exec <name> …`).
    pub fn node_netns(&self) -> Option<&str> {
        self.node_net.as_ref().map(NodeNet::name)
    }

    /// The node's address on the testbed's internet (192.168.100.N/24, N
    /// being the cluster's place in its testbed), for a pod-network
    /// cluster: its InternalIP and host-network pods' IP.
    pub fn node_address(&self) -> Option<Ipv4Addr> {
        self.node_net.as_ref().map(NodeNet::address)
    }

    /// The name of the network namespace of the pod with address `pod_ip`,
    /// for a pod-network cluster (whether or not such a pod exists).
    pub fn pod_netns(&self, pod_ip: Ipv4Addr) -> Option<String> {
        let port = self.api_port()?;
        self.node_net
            .as_ref()
            .map(|_| podnet::names::pod(port, pod_ip))
    }

    /// The node namespace's end of the veth of the pod with address
    /// `pod_ip`, for a pod-network cluster.
    pub fn pod_veth(&self, pod_ip: Ipv4Addr) -> Option<String> {
        self.node_net.as_ref().map(|_| podnet::names::veth(pod_ip))
    }

    /// Cuts (`false`) or mends (`true`) the node's link to the testbed's
    /// internet: the node keeps its address, and its pods their gateway;
    /// packets to and from other nodes are lost meanwhile.
    pub fn set_internet_link(&self, up: bool) -> Result<(), Error> {
        match &self.node_net {
            Some(net) => net.set_internet_link(up),
            None => Err(Error::Spec(format!(
                "cluster {} has no pod network",
                self.spec.name
            ))),
        }
    }

    /// A command that runs `program` in the node namespace (through `ip
    /// netns exec`), for a pod-network cluster.
    pub fn node_command(&self, program: &str) -> Option<std::process::Command> {
        let netns = self.node_netns()?;
        let mut cmd = std::process::Command::new("ip");
        cmd.args(["netns", "exec", netns, program]);
        Some(cmd)
    }

    /// The API server's port, from its URL.
    fn api_port(&self) -> Option<u16> {
        self.server.rsplit_once(':')?.1.parse().ok()
    }

    /// The name of the host-process node, if the cluster has one.
    pub fn host_node_name(&self) -> Option<&str> {
        self.host_node.as_ref().map(HostNode::name)
    }

    /// Gives image `source` of the real node the name `target` too, as
    /// loading an image under that name into the node would.
    pub fn tag_node_image(&self, source: &str, target: &str) -> Result<(), Error> {
        let node = self
            .real_node
            .as_ref()
            .ok_or_else(|| Error::Spec(format!("cluster {} has no real node", self.spec.name)))?;
        node.containerd()
            .tag(source, target)
            .map_err(|e| Error::Spec(format!("real node {}: {e}", node.name())))
    }

    /// The name of the real node, in the real-node mode.
    pub fn real_node_name(&self) -> Option<&str> {
        self.real_node.as_ref().map(RealNode::name)
    }

    /// The folder that holds the folder of each volume the local-path
    /// provisioner made (`<cluster>/storage/`, one folder per claim), in
    /// the real-node mode: empty once every claim is deleted.
    pub fn storage_dir(&self) -> Option<PathBuf> {
        self.real_node
            .as_ref()
            .map(|_| crate::storage::folder(&self.dir))
    }

    /// The end (100 lines) of the log of every container the host-process
    /// node ran, each under a `==> <namespace>_<pod>_<container>.log <==`
    /// header: what a failing test prints to show the agents' side.
    pub fn pod_logs(&self) -> String {
        hostnode::pod_logs(&self.dir.join("pods"))
    }

    /// The cluster's control-plane processes and their resident memory.
    pub fn processes(&self) -> Vec<ProcessInfo> {
        self.processes
            .iter()
            .map(|p| (p.name().to_owned(), p.pid()))
            .chain(
                self.real_node
                    .as_ref()
                    .and_then(RealNode::pid)
                    .map(|pid| ("real node".to_owned(), pid)),
            )
            .map(|(name, pid)| ProcessInfo {
                name,
                pid,
                resident_bytes: resident_bytes(pid),
            })
            .collect()
    }

    /// Stops every process, the last started first.
    pub fn stop(mut self) {
        self.stop_processes();
    }

    fn stop_processes(&mut self) {
        if let Some(mut host) = self.host_node.take() {
            host.stop();
        }
        self.real_node.take();
        // A paused kube-apiserver would hold SIGTERM pending until killed
        // after the grace period; resumed, it exits at once.
        if self.apiserver_state() == ApiServerState::Paused {
            let _ = self.resume_apiserver();
        }
        while let Some(mut process) = self.processes.pop() {
            process.stop(Duration::from_secs(5));
        }
        // Once nothing runs in it.
        self.node_net.take();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_processes();
    }
}
