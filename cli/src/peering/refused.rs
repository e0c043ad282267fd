//! What of an offloaded namespace its providers' terms refuse: the
//! workloads whose pods they would refuse (`offload namespace` lists them
//! before anything is made), and the pods being refused now (`info` counts
//! them: such a namespace is not ready). Read on the consumer only.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::factory::ClusterClient;
use crate::peering::offloading::Terms;

/// The reason on a pod that a virtual kubelet refused for offloading.
const REFUSED_REASON: &str = "OffloadingRefused";

/// A workload whose pods a provider would refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    /// `kind/name`, as kubectl names it.
    pub workload: String,
    pub provider: String,
    /// The first reason.
    pub why: String,
}

/// The workloads of `ns` (Deployments, StatefulSets, DaemonSets, Jobs,
/// CronJobs, and ReplicaSets and pods no controller owns) whose pods a
/// provider of `providers` (its terms and grant) would refuse, with the
/// first reason of the first that would.
pub(crate) async fn workloads(
    cluster: &ClusterClient,
    ns: &str,
    providers: &BTreeMap<String, Terms>,
) -> anyhow::Result<Vec<Refused>> {
    if providers.is_empty() {
        return Ok(Vec::new());
    }
    let lp = ListParams::default();
    let client = &cluster.client;
    let read = |e, what: &str| cluster.explain(e, &format!("listing the {what} of {ns}"));
    let mut templates: Vec<(String, PodTemplateSpec)> = Vec::new();
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns)
        .list(&lp)
        .await;
    for d in deployments.map_err(|e| read(e, "Deployments"))?.items {
        let name = format!("deployment/{}", d.metadata.name.unwrap_or_default());
        templates.extend(d.spec.map(|s| (name, s.template)));
    }
    let sets = Api::<StatefulSet>::namespaced(client.clone(), ns)
        .list(&lp)
        .await;
    for d in sets.map_err(|e| read(e, "StatefulSets"))?.items {
        let name = format!("statefulset/{}", d.metadata.name.unwrap_or_default());
        templates.extend(d.spec.map(|s| (name, s.template)));
    }
    let daemons = Api::<DaemonSet>::namespaced(client.clone(), ns)
        .list(&lp)
        .await;
    for d in daemons.map_err(|e| read(e, "DaemonSets"))?.items {
        let name = format!("daemonset/{}", d.metadata.name.unwrap_or_default());
        templates.extend(d.spec.map(|s| (name, s.template)));
    }
    let crons = Api::<CronJob>::namespaced(client.clone(), ns)
        .list(&lp)
        .await;
    for d in crons.map_err(|e| read(e, "CronJobs"))?.items {
        let name = format!("cronjob/{}", d.metadata.name.unwrap_or_default());
        templates.extend(
            d.spec
                .and_then(|s| s.job_template.spec)
                .map(|s| (name, s.template)),
        );
    }
    let unowned =
        |m: &kube::core::ObjectMeta| m.owner_references.as_ref().is_none_or(Vec::is_empty);
    let jobs = Api::<Job>::namespaced(client.clone(), ns).list(&lp).await;
    for d in jobs.map_err(|e| read(e, "Jobs"))?.items {
        if !unowned(&d.metadata) {
            continue;
        }
        let name = format!("job/{}", d.metadata.name.unwrap_or_default());
        templates.extend(d.spec.map(|s| (name, s.template)));
    }
    let sets = Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list(&lp)
        .await;
    for d in sets.map_err(|e| read(e, "ReplicaSets"))?.items {
        if !unowned(&d.metadata) {
            continue;
        }
        let name = format!("replicaset/{}", d.metadata.name.unwrap_or_default());
        templates.extend(d.spec.and_then(|s| s.template).map(|t| (name, t)));
    }
    let pods = Api::<Pod>::namespaced(client.clone(), ns).list(&lp).await;
    for p in pods.map_err(|e| read(e, "pods"))?.items {
        if !unowned(&p.metadata) {
            continue;
        }
        let name = format!("pod/{}", p.metadata.name.clone().unwrap_or_default());
        templates.push((
            name,
            PodTemplateSpec {
                metadata: Some(p.metadata),
                spec: p.spec,
            },
        ));
    }
    Ok(templates
        .into_iter()
        .filter_map(|(workload, t)| {
            let meta = t.metadata.unwrap_or_default();
            let spec = t.spec?;
            providers.iter().find_map(|(provider, (terms, grant))| {
                let why = terms
                    .refusals(grant, &meta, &terms.within_terms(spec.clone()))
                    .into_iter()
                    .next()?;
                Some(Refused {
                    workload: workload.clone(),
                    provider: provider.clone(),
                    why,
                })
            })
        })
        .collect())
}

/// The pods of a namespace being refused now: refused by a virtual
/// kubelet (Pending, `OffloadingRefused`), or never made because the
/// namespace's Pod Security admission refuses them (their ReplicaSets'
/// `FailedCreate`).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Refusing {
    pub pods: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// What of `ns` is being refused now.
pub(crate) async fn refusing(cluster: &ClusterClient, ns: &str) -> anyhow::Result<Refusing> {
    let lp = ListParams::default();
    let mut out = Refusing::default();
    let pods = Api::<Pod>::namespaced(cluster.client.clone(), ns)
        .list(&lp)
        .await
        .map_err(|e| cluster.explain(e, &format!("listing the pods of {ns}")))?;
    for p in pods.items {
        let Some(status) = p.status else { continue };
        if status.reason.as_deref() == Some(REFUSED_REASON) {
            out.pods += 1;
            if out.why.is_none() {
                out.why = status.message;
            }
        }
    }
    let sets = Api::<ReplicaSet>::namespaced(cluster.client.clone(), ns)
        .list(&lp)
        .await
        .map_err(|e| cluster.explain(e, &format!("listing the ReplicaSets of {ns}")))?;
    for rs in sets.items {
        let wanted = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let Some(status) = rs.status else { continue };
        let failure = status.conditions.iter().flatten().find(|c| {
            c.type_ == "ReplicaFailure"
                && c.status == "True"
                && c.reason.as_deref() == Some("FailedCreate")
        });
        if let Some(c) = failure {
            out.pods += u32::try_from((wanted - status.replicas).max(0)).unwrap_or_default();
            if out.why.is_none() {
                out.why = c.message.clone();
            }
        }
    }
    Ok(out)
}
