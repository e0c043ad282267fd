//! `liqoctl info`: the local identity, the agents' health, the peerings
//! (outgoing: ForeignClusters and their virtual nodes; incoming: Tenants)
//! and the offloaded namespaces, as tables or as JSON/YAML; and
//! `liqoctl info peer NAME`, one peering in detail.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, NodeSelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::ListParams;
use liqo_api::ClusterIdentity;
use liqo_api::admission::{Admission, labels as pss};
use liqo_api::authentication::Tenant;
use liqo_api::core::ForeignCluster;
use liqo_api::names::{self, labels, peering};
use liqo_api::networking::Connection;
use liqo_api::offloading::{ClusterOffloadingStatus, NamespaceOffloading};
use liqo_api::sharing::{Cost, Resources};
use serde::Serialize;

use crate::cli::{GlobalArgs, InfoArgs, InfoCommand, InfoFormat};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::cluster::read_identity;
use crate::kube::rollout::deployment_ready;
use crate::peering::held_tokens::{TokenView, tokens_of};
use crate::peering::refused::{self, Refusing};
use crate::peering::tether::State;
use crate::printer::Printer;
use clusterset::ClustersetView;

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Info {
    identity: ClusterIdentity,
    /// The working mode: `autonomous`, `tethered to ID`, `anchor of IDs`
    /// (docs/tethering.md).
    mode: String,
    agents: Vec<Agent>,
    peerings: Vec<PeeringView>,
    offloaded_namespaces: Vec<Offloaded>,
    /// The peering tokens this cluster issued that are not revoked.
    peering_tokens: Vec<TokenView>,
    /// The clusterset's Services (docs/services.md).
    clusterset: ClustersetView,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Agent {
    name: String,
    ready: bool,
    ready_replicas: i32,
    replicas: i32,
    image: String,
}

/// One peering: outgoing (a ForeignCluster here, this cluster consumes
/// the peer) or incoming (a Tenant here, the peer consumes this cluster).
#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
struct PeeringView {
    /// The peer's cluster name.
    name: String,
    cluster_id: String,
    /// `outgoing`, `incoming`, or for a ForeignCluster marked so, `both`.
    direction: String,
    /// The virtual node standing for the provider (outgoing).
    #[serde(skip_serializing_if = "Option::is_none")]
    virtual_node: Option<String>,
    /// The virtual node's Ready condition: whether the peering works, and why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    ready: Option<Ready>,
    /// The ForeignCluster's or Tenant's conditions.
    conditions: Vec<ConditionView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request: Option<Resources>,
    #[serde(skip_serializing_if = "Option::is_none")]
    grant: Option<Resources>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost: Option<Cost>,
    #[serde(skip_serializing_if = "Option::is_none")]
    certificate_expiry: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant_namespace: Option<String>,
    /// What the provider admits from the consumer beyond the grant.
    #[serde(skip_serializing_if = "Option::is_none")]
    admission: Option<Admission>,
    /// The provider's largest free node (outgoing), or this cluster's as
    /// its gateway last wrote it for the consumer (incoming): what one
    /// pod may ask at most.
    #[serde(skip_serializing_if = "Option::is_none")]
    largest_free_node: Option<Resources>,
    /// The consumer's x509 user name (incoming).
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<String>,
    /// The tunnel between the gateways, unless peered without a network.
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<NetworkView>,
}

/// One end of a peering's tunnel, as this cluster's gateway reports it.
#[derive(Serialize, Debug, Clone, Default)]
#[serde(rename_all = "camelCase")]
struct NetworkView {
    established: bool,
    /// Why not, when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// Where this side dials, or listens.
    #[serde(skip_serializing_if = "Option::is_none")]
    endpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    interface: Option<String>,
    /// Where this cluster sees the peer's pods.
    #[serde(skip_serializing_if = "Option::is_none")]
    peer_pods_seen_as: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_handshake: Option<String>,
    tx_bytes: u64,
    rx_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    rtt_ms: Option<f64>,
}

impl NetworkView {
    fn of(c: &Connection) -> Self {
        let status = c.status.clone().unwrap_or_default();
        let reason = (!c.is_established()).then(|| {
            status
                .conditions
                .iter()
                .filter(|c| c.status != "True")
                .map(|c| c.message.clone())
                .next()
                .unwrap_or_else(|| "the gateway has not reported on it yet".to_owned())
        });
        Self {
            established: c.is_established(),
            reason,
            endpoint: c.spec.endpoint.clone().or(status.endpoint),
            interface: status.interface,
            peer_pods_seen_as: status.peer_seen_as,
            last_handshake: status.last_handshake,
            tx_bytes: status.tx_bytes,
            rx_bytes: status.rx_bytes,
            rtt_ms: status.rtt_ms,
        }
    }

    /// In a few words, for the overview.
    fn line(&self) -> String {
        match (&self.reason, self.rtt_ms) {
            (None, Some(rtt)) => format!("up, {rtt} ms"),
            (None, None) => "up".to_owned(),
            (Some(why), _) => format!("down: {why}"),
        }
    }
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
struct Ready {
    status: String,
    reason: String,
    message: String,
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
struct ConditionView {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    reason: String,
    message: String,
    /// When it last changed (RFC 3339): for `Granted`, when the grant was
    /// last set, at peer time or as it followed the provider's load.
    #[serde(skip_serializing_if = "String::is_empty")]
    last_transition_time: String,
}

impl From<Condition> for ConditionView {
    fn from(c: Condition) -> Self {
        Self {
            type_: c.type_,
            status: c.status,
            reason: c.reason,
            message: c.message,
            last_transition_time: c.last_transition_time.0.to_string(),
        }
    }
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Offloaded {
    namespace: String,
    pod_offloading_strategy: String,
    namespace_mapping_strategy: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster_selector: Option<NodeSelector>,
    /// Per selected provider, as its virtual kubelet reports it.
    clusters: Vec<ClusterOffloadingStatus>,
    /// The Pod Security level its pods are held to here (its providers'
    /// strictest): `enforce` where every pod goes to a provider, `warn`
    /// where they may stay home.
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_security: Option<String>,
    /// Its pods being refused now; a namespace with any is not ready.
    refusing: Refusing,
}

pub async fn run(args: &InfoArgs, global: &GlobalArgs, printer: Printer) -> anyhow::Result<()> {
    let cluster = ClusterClient::local(global).await?;
    let Some(identity) = read_identity(&cluster).await? else {
        return Err(UserError::NotFound(format!(
            "liqo-rs is not installed on cluster {}; run `liqoctl install`",
            cluster.name
        ))
        .into());
    };
    if let Some(InfoCommand::Peer(peer)) = &args.command {
        let all = peerings(&cluster).await?;
        let found = matching(&all, &peer.name)?;
        let parent = args.output.output.and_then(InfoFormat::structured);
        if let Some(format) = peer.output.output.or(parent) {
            return printer.structured(&found, format);
        }
        let layout = Layout::for_output(false);
        let details: Vec<String> = found.iter().map(|p| render_one(p, layout)).collect();
        printer.result(details.join("\n\n"));
        return Ok(());
    }
    let info = Info {
        identity,
        mode: State::read(&cluster).await?.mode(),
        agents: agents(&cluster).await?,
        peerings: peerings(&cluster).await?,
        offloaded_namespaces: offloaded(&cluster).await?,
        peering_tokens: tokens_of(&cluster).await?,
        clusterset: ClustersetView::read(&cluster).await?,
    };
    let format = args.output.output;
    if let Some(structured) = format.and_then(InfoFormat::structured) {
        return printer.structured(&info, structured);
    }
    let wide = format == Some(InfoFormat::Wide);
    printer.result(render(&info, Layout::for_output(wide)));
    Ok(())
}

/// The peerings with `name` as cluster ID or cluster name (both directions
/// when the clusters peer both ways); none is a NotFound naming the known.
fn matching(all: &[PeeringView], name: &str) -> Result<Vec<PeeringView>, UserError> {
    let found: Vec<PeeringView> = all
        .iter()
        .filter(|p| p.cluster_id == name || p.name == name)
        .cloned()
        .collect();
    if !found.is_empty() {
        return Ok(found);
    }
    let mut known: Vec<String> = all
        .iter()
        .map(|p| format!("{} ({}, {})", p.name, p.cluster_id, p.direction))
        .collect();
    known.dedup();
    Err(UserError::NotFound(if known.is_empty() {
        format!("no peer named {name:?}: this cluster has no peerings")
    } else {
        format!("no peer named {name:?}; known peers: {}", known.join(", "))
    }))
}

async fn agents(cluster: &ClusterClient) -> anyhow::Result<Vec<Agent>> {
    let api: Api<Deployment> = Api::namespaced(cluster.client.clone(), names::NAMESPACE);
    let selector = format!("{}={}", labels::MANAGED_BY, labels::MANAGED_BY_VALUE);
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| cluster.explain(e, "listing the agents"))?;
    Ok(list
        .items
        .iter()
        .map(|d| Agent {
            name: d.metadata.name.clone().unwrap_or_default(),
            ready: deployment_ready(d),
            ready_replicas: d
                .status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0),
            replicas: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            image: d
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|p| p.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_default(),
        })
        .collect())
}

/// Outgoing peerings (ForeignClusters, with their virtual node's
/// readiness), then incoming ones (Tenants).
async fn peerings(cluster: &ClusterClient) -> anyhow::Result<Vec<PeeringView>> {
    let api: Api<ForeignCluster> = Api::all(cluster.client.clone());
    let foreign = api
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.explain(e, "listing peerings"))?;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let nodes = nodes
        .list(&ListParams::default().labels(labels::VIRTUAL_NODE))
        .await
        .map_err(|e| cluster.explain(e, "listing virtual nodes"))?
        .items;
    let tenants: Api<Tenant> = Api::all(cluster.client.clone());
    let tenants = match tenants.list(&ListParams::default()).await {
        Ok(list) => list.items,
        // An installation older than the Tenant CRD has no tenants.
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(e) => return Err(cluster.explain(e, "listing tenants")),
    };
    let connections: Vec<Connection> = match Api::<Connection>::all(cluster.client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        // An older installation, or credentials that cannot read them.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => Vec::new(),
        Err(e) => return Err(cluster.explain(e, "listing the tunnels")),
    };
    let tunnel = |namespace: &str, peer: &str| {
        connections
            .iter()
            .find(|c| {
                c.metadata.namespace.as_deref() == Some(namespace)
                    && c.spec.cluster_id.as_str() == peer
            })
            .map(NetworkView::of)
    };
    let mut out: Vec<PeeringView> = foreign
        .items
        .into_iter()
        .map(|fc| {
            let mut p = outgoing(fc, &nodes);
            p.network = tunnel(names::NAMESPACE, &p.cluster_id);
            p
        })
        .collect();
    let claims = token_claims(cluster).await;
    out.extend(tenants.into_iter().map(|t| {
        let token = t
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::manifests::peering_token::TOKEN_LABEL))
            .cloned();
        let mut p = incoming(t);
        // Its end is in its tenant namespace, whatever ID it wrote there.
        p.network = p.tenant_namespace.as_deref().and_then(|ns| {
            connections
                .iter()
                .find(|c| c.metadata.namespace.as_deref() == Some(ns))
                .map(NetworkView::of)
        });
        if let Some(token) = token {
            // A tenant made for a token: its consumer is whoever claimed it.
            match claims.get(&p.cluster_id) {
                Some(name) => p.name = name.clone(),
                None => {
                    p.name = "(unclaimed)".to_owned();
                    p.conditions.push(ConditionView {
                        type_: "Claimed".to_owned(),
                        status: "False".to_owned(),
                        reason: "WaitingForConsumer".to_owned(),
                        message: format!("no consumer has used peering token {token} yet"),
                        last_transition_time: String::new(),
                    });
                }
            }
        }
        p
    }));
    Ok(out)
}

/// The tenants claimed with peering tokens, and the name of the cluster
/// that claimed each (from the claim Secrets; none when they cannot be
/// read with these credentials).
async fn token_claims(cluster: &ClusterClient) -> std::collections::BTreeMap<String, String> {
    use k8s_openapi::api::core::v1::Secret;
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), names::NAMESPACE);
    let Ok(list) = secrets
        .list(&ListParams::default().labels(crate::manifests::peering_token::TOKEN_LABEL))
        .await
    else {
        return Default::default();
    };
    list.items
        .into_iter()
        .filter(|s| s.type_.as_deref() == Some(liqo_api::token::CLAIM_SECRET_TYPE))
        .filter_map(|s| {
            let tenant = s
                .metadata
                .labels
                .as_ref()?
                .get(crate::manifests::peering_token::TENANT_ANNOTATION)?
                .clone();
            let name = s.data.as_ref()?.get("clusterName")?;
            Some((tenant, String::from_utf8_lossy(&name.0).into_owned()))
        })
        .collect()
}

fn outgoing(fc: ForeignCluster, nodes: &[Node]) -> PeeringView {
    let status = fc.status.unwrap_or_default();
    let direction = match (fc.spec.outgoing, fc.spec.incoming) {
        (true, true) => "both",
        (true, false) => "outgoing",
        (false, true) => "incoming",
        (false, false) => "none",
    };
    let node_name = peering::virtual_node(&fc.spec.cluster_id);
    let ready = fc.spec.outgoing.then(|| {
        let node = nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(&node_name));
        let condition = node
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
        match (node, condition) {
            (None, _) => Ready {
                status: "Unknown".into(),
                reason: "NoVirtualNode".into(),
                message: format!("the virtual node {node_name} does not exist"),
            },
            (Some(_), None) => Ready {
                status: "Unknown".into(),
                reason: "NotReported".into(),
                message: format!("the virtual node {node_name} reports no readiness yet"),
            },
            (Some(_), Some(c)) => Ready {
                status: c.status.clone(),
                reason: c.reason.clone().unwrap_or_default(),
                message: c.message.clone().unwrap_or_default(),
            },
        }
    });
    PeeringView {
        name: fc.spec.cluster_name,
        cluster_id: fc.spec.cluster_id.to_string(),
        direction: direction.into(),
        virtual_node: fc.spec.outgoing.then_some(node_name),
        ready,
        conditions: status.conditions.into_iter().map(Into::into).collect(),
        request: fc.spec.request,
        grant: status.grant,
        cost: status.cost,
        certificate_expiry: status.certificate_expiry,
        tenant_namespace: status.tenant_namespace,
        admission: status.admission,
        largest_free_node: status.largest_free_node,
        user: None,
        network: None,
    }
}

fn incoming(t: Tenant) -> PeeringView {
    let status = t.status.unwrap_or_default();
    PeeringView {
        name: t.spec.cluster_name,
        cluster_id: t.spec.cluster_id.to_string(),
        direction: "incoming".into(),
        virtual_node: None,
        ready: None,
        conditions: status.conditions.into_iter().map(Into::into).collect(),
        request: t.spec.request,
        grant: Some(t.spec.grant),
        cost: t.spec.cost,
        certificate_expiry: None,
        tenant_namespace: Some(t.spec.namespace),
        admission: Some(t.spec.admission),
        largest_free_node: status.largest_free_node,
        user: Some(t.spec.user),
        network: None,
    }
}

async fn offloaded(cluster: &ClusterClient) -> anyhow::Result<Vec<Offloaded>> {
    let api: Api<NamespaceOffloading> = Api::all(cluster.client.clone());
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.explain(e, "listing offloaded namespaces"))?;
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    let mut out = Vec::new();
    for o in list.items {
        let namespace = o.metadata.namespace.unwrap_or_default();
        let labels = namespaces
            .get_opt(&namespace)
            .await
            .map_err(|e| cluster.explain(e, &format!("reading namespace {namespace}")))?
            .and_then(|n| n.metadata.labels)
            .unwrap_or_default();
        let pod_security = [pss::ENFORCE, pss::WARN].iter().find_map(|mode| {
            let level = labels.get(*mode)?;
            let how = if *mode == pss::ENFORCE {
                "enforced"
            } else {
                "warned"
            };
            Some(format!("{level} ({how})"))
        });
        out.push(Offloaded {
            refusing: refused::refusing(cluster, &namespace).await?,
            namespace,
            pod_offloading_strategy: o.spec.pod_offloading_strategy.as_str().to_owned(),
            namespace_mapping_strategy: o.spec.namespace_mapping_strategy.as_str().to_owned(),
            cluster_selector: o.spec.cluster_selector,
            clusters: o.status.map(|s| s.clusters).unwrap_or_default(),
            pod_security,
        });
    }
    Ok(out)
}

mod clusterset;
mod render;
use render::{Layout, render, render_one};
#[cfg(test)]
mod tests;
