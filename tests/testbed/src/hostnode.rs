//! The host-process node: one extra node per test cluster, `<cluster>-host`,
//! on which the pods of allow-listed images run as real local processes
//! (the freshly built agent binaries), with the Kubernetes credentials of
//! their service account, so that the in-cluster agents really run in tests
//! under the RBAC their manifests give them.
//!
//! It is a small kubelet, and a test node that does not lie: where it
//! cannot do what a pod asks, the pod fails as it would on a real node,
//! rather than pretend to run. It owns the Node, its Lease, the pods bound
//! to the node (their processes, volumes, status, events and final
//! deletion), the files under `<cluster dir>/pods/` (each container's log,
//! each pod's token, kubeconfig, volumes and working folder) and the mount
//! points it makes on the host. It touches no other node and no other pod.
//!
//! What it does as a kubelet does:
//! - Images: an explicit allow-list (`ClusterSpec::host_images`, image
//!   repository without tag or digest → binary of the agent folder; by
//!   default [`default_host_images`]) says what runs. Any other image, or
//!   an allow-listed one whose binary was not built, fails to pull: the
//!   container waits in `ErrImagePull`, then `ImagePullBackOff`, the pod is
//!   Pending and never Ready, and a `Failed` event says why.
//! - Scheduling: the node is tainted [`HOST_PROCESS_TAINT`]`=true:NoSchedule`
//!   and labelled [`HOST_PROCESS_LABEL`]`=true`; a pod meant for it selects
//!   the label and tolerates the taint (`liqoctl install --node-selector …
//!   --toleration …`), and no other pod lands on it.
//! - Containers get their args (`$(VAR)` expanded), env (values, downward
//!   API, ConfigMap and Secret keys), `workingDir` (a folder of the host)
//!   and volumes; a missing ConfigMap, Secret or key that is not optional
//!   leaves them waiting in `CreateContainerConfigError`.
//! - Volumes: `secret`, `configMap`, `downwardAPI`, `emptyDir` and
//!   `projected` (of those and `serviceAccountToken`, such as the
//!   `kube-api-access-…` volume every pod gets) are folders
//!   `<pod dir>/volumes/<volume>/`, with `items`, modes and `optional`
//!   honoured, kept up to date every second (each changed file written
//!   aside and renamed over). Each process runs in a mount namespace of its
//!   own, private, where each `volumeMount` is bound over its `mountPath`
//!   (read-only if asked; `subPath` and `subPathExpr` too), so only it sees
//!   them. A missing mount point is made on the host (and removed once no
//!   pod needs it), as a container runtime makes one in the image.
//! - Probes: `httpGet`, `tcpSocket` and `exec` startup, readiness and
//!   liveness probes are checked with their timing and thresholds; an exec
//!   probe runs its command as the container runs (environment, folder,
//!   mounts), within `timeoutSeconds`. Failures are told in `Unhealthy`
//!   events; failed startup and liveness probes restart the container.
//! - Restarts follow the restart policy, with back-off; deletion stops the
//!   processes (SIGTERM, then SIGKILL after the grace period, at most 10s)
//!   and removes the pod.
//!
//! How it differs from a kubelet:
//! - It runs on a thread of its own, with its own runtime: the kernel kills
//!   the processes when that thread ends (see [`crate::process`]), so they
//!   never outlive the node, whatever runtime the caller uses.
//! - State is in memory and the loop polls: every [`TICK`] it lists the
//!   node's pods and converges each on what its spec asks for.
//! - A process sees the host's whole file system (with its volumes bound in
//!   its own mount namespace), runs as the harness' user (root), shares the
//!   host's network, and is given the service-account credentials through
//!   `KUBECONFIG` (with a pod-bound token) besides the mounted token.
//! - Pod-network mode (`ClusterSpec::pod_network`, see [`crate::podnet`]):
//!   the node has a network namespace of its own, where host-network pods
//!   run (their IP is the node's address on the testbed's internet, also
//!   its InternalIP); every other pod gets a namespace of its own, an
//!   address of the node's `spec.podCIDR` on a veth routed from the node,
//!   and its containers and exec probes run there; the node's `httpGet`
//!   and `tcpSocket` probes connect from the node namespace. Each
//!   namespace reaches the API servers on the host's loopback through a
//!   relay of the node. The namespace, veth and address go with the pod.
//! - Otherwise, pod IPs are loopback addresses, which all route to `lo` on Linux: each
//!   node hands out `127.H.L.2`, `127.H.L.3`, … where `H.L` is its API
//!   server's port, so the /24 is unique to the cluster among the clusters
//!   running on the machine. The API server takes them as pod IPs, but
//!   EndpointSlices and Endpoints refuse loopback addresses: a Service
//!   selecting host pods has no endpoints, and whoever connects to an agent
//!   must use its pod IP. Processes share the host's network, so an agent
//!   must bind its pod IP (`$(POD_IP)`) rather than `0.0.0.0` for two
//!   clusters' agents not to clash.
//! - Not supported, and refused rather than ignored: init containers,
//!   lifecycle hooks, other kinds of volume (`hostPath` but of a character device, PVCs, …),
//!   `resourceFieldRef`, mount propagation, a `workingDir` that is not a
//!   folder of the host (the container waits in
//!   `CreateContainerConfigError`, saying what is not supported); `grpc`
//!   probes (the container never becomes Ready: the pod's Ready condition
//!   says "grpc probes are not supported on the host-process node"; a grpc
//!   liveness probe is not checked); HTTPS probes (they fail, saying so).
//!   Ignored: resources, security contexts, `emptyDir` size limits.
//!
//! Its parts: the loop that serves the node ([`kubelet`]), the addresses
//! and networks of its pods ([`network`]), the Node and Lease objects
//! ([`node`]), one pod ([`pod`]), its containers' environment ([`env`]),
//! volumes ([`volume`]) and probes ([`probe`]).

mod env;
mod kubelet;
mod network;
mod node;
pub(crate) use network::{loopback_subnet, node_address};
pub(crate) use probe::{Dialer, http_get};
mod pod;
mod probe;
mod volume;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::process::tail;
use crate::{Error, io_error};

/// The label (`true`) of host-process nodes.
pub const HOST_PROCESS_LABEL: &str = "testbed.liqo.io/host-process";
/// The key of the taint (`true:NoSchedule`) of host-process nodes: only
/// pods that tolerate it land there, as only pods meant for a special node
/// land on a tainted one.
pub const HOST_PROCESS_TAINT: &str = "testbed.liqo.io/host-process";

/// The images the host-process node runs unless told otherwise: image
/// repository (no tag or digest) → the binary of the agent folder it
/// stands for. Pods of any other image fail to pull. The repositories are
/// `liqo_api::names::{GATEWAY_IMAGE, VIRTUAL_KUBELET_IMAGE}`, spelt out so
/// that the testbed does not build the API crate (an e2e test checks they
/// agree).
pub fn default_host_images() -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "ghcr.io/liqo-rs/liqo-gateway".to_owned(),
            "liqo-gateway".to_owned(),
        ),
        (
            "ghcr.io/liqo-rs/liqo-virtual-kubelet".to_owned(),
            "liqo-virtual-kubelet".to_owned(),
        ),
    ])
}

/// How often the loop looks at the node's pods.
const TICK: Duration = Duration::from_millis(400);
/// The node's lease lasts this long; it is renewed every [`LEASE_RENEW`].
const LEASE_SECONDS: i32 = 40;
const LEASE_RENEW: Duration = Duration::from_secs(10);
/// How often the node's Ready condition gets a fresh heartbeat time.
const STATUS_HEARTBEAT: Duration = Duration::from_secs(20);
/// Grace of the processes of pods that vanished from the API.
const ORPHAN_GRACE: Duration = Duration::from_secs(2);
/// Grace of every process when the node stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// How many times the removal of unused mount points is tried.
const CLEANUP_TICKS: u8 = 10;
const FIELD_MANAGER: &str = "liqo-testbed-hostnode";

/// What a host node needs to know of its cluster.
#[derive(Debug, Clone)]
pub(crate) struct HostNodeConfig {
    pub(crate) cluster: String,
    pub(crate) node_name: String,
    /// An admin kubeconfig: the node reads ConfigMaps, Secrets and pods,
    /// requests tokens and writes its own objects.
    pub(crate) admin_kubeconfig: PathBuf,
    /// The API server's URL and CA, for the pods' kubeconfigs.
    pub(crate) server: String,
    pub(crate) ca_pem: String,
    /// The binaries that images stand for.
    pub(crate) bin_dir: PathBuf,
    /// The allow-list: image repository → binary of `bin_dir`.
    pub(crate) images: BTreeMap<String, String>,
    pub(crate) pods_dir: PathBuf,
    /// The first three bytes of the pods' addresses, without a pod network.
    pub(crate) subnet: [u8; 3],
    /// The node's address: its InternalIP, every pod's hostIP, and
    /// host-network pods' IP.
    pub(crate) node_ip: Ipv4Addr,
    /// The node's network namespace, in the pod-network mode.
    pub(crate) pod_network: Option<PodNetworkConfig>,
}

/// The host node's part of the pod-network mode: the namespace that
/// [`crate::podnet::NodeNet`] made, to run host-network pods and relay in,
/// and to put each pod's namespace next to.
#[derive(Debug, Clone)]
pub(crate) struct PodNetworkConfig {
    pub(crate) node_netns: String,
    /// The cluster's API server port: the pods' namespaces are named after it.
    pub(crate) api_port: u16,
}

/// A running host node. Dropping it stops its loop and its processes.
#[derive(Debug)]
pub(crate) struct HostNode {
    cluster: String,
    name: String,
    pods_dir: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostNode {
    /// Registers the node and starts its loop; returns once the Node exists.
    pub(crate) async fn start(config: HostNodeConfig) -> Result<Self, Error> {
        std::fs::create_dir_all(&config.pods_dir).map_err(io_error(&config.pods_dir))?;
        let (registered_tx, registered_rx) = oneshot::channel();
        let (stop_tx, stop_rx) = oneshot::channel();
        let mut node = Self {
            cluster: config.cluster.clone(),
            name: config.node_name.clone(),
            pods_dir: config.pods_dir.clone(),
            stop: Some(stop_tx),
            thread: None,
        };
        let thread = std::thread::Builder::new()
            .name(config.node_name.clone())
            .spawn(move || kubelet::serve(config, registered_tx, stop_rx))
            .map_err(io_error(&node.pods_dir))?;
        node.thread = Some(thread);
        match registered_rx.await {
            Ok(result) => result.map(|()| node),
            Err(_) => Err(node.stopped()),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Fails if the loop has ended.
    pub(crate) fn ensure_running(&self) -> Result<(), Error> {
        match &self.thread {
            Some(thread) if !thread.is_finished() => Ok(()),
            _ => Err(self.stopped()),
        }
    }

    fn stopped(&self) -> Error {
        Error::HostNodeStopped {
            cluster: self.cluster.clone(),
            node: self.name.clone(),
        }
    }

    /// Stops the loop and every process, and waits until they are gone.
    pub(crate) fn stop(&mut self) {
        // Dropping the sender is the signal.
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for HostNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Why a container could not be started; shown in its waiting state.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("{kind} {namespace}/{name} not found")]
    Missing {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error("{kind} {name} has no key {key}")]
    MissingKey {
        kind: &'static str,
        name: String,
        key: String,
    },
    #[error("reading {kind} {name}")]
    Read {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0} is not supported on the host-process node")]
    Unsupported(String),
    #[error("{0}")]
    Pull(String),
    #[error("requesting a token for service account {account}")]
    Token {
        account: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no executable {name} in {}", dir.display())]
    NoBinary { name: String, dir: PathBuf },
    #[error("starting {}", program.display())]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl StartError {
    /// The reason the kubelet gives for the same failure.
    fn reason(&self) -> &'static str {
        match self {
            Self::NoBinary { .. } | Self::Spawn { .. } => "RunContainerError",
            Self::Pull(_) => "ErrImagePull",
            _ => "CreateContainerConfigError",
        }
    }
}

/// The tail of every container log in `pods_dir`, each under a header.
pub(crate) fn pod_logs(pods_dir: &Path) -> String {
    let Ok(entries) = std::fs::read_dir(pods_dir) else {
        return String::new();
    };
    let mut logs: Vec<PathBuf> = entries
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    logs.iter()
        .map(|path| {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            format!("==> {name} <==\n{}\n", tail(path, 100))
        })
        .collect()
}
