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

mod env;
mod node;
pub(crate) use probe::{Dialer, http_get};
mod pod;
mod probe;
mod volume;

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;
use tokio::sync::oneshot;

use crate::cluster::client_from_kubeconfig;
use crate::podnet::relay::Relay;
use crate::podnet::{self, PodNet};
use crate::process::{stop_all, tail};
use crate::{Error, io_error};
use pod::{Context, PodRuntime};

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

/// The loopback /24 of the pods of the cluster whose API server listens on
/// `api_port`: unique among the clusters running on the machine, as ports
/// are, and clear of `127.0.0.0/16` since ports below 256 are not used.
pub(crate) fn loopback_subnet(api_port: u16) -> [u8; 3] {
    let [high, low] = api_port.to_be_bytes();
    [127, high, low]
}

/// The host node's own address in its cluster's loopback /24: `.1`. It
/// is the node's InternalIP, every pod's hostIP, and host-network pods'
/// IP, so that two clusters' host-network agents (gateways) bind apart.
pub(crate) fn node_address(subnet: [u8; 3]) -> Ipv4Addr {
    let [a, b, c] = subnet;
    Ipv4Addr::new(a, b, c, 1)
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
            .spawn(move || serve(config, registered_tx, stop_rx))
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

/// The node's thread: registers the node, then runs the loop until told to
/// stop, then stops the processes.
fn serve(
    config: HostNodeConfig,
    registered: oneshot::Sender<Result<(), Error>>,
    stop: oneshot::Receiver<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(source) => {
            let _ = registered.send(Err(Error::Io {
                path: config.pods_dir.clone(),
                source,
            }));
            return;
        }
    };
    runtime.block_on(async move {
        let mut kubelet = match Kubelet::register(config).await {
            Ok(kubelet) => kubelet,
            Err(e) => {
                let _ = registered.send(Err(e));
                return;
            }
        };
        let _ = registered.send(Ok(()));
        tokio::select! {
            _ = stop => {}
            () = kubelet.run() => {}
        }
        kubelet.shutdown();
    });
}

/// The loop's state.
struct Kubelet {
    config: HostNodeConfig,
    client: kube::Client,
    dialer: Dialer,
    /// The relay of the node namespace's loopback, in the pod-network mode.
    _relay: Option<Relay>,
    node_uid: String,
    ready_since: Timestamp,
    lease_renewed: Instant,
    status_posted: Instant,
    pods: HashMap<String, PodRuntime>,
    /// Set once the pods' subnet is known: in the pod-network mode, once
    /// the controller-manager has given the node its pod CIDR.
    ips: Option<IpPool>,
    /// The mount points made on the host for the pods' volumes, parents
    /// first, removed once no pod needs them.
    created: std::cell::RefCell<Vec<PathBuf>>,
    /// How many more passes try to remove them.
    cleanup_ticks: u8,
}

impl Kubelet {
    /// Creates the Node, Ready, and its Lease.
    async fn register(config: HostNodeConfig) -> Result<Self, Error> {
        let client = client_from_kubeconfig(&config.admin_kubeconfig).await?;
        let node_netns = (config.pod_network.as_ref()).map(|p| podnet::netns_path(&p.node_netns));
        let relay = match &node_netns {
            Some(path) => Some(Relay::start(path).map_err(io_error(path))?),
            None => None,
        };
        let dialer = Dialer {
            netns: node_netns.clone(),
        };
        let name = &config.node_name;
        let nodes: Api<Node> = Api::all(client.clone());
        let kube_error = |what: &str| {
            let what = format!("{what} node {name}");
            move |source| Error::Kube { what, source }
        };
        let node = match nodes
            .create(&PostParams::default(), &node::object(name))
            .await
        {
            Ok(node) => node,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                nodes.get(name).await.map_err(kube_error("reading"))?
            }
            Err(source) => return Err(kube_error("creating")(source)),
        };
        let kubelet = Self {
            ips: (config.pod_network.is_none()).then(|| IpPool::new(config.subnet, config.node_ip)),
            node_uid: node.metadata.uid.unwrap_or_default(),
            ready_since: Timestamp::now(),
            lease_renewed: Instant::now(),
            status_posted: Instant::now(),
            pods: HashMap::new(),
            created: std::cell::RefCell::new(Vec::new()),
            cleanup_ticks: 0,
            dialer,
            _relay: relay,
            client,
            config,
        };
        let name = &kubelet.config.node_name;
        kubelet
            .post_node_status()
            .await
            .map_err(|source| Error::Kube {
                what: format!("writing the status of node {name}"),
                source,
            })?;
        kubelet.renew_lease().await.map_err(|source| Error::Kube {
            what: format!("creating the lease of node {name}"),
            source,
        })?;
        tracing::info!(node = %name, bin_dir = %kubelet.config.bin_dir.display(), "host-process node registered");
        Ok(kubelet)
    }

    /// Keeps the node Ready and its pods converging, until cancelled.
    async fn run(&mut self) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.heartbeat().await;
            if let Err(e) = self.reconcile().await {
                tracing::warn!(node = %self.config.node_name, "listing pods: {e}");
            }
        }
    }

    async fn heartbeat(&mut self) {
        let node = &self.config.node_name;
        if self.lease_renewed.elapsed() >= LEASE_RENEW {
            match self.renew_lease().await {
                Ok(()) => self.lease_renewed = Instant::now(),
                Err(e) => tracing::warn!(%node, "renewing the lease: {e}"),
            }
        }
        if self.status_posted.elapsed() >= STATUS_HEARTBEAT {
            match self.post_node_status().await {
                Ok(()) => self.status_posted = Instant::now(),
                Err(e) => tracing::warn!(%node, "writing the node status: {e}"),
            }
        }
    }

    async fn renew_lease(&self) -> Result<(), kube::Error> {
        let name = &self.config.node_name;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "kube-node-lease");
        let lease = node::lease(name, &self.node_uid, &Timestamp::now());
        leases
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&lease),
            )
            .await?;
        Ok(())
    }

    async fn post_node_status(&self) -> Result<(), kube::Error> {
        let name = &self.config.node_name;
        let status = node::status(
            name,
            self.config.node_ip,
            &self.ready_since,
            &Timestamp::now(),
        );
        Api::<Node>::all(self.client.clone())
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await?;
        Ok(())
    }

    /// One pass over the node's pods: each converges on its spec, its
    /// status is written if it changed, the deleted ones are stopped and
    /// then removed, and the processes of vanished ones are stopped.
    async fn reconcile(&mut self) -> Result<(), kube::Error> {
        let node = &self.config.node_name;
        let listed = Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await?;
        if self.ips.is_none() {
            self.ips = self.pod_cidr_pool().await;
        }
        let ctx = Context {
            client: &self.client,
            dialer: &self.dialer,
            config: &self.config,
            created: &self.created,
        };
        let count = self.pods.len();
        let mut seen = HashSet::new();
        for pod in &listed.items {
            let (Some(uid), Some(namespace), Some(name)) = (
                pod.metadata.uid.as_deref(),
                pod.metadata.namespace.as_deref(),
                pod.metadata.name.as_deref(),
            ) else {
                continue;
            };
            seen.insert(uid.to_owned());
            let runtime = match self.pods.entry(uid.to_owned()) {
                Entry::Occupied(entry) => entry.into_mut(),
                // A pod that ended before this node knew it has nothing to run.
                Entry::Vacant(_) if is_finished(pod) => continue,
                Entry::Vacant(entry) => {
                    let Some(ips) = self.ips.as_mut() else {
                        // No pod CIDR yet: the pod waits, as for a CNI.
                        continue;
                    };
                    let Some(ip) = ips.take(pod) else {
                        tracing::warn!(%node, pod = %format!("{namespace}/{name}"), "no pod address left");
                        continue;
                    };
                    let network = match network(ctx.config, pod, ip) {
                        Ok(network) => network,
                        Err(e) => {
                            tracing::warn!(%node, pod = %format!("{namespace}/{name}"), "making its network: {e}");
                            ips.give_back(ip);
                            continue;
                        }
                    };
                    entry.insert(PodRuntime::new(pod, ip, network, ctx.config))
                }
            };
            runtime.sync(pod, &ctx).await;
            post_events(&self.client, node, pod, runtime.take_events()).await;

            let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            if pod.metadata.deletion_timestamp.is_some() {
                // As a kubelet tears down a pod's sandbox before the pod
                // goes from the API: whoever sees it gone sees its
                // namespace and veth gone.
                if runtime.is_stopped() {
                    runtime.release_network();
                }
                if runtime.is_stopped() && delete(&pods, name, uid).await {
                    tracing::info!(%node, pod = %format!("{namespace}/{name}"), "deleted");
                    let ip = runtime.ip();
                    self.pods.remove(uid);
                    if let Some(ips) = self.ips.as_mut() {
                        ips.give_back(ip);
                    }
                }
            } else if let Some(status) = runtime.status_if_changed(pod) {
                let patch = Patch::Merge(json!({ "status": status }));
                match pods
                    .patch_status(name, &PatchParams::default(), &patch)
                    .await
                {
                    Ok(_) => runtime.posted(status),
                    Err(e) => {
                        tracing::warn!(%node, pod = %format!("{namespace}/{name}"), "writing the status: {e}")
                    }
                }
            }
        }

        let vanished: Vec<String> = (self.pods.keys())
            .filter(|uid| !seen.contains(*uid))
            .cloned()
            .collect();
        for uid in vanished {
            let Entry::Occupied(mut entry) = self.pods.entry(uid) else {
                continue;
            };
            let runtime = entry.get_mut();
            runtime.stop(ORPHAN_GRACE);
            runtime.reap_all();
            if runtime.is_stopped() {
                let ip = entry.remove().ip();
                if let Some(ips) = self.ips.as_mut() {
                    ips.give_back(ip);
                }
            }
        }
        if self.pods.len() < count {
            self.cleanup_ticks = CLEANUP_TICKS;
        }
        // A mount point stays while any process has it mounted, such as an
        // exec probe killed a moment ago: the removal is tried a few times.
        if self.cleanup_ticks > 0 {
            self.cleanup_ticks -= 1;
            self.remove_unused_mount_points();
        }
        Ok(())
    }

    /// The pool of the node's pod CIDR (the first /24 of it), once the
    /// controller-manager has given it one.
    async fn pod_cidr_pool(&self) -> Option<IpPool> {
        let node = Api::<Node>::all(self.client.clone())
            .get(&self.config.node_name)
            .await
            .ok()?;
        let cidr = node.spec?.pod_cidr?;
        match pod_subnet(&cidr) {
            Some(subnet) => Some(IpPool::new(subnet, self.config.node_ip)),
            None => {
                tracing::warn!(node = %self.config.node_name, %cidr, "the pod CIDR is not an IPv4 CIDR of a /24 or more");
                None
            }
        }
    }

    /// Removes the mount points the node made that no pod uses any more.
    fn remove_unused_mount_points(&self) {
        let in_use: BTreeSet<PathBuf> = (self.pods.values())
            .flat_map(PodRuntime::mount_targets)
            .map(Path::to_owned)
            .collect();
        volume::remove_created(&mut self.created.borrow_mut(), &in_use);
    }

    /// Stops every process of the node at once.
    fn shutdown(&mut self) {
        stop_all(
            self.pods.values_mut().flat_map(PodRuntime::processes_mut),
            SHUTDOWN_GRACE,
        );
        self.pods.clear();
        for _ in 0..CLEANUP_TICKS {
            self.remove_unused_mount_points();
            if self.created.borrow().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        tracing::info!(node = %self.config.node_name, "host-process node stopped");
    }
}

/// The first three bytes of the /24 that a node's pods get their
/// addresses from, out of its pod CIDR.
fn pod_subnet(cidr: &str) -> Option<[u8; 3]> {
    let net: ipnet::Ipv4Net = cidr.parse().ok()?;
    let [a, b, c, _] = net.network().octets();
    (net.prefix_len() <= 24).then_some([a, b, c])
}

/// Where a pod with address `ip` meets the network: in the pod-network
/// mode, the node's namespace for a host-network pod, else a namespace of
/// its own, made now; otherwise the host's.
fn network(config: &HostNodeConfig, pod: &Pod, ip: Ipv4Addr) -> Result<pod::Network, Error> {
    let host_ip = config.node_ip;
    let Some(net) = &config.pod_network else {
        return Ok(pod::Network {
            host_ip,
            netns: None,
            own: None,
        });
    };
    if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
        return Ok(pod::Network {
            host_ip,
            netns: Some(podnet::netns_path(&net.node_netns)),
            own: None,
        });
    }
    let own = PodNet::new(net.api_port, &net.node_netns, host_ip, ip)?;
    let relay = Relay::start(&own.path()).map_err(io_error(&own.path()))?;
    Ok(pod::Network {
        host_ip,
        netns: Some(own.path()),
        own: Some((own, relay)),
    })
}

fn is_finished(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// Removes a stopped pod from the API at once, as a kubelet does once its
/// containers are gone; only this very pod (its UID), not a namesake made
/// since. True when the pod is gone.
async fn delete(pods: &Api<Pod>, name: &str, uid: &str) -> bool {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match pods.delete(name, &params).await {
        Ok(_) => true,
        // Gone already, or replaced by a namesake.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => true,
        Err(e) => {
            tracing::warn!(pod = %name, "deleting: {e}");
            false
        }
    }
}

/// Tells what happened to `pod`'s containers with Events, as a kubelet does;
/// an event that cannot be posted is only logged.
async fn post_events(client: &kube::Client, node: &str, pod: &Pod, events: Vec<pod::Event>) {
    if events.is_empty() {
        return;
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    for event in events {
        let now = Timestamp::now();
        let object = json!({
            "metadata": { "generateName": format!("{name}.") },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": namespace,
                "name": name,
                "uid": pod.metadata.uid,
                "fieldPath": format!("spec.containers{{{}}}", event.container),
            },
            "type": if event.warning { "Warning" } else { "Normal" },
            "reason": event.reason,
            "message": event.message,
            "source": { "component": "kubelet", "host": node },
            "reportingComponent": "kubelet",
            "reportingInstance": node,
            "firstTimestamp": Time(now),
            "lastTimestamp": Time(now),
            "count": 1,
        });
        let posted = match serde_json::from_value::<Event>(object) {
            Ok(object) => api
                .create(&PostParams::default(), &object)
                .await
                .err()
                .map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(e) = posted {
            tracing::warn!(%node, pod = %format!("{namespace}/{name}"), reason = event.reason, "posting an event: {e}");
        }
    }
}

/// The addresses of a node's pods, handed out in turn so that a freed one is
/// not reused at once.
#[derive(Debug)]
struct IpPool {
    subnet: [u8; 3],
    /// Host-network pods' address.
    node: Ipv4Addr,
    used: HashSet<u8>,
    next: u8,
}

impl IpPool {
    const FIRST: u8 = 2;
    const LAST: u8 = 254;

    fn new(subnet: [u8; 3], node: Ipv4Addr) -> Self {
        Self {
            subnet,
            node,
            used: HashSet::new(),
            next: Self::FIRST,
        }
    }

    /// An address for `pod`: the node's for a host-network pod, else a
    /// free one of the subnet, if any is left.
    fn take(&mut self, pod: &Pod) -> Option<Ipv4Addr> {
        if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
            return Some(self.node);
        }
        let span = Self::LAST - Self::FIRST + 1;
        let host = (0..span)
            .map(|i| Self::FIRST + (self.next - Self::FIRST + i) % span)
            .find(|h| !self.used.contains(h))?;
        self.used.insert(host);
        self.next = if host == Self::LAST {
            Self::FIRST
        } else {
            host + 1
        };
        let [a, b, c] = self.subnet;
        Some(Ipv4Addr::new(a, b, c, host))
    }

    fn give_back(&mut self, ip: Ipv4Addr) {
        let [a, b, c, host] = ip.octets();
        if [a, b, c] == self.subnet {
            self.used.remove(&host);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(host_network: bool) -> Pod {
        serde_json::from_value(json!({ "spec": { "containers": [], "hostNetwork": host_network } }))
            .expect("pod")
    }

    #[test]
    fn pods_take_the_first_slash_24_of_the_node_pod_cidr() {
        assert_eq!(pod_subnet("10.201.3.0/24"), Some([10, 201, 3]));
        assert_eq!(pod_subnet("10.201.0.0/16"), Some([10, 201, 0]));
        assert_eq!(pod_subnet("10.201.3.0/26"), None, "too small");
        assert_eq!(pod_subnet("fd00::/64"), None);
    }

    #[test]
    fn loopback_subnets_follow_the_api_port() {
        assert_eq!(loopback_subnet(0x9c41), [127, 0x9c, 0x41]);
    }

    #[test]
    fn ip_pool_hands_out_in_turn_and_takes_back() {
        let mut pool = IpPool::new([127, 1, 2], node_address([127, 1, 2]));
        let a = pool.take(&pod(false)).expect("first");
        let b = pool.take(&pod(false)).expect("second");
        assert_eq!(a, Ipv4Addr::new(127, 1, 2, 2));
        assert_eq!(b, Ipv4Addr::new(127, 1, 2, 3));
        pool.give_back(a);
        assert_eq!(pool.take(&pod(false)), Some(Ipv4Addr::new(127, 1, 2, 4)));
        // A host-network pod has the node's address, which is never lent.
        assert_eq!(pool.take(&pod(true)), Some(Ipv4Addr::new(127, 1, 2, 1)));
        pool.give_back(Ipv4Addr::new(127, 1, 2, 1));
        for _ in 5..=254 {
            assert!(pool.take(&pod(false)).is_some());
        }
        assert_eq!(
            pool.take(&pod(false)),
            Some(a),
            "wraps around to the freed one"
        );
        assert_eq!(pool.take(&pod(false)), None, "full");
    }
}
