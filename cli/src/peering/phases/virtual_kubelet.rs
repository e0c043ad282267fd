//! The virtual-kubelet phase, on the consumer: the ForeignCluster that
//! records the peering (with the grant in its status), and the virtual
//! kubelet it owns (built by [`crate::manifests::virtual_kubelet`]), with its
//! rights in the namespaces offloaded already. Removed with the virtual
//! node, waiting until the node and the record are gone.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use liqo_api::core::{ForeignCluster, ForeignClusterSpec};
use liqo_api::following;
use liqo_api::names::{labels, peering};
use liqo_api::offloading::NamespaceOffloading;
use liqo_api::{ClusterId, ClusterIdentity};
use serde_json::json;

use super::{Ends, Peering, Reached};
use crate::factory::ClusterClient;
use crate::kube::cluster::installed_pod_placement;
use crate::kube::ownership;
use crate::manifests::virtual_kubelet;
use crate::manifests::{Manifest, common_labels};
use crate::peering::journal::Journal;
use crate::peering::{PEER_AGAIN, refuse_foreign};
use crate::show::show_resources;

/// Starts the virtual kubelet of `provider`: the ForeignCluster that
/// records the peering, and the agent it owns. Run before the consumer's
/// identity on the provider is made where the provider is known by then
/// (the agent waits for its identity Secret), so that its pod starts
/// meanwhile; [`record`] adds the grant once the identity is made.
pub(super) async fn start(
    run: &Peering<'_>,
    consumer: &ClusterClient,
    provider: &ClusterIdentity,
    journal: &mut Journal,
) -> anyhow::Result<()> {
    let step = run.printer.step(format!(
        "Starting the virtual kubelet on cluster {}",
        consumer.name
    ));
    let started = async {
        let uid = foreign_cluster(run, consumer, provider, journal).await?;
        agent(consumer, &provider.cluster_id, journal, &uid).await
    }
    .await;
    match started {
        Ok(()) => {
            step.done("");
            Ok(())
        }
        Err(e) => {
            step.fail("");
            Err(e)
        }
    }
}

/// The ForeignCluster of the provider on the consumer; returns its UID,
/// which the virtual kubelet's objects name as their owner.
async fn foreign_cluster(
    run: &Peering<'_>,
    consumer: &ClusterClient,
    p: &ClusterIdentity,
    journal: &mut Journal,
) -> anyhow::Result<String> {
    let mut fc_labels = common_labels("peering");
    fc_labels.insert(labels::PEER_CLUSTER_ID.to_owned(), p.cluster_id.to_string());
    let fc = Manifest::ForeignCluster(Box::new(ForeignCluster {
        metadata: kube::core::ObjectMeta {
            name: Some(p.cluster_id.to_string()),
            labels: Some(fc_labels),
            ..Default::default()
        },
        spec: ForeignClusterSpec {
            cluster_id: p.cluster_id.clone(),
            cluster_name: p.cluster_name.clone(),
            api_server_url: None,
            outgoing: true,
            incoming: false,
            cluster_labels: p.labels.clone(),
            request: run.granted.request.clone(),
        },
        status: None,
    }));
    refuse_foreign(consumer, std::slice::from_ref(&fc), PEER_AGAIN).await?;
    journal.apply(consumer, fc).await
}

/// Records the grant, the identity's expiry and the tenant namespace in
/// the status of the provider's ForeignCluster, once the consumer's
/// identity is made.
pub(super) async fn record(
    run: &Peering<'_>,
    consumer: &ClusterClient,
    reached: &Reached,
) -> anyhow::Result<()> {
    let p = &reached.provider_id;
    let api: Api<ForeignCluster> = Api::all(consumer.client.clone());
    let name = p.cluster_id.as_str();
    let condition = Condition {
        type_: following::GRANTED.to_owned(),
        status: "True".to_owned(),
        reason: following::PEERED.to_owned(),
        message: format!(
            "cluster {} granted {}",
            p.cluster_name,
            show_resources(&run.granted.grant)
        ),
        last_transition_time: Time(Timestamp::now()),
        observed_generation: None,
    };
    let status = json!({ "status": {
        "grant": run.granted.grant,
        "cost": run.granted.cost,
        "certificateExpiry": reached.expiry,
        "tenantNamespace": peering::tenant_namespace(&reached.tenant),
        "conditions": [condition],
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(|e| {
            consumer.explain(e, &format!("recording the grant in ForeignCluster {name}"))
        })?;
    Ok(())
}

/// The virtual kubelet of `provider` on the consumer, owned by its
/// ForeignCluster (`uid`).
async fn agent(
    consumer: &ClusterClient,
    provider: &ClusterId,
    journal: &mut Journal,
    uid: &str,
) -> anyhow::Result<()> {
    let placement = installed_pod_placement(consumer).await?;
    let mut objects = virtual_kubelet::manifests(
        provider,
        Some(uid),
        &placement.node_selector,
        &placement.tolerations,
        &placement.images,
    );
    // Its rights in the namespaces offloaded already (`liqoctl offload`
    // binds them in those offloaded later).
    let offloadings: Api<NamespaceOffloading> = Api::all(consumer.client.clone());
    let offloaded = offloadings
        .list(&Default::default())
        .await
        .map_err(|e| consumer.explain(e, "listing offloaded namespaces"))?;
    let bindings = offloaded.items.iter().filter_map(|o| {
        let ns = o.metadata.namespace.as_deref()?;
        Some(virtual_kubelet::offloaded_namespace_binding(
            provider,
            ns,
            o.metadata.uid.as_deref(),
        ))
    });
    // Bound before the agent starts (by rank), so that it finds them
    // readable.
    objects.extend(bindings);
    refuse_foreign(consumer, &objects, PEER_AGAIN).await?;
    journal.apply_all(consumer, objects).await?;
    Ok(())
}

/// Removes the virtual kubelet and its rights, releases the offloadings
/// it held, and deletes the ForeignCluster and the virtual node; waits
/// until the node and the record are gone.
pub(super) async fn remove(
    ends: &Ends<'_>,
    consumer: &ClusterClient,
) -> anyhow::Result<Vec<String>> {
    let provider = &ends.provider_id;
    let mut objects = virtual_kubelet::manifests(
        provider,
        None,
        &Default::default(),
        &[],
        &Default::default(),
    );
    // Its rights in offloaded namespaces (those of namespaces still
    // offloaded would otherwise stay, owned by their offloadings).
    objects.extend(offloaded_namespace_bindings(consumer, provider).await?);
    let left = super::delete_all(consumer, &objects).await?;
    release_offloadings(consumer, provider).await?;
    let fcs: Api<ForeignCluster> = Api::all(consumer.client.clone());
    let fc_uid = fcs
        .get_opt(provider.as_str())
        .await
        .map_err(|e| consumer.explain(e, "reading the ForeignCluster"))?
        .filter(|fc| ownership::is_ours(&fc.metadata))
        .and_then(|fc| fc.metadata.uid);
    if fc_uid.is_some() {
        // In the background: what it owns was deleted just above, and the
        // garbage collector takes the rest (the agent's pods).
        let _ = fcs
            .delete(provider.as_str(), &DeleteParams::background())
            .await;
    }
    let node_name = peering::virtual_node(provider);
    let nodes: Api<Node> = Api::all(consumer.client.clone());
    let node_uid = nodes
        .get_opt(&node_name)
        .await
        .map_err(|e| consumer.explain(e, "reading the virtual node"))?
        .filter(|n| ownership::is_ours(&n.metadata))
        .and_then(|n| n.metadata.uid);
    if let Some(uid) = &node_uid {
        let _ = nodes.delete(&node_name, &DeleteParams::default()).await;
        super::gone(ends, consumer, nodes, &node_name, uid).await?;
    }
    if let Some(uid) = &fc_uid {
        super::gone(ends, consumer, fcs, provider.as_str(), uid).await?;
    }
    Ok(left)
}

/// The RoleBindings of the virtual kubelet of `provider` in offloaded
/// namespaces, wherever they are: found by their labels, which its other
/// bindings (in `kube-node-lease` and `kube-system`) share, and told
/// apart by the role they bind.
async fn offloaded_namespace_bindings(
    consumer: &ClusterClient,
    provider: &ClusterId,
) -> anyhow::Result<Vec<Manifest>> {
    let bindings: Api<RoleBinding> = Api::all(consumer.client.clone());
    let selector = format!(
        "{},{}={provider}",
        virtual_kubelet::agents_selector(),
        labels::PEER_CLUSTER_ID
    );
    let list = bindings
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| consumer.explain(e, "listing the virtual kubelet's RoleBindings"))?;
    Ok(list
        .items
        .iter()
        .filter(|b| b.role_ref.name == peering::virtual_kubelet_offloaded_role(provider))
        .filter_map(|b| b.metadata.namespace.as_deref())
        .map(|ns| virtual_kubelet::offloaded_namespace_binding(provider, ns, None))
        .collect())
}

/// Takes the provider's finalizer off every NamespaceOffloading: its
/// virtual kubelet, which would have removed it once the twin namespace
/// was gone, is gone itself (only reached with `--force` while namespaces
/// are offloaded; the twin namespaces go with the tenant).
async fn release_offloadings(consumer: &ClusterClient, provider: &ClusterId) -> anyhow::Result<()> {
    let finalizer = peering::twin_finalizer(provider);
    let api: Api<NamespaceOffloading> = Api::all(consumer.client.clone());
    let list = match api.list(&Default::default()).await {
        Ok(list) => list,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(consumer.explain(e, "listing offloaded namespaces")),
    };
    for off in list
        .items
        .into_iter()
        .filter(|o| o.finalizers().contains(&finalizer))
    {
        let (Some(ns), Some(name)) = (off.metadata.namespace.clone(), off.metadata.name.clone())
        else {
            continue;
        };
        let kept: Vec<&String> = off
            .finalizers()
            .iter()
            .filter(|f| **f != finalizer)
            .collect();
        // With the resourceVersion read: a concurrent change makes this fail
        // rather than drop someone else's finalizer.
        let patch = json!({ "metadata": {
            "finalizers": kept,
            "resourceVersion": off.metadata.resource_version,
        }});
        Api::<NamespaceOffloading>::namespaced(consumer.client.clone(), &ns)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| {
                consumer.explain(e, &format!("releasing the offloading of namespace {ns}"))
            })?;
    }
    Ok(())
}
