//! Pure functions for twin namespaces: the Namespace and the RoleBinding
//! the agent creates on the provider for an offloaded namespace, what it
//! writes into the NamespaceOffloading's status for its provider, and
//! whether an existing namespace is one of ours. The offloading contract
//! itself (names, selection) is `liqo_api::offloading`'s.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use kube::core::ObjectMeta;
use liqo_api::ClusterId;
use liqo_api::admission::Admission;
use liqo_api::authentication::peer_user;
use liqo_api::names::{self, labels, peering};
use liqo_api::offloading::ClusterOffloadingStatus;

/// The finalizer this agent puts on a NamespaceOffloading while its twin
/// namespace exists on its provider: the consumer's identity cannot list
/// namespaces on the provider, so the offloading itself must outlive the
/// twin to say what to delete, even across a restart of the agent.
pub fn finalizer(provider: &ClusterId) -> String {
    names::peering::twin_finalizer(provider)
}

fn twin_labels(consumer: &ClusterId, origin: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::TENANT.to_owned(), consumer.to_string()),
        (labels::ORIGIN_NAMESPACE.to_owned(), origin.to_owned()),
        (
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        ),
    ])
}

/// The twin namespace `name` of local namespace `origin`, as the
/// provider's admission policies let consumer `consumer` create it: with
/// the Pod Security labels of the provider's terms, where it states them.
pub fn twin_namespace(
    name: &str,
    consumer: &ClusterId,
    origin: &str,
    terms: Option<&Admission>,
) -> Namespace {
    let mut labels = twin_labels(consumer, origin);
    if let Some(terms) = terms {
        labels.extend(terms.namespace_labels());
    }
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

/// Whether an existing namespace on the provider is consumer `consumer`'s
/// twin of `origin`: only such a one is used, or deleted.
pub fn is_our_twin(ns: &Namespace, consumer: &ClusterId, origin: &str) -> bool {
    let l = ns.metadata.labels.as_ref();
    let get = |k: &str| l.and_then(|l| l.get(k)).map(String::as_str);
    get(labels::TENANT) == Some(consumer.as_str()) && get(labels::ORIGIN_NAMESPACE) == Some(origin)
}

/// The RoleBinding in a twin namespace that gives the consumer's identity
/// the tenant's rights there.
pub fn tenant_role_binding(namespace: &str, consumer: &ClusterId) -> RoleBinding {
    RoleBinding {
        metadata: ObjectMeta {
            name: Some(peering::TWIN_ROLE_BINDING.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([
                (labels::TENANT.to_owned(), consumer.to_string()),
                (
                    labels::MANAGED_BY.to_owned(),
                    labels::MANAGED_BY_VALUE.to_owned(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "ClusterRole".to_owned(),
            name: peering::tenant_role(consumer),
        },
        subjects: Some(vec![Subject {
            kind: "User".to_owned(),
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            name: peer_user(consumer),
            namespace: None,
        }]),
    }
}

/// This provider's entry in an offloading's status.
pub fn status_entry(
    provider: &ClusterId,
    remote_namespace: &str,
    outcome: Result<(), (&str, String)>,
) -> ClusterOffloadingStatus {
    let (ready, reason, message) = match outcome {
        Ok(()) => (true, None, None),
        Err((reason, message)) => (false, Some(reason.to_owned()), Some(message)),
    };
    ClusterOffloadingStatus {
        cluster_id: provider.clone(),
        remote_namespace: remote_namespace.to_owned(),
        ready,
        reason,
        message,
    }
}

/// The status entries with this provider's `entry` in place of its old
/// one (or without it, for `None`); other providers' entries untouched,
/// kept in cluster-ID order so that every writer writes the same list.
pub fn with_entry(
    entries: &[ClusterOffloadingStatus],
    provider: &ClusterId,
    entry: Option<ClusterOffloadingStatus>,
) -> Vec<ClusterOffloadingStatus> {
    let mut out: Vec<_> = entries
        .iter()
        .filter(|e| e.cluster_id != *provider)
        .cloned()
        .chain(entry)
        .collect();
    out.sort_by(|a, b| a.cluster_id.as_str().cmp(b.cluster_id.as_str()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ClusterId {
        ClusterId::new(s).expect("valid")
    }

    #[test]
    fn twin_namespace_carries_the_tenant_and_origin() {
        let ns = twin_namespace("shop-home", &id("cons-1"), "shop", None);
        let l = ns.metadata.labels.clone().expect("labels");
        assert_eq!(l[labels::TENANT], "cons-1");
        assert_eq!(l[labels::ORIGIN_NAMESPACE], "shop");
        assert!(!l.contains_key(liqo_api::admission::labels::ENFORCE));
        // With the provider's terms: its Pod Security level in each mode.
        let baseline = Admission {
            pod_security: liqo_api::pod_security::Level::Baseline,
            ..Admission::default()
        };
        let with = twin_namespace("shop-home", &id("cons-1"), "shop", Some(&baseline));
        let l = with.metadata.labels.expect("labels");
        for mode in liqo_api::admission::labels::MODES {
            assert_eq!(l[mode], "baseline", "{mode}");
        }
        let table = [
            ("ours", "cons-1", "shop", true),
            ("another tenant's", "cons-2", "shop", false),
            ("another origin's", "cons-1", "cart", false),
        ];
        for (what, consumer, origin, want) in table {
            assert_eq!(is_our_twin(&ns, &id(consumer), origin), want, "{what}");
        }
        assert!(!is_our_twin(&Namespace::default(), &id("cons-1"), "shop"));
    }

    #[test]
    fn role_binding_binds_the_tenant_cluster_role_to_the_peer_user() {
        let rb = tenant_role_binding("shop-home", &id("cons-1"));
        assert_eq!(rb.metadata.name.as_deref(), Some("liqo-tenant"));
        assert_eq!(rb.metadata.namespace.as_deref(), Some("shop-home"));
        assert_eq!(rb.role_ref.kind, "ClusterRole");
        assert_eq!(rb.role_ref.name, "liqo-tenant-cons-1");
        let subjects = rb.subjects.expect("subjects");
        assert_eq!(subjects[0].name, "liqo.io:peer:cons-1");
    }

    #[test]
    fn status_entries_table() {
        let a = status_entry(&id("a"), "x", Ok(()));
        let b_old = status_entry(&id("b"), "x", Err(("Forbidden", "no".into())));
        let b_new = status_entry(&id("b"), "x", Ok(()));
        let c = status_entry(&id("c"), "x", Ok(()));
        assert!(!b_old.ready && b_old.reason.as_deref() == Some("Forbidden"));
        let table = [
            (
                "added",
                vec![c.clone(), a.clone()],
                Some(b_new.clone()),
                vec![&a, &b_new, &c],
            ),
            (
                "replaced",
                vec![a.clone(), b_old.clone()],
                Some(b_new.clone()),
                vec![&a, &b_new],
            ),
            ("removed", vec![a.clone(), b_old.clone()], None, vec![&a]),
            ("none to remove", vec![a.clone()], None, vec![&a]),
        ];
        for (what, have, entry, want) in table {
            let got = with_entry(&have, &id("b"), entry);
            let want: Vec<_> = want.into_iter().cloned().collect();
            assert_eq!(got, want, "{what}");
        }
    }
}
