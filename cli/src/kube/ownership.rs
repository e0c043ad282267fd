//! Which objects are liqoctl's. liqoctl takes over, changes and deletes
//! only what it made: objects carrying our managed-by label or applied by
//! our field manager, and what those own (a Deployment's pods). Anything
//! else with a name we would use is someone else's, and left alone.

use std::collections::HashSet;

use kube::api::{Api, DynamicObject, ListParams};
use kube::core::ObjectMeta;
use kube::discovery::{Discovery, Scope, verbs};
use liqo_api::names::labels;

use crate::factory::ClusterClient;
use crate::manifests::Manifest;

/// The field manager of everything liqoctl applies: what [`is_ours`] looks
/// for in an object's managed fields.
pub const FIELD_MANAGER: &str = "liqoctl";

/// What the cluster holds under a manifest's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    Absent,
    /// Ours; the UID of the very object, so that deleting it cannot hit a
    /// namesake created since.
    Ours {
        uid: String,
    },
    Foreign,
}

/// Whether liqoctl made the object: our label, or our field manager. A
/// namespace labelled as a peer's (`liqo.io/tenant`) is the peer's, who
/// may write any label and field manager it likes: those prove nothing
/// there (a peer may only create namespaces so labelled, and none under a
/// name liqoctl uses: docs/offloading.md).
pub fn is_ours(meta: &ObjectMeta) -> bool {
    let a_peers = meta
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(labels::TENANT));
    if a_peers {
        return false;
    }
    let labelled = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::MANAGED_BY))
        .is_some_and(|v| v == labels::MANAGED_BY_VALUE);
    let applied = meta
        .managed_fields
        .iter()
        .flatten()
        .any(|f| f.manager.as_deref() == Some(FIELD_MANAGER));
    labelled || applied
}

/// Reads who owns the object a manifest names.
pub async fn of(cluster: &ClusterClient, manifest: &Manifest) -> anyhow::Result<Ownership> {
    let found = super::api_of(cluster, manifest)
        .get_opt(manifest.name())
        .await
        .map_err(|e| cluster.explain(e, &format!("reading {}", manifest.describe())))?;
    Ok(match found {
        None => Ownership::Absent,
        Some(obj) if is_ours(&obj.metadata) => Ownership::Ours {
            uid: obj.metadata.uid.unwrap_or_default(),
        },
        Some(_) => Ownership::Foreign,
    })
}

/// The objects of `manifests` that exist and are not ours, as `Kind/name`.
pub async fn foreign(
    cluster: &ClusterClient,
    manifests: &[Manifest],
) -> anyhow::Result<Vec<String>> {
    let checks = manifests.iter().map(|m| async move {
        Ok::<_, anyhow::Error>((of(cluster, m).await? == Ownership::Foreign).then(|| m.describe()))
    });
    let mut found = Vec::new();
    for result in futures::future::join_all(checks).await {
        found.extend(result?);
    }
    Ok(found)
}

/// Objects a namespace holds that nobody needs to have made: the cluster
/// makes them in every namespace.
fn automatic(kind: &str, name: &str) -> bool {
    matches!(
        (kind, name),
        ("ConfigMap", "kube-root-ca.crt") | ("ServiceAccount", "default") | ("Event", _)
    )
}

/// Every object in `namespace` that liqoctl did not make and that no
/// object of ours owns, as `Kind/name`: deleting the namespace would
/// delete them too. Walks every listable namespaced resource type.
pub async fn foreign_in_namespace(
    cluster: &ClusterClient,
    namespace: &str,
) -> anyhow::Result<Vec<String>> {
    let discovery = Discovery::new(cluster.client.clone())
        .run()
        .await
        .map_err(|e| cluster.explain(e, "discovering the API's resource types"))?;
    let mut objects = Vec::new();
    for group in discovery.groups() {
        for (resource, caps) in group.recommended_resources() {
            if caps.scope != Scope::Namespaced || !caps.supports_operation(verbs::LIST) {
                continue;
            }
            let api: Api<DynamicObject> =
                Api::namespaced_with(cluster.client.clone(), namespace, &resource);
            match api.list(&ListParams::default()).await {
                Ok(list) => {
                    objects.extend(list.items.into_iter().map(|o| (resource.kind.clone(), o)))
                }
                // Types the user may not list are not ours to worry about.
                Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 || s.code == 405 => {}
                Err(e) => {
                    return Err(
                        cluster.explain(e, &format!("listing {} in {namespace}", resource.plural))
                    );
                }
            }
        }
    }
    Ok(unowned(objects))
}

/// The objects that are neither ours nor owned, through owner references,
/// by ours, nor made by the cluster itself.
fn unowned(objects: Vec<(String, DynamicObject)>) -> Vec<String> {
    let mut ours: HashSet<String> = objects
        .iter()
        .filter(|(_, o)| is_ours(&o.metadata))
        .filter_map(|(_, o)| o.metadata.uid.clone())
        .collect();
    // Ownership is transitive (Deployment → ReplicaSet → Pod): grow the set
    // until it stops growing.
    loop {
        let before = ours.len();
        for (_, o) in &objects {
            let owned = o
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|r| ours.contains(&r.uid));
            if owned && let Some(uid) = &o.metadata.uid {
                ours.insert(uid.clone());
            }
        }
        if ours.len() == before {
            break;
        }
    }
    let mut left: Vec<String> = objects
        .iter()
        .filter(|(_, o)| !o.metadata.uid.as_ref().is_some_and(|u| ours.contains(u)))
        .filter(|(kind, o)| !automatic(kind, o.metadata.name.as_deref().unwrap_or_default()))
        .map(|(kind, o)| format!("{kind}/{}", o.metadata.name.as_deref().unwrap_or_default()))
        .collect();
    left.sort();
    left.dedup();
    left
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(
        kind: &str,
        name: &str,
        uid: &str,
        extra: serde_json::Value,
    ) -> (String, DynamicObject) {
        let mut meta = json!({ "name": name, "uid": uid });
        if let (Some(meta), Some(extra)) = (meta.as_object_mut(), extra.as_object()) {
            meta.extend(extra.clone());
        }
        let obj =
            serde_json::from_value(json!({ "apiVersion": "v1", "kind": kind, "metadata": meta }))
                .expect("object");
        (kind.to_owned(), obj)
    }

    #[test]
    fn ours_by_label_or_field_manager_only() {
        let meta =
            |v: serde_json::Value| -> ObjectMeta { serde_json::from_value(v).expect("meta") };
        assert!(is_ours(&meta(
            json!({ "labels": { labels::MANAGED_BY: "liqoctl" } })
        )));
        assert!(is_ours(&meta(
            json!({ "managedFields": [{ "manager": "liqoctl", "operation": "Apply" }] })
        )));
        assert!(!is_ours(&meta(
            json!({ "labels": { labels::MANAGED_BY: "helm" } })
        )));
        assert!(!is_ours(&meta(
            json!({ "managedFields": [{ "manager": "kubectl", "operation": "Apply" }] })
        )));
        assert!(!is_ours(&meta(json!({}))));
    }

    #[test]
    fn owned_objects_follow_their_owners_and_the_rest_is_foreign() {
        let ours = json!({ "labels": { labels::MANAGED_BY: "liqoctl" } });
        let owned_by = |uid: &str| json!({ "ownerReferences": [{ "apiVersion": "v1", "kind": "X", "name": "x", "uid": uid }] });
        let objects = vec![
            // Listed before its owner's owner, to need more than one pass.
            object("Pod", "gw-abc", "3", owned_by("2")),
            object("ReplicaSet", "gw", "2", owned_by("1")),
            object("Deployment", "gw", "1", ours),
            object("Secret", "someone", "4", json!({})),
            object("Pod", "stray", "5", owned_by("4")),
            object("ConfigMap", "kube-root-ca.crt", "6", json!({})),
            object("ServiceAccount", "default", "7", json!({})),
            object("Event", "gw.123", "8", json!({})),
        ];
        assert_eq!(unowned(objects), vec!["Pod/stray", "Secret/someone"]);
    }
}
