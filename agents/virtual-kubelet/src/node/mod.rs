//! The virtual node's life on the consumer: registration (the Node's
//! metadata and spec, server-side applied from the ForeignCluster), its
//! status (capacity from the grant, conditions from the provider's health,
//! with a heartbeat) and its Lease ([`lease`]). The Node is never deleted
//! here: a restarting agent must not make it flap; the garbage collector
//! removes it with its ForeignCluster.

pub mod lease;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use liqo_agent_runtime::Readiness;
use liqo_agent_runtime::follow::Followed;
use liqo_api::core::ForeignCluster;
use liqo_api::sharing::Resources;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::forge::{self, NetworkState, ProviderState};
use crate::provider::{Health, KubeconfigError, ProviderClient};

/// The field manager of everything the agent writes.
pub const FIELD_MANAGER: &str = "liqo-virtual-kubelet";
/// The status gets a fresh heartbeat at least this often, as a kubelet's.
const STATUS_HEARTBEAT: Duration = Duration::from_secs(20);
/// How often the desired state is compared with what was written, besides
/// waking on every change of the ForeignCluster or the provider's health:
/// the Ready condition turns False by the passing of time alone.
const TICK: Duration = Duration::from_secs(1);

/// Keeps the Node registered and its status current, once the agent
/// holds the peering's identity (a failed `peer` that rolls back before
/// making it leaves no node behind). Publishes the
/// Node's UID on `registered` once it is as wanted (the Lease is owned by
/// it) and keeps `readiness` set while the node is registered, the
/// ForeignCluster is known and current, and the placement webhook (where
/// it is served) can answer.
#[allow(missing_debug_implementations)] // kube::Client is not Debug.
pub struct NodeKeeper {
    pub client: kube::Client,
    pub node_name: String,
    pub fc_ref: ObjectRef<ForeignCluster>,
    pub peers: Followed<ForeignCluster>,
    pub health: watch::Receiver<Health>,
    /// The client for the provider: none until the identity Secret is
    /// read, and kept once it was.
    pub provider: watch::Receiver<ProviderClient>,
    pub registered: watch::Sender<Option<String>>,
    /// Where the kubelet API is served, if it is.
    pub kubelet_endpoint: Option<forge::KubeletEndpoint>,
    /// The tunnel to the provider (its Connection here).
    pub tunnel: Followed<liqo_api::networking::Connection>,
    /// Whether the placement webhook can answer (true where it is not
    /// served): the agent is not ready while it cannot.
    pub placement: watch::Receiver<bool>,
}

/// What was last written, to write again only on a change. A cache of
/// the API's state, not state of our own: a restarted agent starts empty
/// and writes everything once.
#[derive(Default)]
struct Written {
    node: Option<Node>,
    status: Option<(Option<Resources>, ProviderState, NetworkState, Instant)>,
    /// The last error logged, to log each once.
    error: Option<String>,
}

impl NodeKeeper {
    pub async fn run(mut self, readiness: Readiness) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut written = Written::default();
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.converge(&nodes, &mut written, &readiness).await;
            self.show_readiness(&written, &readiness);
            tokio::select! {
                _ = ticker.tick() => {}
                changed = self.peers.state.changed() => if changed.is_err() { return },
                changed = self.health.changed() => if changed.is_err() { return },
                changed = self.provider.changed() => if changed.is_err() { return },
                changed = self.tunnel.state.changed() => if changed.is_err() { return },
                // Its sender lives as long as the webhook is served.
                Ok(()) = self.placement.changed() => {}
            }
        }
    }

    /// Ready while the node is registered, the ForeignCluster current and
    /// the placement webhook able to answer.
    fn show_readiness(&self, written: &Written, readiness: &Readiness) {
        readiness
            .set(written.node.is_some() && self.peers.is_current() && *self.placement.borrow());
    }

    async fn converge(&self, nodes: &Api<Node>, written: &mut Written, readiness: &Readiness) {
        if let Err(why) = &*self.provider.borrow() {
            if !matches!(**why, KubeconfigError::NotReadYet) {
                log_once(
                    &mut written.error,
                    format!("waiting for the peering's identity: {}", why.chain()),
                );
            }
            return;
        }
        // The store keeps the last known ForeignCluster while its watch
        // recovers: the node keeps its heartbeat meanwhile.
        let Some(fc) = self.peers.store.get("", &self.fc_ref.name) else {
            if self.peers.is_current() {
                log_once(
                    &mut written.error,
                    format!("the ForeignCluster {} does not exist", self.fc_ref.name),
                );
                // The peering is gone, and the garbage collector takes the
                // node with it: nothing to keep, no Lease to renew.
                *written = Written {
                    error: written.error.take(),
                    ..Written::default()
                };
                self.registered.send_if_modified(|uid| uid.take().is_some());
            }
            return;
        };
        let want = forge::node(&self.node_name, &fc);
        if written.node.as_ref() != Some(&want) {
            match apply(nodes, &self.node_name, &want, false).await {
                Ok(node) => {
                    tracing::info!(node = %self.node_name, "node registered");
                    written.node = Some(want);
                    written.error = None;
                    self.registered.send_replace(node.metadata.uid.clone());
                    // At once, not after the status: the kubelet probes
                    // the agent when it first sees it running, and a
                    // failed probe waits a period for the next.
                    self.show_readiness(written, readiness);
                }
                Err(e) => {
                    log_once(&mut written.error, format!("registering the node: {e}"));
                    return;
                }
            }
        }

        let grant = fc.status.as_ref().and_then(|s| s.grant.clone());
        let state = self.health.borrow().state(Instant::now());
        // While the tunnel's store is not current, the last known state.
        let network = match (&written.status, self.tunnel.is_current()) {
            (Some((_, _, known, _)), false) => known.clone(),
            _ => NetworkState::of(self.tunnel.store.state().first().map(AsRef::as_ref)),
        };
        let due = match &written.status {
            None => true,
            Some((g, s, n, at)) => {
                *g != grant || *s != state || *n != network || at.elapsed() >= STATUS_HEARTBEAT
            }
        };
        if !due {
            return;
        }
        // The transition times come from the API's copy, so that a
        // restarted agent keeps them.
        let previous = match nodes.get_opt(&self.node_name).await {
            Ok(Some(node)) => node.status.and_then(|s| s.conditions).unwrap_or_default(),
            Ok(None) => {
                // Deleted behind our back: register it again next time.
                written.node = None;
                self.registered.send_if_modified(|uid| uid.take().is_some());
                return;
            }
            Err(e) => {
                log_once(&mut written.error, format!("reading the node: {e}"));
                return;
            }
        };
        let now = Time(Timestamp::now());
        let conditions = forge::conditions(&state, &network, &now, &previous);
        let status = forge::node_status(
            &self.node_name,
            grant.as_ref(),
            conditions,
            self.kubelet_endpoint,
        );
        match apply(nodes, &self.node_name, &status, true).await {
            Ok(_) => {
                let changed = written
                    .status
                    .as_ref()
                    .is_none_or(|(g, s, n, _)| *g != grant || *s != state || *n != network);
                if changed {
                    tracing::info!(?state, ?network, ?grant, "node status updated");
                }
                written.status = Some((grant, state, network, Instant::now()));
                written.error = None;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => written.node = None,
            Err(e) => log_once(&mut written.error, format!("updating the node status: {e}")),
        }
    }
}

/// Server-side applies the Node, or its status. Forced: the node is ours,
/// and the node lifecycle controller's edits of the same fields (its
/// taints, a Ready=Unknown) are to be overridden as a kubelet does.
async fn apply(
    nodes: &Api<Node>,
    name: &str,
    obj: &Node,
    status: bool,
) -> Result<Node, kube::Error> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    // Server-side apply needs the type in the body.
    let mut body = serde_json::to_value(obj).map_err(kube::Error::SerdeError)?;
    body["apiVersion"] = "v1".into();
    body["kind"] = "Node".into();
    if status {
        nodes
            .patch_status(name, &params, &Patch::Apply(&body))
            .await
    } else {
        nodes.patch(name, &params, &Patch::Apply(&body)).await
    }
}

fn log_once(last: &mut Option<String>, why: String) {
    if last.as_ref() != Some(&why) {
        tracing::warn!(%why, "cannot keep the node");
        *last = Some(why);
    }
}
