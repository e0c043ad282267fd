//! The consumer's side of a peering: the ForeignCluster that records it,
//! the virtual kubelet that stands for the provider (and its rights in
//! offloaded namespaces), and the wait for its virtual node. Once its
//! identity is in place, every way of peering ends here.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use liqo_api::core::{ForeignCluster, ForeignClusterSpec};
use liqo_api::names::{self, labels, peering};
use liqo_api::offloading::NamespaceOffloading;
use liqo_api::sharing::{self, Resources};
use liqo_api::{ClusterId, ClusterIdentity};
use serde_json::json;

use super::report::{Report, print_reports};
use super::{Journal, PEER_AGAIN, Side, network, refuse_foreign, virtual_kubelet};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::agents::{self, Readiness};
use crate::kube::apply;
use crate::kube::cluster::{installed, installed_pod_placement};
use crate::kube::wait::{self, Waited};
use crate::manifests::{Manifest, common_labels};
use crate::printer::Printer;
use crate::show::show_resources;

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
    let ready = match agents::wait_ready(consumer, &vk, wait::left(deadline)).await? {
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

/// What the consumer records of a peering in its ForeignCluster.
pub(crate) struct Recorded<'a> {
    pub provider: &'a ClusterIdentity,
    pub request: Option<&'a Resources>,
    pub grant: &'a Resources,
    pub cost: Option<&'a sharing::Cost>,
    /// When the consumer's credential expires.
    pub expiry: &'a str,
    pub tenant_namespace: String,
}

/// The ForeignCluster of the provider on the consumer, with the grant in
/// its status; returns its UID, which the virtual kubelet's objects name
/// as their owner.
pub(crate) async fn record(
    consumer: &ClusterClient,
    journal: &mut Journal,
    r: &Recorded<'_>,
) -> anyhow::Result<String> {
    let p = r.provider;
    let mut fc_labels = common_labels("peering");
    fc_labels.insert(labels::PEER_CLUSTER_ID.to_owned(), p.cluster_id.to_string());
    let fc = ForeignCluster {
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
            request: r.request.cloned(),
        },
        status: None,
    };
    refuse_foreign(
        consumer,
        &[Manifest::ForeignCluster(Box::new(fc.clone()))],
        PEER_AGAIN,
    )
    .await?;
    journal
        .apply(
            Side::Consumer,
            consumer,
            Manifest::ForeignCluster(Box::new(fc)),
        )
        .await?;
    let api: Api<ForeignCluster> = Api::all(consumer.client.clone());
    let name = p.cluster_id.as_str();
    let now = Time(Timestamp::now());
    let condition = Condition {
        type_: "Granted".to_owned(),
        status: "True".to_owned(),
        reason: "PolicyGranted".to_owned(),
        message: format!(
            "cluster {} granted {}",
            p.cluster_name,
            show_resources(r.grant)
        ),
        last_transition_time: now,
        observed_generation: None,
    };
    let status = json!({ "status": {
        "grant": r.grant,
        "cost": r.cost,
        "certificateExpiry": r.expiry,
        "tenantNamespace": r.tenant_namespace,
        "conditions": [condition],
    }});
    let fc = api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(|e| {
            consumer.explain(e, &format!("recording the grant in ForeignCluster {name}"))
        })?;
    Ok(fc.uid().unwrap_or_default())
}

/// The consumer's side of a peering once its identity is in place (a
/// token's or a response file's): the ForeignCluster, the virtual kubelet
/// (rolled back with whatever `journal` already holds if they fail), the
/// wait for the virtual node, and the report.
pub(crate) async fn finish_on_consumer(
    consumer: &ClusterClient,
    provider: &ClusterClient,
    mut journal: Journal,
    recorded: Recorded<'_>,
    finish: Finish,
    printer: &Printer,
) -> anyhow::Result<()> {
    let Finish {
        deadline,
        timeout,
        output,
        network,
    } = finish;
    let step = printer.step(format!(
        "Starting the virtual kubelet on cluster {}",
        consumer.name
    ));
    let started = async {
        let uid = record(consumer, &mut journal, &recorded).await?;
        start_virtual_kubelet(consumer, &mut journal, &recorded.provider.cluster_id, &uid).await
    }
    .await;
    if let Err(e) = started {
        step.fail("");
        for object in journal.roll_back(consumer, provider).await {
            printer.info(format!("  could not remove {object}"));
        }
        return Err(e);
    }
    step.done("");
    let linked = match network {
        false => None,
        true => {
            let linked = async {
                let consumer_id = installed(consumer).await?;
                network::connect(
                    consumer,
                    &consumer_id,
                    provider,
                    recorded.provider,
                    &recorded.tenant_namespace,
                    &mut journal,
                    printer,
                )
                .await
            }
            .await;
            match linked {
                Ok(linked) => Some(linked),
                Err(e) => {
                    for object in journal.roll_back(consumer, provider).await {
                        printer.info(format!("  could not remove {object}"));
                    }
                    return Err(e);
                }
            }
        }
    };
    let virtual_node = wait_for_virtual_node(
        consumer,
        &recorded.provider.cluster_id,
        deadline,
        timeout,
        printer,
    )
    .await?;
    let report = Report {
        consumer: consumer.name.clone(),
        provider: recorded.provider.cluster_name.clone(),
        provider_cluster_id: recorded.provider.cluster_id.to_string(),
        grant: recorded.grant.clone(),
        cost: recorded.cost.cloned(),
        certificate_expiry: recorded.expiry.to_owned(),
        tenant_namespace: recorded.tenant_namespace.clone(),
        virtual_node,
        network: linked,
    };
    print_reports(&[report], output, printer)
}

/// How [`finish_on_consumer`] ends: its deadline (`timeout`, in seconds,
/// for messages), the output format, and whether to link the networks.
pub(crate) struct Finish {
    pub deadline: tokio::time::Instant,
    pub timeout: u64,
    pub output: Option<crate::cli::OutputFormat>,
    pub network: bool,
}

/// The virtual kubelet of `provider` on the consumer, owned by its
/// ForeignCluster (`uid`).
pub(crate) async fn start_virtual_kubelet(
    consumer: &ClusterClient,
    journal: &mut Journal,
    provider: &liqo_api::ClusterId,
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
    // Before the agent starts, so that it finds them readable.
    let at = objects
        .iter()
        .position(|m| matches!(m, Manifest::Deployment(_)))
        .unwrap_or(objects.len());
    objects.splice(at..at, bindings);
    refuse_foreign(consumer, &objects, PEER_AGAIN).await?;
    for m in objects {
        journal.apply(Side::Consumer, consumer, m).await?;
    }
    Ok(())
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
