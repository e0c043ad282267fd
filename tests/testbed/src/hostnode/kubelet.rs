//! The host node's loop, its small kubelet: it registers the Node, keeps
//! it Ready and its Lease renewed, and every [`TICK`] converges each pod
//! bound to the node on its spec, writes its status, posts its events and
//! removes it once deleted and stopped.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;
use tokio::sync::oneshot;

use super::network::{IpPool, network, pod_subnet};
use super::pod::{self, Context, PodRuntime};
use super::{
    CLEANUP_TICKS, Dialer, FIELD_MANAGER, HostNodeConfig, LEASE_RENEW, ORPHAN_GRACE,
    SHUTDOWN_GRACE, STATUS_HEARTBEAT, TICK, node, volume,
};
use crate::cluster::client_from_kubeconfig;
use crate::podnet::{self, relay::Relay};
use crate::process::stop_all;
use crate::{Error, io_error};

/// The node's thread: registers the node, then runs the loop until told to
/// stop, then stops the processes.
pub(super) fn serve(
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
