//! The tethered working mode (docs/tethering.md): a small cluster (the
//! tethered one) hands its scheduling to one foreign cluster (its anchor)
//! and takes it back when the tether ends. `liqoctl tether` peers the two
//! both ways, offers the anchor all the tethered cluster has, offloads the
//! tethered cluster's namespaces to the anchor and taints its own nodes;
//! `liqoctl untether` undoes each of these. Pure: which namespaces, pods
//! and nodes a tether touches, and the policy it gives the anchor.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};

use crate::names::{self, labels};
use crate::sharing::{Offer, SharingPolicySpec};

/// Which end of a tether a cluster is, as the label [`labels::TETHER`]
/// says on what `liqoctl tether` made or changed there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Hands its scheduling to its anchor.
    Tethered,
    /// Schedules the tethered cluster's workloads.
    Anchor,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tethered => "tethered",
            Self::Anchor => "anchor",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "tethered" => Some(Self::Tethered),
            "anchor" => Some(Self::Anchor),
            _ => None,
        }
    }

    /// The role `labels` give, if any.
    pub fn of(labels: &BTreeMap<String, String>) -> Option<Self> {
        labels.get(labels::TETHER).and_then(|v| Self::parse(v))
    }
}

/// Why a namespace of the tethered cluster is not handed to the anchor, or
/// `None` when it is: what stays home anyway
/// ([`crate::offloading::stays_home`]: the system namespaces, liqo-rs's
/// own, the twins the anchor's pods run in), and anything else liqoctl
/// made.
pub fn kept_home(name: &str, namespace_labels: &BTreeMap<String, String>) -> Option<&'static str> {
    crate::offloading::stays_home(name, namespace_labels).or_else(|| {
        (namespace_labels.get(labels::MANAGED_BY).map(String::as_str)
            == Some(labels::MANAGED_BY_VALUE))
        .then_some("was made by liqoctl")
    })
}

/// Whether `tether` restarts a running pod so that it goes through the
/// anchor: one a controller recreates (not a DaemonSet's, which belongs
/// on its node), on one of the cluster's own nodes (`own_nodes`, virtual
/// ones left out), not finished. A bare pod is never deleted: nothing
/// would make it again.
pub fn restarted(pod: &Pod, own_nodes: &BTreeSet<String>) -> bool {
    let owned = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind != "DaemonSet");
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let finished = matches!(phase, Some("Succeeded" | "Failed"));
    let on_own_node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| own_nodes.contains(n));
    owned && on_own_node && !finished && pod.metadata.deletion_timestamp.is_none()
}

/// The taint a tethered cluster's own nodes carry.
pub fn taint(anchor_name: &str) -> Taint {
    Taint {
        key: names::TETHERED_TAINT.to_owned(),
        value: Some(anchor_name.to_owned()),
        effect: "NoSchedule".to_owned(),
        time_added: None,
    }
}

/// The toleration of [`taint`]: the anchor's pods and liqo-rs's agents
/// carry it.
pub fn toleration() -> Toleration {
    Toleration {
        key: Some(names::TETHERED_TAINT.to_owned()),
        operator: Some("Exists".to_owned()),
        effect: Some("NoSchedule".to_owned()),
        ..Default::default()
    }
}

/// The tolerations of liqo-rs's agents: those their administrator gave,
/// and [`toleration`], so that an agent made again on a tethered cluster
/// still finds a node.
pub fn agent_tolerations(given: &[Toleration]) -> Vec<Toleration> {
    let mut all = given.to_vec();
    if !all.contains(&toleration()) {
        all.push(toleration());
    }
    all
}

/// The sharing policy the tethered cluster gives its anchor, from the one
/// that applied before (its own for the anchor, the cluster's default, or
/// the built-in one): all of the free capacity, no ceiling, and the right
/// to tolerate [`taint`]; the rest of its terms are kept.
pub fn anchor_policy(before: &SharingPolicySpec) -> SharingPolicySpec {
    let mut policy = before.clone();
    let all = || Some(Offer("100%".to_owned()));
    policy.accept_new_peers = true;
    policy.cpu = all();
    policy.memory = all();
    policy.pods = all();
    policy.ceiling = None;
    if !policy
        .admission
        .tolerations
        .iter()
        .any(|t| t == names::TETHERED_TAINT)
    {
        policy
            .admission
            .tolerations
            .push(names::TETHERED_TAINT.to_owned());
    }
    policy
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharing::default_policy;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn pod(owner: Option<&str>, node: &str, phase: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                owner_references: owner.map(|kind| {
                    vec![OwnerReference {
                        kind: kind.to_owned(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.to_owned()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.to_owned()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn only_what_a_controller_makes_again_is_restarted() {
        let own = BTreeSet::from(["laptop-1".to_owned()]);
        let restarted = |p: Pod| restarted(&p, &own);
        assert!(restarted(pod(Some("ReplicaSet"), "laptop-1", "Running")));
        assert!(restarted(pod(Some("StatefulSet"), "laptop-1", "Pending")));
        assert!(!restarted(pod(None, "laptop-1", "Running")), "a bare pod");
        assert!(!restarted(pod(Some("DaemonSet"), "laptop-1", "Running")));
        assert!(!restarted(pod(Some("Job"), "laptop-1", "Succeeded")));
        assert!(
            !restarted(pod(Some("ReplicaSet"), "liqo-company", "Running")),
            "already through a peer"
        );
    }

    #[test]
    fn system_agent_and_peer_namespaces_stay_home() {
        let none = BTreeMap::new();
        assert_eq!(kept_home("shop", &none), None);
        assert_eq!(kept_home("default", &none), None);
        for name in ["kube-system", "kube-node-lease", "liqo", "liqo-tenant-abc"] {
            assert!(kept_home(name, &none).is_some(), "{name}");
        }
        let twin = BTreeMap::from([(labels::TENANT.to_owned(), "c1".to_owned())]);
        assert!(kept_home("shop-c1", &twin).is_some());
        let ours = BTreeMap::from([(
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        )]);
        assert!(kept_home("made", &ours).is_some());
    }

    #[test]
    fn the_anchor_gets_everything_and_the_taint_and_keeps_the_rest() {
        let mut before = default_policy();
        before.accept_new_peers = false;
        before.admission.tolerations = vec!["dedicated".to_owned()];
        before.ceiling = Some(Default::default());
        let policy = anchor_policy(&before);
        assert!(policy.accept_new_peers);
        assert_eq!(policy.cpu, Some(Offer("100%".to_owned())));
        assert_eq!(policy.ceiling, None);
        assert_eq!(
            policy.admission.tolerations,
            ["dedicated", names::TETHERED_TAINT]
        );
        assert_eq!(anchor_policy(&policy), policy, "applied twice, the same");
        assert!(policy.admission.tolerates(&toleration()));
    }

    #[test]
    fn roles_read_back() {
        for role in [Role::Tethered, Role::Anchor] {
            let labels = BTreeMap::from([(labels::TETHER.to_owned(), role.as_str().to_owned())]);
            assert_eq!(Role::of(&labels), Some(role));
        }
        assert_eq!(Role::parse("laptop"), None);
    }
}
