//! The provider's free allocatable capacity, read from its API
//! (`liqo_api::capacity` computes it).

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, ListParams};
use liqo_api::ClusterId;
use liqo_api::capacity;
use liqo_api::names::{labels, peering};
use liqo_api::sharing::Amounts;

use crate::factory::ClusterClient;

/// The provider's free capacity.
pub async fn free(cluster: &ClusterClient) -> anyhow::Result<Amounts> {
    free_for(cluster, None).await
}

/// The provider's free capacity as tenant `tenant` sees it: the pods of
/// its own namespaces (its tenant namespace and twins) counted free, as
/// the provider's gateway counts them when the grant follows the load.
pub async fn free_for(
    cluster: &ClusterClient,
    tenant: Option<&ClusterId>,
) -> anyhow::Result<Amounts> {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let nodes = nodes
        .list(&ListParams::default().labels(&format!("!{}", labels::VIRTUAL_NODE)))
        .await
        .map_err(|e| cluster.explain(e, "listing nodes"))?;
    let pods: Api<Pod> = Api::all(cluster.client.clone());
    let pods = pods
        .list(&ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed"))
        .await
        .map_err(|e| cluster.explain(e, "listing pods"))?;
    let mut own = Vec::new();
    if let Some(tenant) = tenant {
        own.push(peering::tenant_namespace(tenant));
        let twins: Api<Namespace> = Api::all(cluster.client.clone());
        let twins = twins
            .list(&ListParams::default().labels(&format!("{}={tenant}", labels::TENANT)))
            .await
            .map_err(|e| cluster.explain(e, "listing the tenant's namespaces"))?;
        own.extend(twins.items.into_iter().filter_map(|n| n.metadata.name));
    }
    let pods: Vec<&Pod> = pods.items.iter().collect();
    let (free, _) = capacity::for_tenant(&nodes.items, &pods, |p| {
        p.metadata
            .namespace
            .as_ref()
            .is_some_and(|ns| own.contains(ns))
    });
    Ok(free)
}
