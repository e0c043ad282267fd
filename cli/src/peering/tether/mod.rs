//! The pieces of a tether (docs/tethering.md) that `liqoctl tether`,
//! `untether` and `info` share: what a cluster's tether state is, and the
//! tether's own phases ([`phases`]; the peerings are
//! [`super::by_kubeconfigs`]' and [`super::by_token`]'), every one of which
//! can be applied again and removed by name.
//!
//! | phase | on | made | removed |
//! | --- | --- | --- | --- |
//! | policy | tethered | its SharingPolicy for the anchor offers everything | the policy before it, or none |
//! | hand-over | tethered | its namespaces offloaded to the anchor alone | the offloadings it made, and its pods on the anchor |
//! | taint | tethered | its own nodes carry [`tether::taint`] | the taint |
//! | mark | both | the ForeignClusters say [`Role`] | the label |
//!
//! The policy is made first and put back last: while it says
//! [`Role::Tethered`], the cluster is tethered or a tether of it was not
//! finished, and `untether` has something to do.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Namespace, Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint,
};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use liqo_api::ClusterId;
use liqo_api::core::ForeignCluster;
use liqo_api::names::{self, labels};
use liqo_api::offloading::{
    NamespaceMappingStrategy, NamespaceOffloading, NamespaceOffloadingSpec, PodOffloadingStrategy,
};
use liqo_api::sharing::{SharingPolicy, SharingPolicySpec};
use liqo_api::tether::{self, Role};
use serde_json::json;

mod phases;

pub(crate) use phases::{Anchor, Outcome, Tether};

use super::offloading::{self, Removed};
use super::terms::policy_for;
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::apply;
use crate::kube::ownership::is_ours;
use crate::manifests::{Manifest, common_labels};

/// On the tethered cluster's SharingPolicy for its anchor: the policy's
/// spec before the tether changed it (JSON), put back by `untether`.
pub(crate) const PRIOR_POLICY: &str = "liqo.io/tether-prior-policy";

/// A cluster's tether, as its objects say.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// The anchor of a tether made or begun here (its SharingPolicy).
    pub begun_with: Option<ClusterId>,
    /// The anchor this cluster is tethered to, the tether finished (its
    /// ForeignCluster says so).
    pub tethered_to: Option<ClusterId>,
    /// The clusters tethered to this one.
    pub anchor_of: Vec<ClusterId>,
}

impl State {
    pub(crate) async fn read(cluster: &ClusterClient) -> anyhow::Result<Self> {
        let mut state = Self::default();
        let of_tether = ListParams::default().labels(labels::TETHER);
        let policies: Api<SharingPolicy> = Api::all(cluster.client.clone());
        let policies = match policies.list(&of_tether).await {
            Ok(list) => list.items,
            Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
            Err(e) => return Err(cluster.explain(e, "reading the sharing policies")),
        };
        state.begun_with = policies
            .iter()
            .filter(|p| Role::of(p.labels()) == Some(Role::Tethered))
            .find_map(|p| ClusterId::new(p.name_any()).ok());
        let fcs: Api<ForeignCluster> = Api::all(cluster.client.clone());
        let fcs = match fcs.list(&of_tether).await {
            Ok(list) => list.items,
            Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
            Err(e) => return Err(cluster.explain(e, "reading the peerings")),
        };
        for fc in fcs {
            let Ok(id) = ClusterId::new(fc.name_any()) else {
                continue;
            };
            match Role::of(fc.labels()) {
                Some(Role::Tethered) => state.tethered_to = Some(id),
                Some(Role::Anchor) => state.anchor_of.push(id),
                None => {}
            }
        }
        Ok(state)
    }

    /// How `info` says it: `autonomous`, `tethered to ID`, `anchor of IDs`.
    pub(crate) fn mode(&self) -> String {
        if let Some(anchor) = &self.tethered_to {
            return format!("tethered to {anchor}");
        }
        if let Some(anchor) = &self.begun_with {
            return format!("tethering to {anchor} (not finished: run tether or untether again)");
        }
        if !self.anchor_of.is_empty() {
            let ids: Vec<_> = self.anchor_of.iter().map(ClusterId::as_str).collect();
            return format!("anchor of {}", ids.join(", "));
        }
        "autonomous".to_owned()
    }
}

/// The policy phase: the tethered cluster offers its anchor everything.
/// Says whether it made the policy so now (not an earlier run).
async fn give_everything(cluster: &ClusterClient, anchor: &ClusterId) -> anyhow::Result<bool> {
    let api: Api<SharingPolicy> = Api::all(cluster.client.clone());
    let existing = api
        .get_opt(anchor.as_str())
        .await
        .map_err(|e| cluster.explain(e, "reading the sharing policies"))?;
    let made = existing
        .as_ref()
        .is_none_or(|p| Role::of(p.labels()) != Some(Role::Tethered));
    let (base, prior) = match existing {
        Some(p) if !is_ours(&p.metadata) => {
            return Err(UserError::Refused(format!(
                "SharingPolicy/{anchor} on cluster {} was not made by liqoctl; delete it, then \
                 tether again",
                cluster.name
            ))
            .into());
        }
        // Made by an earlier run: the prior spec it kept stays.
        Some(p) if Role::of(p.labels()) == Some(Role::Tethered) => {
            let prior = p.annotations().get(PRIOR_POLICY).cloned();
            (p.spec, prior)
        }
        Some(p) => {
            let prior = serde_json::to_string(&p.spec)?;
            (p.spec, Some(prior))
        }
        None => (policy_for(cluster, Some(anchor)).await?, None),
    };
    let mut policy = SharingPolicy::new(anchor.as_str(), tether::anchor_policy(&base));
    let mut policy_labels = common_labels("sharing-policy");
    policy_labels.insert(
        labels::TETHER.to_owned(),
        Role::Tethered.as_str().to_owned(),
    );
    policy.metadata.labels = Some(policy_labels);
    policy.metadata.annotations = prior.map(|p| BTreeMap::from([(PRIOR_POLICY.to_owned(), p)]));
    apply::apply(cluster, &Manifest::SharingPolicy(Box::new(policy))).await?;
    Ok(made)
}

/// Removes the policy phase: puts back the policy there was before, or
/// deletes the one the tether made. A policy the tether did not write is
/// left as it is.
async fn take_back_everything(cluster: &ClusterClient, anchor: &ClusterId) -> anyhow::Result<()> {
    let api: Api<SharingPolicy> = Api::all(cluster.client.clone());
    let Some(existing) = api
        .get_opt(anchor.as_str())
        .await
        .map_err(|e| cluster.explain(e, "reading the sharing policies"))?
    else {
        return Ok(());
    };
    if Role::of(existing.labels()) != Some(Role::Tethered) {
        return Ok(());
    }
    match existing.annotations().get(PRIOR_POLICY) {
        Some(prior) => {
            let spec: SharingPolicySpec = serde_json::from_str(prior).map_err(|e| {
                UserError::Refused(format!(
                    "the annotation {PRIOR_POLICY} of SharingPolicy/{anchor} on cluster {} is \
                     not a policy ({e}); set the policy with `liqoctl sharing-policy set`, \
                     remove the annotation, and untether again",
                    cluster.name
                ))
            })?;
            let mut policy = SharingPolicy::new(anchor.as_str(), spec);
            policy.metadata.labels = Some(common_labels("sharing-policy"));
            apply::apply(cluster, &Manifest::SharingPolicy(Box::new(policy))).await?;
        }
        None => {
            apply::delete(cluster, &Manifest::SharingPolicy(Box::new(existing))).await?;
        }
    }
    Ok(())
}

/// The cluster's own nodes: all but virtual ones.
async fn own_nodes(cluster: &ClusterClient) -> anyhow::Result<Vec<Node>> {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    Ok(nodes
        .list(&ListParams::default().labels(&format!("!{}", labels::VIRTUAL_NODE)))
        .await
        .map_err(|e| cluster.explain(e, "listing the nodes"))?
        .items)
}

/// The taint phase: each of the cluster's own nodes gets the tethered
/// taint, beside the taints it has. Returns how many nodes it tainted now.
async fn taint_nodes(cluster: &ClusterClient, anchor_name: &str) -> anyhow::Result<usize> {
    let taint = tether::taint(anchor_name);
    retaint_nodes(cluster, "tainting", |taints| {
        if taints.iter().any(|t| t.key == names::TETHERED_TAINT) {
            return false;
        }
        taints.push(taint.clone());
        true
    })
    .await
}

/// Removes the taint phase: the tethered taint goes, the node's other
/// taints stay. Returns how many nodes it untainted.
async fn untaint_nodes(cluster: &ClusterClient) -> anyhow::Result<usize> {
    retaint_nodes(cluster, "untainting", |taints| {
        let before = taints.len();
        taints.retain(|t| t.key != names::TETHERED_TAINT);
        taints.len() != before
    })
    .await
}

/// Changes the taints of each own node with `change` (which says whether
/// it changed them), written only if the node did not change meanwhile
/// (a node's taints are one list: a patch would replace it whole, and
/// the node lifecycle controller writes it too); `doing` names it in
/// errors. Returns how many nodes changed.
async fn retaint_nodes(
    cluster: &ClusterClient,
    doing: &str,
    change: impl Fn(&mut Vec<Taint>) -> bool,
) -> anyhow::Result<usize> {
    const ATTEMPTS: usize = 5;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let mut count = 0;
    for node in own_nodes(cluster).await? {
        let name = node.name_any();
        let mut node = node;
        for attempt in 1..=ATTEMPTS {
            let mut taints = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            if !change(&mut taints) {
                break;
            }
            let patch = json!({
                "metadata": { "resourceVersion": node.resource_version() },
                "spec": { "taints": taints },
            });
            match nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    count += 1;
                    break;
                }
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < ATTEMPTS => {
                    node = nodes
                        .get(&name)
                        .await
                        .map_err(|e| cluster.explain(e, &format!("reading node {name}")))?;
                }
                Err(e) => return Err(cluster.explain(e, &format!("{doing} node {name}"))),
            }
        }
    }
    Ok(count)
}

/// What the hand-over phase did.
#[derive(Debug, Default)]
pub(crate) struct HandedOver {
    /// The namespaces offloaded to the anchor by the tether.
    pub namespaces: Vec<String>,
    /// Namespaces offloaded before the tether: left as they were.
    pub kept: Vec<String>,
}

/// The offloading the tether gives a namespace: every pod to the anchor
/// alone, the twin named as by default.
fn hand_over_offloading(ns: &str, anchor: &ClusterId) -> NamespaceOffloading {
    let spec = NamespaceOffloadingSpec {
        pod_offloading_strategy: PodOffloadingStrategy::Remote,
        namespace_mapping_strategy: NamespaceMappingStrategy::DefaultName,
        remote_namespace_name: None,
        cluster_selector: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![NodeSelectorRequirement {
                    key: labels::PEER_CLUSTER_ID.to_owned(),
                    operator: "In".to_owned(),
                    values: Some(vec![anchor.to_string()]),
                }]),
                match_fields: None,
            }],
        }),
    };
    let mut object = NamespaceOffloading::new(names::NAMESPACE_OFFLOADING, spec);
    object.metadata.namespace = Some(ns.to_owned());
    let mut object_labels = common_labels("tether");
    object_labels.insert(
        labels::TETHER.to_owned(),
        Role::Tethered.as_str().to_owned(),
    );
    object.metadata.labels = Some(object_labels);
    object
}

/// The hand-over phase: every namespace of the cluster's that is not kept
/// home ([`tether::kept_home`]) nor offloaded already is offloaded to the
/// anchor alone, with [`PodOffloadingStrategy::Remote`].
async fn hand_over(cluster: &ClusterClient, anchor: &ClusterId) -> anyhow::Result<HandedOver> {
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    let all = namespaces
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.explain(e, "listing the namespaces"))?
        .items;
    let offloadings: Api<NamespaceOffloading> = Api::all(cluster.client.clone());
    let offloaded: BTreeMap<String, NamespaceOffloading> = offloadings
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.explain(e, "listing the offloaded namespaces"))?
        .items
        .into_iter()
        .filter_map(|o| Some((o.namespace()?, o)))
        .collect();
    let agents = offloading::virtual_kubelets(cluster).await?;
    let providers = offloading::Providers::read(cluster, &BTreeMap::new()).await?;
    let mut done = HandedOver::default();
    for ns in &all {
        let name = ns.name_any();
        let terminating =
            ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating");
        if terminating || tether::kept_home(&name, ns.labels()).is_some() {
            continue;
        }
        if let Some(o) = offloaded.get(&name)
            && Role::of(o.labels()) != Some(Role::Tethered)
        {
            done.kept.push(name);
            continue;
        }
        offloading::apply(
            cluster,
            &hand_over_offloading(&name, anchor),
            &agents,
            &providers,
        )
        .await?;
        done.namespaces.push(name);
    }
    Ok(done)
}

/// The namespaces the tether offloaded.
async fn handed_over(cluster: &ClusterClient) -> anyhow::Result<Vec<String>> {
    let api: Api<NamespaceOffloading> = Api::all(cluster.client.clone());
    let of_tether =
        ListParams::default().labels(&format!("{}={}", labels::TETHER, Role::Tethered.as_str()));
    Ok(match api.list(&of_tether).await {
        Ok(list) => list
            .items
            .iter()
            .filter_map(ResourceExt::namespace)
            .collect(),
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(e) => return Err(cluster.explain(e, "listing the offloaded namespaces")),
    })
}

/// Removes the hand-over phase: each namespace the tether offloaded is
/// offloaded no more, and its pods on the anchor's virtual node are
/// deleted (their controllers make them again on the cluster's own
/// nodes). Returns the namespaces, and how many pods were deleted.
async fn take_back(
    cluster: &ClusterClient,
    anchor: &ClusterId,
    deadline: tokio::time::Instant,
    timeout: u64,
) -> anyhow::Result<(Vec<String>, usize)> {
    let namespaces = handed_over(cluster).await?;
    for ns in &namespaces {
        if offloading::remove(cluster, ns, deadline).await? == Removed::TimedOut {
            return Err(UserError::Timeout(format!(
                "the twin namespace of {ns} on cluster {anchor} is not deleted after {timeout}s: \
                 the anchor may be unreachable; see `liqoctl info` and run untether again"
            ))
            .into());
        }
    }
    let node = names::peering::virtual_node(anchor);
    let deleted = delete_pods_on(cluster, Some(&namespaces), &node, false).await?;
    Ok((namespaces, deleted))
}

/// Deletes the pods bound to `node`, in `namespaces` or in every
/// namespace; with `force`, at once (a node whose agent is gone confirms
/// nothing). Returns how many.
async fn delete_pods_on(
    cluster: &ClusterClient,
    namespaces: Option<&[String]>,
    node: &str,
    force: bool,
) -> anyhow::Result<usize> {
    let pods: Api<Pod> = Api::all(cluster.client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let list = pods
        .list(&on_node)
        .await
        .map_err(|e| cluster.explain(e, &format!("listing the pods on {node}")))?;
    let params = DeleteParams {
        grace_period_seconds: force.then_some(0),
        ..DeleteParams::default()
    };
    let chosen = list.items.iter().filter(|p| {
        namespaces.is_none_or(|all| {
            all.iter()
                .any(|ns| Some(ns) == p.metadata.namespace.as_ref())
        })
    });
    delete_pods(cluster, chosen, &params).await
}

/// The restart that finishes a tether: the pods of `namespaces` that run on
/// the cluster's own nodes and a controller makes again
/// ([`tether::restarted`]) are deleted, so that they come back through
/// the anchor. Returns how many.
async fn restart(cluster: &ClusterClient, namespaces: &[String]) -> anyhow::Result<usize> {
    let own: BTreeSet<String> = own_nodes(cluster)
        .await?
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    let mut count = 0;
    for ns in namespaces {
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
        let list = pods
            .list(&ListParams::default())
            .await
            .map_err(|e| cluster.explain(e, &format!("listing the pods of {ns}")))?;
        let chosen = list.items.iter().filter(|p| tether::restarted(p, &own));
        count += delete_pods(cluster, chosen, &DeleteParams::default()).await?;
    }
    Ok(count)
}

/// Deletes `pods`, but those being deleted already (or gone meanwhile);
/// returns how many it deleted.
async fn delete_pods<'a>(
    cluster: &ClusterClient,
    pods: impl IntoIterator<Item = &'a Pod>,
    params: &DeleteParams,
) -> anyhow::Result<usize> {
    let mut count = 0;
    for pod in pods
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let api: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
        match api.delete(&name, params).await {
            Ok(_) => count += 1,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(cluster.explain(e, &format!("deleting pod {ns}/{name}"))),
        }
    }
    Ok(count)
}

/// The mark phase: the ForeignCluster of `peer` on `cluster` says which
/// end of the tether `cluster` is; with `None`, it says so no more (a
/// peering gone already has nothing to unmark).
async fn mark(cluster: &ClusterClient, peer: &ClusterId, role: Option<Role>) -> anyhow::Result<()> {
    let fcs: Api<ForeignCluster> = Api::all(cluster.client.clone());
    let patch = json!({ "metadata": { "labels": { labels::TETHER: role.map(Role::as_str) } } });
    match fcs
        .patch(
            peer.as_str(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 && role.is_none() => Ok(()),
        Err(e) => Err(cluster.explain(e, &format!("marking the peering with {peer}"))),
    }
}

/// Whether `consumer` has an outgoing peering with `provider`.
async fn peered(consumer: &ClusterClient, provider: &ClusterId) -> anyhow::Result<bool> {
    let fcs: Api<ForeignCluster> = Api::all(consumer.client.clone());
    Ok(fcs
        .get_opt(provider.as_str())
        .await
        .map_err(|e| consumer.explain(e, "reading the peerings"))?
        .is_some())
}
