//! Offloading one namespace, and ending it: what `liqoctl offload
//! namespace`, `unoffload namespace` and `tether` write on the consumer
//! (docs/offloading.md). The twin namespaces and pods are the virtual
//! kubelets'.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::wait::conditions;
use liqo_api::ClusterId;
use liqo_api::admission::Admission;
use liqo_api::core::ForeignCluster;
use liqo_api::home_level;
use liqo_api::names::{self, labels};
use liqo_api::offloading::{NamespaceOffloading, NamespaceOffloadingSpec, PodOffloadingStrategy};
use liqo_api::pod_security::Level;
use liqo_api::sharing::Resources;
use serde_json::json;

use crate::factory::ClusterClient;
use crate::kube::ownership::FIELD_MANAGER;
use crate::kube::wait::{self, Waited};
use crate::manifests::virtual_kubelet;
use crate::peering::consumer::bind_virtual_kubelets;

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
/// of the virtual kubelets of `agents` there, the offloading, the Pod
/// Security level of the `providers` it selects, then the namespace's
/// placement labels. Each step can be applied again.
pub(crate) async fn apply(
    cluster: &ClusterClient,
    object: &NamespaceOffloading,
    agents: &[ClusterId],
    providers: &Providers,
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
    // Its pods are judged here by its providers' Pod Security level
    // before any of them is placed on a virtual node.
    let spec = &object.spec;
    hold_to_level(
        cluster,
        ns,
        spec.pod_offloading_strategy,
        providers.level(spec),
    )
    .await?;
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

/// What a provider admits from this cluster: its terms, and the grant.
pub(crate) type Terms = (Admission, Resources);

/// This cluster's providers as it knows them at one moment, read once for
/// every namespace a command works on: each virtual node's labels (what an
/// offloading's selector selects) and each provider's terms.
#[derive(Debug, Default)]
pub(crate) struct Providers {
    /// Each virtual node's provider ID and labels.
    nodes: Vec<(String, BTreeMap<String, String>)>,
    /// Each provider's terms, by cluster ID.
    terms: BTreeMap<String, Terms>,
}

impl Providers {
    /// The virtual nodes, and the terms as each provider's virtual kubelet
    /// last read them (the ForeignCluster's status), or as `known` says (a
    /// peering just made, whose agent may not have read them yet).
    pub(crate) async fn read(
        cluster: &ClusterClient,
        known: &BTreeMap<String, Terms>,
    ) -> anyhow::Result<Self> {
        let nodes: Api<Node> = Api::all(cluster.client.clone());
        let nodes = nodes
            .list(&ListParams::default().labels(&format!("{}=true", labels::VIRTUAL_NODE)))
            .await
            .map_err(|e| cluster.explain(e, "listing virtual nodes"))?;
        let peers: Api<ForeignCluster> = Api::all(cluster.client.clone());
        let peers = peers
            .list(&ListParams::default())
            .await
            .map_err(|e| cluster.explain(e, "listing the peers"))?;
        let mut terms: BTreeMap<String, Terms> = peers
            .items
            .into_iter()
            .filter_map(|fc| {
                let status = fc.status?;
                let terms = (status.admission?, status.grant.unwrap_or_default());
                Some((fc.spec.cluster_id.to_string(), terms))
            })
            .collect();
        terms.extend(known.iter().map(|(k, v)| (k.clone(), v.clone())));
        Ok(Self {
            nodes: nodes
                .items
                .into_iter()
                .filter_map(|n| {
                    let labels = n.metadata.labels.unwrap_or_default();
                    Some((labels.get(labels::PEER_CLUSTER_ID)?.clone(), labels))
                })
                .collect(),
            terms,
        })
    }

    /// The cluster IDs of the providers whose virtual node `spec` selects.
    pub(crate) fn selected(&self, spec: &NamespaceOffloadingSpec) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(_, labels)| liqo_api::offloading::selects(spec, labels))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The terms of the providers `spec` selects, where known.
    pub(crate) fn selected_terms(&self, spec: &NamespaceOffloadingSpec) -> BTreeMap<String, Terms> {
        self.selected(spec)
            .into_iter()
            .filter_map(|id| Some((id.clone(), self.terms.get(&id)?.clone())))
            .collect()
    }

    /// The strictest Pod Security level among the providers `spec`
    /// selects; `None` where none of their terms is known yet.
    pub(crate) fn level(&self, spec: &NamespaceOffloadingSpec) -> Option<Level> {
        self.selected_terms(spec)
            .values()
            .map(|(t, _)| t.pod_security)
            .max()
    }
}

/// Holds namespace `ns`, offloaded with `strategy`, to `level` (`None`:
/// no provider's level, so its own labels come back): see
/// [`liqo_api::home_level`].
async fn hold_to_level(
    cluster: &ClusterClient,
    ns: &str,
    strategy: PodOffloadingStrategy,
    level: Option<Level>,
) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    let Some(found) = namespaces
        .get_opt(ns)
        .await
        .map_err(|e| cluster.explain(e, &format!("reading namespace {ns}")))?
    else {
        return Ok(());
    };
    let meta = &found.metadata;
    let none = BTreeMap::new();
    let changes = home_level::changes(
        strategy,
        level,
        meta.labels.as_ref().unwrap_or(&none),
        meta.annotations.as_ref().unwrap_or(&none),
    );
    if !changes.is_empty() {
        let patch = json!({ "metadata": {
            "labels": changes.labels,
            "annotations": changes.annotations,
        } });
        namespaces
            .patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| cluster.explain(e, &format!("setting the Pod Security labels of {ns}")))?;
    }
    Ok(())
}

/// Holds every offloaded namespace to the level of the providers it
/// selects, with `known` terms for peerings just made.
pub(crate) async fn follow_levels(
    cluster: &ClusterClient,
    known: &BTreeMap<String, Terms>,
) -> anyhow::Result<()> {
    let api: Api<NamespaceOffloading> = Api::all(cluster.client.clone());
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.explain(e, "listing the offloaded namespaces"))?;
    let providers = Providers::read(cluster, known).await?;
    for o in list.items {
        let Some(ns) = o.metadata.namespace.as_deref() else {
            continue;
        };
        if o.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let level = providers.level(&o.spec);
        hold_to_level(cluster, ns, o.spec.pod_offloading_strategy, level).await?;
    }
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

/// Marks the offloading of `ns` so that, when it is removed, its twin
/// namespaces keep the claims they hold (the virtual kubelets empty them
/// of everything else and leave them).
pub(crate) async fn keep_remote_data(cluster: &ClusterClient, ns: &str) -> anyhow::Result<()> {
    let api: Api<NamespaceOffloading> = Api::namespaced(cluster.client.clone(), ns);
    let mark = json!({ "metadata": { "annotations": {
        names::KEEP_REMOTE_DATA_ANNOTATION: "true",
    } } });
    match api
        .patch(
            names::NAMESPACE_OFFLOADING,
            &PatchParams::default(),
            &Patch::Merge(&mark),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(cluster.explain(
            e,
            &format!("marking the offloading of {ns} to keep its claims"),
        )),
    }
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
    hold_to_level(cluster, ns, PodOffloadingStrategy::Local, None).await?;
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
