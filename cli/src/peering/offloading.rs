//! Offloading one namespace, and ending it: what `liqoctl offload
//! namespace`, `unoffload namespace` and `tether` write on the consumer
//! (docs/offloading.md). The twin namespaces and pods are the virtual
//! kubelets'.

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::wait::conditions;
use liqo_api::ClusterId;
use liqo_api::names::{self, labels};
use liqo_api::offloading::NamespaceOffloading;
use serde_json::json;

use crate::factory::ClusterClient;
use crate::kube::ownership::FIELD_MANAGER;
use crate::kube::wait::{self, Waited};
use crate::peering::consumer::bind_virtual_kubelets;
use crate::peering::virtual_kubelet;

/// The providers of this cluster's outgoing peerings, from their virtual
/// kubelets' ServiceAccounts.
pub(crate) async fn virtual_kubelets(cluster: &ClusterClient) -> anyhow::Result<Vec<ClusterId>> {
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client.clone(), names::NAMESPACE);
    let list = accounts
        .list(&ListParams::default().labels(&virtual_kubelet::agents_selector()))
        .await
        .map_err(|e| cluster.explain(e, "listing the virtual kubelets"))?;
    Ok(list
        .items
        .iter()
        .filter_map(|a| {
            let id = a.labels().get(labels::PEER_CLUSTER_ID)?;
            ClusterId::new(id).ok()
        })
        .collect())
}

/// Offloads the namespace of `object` (a NamespaceOffloading): the rights
/// of the virtual kubelets of `agents` there, the offloading, then the
/// namespace's placement labels. Each step can be applied again.
pub(crate) async fn apply(
    cluster: &ClusterClient,
    object: &NamespaceOffloading,
    agents: &[ClusterId],
) -> anyhow::Result<()> {
    let ns = object.metadata.namespace.as_deref().unwrap_or_default();
    let api: Api<NamespaceOffloading> = Api::namespaced(cluster.client.clone(), ns);
    // The agents' rights in the namespace first, so that none of them
    // finds it offloaded and unreadable; owned by the offloading (once it
    // exists, below) so that they go with it.
    let existing = api
        .get_opt(names::NAMESPACE_OFFLOADING)
        .await
        .map_err(|e| cluster.explain(e, &format!("reading the offloading of {ns}")))?
        .and_then(|o| o.metadata.uid);
    bind_virtual_kubelets(cluster, ns, existing.as_deref(), agents, "offload again").await?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let applied = api
        .patch(names::NAMESPACE_OFFLOADING, &params, &Patch::Apply(object))
        .await
        .map_err(|e| cluster.explain(e, &format!("offloading namespace {ns}")))?;
    if applied.metadata.uid != existing {
        bind_virtual_kubelets(
            cluster,
            ns,
            applied.metadata.uid.as_deref(),
            agents,
            "offload again",
        )
        .await?;
    }
    // After the offloading exists, so that no pod is placed on a virtual
    // node before a peer is told to take it.
    let placement = json!({ "metadata": { "labels": {
        labels::OFFLOADING: "true",
        labels::POD_OFFLOADING_STRATEGY: object.spec.pod_offloading_strategy.as_str(),
    } } });
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    namespaces
        .patch(ns, &PatchParams::default(), &Patch::Merge(&placement))
        .await
        .map_err(|e| cluster.explain(e, &format!("labelling namespace {ns}")))?;
    Ok(())
}

/// How ending a namespace's offloading went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removed {
    /// The offloading and its twin namespaces are gone.
    Gone,
    /// The namespace was not offloaded.
    WasNot,
    /// The twin namespaces were still there at the deadline.
    TimedOut,
}

/// Ends the offloading of `ns`: its placement labels first (pods created
/// from then on stay local), then its NamespaceOffloading, which the
/// virtual kubelets hold (a finalizer) until the twin namespaces are gone.
pub(crate) async fn remove(
    cluster: &ClusterClient,
    ns: &str,
    deadline: tokio::time::Instant,
) -> anyhow::Result<Removed> {
    let placement = json!({ "metadata": { "labels": {
        labels::OFFLOADING: null,
        labels::POD_OFFLOADING_STRATEGY: null,
    } } });
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    namespaces
        .patch(ns, &PatchParams::default(), &Patch::Merge(&placement))
        .await
        .map_err(|e| cluster.explain(e, &format!("unlabelling namespace {ns}")))?;
    let api: Api<NamespaceOffloading> = Api::namespaced(cluster.client.clone(), ns);
    let uid = match api
        .delete(names::NAMESPACE_OFFLOADING, &DeleteParams::default())
        .await
    {
        Ok(either) => either.left().and_then(|o| o.metadata.uid),
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Removed::WasNot),
        Err(e) => return Err(cluster.explain(e, &format!("unoffloading {ns}"))),
    };
    if let Some(uid) = uid {
        let waited = wait::until(
            cluster,
            api,
            names::NAMESPACE_OFFLOADING,
            conditions::is_deleted(&uid),
            wait::left(deadline),
            "waiting for the twin namespaces to be deleted",
        )
        .await?;
        if let Waited::TimedOut = waited {
            return Ok(Removed::TimedOut);
        }
    }
    Ok(Removed::Gone)
}
