//! Bringing a tenant that exists under the terms its provider admits now
//! ([`liqo_api::admission::Admission`]): its Tenant record (the admission
//! policies' parameter), its bindings of those policies, and the Pod
//! Security labels of its twin namespaces. Run by `peer`, by `sharing-policy
//! set` for the tenants the policy governs, and by `install` for the
//! tenants of an earlier version. Running pods are never touched: those the
//! new terms would refuse are reported, and keep running.

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use liqo_api::ClusterId;
use liqo_api::admission::Admission;
use liqo_api::authentication::Tenant;
use liqo_api::names::labels;
use liqo_api::sharing::{self, SharingPolicy, SharingPolicySpec};
use serde_json::json;

use crate::factory::ClusterClient;
use crate::kube::apply;
use crate::kube::ownership;
use crate::manifests::common_labels;
use crate::manifests::peer_admission;

/// The sharing policy of `provider` that applies to `consumer`: its own,
/// else `default`, else the built-in one.
pub async fn policy_for(
    provider: &ClusterClient,
    consumer: Option<&liqo_api::ClusterId>,
) -> anyhow::Result<SharingPolicySpec> {
    let policies: Api<SharingPolicy> = Api::all(provider.client.clone());
    for name in consumer.map(|c| c.as_str()).into_iter().chain(["default"]) {
        match policies.get_opt(name).await {
            Ok(Some(p)) => return Ok(p.spec),
            Ok(None) => {}
            Err(e) => return Err(provider.explain(e, "reading the provider's sharing policy")),
        }
    }
    Ok(sharing::default_policy())
}

/// What bringing one tenant under its terms did.
#[derive(Debug, Default)]
pub struct Brought {
    /// Whether its record said other terms before.
    pub changed: bool,
    /// Its twin namespaces whose Pod Security labels were changed.
    pub relabelled: Vec<String>,
    /// Running pods the terms would refuse now: `namespace/name: why`.
    pub would_refuse: Vec<String>,
}

impl Brought {
    /// What to tell of it: a line when the terms or labels changed, and a
    /// warning per running pod the terms would refuse.
    pub fn report(&self, id: &ClusterId, terms: &Admission) -> (Option<String>, Vec<String>) {
        let changed = (self.changed || !self.relabelled.is_empty()).then(|| {
            let relabelled = if self.relabelled.is_empty() {
                String::new()
            } else {
                format!("; relabelled {}", self.relabelled.join(", "))
            };
            format!(
                "tenant/{id} admitted under: {}{relabelled}",
                terms.describe()
            )
        });
        // A few in full; the rest counted (a Deployment of hundreds would
        // bury everything else).
        const SHOWN: usize = 3;
        let mut warnings: Vec<String> = self
            .would_refuse
            .iter()
            .take(SHOWN)
            .map(|pod| {
                format!(
                    "warning: tenant/{id}: pod {pod}; it keeps running, a new one would be refused"
                )
            })
            .collect();
        if self.would_refuse.len() > SHOWN {
            warnings.push(format!(
                "warning: tenant/{id}: {} more running pods would be refused now, for the same reasons or others",
                self.would_refuse.len() - SHOWN
            ));
        }
        (changed, warnings)
    }
}

/// Brings tenant `id` of `provider` under `terms`; `None` when the
/// provider has no Tenant of ours by that name.
pub async fn bring_under(
    provider: &ClusterClient,
    id: &ClusterId,
    terms: &Admission,
) -> anyhow::Result<Option<Brought>> {
    let tenants: Api<Tenant> = Api::all(provider.client.clone());
    let name = id.as_str();
    let Some(tenant) = tenants
        .get_opt(name)
        .await
        .map_err(|e| provider.explain(e, &format!("reading Tenant {name}")))?
    else {
        return Ok(None);
    };
    if !ownership::is_ours(&tenant.metadata) {
        return Ok(None);
    }
    let mut brought = Brought {
        changed: tenant.spec.admission != *terms,
        ..Brought::default()
    };
    if brought.changed {
        tenants
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({ "spec": { "admission": replacing(&tenant.spec.admission, terms) } }),
                ),
            )
            .await
            .map_err(|e| provider.explain(e, &format!("writing the terms of Tenant {name}")))?;
    }
    let mut binding_labels = common_labels("tenant");
    binding_labels.insert(labels::PEER_CLUSTER_ID.to_owned(), id.to_string());
    let bindings = peer_admission::bindings(id, &binding_labels);
    futures::future::try_join_all(bindings.iter().map(|b| apply::apply(provider, b))).await?;
    let namespaces: Api<Namespace> = Api::all(provider.client.clone());
    let twins = namespaces
        .list(&ListParams::default().labels(&format!("{}={id}", labels::TENANT)))
        .await
        .map_err(|e| provider.explain(e, &format!("listing the twin namespaces of {name}")))?;
    for twin in twins.items {
        let Some(ns) = twin.metadata.name.clone() else {
            continue;
        };
        if twin.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let changes = terms.namespace_label_changes(twin.metadata.labels.as_ref());
        if !changes.is_empty() {
            namespaces
                .patch(
                    &ns,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "metadata": { "labels": changes } })),
                )
                .await
                .map_err(|e| {
                    provider.explain(e, &format!("labelling namespace {ns} for Pod Security"))
                })?;
            brought.relabelled.push(ns.clone());
        }
        brought
            .would_refuse
            .extend(refused_pods(provider, &ns, terms, &tenant.spec.grant).await?);
    }
    Ok(Some(brought))
}

/// `new` as a merge patch over `old`: what `new` drops is removed (lists
/// are replaced whole by a merge; map keys and optional fields are not).
fn replacing(old: &Admission, new: &Admission) -> serde_json::Value {
    let mut value = json!(new);
    if new.runtime_class_name.is_none() {
        value["runtimeClassName"] = serde_json::Value::Null;
    }
    // Left out of the JSON when empty, which a merge patch reads as kept.
    value["reservedNamespaces"] = json!(new.reserved_namespaces);
    for key in old.node_selector.keys() {
        if !new.node_selector.contains_key(key) {
            value["nodeSelector"][key] = serde_json::Value::Null;
        }
    }
    value
}

/// The pods of `ns` still running that `terms` would refuse if they were
/// made now.
async fn refused_pods(
    provider: &ClusterClient,
    ns: &str,
    terms: &Admission,
    grant: &liqo_api::sharing::Resources,
) -> anyhow::Result<Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(provider.client.clone(), ns);
    let list = pods
        .list(&ListParams::default())
        .await
        .map_err(|e| provider.explain(e, &format!("listing the pods of {ns}")))?;
    let mut out = Vec::new();
    for pod in list.items {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let Some(spec) = &pod.spec else { continue };
        // Made by the provider's controllers from the peer's templates,
        // its replacements need no disk limit.
        let why = terms.refusals(grant, &pod.metadata, &terms.with_disk_limits(spec.clone()));
        if !why.is_empty() {
            out.push(format!(
                "{ns}/{}: {}",
                pod.metadata.name.as_deref().unwrap_or_default(),
                why.join("; ")
            ));
        }
    }
    Ok(out)
}

/// Brings every tenant of ours on `provider` under the terms its sharing
/// policy gives it now; returns one line per tenant changed and one per
/// running pod the terms would refuse now.
pub async fn bring_all_under(provider: &ClusterClient) -> anyhow::Result<Vec<String>> {
    let tenants: Api<Tenant> = Api::all(provider.client.clone());
    let all = match tenants.list(&ListParams::default()).await {
        Ok(list) => list.items,
        // No Tenant CRD yet: nothing to bring.
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Vec::new()),
        Err(e) => return Err(provider.explain(e, "listing the tenants")),
    };
    let mut lines = Vec::new();
    for tenant in all.iter().filter(|t| ownership::is_ours(&t.metadata)) {
        let id = &tenant.spec.cluster_id;
        let policy = policy_for(provider, Some(id)).await?;
        let Some(brought) = bring_under(provider, id, &policy.admission).await? else {
            continue;
        };
        let (changed, warnings) = brought.report(id, &policy.admission);
        lines.extend(changed);
        lines.extend(warnings);
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn new_terms_replace_the_old_whole() {
        let old = Admission {
            node_selector: BTreeMap::from([
                ("pool".to_owned(), "peers".to_owned()),
                ("zone".to_owned(), "a".to_owned()),
            ]),
            runtime_class_name: Some("gvisor".to_owned()),
            priority_classes: vec!["low".to_owned()],
            reserved_namespaces: vec!["cert-manager".to_owned()],
            ..Admission::default()
        };
        let new = Admission {
            node_selector: BTreeMap::from([("pool".to_owned(), "other".to_owned())]),
            ..Admission::default()
        };
        let patch = replacing(&old, &new);
        assert_eq!(
            patch["nodeSelector"],
            json!({ "pool": "other", "zone": null })
        );
        assert_eq!(patch["runtimeClassName"], serde_json::Value::Null);
        assert_eq!(patch["priorityClasses"], json!([]));
        assert_eq!(patch["podSecurity"], "baseline");
        assert_eq!(patch["reservedNamespaces"], json!([]));
    }
}
