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

use k8s_openapi::api::core::v1::{PodSpec, Toleration, Volume};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::pod_security::{self, Level};
use crate::sharing::{Resources, parse_bytes, parse_cpu_millis};

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
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Admission {
    /// The Pod Security Standards level of every namespace the peer runs
    /// pods in: `baseline` (the default), `restricted`, or `privileged`
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
    /// The StorageClasses of this cluster the peer's claims may name; the
    /// first is the one its claims get when the consumer names none. None
    /// by default: the peer may make no claim, and its pods may mount
    /// none. How much it may claim is its grant's (storage, claims).
    #[serde(default)]
    pub storage_classes: Vec<String>,
    /// How many node ports the peer's Services may hold in each of its
    /// namespaces (NodePort Services, and LoadBalancer ones that allocate
    /// node ports); 0, the default, refuses NodePort Services.
    #[serde(default)]
    pub node_ports: u32,
    /// How many LoadBalancer Services the peer may hold in each of its
    /// namespaces; 0, the default, refuses them.
    #[serde(default)]
    pub load_balancers: u32,
    /// The local disk (`ephemeral-storage`) each container of the peer may
    /// use, at most: every container states it as its limit (the
    /// consumer's virtual kubelet states it where a pod does not), and the
    /// provider's kubelet evicts a pod that writes more.
    #[serde(default = "default_ephemeral_storage")]
    pub ephemeral_storage: String,
    /// How many objects of each kind (Services, ConfigMaps, Secrets,
    /// ReplicaSets, Jobs, EndpointSlices) the peer may hold in each of its
    /// namespaces.
    #[serde(default = "default_objects")]
    pub objects: u32,
    /// How many twin namespaces of the peer get a share of its grant (the
    /// oldest): one beyond the number holds nothing, since the provider's
    /// API server refuses every object in a twin without its share.
    #[serde(default = "default_namespaces")]
    pub namespaces: u32,
    /// Names a peer's namespaces may not take, beyond those no peer ever
    /// may (`liqo`, `liqo-tenant-*`, `kube-*`, `default`, `*-system`): the
    /// namespaces the provider's own installers will make, so that no
    /// peer makes them first. A trailing `*` matches any suffix.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_namespaces: Vec<String>,
}

const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// The default of [`Admission::ephemeral_storage`].
pub const DEFAULT_EPHEMERAL_STORAGE: &str = "4Gi";
/// The default of [`Admission::objects`].
pub const DEFAULT_OBJECTS: u32 = 1000;
/// The default of [`Admission::namespaces`].
pub const DEFAULT_NAMESPACES: u32 = 100;

fn default_namespaces() -> u32 {
    DEFAULT_NAMESPACES
}

fn default_ephemeral_storage() -> String {
    DEFAULT_EPHEMERAL_STORAGE.to_owned()
}

fn default_objects() -> u32 {
    DEFAULT_OBJECTS
}

impl Default for Admission {
    fn default() -> Self {
        Self {
            pod_security: Level::default(),
            priority_classes: Vec::new(),
            tolerations: Vec::new(),
            node_selector: BTreeMap::new(),
            runtime_class_name: None,
            storage_classes: Vec::new(),
            node_ports: 0,
            load_balancers: 0,
            ephemeral_storage: default_ephemeral_storage(),
            objects: DEFAULT_OBJECTS,
            namespaces: DEFAULT_NAMESPACES,
            reserved_namespaces: Vec::new(),
        }
    }
}

/// The namespace names no peer may take, whatever its terms: this
/// project's, the cluster's own, and the usual home of installed systems.
/// A trailing `*` matches any suffix, a leading one any prefix.
pub const ALWAYS_RESERVED_NAMESPACES: [&str; 5] =
    ["liqo", "liqo-tenant-*", "kube-*", "default", "*-system"];

/// Whether `name` matches `pattern` (`x`, `x*` or `*x`).
pub fn name_matches(pattern: &str, name: &str) -> bool {
    if let Some(prefix) = pattern.strip_suffix('*') {
        name.starts_with(prefix)
    } else if let Some(suffix) = pattern.strip_prefix('*') {
        name.ends_with(suffix)
    } else {
        name == pattern
    }
}

/// The only labels a peer's namespace may carry: what says whose it is
/// and where it comes from, and its Pod Security labels (any label more
/// could pass it for another namespace in a provider's selectors, as
/// `name=kube-system` would).
pub const NAMESPACE_LABELS: [&str; 4] = [
    crate::names::labels::TENANT,
    crate::names::labels::ORIGIN_NAMESPACE,
    crate::names::labels::MANAGED_BY,
    "kubernetes.io/metadata.name",
];

/// The resources a peer's containers may request or be limited to: what
/// the grant counts, and the local disk the terms bound. Extended
/// resources (GPUs and the like) and huge pages are not in any grant.
pub const CONTAINER_RESOURCES: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

/// The volume types a peer's pods may mount below the `privileged` level:
/// those that hold only what the peer itself put in its namespace. No
/// claim (storage is not granted, and a claim may name a provider's
/// volume), no generic ephemeral volume (its claim is made by the
/// provider's controller, outside any quota), no inline CSI volume (a
/// driver may hand out the node's or the cloud's secrets), no host path
/// nor network filesystem.
pub const VOLUME_TYPES: [&str; 5] = [
    "configMap",
    "secret",
    "emptyDir",
    "downwardAPI",
    "projected",
];

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
    /// `spec` if it were made now under a grant of `grant`, one reason per
    /// rule broken (its Pod Security level's checks as one); empty when it
    /// would admit it. The node name is not judged: a running pod has one.
    pub fn refusals(
        &self,
        grant: &Resources,
        metadata: &ObjectMeta,
        spec: &PodSpec,
    ) -> Vec<String> {
        let mut out = Vec::new();
        let violations = pod_security::check(self.pod_security, metadata, spec);
        if !violations.is_empty() {
            out.push(pod_security::describe(self.pod_security, &violations));
        }
        out.extend(self.volume_refusals(spec));
        out.extend(self.resource_refusals(grant, spec));
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

    /// What the volume rules refuse of `spec`: a service account token of
    /// the provider's (mounted by default, or asked for in a projected
    /// volume), a claim when the terms allow no storage class, a generic
    /// ephemeral volume (its claim is made by the provider's controller,
    /// not by the peer), and below the `privileged` level any type but
    /// [`VOLUME_TYPES`] and claims.
    fn volume_refusals(&self, spec: &PodSpec) -> Vec<String> {
        let mut out = Vec::new();
        let volumes = spec.volumes.iter().flatten();
        let tokens: Vec<&str> = volumes
            .clone()
            .filter(|v| {
                v.projected.as_ref().is_some_and(|p| {
                    p.sources
                        .iter()
                        .flatten()
                        .any(|s| s.service_account_token.is_some())
                })
            })
            .map(|v| v.name.as_str())
            .collect();
        if !tokens.is_empty() {
            out.push(format!(
                "volume {} holds a service account token of the provider's: set \
                 automountServiceAccountToken: false and mount no serviceAccountToken",
                tokens.join(", ")
            ));
        }
        let ephemeral: Vec<&str> = volumes
            .clone()
            .filter(|v| v.ephemeral.is_some())
            .map(|v| v.name.as_str())
            .collect();
        if !ephemeral.is_empty() {
            out.push(format!(
                "volume {} is a generic ephemeral volume: mount a claim of the peer's instead",
                ephemeral.join(", ")
            ));
        }
        let claims: Vec<&str> = volumes
            .clone()
            .filter(|v| v.persistent_volume_claim.is_some())
            .map(|v| v.name.as_str())
            .collect();
        if !claims.is_empty() && self.storage_classes.is_empty() {
            out.push(format!(
                "volume {} is a claim: the provider grants no storage",
                claims.join(", ")
            ));
        }
        if self.pod_security != Level::Privileged {
            let other: Vec<&str> = volumes
                .filter(|v| {
                    v.persistent_volume_claim.is_none()
                        && v.ephemeral.is_none()
                        && volume_type(v).is_none_or(|t| !VOLUME_TYPES.contains(&t))
                })
                .map(|v| v.name.as_str())
                .collect();
            if !other.is_empty() {
                out.push(format!(
                    "volume {} is of a type the provider does not allow (only {})",
                    other.join(", "),
                    VOLUME_TYPES.join(", ")
                ));
            }
        }
        out
    }

    /// What the resource rules refuse of `spec`: resources that are not
    /// in a grant, a local disk limit missing or over the terms, and a CPU
    /// or memory limit above the whole grant.
    fn resource_refusals(&self, grant: &Resources, spec: &PodSpec) -> Vec<String> {
        let mut out = Vec::new();
        let containers = || {
            spec.containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
        };
        let mut others: Vec<String> = containers()
            .filter_map(|c| c.resources.as_ref())
            .flat_map(|r| r.requests.iter().flatten().chain(r.limits.iter().flatten()))
            .map(|(k, _)| k.clone())
            .filter(|k| !CONTAINER_RESOURCES.contains(&k.as_str()))
            .collect();
        others.sort();
        others.dedup();
        if !others.is_empty() {
            out.push(format!(
                "{} is not in the grant (containers may ask only for {})",
                others.join(", "),
                CONTAINER_RESOURCES.join(", ")
            ));
        }
        let limit = |c: &k8s_openapi::api::core::v1::Container, r: &str| {
            c.resources
                .as_ref()
                .and_then(|x| x.limits.as_ref())
                .and_then(|l| l.get(r))
                .map(|q| q.0.clone())
        };
        let most = parse_bytes(&self.ephemeral_storage).unwrap_or(u64::MAX);
        let over_disk: Vec<&str> = containers()
            .filter(|c| {
                limit(c, "ephemeral-storage")
                    .and_then(|q| parse_bytes(&q))
                    .is_none_or(|b| b > most)
            })
            .map(|c| c.name.as_str())
            .collect();
        if !over_disk.is_empty() {
            out.push(format!(
                "container {} must state an ephemeral-storage limit of at most {}",
                over_disk.join(", "),
                self.ephemeral_storage
            ));
        }
        for (resource, granted, parse) in [
            (
                "cpu",
                grant.cpu.as_ref(),
                parse_cpu_millis as fn(&str) -> Option<u64>,
            ),
            ("memory", grant.memory.as_ref(), parse_bytes),
        ] {
            let Some(bound) = granted.and_then(|q| parse(&q.0)) else {
                continue;
            };
            let over: Vec<&str> = containers()
                .filter(|c| {
                    limit(c, resource)
                        .and_then(|q| parse(&q))
                        .is_some_and(|v| v > bound)
                })
                .map(|c| c.name.as_str())
                .collect();
            if !over.is_empty() {
                out.push(format!(
                    "container {} has a {resource} limit above the whole grant ({})",
                    over.join(", "),
                    granted.map(|q| q.0.as_str()).unwrap_or_default()
                ));
            }
        }
        out
    }

    /// A pod's spec within these terms, as a consumer sends it: the
    /// runtime class and node labels they require, only the tolerations
    /// they allow (a toleration of the consumer's own taints means nothing
    /// on the provider, and one the provider does not allow would be
    /// refused), and the local disk each container may use where it does
    /// not say (the most the terms allow, with no request, which the
    /// scheduler would count against the provider's nodes' disk).
    pub fn within_terms(&self, mut spec: PodSpec) -> PodSpec {
        if let Some(class) = &self.runtime_class_name {
            spec.runtime_class_name = Some(class.clone());
        }
        if !self.node_selector.is_empty() {
            spec.node_selector
                .get_or_insert_default()
                .extend(self.node_selector.clone());
        }
        let mut kept: Vec<_> = spec
            .tolerations
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|t| self.tolerates(t))
            .collect();
        // A provider tethered to the consumer lets it tolerate the taint
        // on its own nodes: every pod sent there does.
        let tethered = crate::tether::toleration();
        if self.tolerates(&tethered) && !kept.contains(&tethered) {
            kept.push(tethered);
        }
        spec.tolerations = (!kept.is_empty()).then_some(kept);
        self.with_disk_limits(spec)
    }

    /// `spec` with the terms' local disk limit on each container that
    /// states none (and no request for it): pods a controller makes from
    /// a template of before these terms are admitted without it.
    pub fn with_disk_limits(&self, mut spec: PodSpec) -> PodSpec {
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            let resources = c.resources.get_or_insert_default();
            let limits = resources.limits.get_or_insert_default();
            if !limits.contains_key(EPHEMERAL_STORAGE) {
                limits.insert(
                    EPHEMERAL_STORAGE.to_owned(),
                    Quantity(self.ephemeral_storage.clone()),
                );
                resources
                    .requests
                    .get_or_insert_default()
                    .entry(EPHEMERAL_STORAGE.to_owned())
                    .or_insert_with(|| Quantity("0".to_owned()));
            }
        }
        spec
    }

    /// Whether a peer may name a namespace `name`: not one of
    /// [`ALWAYS_RESERVED_NAMESPACES`] nor of the terms' own.
    pub fn allows_namespace_name(&self, name: &str) -> bool {
        !ALWAYS_RESERVED_NAMESPACES
            .iter()
            .copied()
            .chain(self.reserved_namespaces.iter().map(String::as_str))
            .any(|p| name_matches(p, name))
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
            "pod security {}, priority classes {}, tolerations {}, nodes {}, runtime class {}, \
             storage classes {}, node ports {}, load balancers {}, local disk {} per container, \
             {} objects of a kind per namespace, {} namespaces",
            self.pod_security,
            list(&self.priority_classes),
            list(&self.tolerations),
            selector,
            self.runtime_class_name.as_deref().unwrap_or("any"),
            list(&self.storage_classes),
            self.node_ports,
            self.load_balancers,
            self.ephemeral_storage,
            self.objects,
            self.namespaces,
        )
    }
}

/// The type of `volume`: the name of the one source it sets, as the API
/// spells it.
fn volume_type(v: &Volume) -> Option<&'static str> {
    let types: [(&'static str, bool); 5] = [
        ("configMap", v.config_map.is_some()),
        ("secret", v.secret.is_some()),
        ("emptyDir", v.empty_dir.is_some()),
        ("downwardAPI", v.downward_api.is_some()),
        ("projected", v.projected.is_some()),
    ];
    types.into_iter().find(|(_, set)| *set).map(|(t, _)| t)
}

#[cfg(test)]
mod tests;
