//! The cluster's nodes: waiting for kwok's to be usable, and starting the
//! host-process node or the real node and waiting for it to be Ready.

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, ListParams};

use std::time::Duration;

use super::Cluster;
use crate::Error;
use crate::hostnode::{HostNode, HostNodeConfig};
use crate::realnode::{RealNode, RealNodeConfig};

/// How long a real node may take to be Ready, each time it is started.
const REAL_NODE_PATIENCE: Duration = Duration::from_secs(150);
/// How many times a real node is started before the cluster fails.
const REAL_NODE_STARTS: u32 = 2;

impl Cluster {
    pub(super) async fn wait_until_usable(&mut self, client: &kube::Client) -> Result<(), Error> {
        let want = self.spec.nodes as usize;
        let nodes: Api<Node> = Api::all(client.clone());
        self.wait_for("the worker nodes to be Ready with a pod CIDR", || {
            let nodes = nodes.clone();
            async move {
                let Ok(list) = nodes.list(&ListParams::default()).await else {
                    return Ok(false);
                };
                let ready = list.items.iter().filter(|n| node_is_ready(n)).count();
                Ok(ready == want)
            }
        })
        .await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        self.wait_for("the default service account", || {
            let accounts = accounts.clone();
            async move { Ok(accounts.get_opt("default").await.ok().flatten().is_some()) }
        })
        .await
    }

    pub(super) async fn start_real_node(
        &mut self,
        config: RealNodeConfig,
        client: &kube::Client,
    ) -> Result<(), Error> {
        let name = config.node_name.clone();
        // A real kubelet registers, gets its runtime's network ready and
        // reports Ready in seconds on an idle machine, and in a minute or
        // two when several start at once beside builds. One now and then
        // stalled in its start-up with nothing in its log: stopped (its
        // PID namespace, mounts and cgroup go) and started again once.
        for attempt in 1..=REAL_NODE_STARTS {
            self.real_node = Some(RealNode::start(config.clone())?);
            let ready = self
                .wait_for_node(
                    client,
                    name.clone(),
                    "the real node to be Ready",
                    REAL_NODE_PATIENCE,
                )
                .await;
            match ready {
                Err(Error::Timeout { ref log, .. }) if attempt < REAL_NODE_STARTS => {
                    tracing::warn!(cluster = %self.spec.name, %log, "the real node is not Ready; starting it again");
                    self.real_node = None;
                }
                other => return other,
            }
        }
        unreachable!("the last start returns")
    }

    pub(super) async fn start_host_node(
        &mut self,
        config: HostNodeConfig,
        client: &kube::Client,
    ) -> Result<(), Error> {
        let name = config.node_name.clone();
        self.host_node = Some(HostNode::start(config).await?);
        self.wait_for_node(
            client,
            name,
            "the host-process node to be Ready",
            super::PHASE_TIMEOUT,
        )
        .await
    }

    /// Waits for node `name` to be Ready and free of the node lifecycle's taints.
    async fn wait_for_node(
        &mut self,
        client: &kube::Client,
        name: String,
        what: &str,
        patience: Duration,
    ) -> Result<(), Error> {
        let nodes: Api<Node> = Api::all(client.clone());
        self.wait_within(what, patience, || {
            let nodes = nodes.clone();
            let name = name.clone();
            async move {
                let Ok(Some(node)) = nodes.get_opt(&name).await else {
                    return Ok(false);
                };
                // The node lifecycle controller may have tainted it before
                // its first status; the scheduler skips it until untainted.
                let not_ready_taint = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|ts| ts.iter().any(|t| t.key.starts_with("node.kubernetes.io/")));
                Ok(node_is_ready(&node) && !not_ready_taint)
            }
        })
        .await
    }
}

fn node_is_ready(node: &Node) -> bool {
    let has_cidr = node.spec.as_ref().is_some_and(|s| s.pod_cidr.is_some());
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    has_cidr && ready
}
