//! The consumer's side of a peering once its phases are done: the wait
//! for its virtual node, where every way of peering ends; and the virtual
//! kubelets' rights in a namespace offloaded later.

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use liqo_api::ClusterId;
use liqo_api::names::{self, peering};

use super::refuse_foreign;
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::apply;
use crate::kube::rollout::{self, Readiness};
use crate::kube::wait::{self, Waited};
use crate::manifests::Manifest;
use crate::manifests::virtual_kubelet;
use crate::printer::Printer;

/// Waits until the virtual node of `provider` is Ready and its agent's pod
/// passes its readiness probe; returns the node's name.
pub(crate) async fn wait_for_virtual_node(
    consumer: &ClusterClient,
    provider: &liqo_api::ClusterId,
    deadline: tokio::time::Instant,
    timeout: u64,
    printer: &Printer,
) -> anyhow::Result<String> {
    let node_name = peering::virtual_node(provider);
    let step = printer.step(format!("Waiting for the virtual node {node_name}"));
    // The agent's pod first: an image its node cannot pull is told at
    // once. The node is Ready as soon as the agent registers it, and the
    // pod passes its readiness probe about then; `info` shows both, so
    // both are waited for.
    let vk = peering::virtual_kubelet(provider);
    let ready = match rollout::wait_ready(consumer, &vk, wait::left(deadline)).await? {
        Readiness::Ready => {
            let nodes: Api<Node> = Api::all(consumer.client.clone());
            let waited = wait::until(
                consumer,
                nodes,
                &node_name,
                |n: Option<&Node>| n.is_some_and(node_ready),
                wait::left(deadline),
                &format!("waiting for the virtual node {node_name}"),
            )
            .await?;
            matches!(waited, Waited::Done(_))
        }
        Readiness::TimedOut => false,
        Readiness::CannotPull(failure) => {
            step.fail("image not found");
            return Err(UserError::NotFound(failure.advice("`liqoctl peer`")).into());
        }
        Readiness::CannotMount(failure) => {
            step.fail("the node lacks a device");
            return Err(UserError::NotFound(failure.advice("`liqoctl peer`")).into());
        }
    };
    if !ready {
        step.fail("timed out");
        return Err(UserError::Timeout(format!(
            "the virtual node {node_name} is not ready after {timeout}s; see `kubectl -n {ns} logs deploy/{vk}` \
             on cluster {}, then run peer again",
            consumer.name,
            ns = names::NAMESPACE,
        ))
        .into());
    }
    step.done("");
    Ok(node_name)
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Lets the virtual kubelet of each of `providers` act in the offloaded
/// namespace `ns` (read what it reflects, copy Events, mint tokens): one
/// RoleBinding each, owned by the namespace's NamespaceOffloading
/// (`offloading_uid`) when given. Idempotent; refuses a namesake that is
/// not ours.
pub(crate) async fn bind_virtual_kubelets(
    cluster: &ClusterClient,
    ns: &str,
    offloading_uid: Option<&str>,
    providers: &[ClusterId],
    then: &str,
) -> anyhow::Result<()> {
    let bindings: Vec<Manifest> = providers
        .iter()
        .map(|p| virtual_kubelet::offloaded_namespace_binding(p, ns, offloading_uid))
        .collect();
    refuse_foreign(cluster, &bindings, then).await?;
    for binding in &bindings {
        apply::apply(cluster, binding).await?;
    }
    Ok(())
}
