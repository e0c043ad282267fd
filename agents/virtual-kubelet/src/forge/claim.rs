//! Claims kept on the provider (docs/storage.md), with nothing read from
//! anywhere: which of the consumer's claims this virtual node keeps, the
//! claim made for one in the twin namespace, the volume that binds the
//! consumer's claim to this node, and what is said when the provider
//! refuses.
//!
//! A consumer's claim of the class `liqo` is this node's when the
//! scheduler picked this node for a pod that uses it (the
//! `volume.kubernetes.io/selected-node` annotation, while it is unbound),
//! or when it is bound to a volume of this node's. Its volume is a
//! PersistentVolume of the consumer's, named after the claim's UID, whose
//! node affinity names this node: every later pod that uses the claim
//! goes where its data is.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Event, EventSource, LocalVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeSpec, VolumeNodeAffinity, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::ObjectMeta;
use liqo_api::names::{self, labels};
use liqo_api::sharing::parse_bytes;

/// On a claim: the node the scheduler picked for its first pod.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// On a volume: who provisioned it (the PersistentVolume controller leaves
/// the deletion of a released volume to its provisioner).
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// On a claim in a twin: the UID of the consumer's claim it keeps.
pub const CLAIM_UID: &str = "liqo.io/claim-uid";
/// On a volume: the claim in the twin that holds its data.
pub const REMOTE_CLAIM: &str = names::REMOTE_CLAIM_ANNOTATION;

/// The consumer's volume of the claim with UID `uid`.
pub fn volume_name(uid: &str) -> String {
    format!("liqo-{uid}")
}

/// The labels of the volumes of the virtual node of `provider`: ours, and
/// the provider's cluster ID.
pub fn volume_labels(provider: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        ),
        (labels::PEER_CLUSTER_ID.to_owned(), provider.to_owned()),
    ])
}

/// The selector of [`volume_labels`].
pub fn volume_selector(provider: &str) -> String {
    volume_labels(provider)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The bytes `claim` requests.
pub fn requested(claim: &PersistentVolumeClaim) -> Option<u64> {
    let spec = claim.spec.as_ref()?;
    let requests = spec.resources.as_ref()?.requests.as_ref()?;
    parse_bytes(&requests.get("storage")?.0)
}

/// The bytes the provider gave `claim` (its status).
pub fn given(claim: &PersistentVolumeClaim) -> Option<u64> {
    let capacity = claim.status.as_ref()?.capacity.as_ref()?;
    parse_bytes(&capacity.get("storage")?.0)
}

/// Whether the consumer's `claim` is kept by the virtual node `node_name`:
/// of the class `liqo`, and bound to a volume `ours` says is this node's,
/// or unbound with a pod scheduled here.
pub fn keeps(claim: &PersistentVolumeClaim, node_name: &str, ours: impl Fn(&str) -> bool) -> bool {
    let Some(spec) = claim.spec.as_ref() else {
        return false;
    };
    if spec.storage_class_name.as_deref() != Some(names::STORAGE_CLASS) {
        return false;
    }
    match spec.volume_name.as_deref().filter(|v| !v.is_empty()) {
        Some(volume) => ours(volume),
        None => claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SELECTED_NODE))
            .is_some_and(|n| n == node_name),
    }
}

/// What `claims` of a namespace that this node keeps ask together: their
/// storage, and their number.
pub fn demand<'a>(
    claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
    node_name: &str,
    ours: impl Fn(&str) -> bool,
) -> liqo_api::sharing::Amounts {
    let mut total = liqo_api::sharing::Amounts::default();
    for c in claims {
        if c.metadata.deletion_timestamp.is_none() && keeps(c, node_name, &ours) {
            total.storage_bytes = total
                .storage_bytes
                .saturating_add(requested(c).unwrap_or(0));
            total.claims += 1;
        }
    }
    total
}

/// Why a claim has no class on the provider.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoClass {
    #[error(
        "the provider does not allow the storage class {asked} ({annotation} names it; allowed: {allowed})",
        annotation = names::REMOTE_STORAGE_CLASS_ANNOTATION,
        allowed = if .allowed.is_empty() { "none".to_owned() } else { .allowed.join(", ") }
    )]
    NotAllowed { asked: String, allowed: Vec<String> },
    #[error("the provider grants no storage (no storage class allowed)")]
    NoneAllowed,
}

/// The provider's class for `claim`: the one its annotation names, if the
/// provider allows it, else the first the provider allows.
pub fn remote_class(claim: &PersistentVolumeClaim, allowed: &[String]) -> Result<String, NoClass> {
    let asked = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::REMOTE_STORAGE_CLASS_ANNOTATION));
    match asked {
        Some(class) if allowed.contains(class) => Ok(class.clone()),
        Some(class) => Err(NoClass::NotAllowed {
            asked: class.clone(),
            allowed: allowed.to_vec(),
        }),
        None => allowed.first().cloned().ok_or(NoClass::NoneAllowed),
    }
}

/// The claim kept in `twin` for the consumer's `claim`, of the provider's
/// `class`: the same name, access modes, volume mode and request.
pub fn remote(claim: &PersistentVolumeClaim, twin: &str, class: &str) -> PersistentVolumeClaim {
    let meta = &claim.metadata;
    let spec = claim.spec.clone().unwrap_or_default();
    let mut claim_labels = BTreeMap::from([
        (
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        ),
        (
            labels::ORIGIN_NAMESPACE.to_owned(),
            meta.namespace.clone().unwrap_or_default(),
        ),
    ]);
    // The consumer's labels say what the data is (app, StatefulSet).
    for (k, v) in meta.labels.iter().flatten() {
        claim_labels.entry(k.clone()).or_insert_with(|| v.clone());
    }
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            namespace: Some(twin.to_owned()),
            labels: Some(claim_labels),
            annotations: Some(BTreeMap::from([(
                CLAIM_UID.to_owned(),
                meta.uid.clone().unwrap_or_default(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: spec.access_modes,
            volume_mode: spec.volume_mode,
            storage_class_name: Some(class.to_owned()),
            resources: Some(VolumeResourceRequirements {
                requests: spec.resources.and_then(|r| r.requests).map(|r| {
                    r.into_iter()
                        .filter(|(k, _)| k == "storage")
                        .collect::<BTreeMap<_, _>>()
                }),
                limits: None,
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// Whether `remote` keeps the consumer's claim with UID `uid` of namespace
/// `origin`: only such a claim is changed or deleted.
pub fn is_ours(remote: &PersistentVolumeClaim, origin: &str, uid: Option<&str>) -> bool {
    let labelled = crate::forge::reflected::is_ours(&remote.metadata, origin);
    let kept = remote
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CLAIM_UID))
        .map(String::as_str);
    labelled && uid.is_none_or(|uid| kept == Some(uid))
}

/// The consumer's volume of `claim`, kept in `twin` on `provider`, of the
/// size `bytes`: bound to the claim, on the virtual node `node_name`.
pub fn volume(
    claim: &PersistentVolumeClaim,
    node_name: &str,
    provider: &str,
    twin: &str,
    bytes: u64,
) -> PersistentVolume {
    let meta = &claim.metadata;
    let name = meta.name.clone().unwrap_or_default();
    let uid = meta.uid.clone().unwrap_or_default();
    let spec = claim.spec.clone().unwrap_or_default();
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(volume_name(&uid)),
            labels: Some(volume_labels(provider)),
            annotations: Some(BTreeMap::from([
                (
                    PROVISIONED_BY.to_owned(),
                    names::STORAGE_PROVISIONER.to_owned(),
                ),
                (REMOTE_CLAIM.to_owned(), format!("{twin}/{name}")),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity(liqo_api::sharing::format_bytes(bytes)),
            )])),
            access_modes: spec.access_modes,
            volume_mode: spec.volume_mode,
            storage_class_name: Some(names::STORAGE_CLASS.to_owned()),
            persistent_volume_reclaim_policy: Some("Delete".to_owned()),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("PersistentVolumeClaim".to_owned()),
                namespace: meta.namespace.clone(),
                name: Some(name.clone()),
                uid: Some(uid),
                ..ObjectReference::default()
            }),
            // Never mounted here: the path says where the data is.
            local: Some(LocalVolumeSource {
                path: format!("/liqo/{provider}/{twin}/{name}"),
                fs_type: None,
            }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "kubernetes.io/hostname".to_owned(),
                            operator: "In".to_owned(),
                            values: Some(vec![node_name.to_owned()]),
                        }]),
                        match_fields: None,
                    }],
                }),
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

/// The consumer's claim a volume of ours is bound to: its namespace and
/// name.
pub fn claim_of(volume: &PersistentVolume) -> Option<(String, String)> {
    let claim = volume.spec.as_ref()?.claim_ref.as_ref()?;
    Some((claim.namespace.clone()?, claim.name.clone()?))
}

/// A Warning Event on the consumer's `claim`, named after it and `reason`
/// so that it is said once.
pub fn warning(
    claim: &PersistentVolumeClaim,
    reason: &str,
    message: &str,
    node_name: &str,
    now: Time,
) -> Event {
    let meta = &claim.metadata;
    let uid = meta.uid.clone().unwrap_or_default();
    Event {
        metadata: ObjectMeta {
            name: Some(format!(
                "{}.{}-{}",
                meta.name.clone().unwrap_or_default(),
                uid.chars().take(8).collect::<String>(),
                reason.to_ascii_lowercase()
            )),
            namespace: meta.namespace.clone(),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("PersistentVolumeClaim".to_owned()),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            ..ObjectReference::default()
        },
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        type_: Some("Warning".to_owned()),
        source: Some(EventSource {
            component: Some(names::STORAGE_PROVISIONER.to_owned()),
            host: Some(node_name.to_owned()),
        }),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Event::default()
    }
}

/// The copy on the consumer's `claim` of the provider's Warning Event
/// `remote` about its claim there: named after it, so that it is copied
/// once, and saying where it comes from.
pub fn copied_warning(claim: &PersistentVolumeClaim, remote: &Event, node_name: &str) -> Event {
    let uid = remote.metadata.uid.clone().unwrap_or_default();
    let mut copy = warning(
        claim,
        remote.reason.as_deref().unwrap_or("Warning"),
        &format!(
            "on the provider: {}",
            remote.message.as_deref().unwrap_or_default()
        ),
        node_name,
        remote
            .last_timestamp
            .clone()
            .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now())),
    );
    copy.metadata.name = Some(format!(
        "{}.{}",
        claim.metadata.name.clone().unwrap_or_default(),
        uid.chars().take(13).collect::<String>()
    ));
    copy.count = remote.count;
    copy
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(class: &str, volume: Option<&str>, selected: Option<&str>) -> PersistentVolumeClaim {
        let mut annotations = serde_json::Map::new();
        if let Some(node) = selected {
            annotations.insert(SELECTED_NODE.to_owned(), json!(node));
        }
        annotations.insert(
            "kubectl.kubernetes.io/last-applied-configuration".to_owned(),
            json!("{}"),
        );
        serde_json::from_value(json!({
            "metadata": {
                "name": "data-db-0", "namespace": "shop", "uid": "0123456789ab",
                "labels": { "app": "db" }, "annotations": annotations,
            },
            "spec": {
                "storageClassName": class,
                "volumeName": volume.unwrap_or(""),
                "accessModes": ["ReadWriteOnce"],
                "resources": { "requests": { "storage": "1Gi" } },
                "selector": { "matchLabels": { "tier": "fast" } },
            },
        }))
        .expect("claim")
    }

    #[test]
    fn a_node_keeps_the_liqo_claims_scheduled_on_it_or_bound_to_its_volumes() {
        let mine = |v: &str| v == "liqo-0123456789ab";
        let table = [
            (claim("liqo", None, Some("liqo-prov")), true),
            (claim("liqo", None, Some("liqo-other")), false),
            (claim("liqo", None, None), false),
            (claim("liqo", Some("liqo-0123456789ab"), None), true),
            (
                claim("liqo", Some("pvc-elsewhere"), Some("liqo-prov")),
                false,
            ),
            (claim("local-path", None, Some("liqo-prov")), false),
        ];
        for (c, want) in table {
            assert_eq!(keeps(&c, "liqo-prov", mine), want, "{:?}", c.spec);
        }
    }

    #[test]
    fn the_demand_counts_the_claims_this_node_keeps() {
        let mine = |v: &str| v == "liqo-0123456789ab";
        let claims = [
            claim("liqo", None, Some("liqo-prov")),
            claim("liqo", Some("liqo-0123456789ab"), None),
            claim("liqo", None, Some("liqo-other")),
            claim("local-path", None, Some("liqo-prov")),
        ];
        let d = demand(claims.iter(), "liqo-prov", mine);
        assert_eq!((d.storage_bytes, d.claims), (2 << 30, 2));
    }

    #[test]
    fn the_remote_class_is_the_annotations_if_allowed_else_the_first() {
        let allowed = vec!["standard".to_owned(), "fast".to_owned()];
        let mut c = claim("liqo", None, None);
        assert_eq!(remote_class(&c, &allowed), Ok("standard".to_owned()));
        c.metadata.annotations.get_or_insert_default().insert(
            names::REMOTE_STORAGE_CLASS_ANNOTATION.to_owned(),
            "fast".to_owned(),
        );
        assert_eq!(remote_class(&c, &allowed), Ok("fast".to_owned()));
        c.metadata.annotations.get_or_insert_default().insert(
            names::REMOTE_STORAGE_CLASS_ANNOTATION.to_owned(),
            "gold".to_owned(),
        );
        let refused = remote_class(&c, &allowed)
            .expect_err("not allowed")
            .to_string();
        assert!(
            refused.contains("does not allow the storage class gold")
                && refused.contains("allowed: standard, fast"),
            "{refused}"
        );
        let none = remote_class(&claim("liqo", None, None), &[]).expect_err("no class");
        assert_eq!(none, NoClass::NoneAllowed);
        assert!(none.to_string().contains("grants no storage"), "{none}");
    }

    #[test]
    fn the_remote_claim_asks_what_the_consumer_asked_and_nothing_it_may_not() {
        let local = claim("liqo", None, Some("liqo-prov"));
        let made = remote(&local, "shop-home", "standard");
        let spec = made.spec.clone().expect("spec");
        assert_eq!(spec.storage_class_name.as_deref(), Some("standard"));
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
        // No selector nor volume name: the provider refuses both.
        assert!(spec.selector.is_none() && spec.volume_name.is_none());
        assert_eq!(requested(&made), Some(1 << 30));
        assert!(is_ours(&made, "shop", Some("0123456789ab")));
        assert!(!is_ours(&made, "shop", Some("another")));
        assert!(!is_ours(&made, "other", None));
        assert_eq!(made.metadata.namespace.as_deref(), Some("shop-home"));
        let kept = made.metadata.labels.expect("labels");
        assert_eq!(kept.get("app").map(String::as_str), Some("db"));
    }

    #[test]
    fn a_providers_warning_is_copied_once_and_says_where_it_comes_from() {
        let local = claim("liqo", None, Some("liqo-prov"));
        let remote: Event = serde_json::from_value(json!({
            "metadata": { "name": "data-db-0.1", "namespace": "shop-home", "uid": "abcdef12-3456-7890" },
            "involvedObject": { "kind": "PersistentVolumeClaim", "name": "data-db-0" },
            "reason": "ProvisioningFailed", "message": "no space left", "type": "Warning", "count": 3,
        }))
        .expect("event");
        let copy = copied_warning(&local, &remote, "liqo-prov");
        assert_eq!(
            copy.metadata.name.as_deref(),
            Some("data-db-0.abcdef12-3456")
        );
        assert_eq!(copy.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(copy.reason.as_deref(), Some("ProvisioningFailed"));
        assert_eq!(
            copy.message.as_deref(),
            Some("on the provider: no space left")
        );
        assert_eq!(copy.count, Some(3));
        assert_eq!(copy.involved_object.uid.as_deref(), Some("0123456789ab"));
    }

    #[test]
    fn the_volume_binds_the_claim_to_this_node() {
        let local = claim("liqo", None, Some("liqo-prov"));
        let pv = volume(&local, "liqo-prov", "prov", "shop-home", 1 << 30);
        assert_eq!(pv.metadata.name.as_deref(), Some("liqo-0123456789ab"));
        assert_eq!(
            claim_of(&pv),
            Some(("shop".to_owned(), "data-db-0".to_owned()))
        );
        let spec = pv.spec.expect("spec");
        assert_eq!(
            spec.storage_class_name.as_deref(),
            Some(names::STORAGE_CLASS)
        );
        let terms = spec
            .node_affinity
            .and_then(|a| a.required)
            .expect("affinity");
        let requirement = &terms.node_selector_terms[0]
            .match_expressions
            .as_ref()
            .expect("expressions")[0];
        assert_eq!(requirement.values, Some(vec!["liqo-prov".to_owned()]));
        let annotations = pv.metadata.annotations.expect("annotations");
        assert_eq!(annotations[PROVISIONED_BY], names::STORAGE_PROVISIONER);
        assert_eq!(annotations[REMOTE_CLAIM], "shop-home/data-db-0");
    }
}
