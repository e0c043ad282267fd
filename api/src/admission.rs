//! What a provider's API server admits from a peer beyond what its quota
//! counts: the Pod Security level of its namespaces, the priority classes,
//! taints, nodes and runtime class its pods may use, and the Services that
//! reach outside the cluster. The provider states it in its sharing policy
//! ([`crate::sharing::SharingPolicySpec::admission`]); `liqoctl peer`
//! copies it into the peer's Tenant record, which the provider's admission
//! policies take as their parameter (so the API server enforces it alone)
//! and the consumer's virtual kubelet reads, to send only pods the
//! provider admits. Pure: no IO.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::pod_security::{self, Level};

/// The labels Pod Security admission reads on a namespace.
pub mod labels {
    pub const ENFORCE: &str = "pod-security.kubernetes.io/enforce";
    pub const AUDIT: &str = "pod-security.kubernetes.io/audit";
    pub const WARN: &str = "pod-security.kubernetes.io/warn";
    pub const ENFORCE_VERSION: &str = "pod-security.kubernetes.io/enforce-version";
    pub const AUDIT_VERSION: &str = "pod-security.kubernetes.io/audit-version";
    pub const WARN_VERSION: &str = "pod-security.kubernetes.io/warn-version";

    /// The modes, each set to the peer's level.
    pub const MODES: [&str; 3] = [ENFORCE, AUDIT, WARN];
    /// The versions, each absent or `latest`.
    pub const VERSIONS: [&str; 3] = [ENFORCE_VERSION, AUDIT_VERSION, WARN_VERSION];
}

/// Taints every pod tolerates for a while, as the API server's
/// DefaultTolerationSeconds admission adds them (`NoExecute` only): they
/// say how long a pod stays on a node that stopped answering, and place
/// nothing anywhere.
pub const ALWAYS_TOLERATED: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// What a provider admits from one peer. Everything not named here is
/// refused: the defaults are the narrowest that run ordinary workloads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Admission {
    /// The Pod Security Standards level of every namespace the peer runs
    /// pods in: `restricted` (the default), `baseline`, or `privileged`
    /// (only when the provider's administrator grants it to that peer).
    #[serde(default)]
    pub pod_security: Level,
    /// The PriorityClasses the peer's pods may name; none by default.
    #[serde(default)]
    pub priority_classes: Vec<String>,
    /// The keys of the provider's taints the peer's pods may tolerate
    /// (with any value and effect); none by default, beyond not-ready and
    /// unreachable nodes for a while (`NoExecute`), which every pod may.
    #[serde(default)]
    pub tolerations: Vec<String>,
    /// Node labels every pod of the peer must select (`nodeSelector`), so
    /// that they run only on the nodes the provider set aside for peers.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// The RuntimeClass every pod of the peer must use (a sandboxed
    /// runtime, for example); any, when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// How many node ports the peer's Services may hold in each of its
    /// namespaces (NodePort Services, and LoadBalancer ones that allocate
    /// node ports); 0, the default, refuses NodePort Services.
    #[serde(default)]
    pub node_ports: u32,
    /// How many LoadBalancer Services the peer may hold in each of its
    /// namespaces; 0, the default, refuses them.
    #[serde(default)]
    pub load_balancers: u32,
}

impl Admission {
    /// Whether a pod of the peer may carry `toleration`.
    pub fn tolerates(&self, toleration: &Toleration) -> bool {
        let Some(key) = toleration.key.as_deref().filter(|k| !k.is_empty()) else {
            // An empty key with Exists tolerates every taint.
            return false;
        };
        self.tolerations.iter().any(|k| k == key)
            || (ALWAYS_TOLERATED.contains(&key)
                && toleration.effect.as_deref() == Some("NoExecute"))
    }

    /// Whether a pod of the peer may name `class` as its priority class.
    pub fn allows_priority_class(&self, class: &str) -> bool {
        class.is_empty() || self.priority_classes.iter().any(|c| c == class)
    }

    /// Why the provider would refuse a pod of the peer with `metadata` and
    /// `spec` if it were made now, one reason per rule broken (its Pod
    /// Security level's checks as one); empty when it would admit it. The
    /// node name is not judged: a running pod has one.
    pub fn refusals(&self, metadata: &ObjectMeta, spec: &PodSpec) -> Vec<String> {
        let mut out = Vec::new();
        let violations = pod_security::check(self.pod_security, metadata, spec);
        if !violations.is_empty() {
            out.push(pod_security::describe(self.pod_security, &violations));
        }
        if let Some(class) = spec.priority_class_name.as_deref()
            && !self.allows_priority_class(class)
        {
            out.push(format!(
                "priorityClassName {class} is not one the provider allows"
            ));
        }
        let untolerated: Vec<&str> = spec
            .tolerations
            .iter()
            .flatten()
            .filter(|t| !self.tolerates(t))
            .map(|t| t.key.as_deref().unwrap_or("(every taint)"))
            .collect();
        if !untolerated.is_empty() {
            out.push(format!(
                "the provider does not allow tolerating {}",
                untolerated.join(", ")
            ));
        }
        let selector = spec.node_selector.as_ref();
        let missing: Vec<String> = self
            .node_selector
            .iter()
            .filter(|(k, v)| selector.and_then(|s| s.get(*k)) != Some(*v))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if !missing.is_empty() {
            out.push(format!("nodeSelector must hold {}", missing.join(",")));
        }
        if let Some(class) = &self.runtime_class_name
            && spec.runtime_class_name.as_ref() != Some(class)
        {
            out.push(format!("runtimeClassName must be {class}"));
        }
        out
    }

    /// The labels a namespace of the peer carries for Pod Security
    /// admission.
    pub fn namespace_labels(&self) -> BTreeMap<String, String> {
        labels::MODES
            .iter()
            .map(|k| ((*k).to_owned(), self.pod_security.as_str().to_owned()))
            .collect()
    }

    /// The namespace labels that differ from what this admission wants
    /// (the level of each mode, and no pinned version), as the value each
    /// should take (`None`: removed).
    pub fn namespace_label_changes(
        &self,
        current: Option<&BTreeMap<String, String>>,
    ) -> BTreeMap<String, Option<String>> {
        let get = |k: &str| current.and_then(|l| l.get(k)).map(String::as_str);
        let mut changes = BTreeMap::new();
        for mode in labels::MODES {
            if get(mode) != Some(self.pod_security.as_str()) {
                changes.insert(mode.to_owned(), Some(self.pod_security.as_str().to_owned()));
            }
        }
        for version in labels::VERSIONS {
            if get(version).is_some_and(|v| v != "latest") {
                changes.insert(version.to_owned(), None);
            }
        }
        changes
    }

    /// One line for people: `restricted; priority classes: -; ...`.
    pub fn describe(&self) -> String {
        let list = |v: &[String]| {
            if v.is_empty() {
                "none".to_owned()
            } else {
                v.join(",")
            }
        };
        let selector = if self.node_selector.is_empty() {
            "any node".to_owned()
        } else {
            self.node_selector
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "pod security {}, priority classes {}, tolerations {}, nodes {}, runtime class {}, node ports {}, load balancers {}",
            self.pod_security,
            list(&self.priority_classes),
            list(&self.tolerations),
            selector,
            self.runtime_class_name.as_deref().unwrap_or("any"),
            self.node_ports,
            self.load_balancers,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toleration(key: Option<&str>, effect: Option<&str>) -> Toleration {
        Toleration {
            key: key.map(str::to_owned),
            effect: effect.map(str::to_owned),
            operator: Some("Exists".to_owned()),
            ..Toleration::default()
        }
    }

    #[test]
    fn tolerations_are_those_listed_and_the_default_ones() {
        let a = Admission {
            tolerations: vec!["dedicated".to_owned()],
            ..Admission::default()
        };
        for (key, effect, ok) in [
            (Some("dedicated"), Some("NoSchedule"), true),
            (Some("dedicated"), None, true),
            (
                Some("node.kubernetes.io/not-ready"),
                Some("NoExecute"),
                true,
            ),
            (
                Some("node.kubernetes.io/unreachable"),
                Some("NoExecute"),
                true,
            ),
            (
                Some("node.kubernetes.io/not-ready"),
                Some("NoSchedule"),
                false,
            ),
            (Some("node-role.kubernetes.io/control-plane"), None, false),
            // Tolerates everything.
            (None, None, false),
            (Some(""), None, false),
        ] {
            assert_eq!(
                a.tolerates(&toleration(key, effect)),
                ok,
                "{key:?} {effect:?}"
            );
        }
        assert!(!Admission::default().tolerates(&toleration(Some("dedicated"), None)));
    }

    #[test]
    fn priority_classes_are_none_but_those_listed() {
        let a = Admission::default();
        assert!(a.allows_priority_class(""));
        assert!(!a.allows_priority_class("system-cluster-critical"));
        let a = Admission {
            priority_classes: vec!["batch-low".to_owned()],
            ..a
        };
        assert!(a.allows_priority_class("batch-low"));
        assert!(!a.allows_priority_class("system-node-critical"));
    }

    #[test]
    fn namespace_labels_follow_the_level_and_drop_pinned_versions() {
        let a = Admission {
            pod_security: Level::Baseline,
            ..Admission::default()
        };
        assert_eq!(
            a.namespace_labels()
                .get(labels::ENFORCE)
                .map(String::as_str),
            Some("baseline")
        );
        assert_eq!(
            a.namespace_label_changes(Some(&a.namespace_labels())),
            BTreeMap::new()
        );
        let mut old = Admission::default().namespace_labels();
        old.insert(labels::ENFORCE_VERSION.to_owned(), "v1.20".to_owned());
        old.insert(labels::WARN_VERSION.to_owned(), "latest".to_owned());
        let changes = a.namespace_label_changes(Some(&old));
        assert_eq!(changes.len(), 4, "{changes:?}");
        assert_eq!(changes[labels::ENFORCE_VERSION], None);
        assert_eq!(changes[labels::AUDIT].as_deref(), Some("baseline"));
        assert_eq!(a.namespace_label_changes(None).len(), 3);
    }

    #[test]
    fn refusals_name_each_rule_a_pod_breaks() {
        let spec: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [{ "name": "app", "image": "app" }],
            "priorityClassName": "system-cluster-critical",
            "tolerations": [{ "key": "dedicated", "operator": "Exists" }],
        }))
        .expect("spec");
        let a = Admission {
            pod_security: Level::Baseline,
            node_selector: BTreeMap::from([("pool".to_owned(), "peers".to_owned())]),
            runtime_class_name: Some("gvisor".to_owned()),
            ..Admission::default()
        };
        let got = a.refusals(&ObjectMeta::default(), &spec);
        assert_eq!(
            got,
            [
                "priorityClassName system-cluster-critical is not one the provider allows",
                "the provider does not allow tolerating dedicated",
                "nodeSelector must hold pool=peers",
                "runtimeClassName must be gvisor",
            ]
        );
        // Within the terms: nothing.
        let ok = PodSpec {
            priority_class_name: None,
            tolerations: None,
            node_selector: Some(a.node_selector.clone()),
            runtime_class_name: a.runtime_class_name.clone(),
            ..spec
        };
        assert!(a.refusals(&ObjectMeta::default(), &ok).is_empty());
        // Restricted by default: the bare container fails its checks.
        let got = Admission::default().refusals(&ObjectMeta::default(), &ok);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].starts_with("violates PodSecurity \"restricted:latest\""),
            "{got:?}"
        );
    }

    #[test]
    fn the_default_is_the_narrowest() {
        let a: Admission = serde_json::from_str("{}").expect("parses");
        assert_eq!(a, Admission::default());
        assert_eq!(a.pod_security, Level::Restricted);
        assert_eq!(
            a.describe(),
            "pod security restricted, priority classes none, tolerations none, nodes any node, \
             runtime class any, node ports 0, load balancers 0"
        );
    }
}
