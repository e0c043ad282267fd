//! The Multi-Cluster Services API across peerings, with nothing read from
//! anywhere: what a cluster exports ([`Exports`], which travels between
//! peers on their Connections), the API's own objects ([`ServiceExport`],
//! [`ServiceImport`], v1beta1 of `multicluster.x-k8s.io`), and how the
//! exports of every cluster of the clusterset merge into the imports of
//! one ([`merge`]), conflicts resolved as KEP-1645 says: the oldest
//! export wins, and every export that differs from the winner says so.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::SessionAffinityConfig;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::networking::Remap;

/// The MCS API's group and the version this project speaks.
pub const GROUP: &str = "multicluster.x-k8s.io";
/// The labels of an imported Service's EndpointSlices.
pub const LABEL_SERVICE_NAME: &str = "multicluster.kubernetes.io/service-name";
pub const LABEL_SOURCE_CLUSTER: &str = "multicluster.kubernetes.io/source-cluster";

/// The DNS zone of the clusterset's Services,
/// `<service>.<namespace>.svc.clusterset.local`.
pub const DOMAIN: &str = "clusterset.local";

/// The Service without selector, beside a ClusterSetIP import, whose
/// cluster IP is the import's clusterset IP.
pub fn derived_name(import: &str) -> String {
    bounded(&format!("liqo-mcs-{import}"), import)
}

/// The EndpointSlice of one exporting cluster's endpoints of an import.
pub fn imported_slice_name(import: &str, cluster_id: &str) -> String {
    bounded(
        &format!("{}-{:08x}", derived_name(import), stable_hash(cluster_id)),
        &format!("{import}/{cluster_id}"),
    )
}

/// `wanted`, or a prefix of it and a hash of `seed` when it is longer than
/// a name may be.
fn bounded(wanted: &str, seed: &str) -> String {
    if wanted.len() <= 63 {
        return wanted.to_owned();
    }
    format!("{}-{:08x}", &wanted[..54], stable_hash(seed))
}

/// FNV-1a of `text`, 32 bits: the same in every build, so that an
/// upgraded agent names what it writes as the one before it did.
fn stable_hash(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The ServiceExport's condition types and reasons (KEP-1645).
pub mod conditions {
    pub const VALID: &str = "Valid";
    pub const READY: &str = "Ready";
    pub const CONFLICT: &str = "Conflict";
    pub const REASON_VALID: &str = "Valid";
    pub const REASON_NO_SERVICE: &str = "NoService";
    pub const REASON_INVALID_TYPE: &str = "InvalidServiceType";
    pub const REASON_EXPORTED: &str = "Exported";
    pub const REASON_NO_CONFLICT: &str = "NoConflicts";
    pub const REASON_PORT: &str = "PortConflict";
    pub const REASON_TYPE: &str = "TypeConflict";
    pub const REASON_SESSION_AFFINITY: &str = "SessionAffinityConflict";
    pub const REASON_SESSION_AFFINITY_CONFIG: &str = "SessionAffinityConfigConflict";
    pub const REASON_LABELS: &str = "LabelsConflict";
    pub const REASON_ANNOTATIONS: &str = "AnnotationsConflict";
    pub const REASON_INTERNAL_TRAFFIC_POLICY: &str = "InternalTrafficPolicyConflict";
}

/// Exports the Service of its name and namespace to the clusterset. Its
/// spec is optional (most exports have none), hence written here rather
/// than derived.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ServiceExport {
    /// `apiVersion` and `kind`, as read (and needed to create one).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub types: Option<kube::core::TypeMeta>,
    pub metadata: kube::core::ObjectMeta,
    #[serde(default)]
    pub spec: ServiceExportSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ServiceExportStatus>,
}

impl kube::Resource for ServiceExport {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "ServiceExport".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1beta1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "serviceexports".into()
    }
    fn meta(&self) -> &kube::core::ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut kube::core::ObjectMeta {
        &mut self.metadata
    }
}

impl ServiceExport {
    /// An export of the Service `name` of `namespace`, with the types the
    /// API server needs to create it.
    pub fn new(name: &str, namespace: &str) -> Self {
        Self {
            types: Some(kube::core::TypeMeta {
                api_version: format!("{GROUP}/v1beta1"),
                kind: "ServiceExport".to_owned(),
            }),
            metadata: kube::core::ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceExportSpec {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub exported_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub exported_annotations: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ServiceExportStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A Service of the clusterset, as one cluster imports it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "multicluster.x-k8s.io",
    version = "v1beta1",
    kind = "ServiceImport",
    namespaced,
    status = "ServiceImportStatus",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceImportSpec {
    #[serde(default)]
    pub ports: Vec<Port>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity_config: Option<SessionAffinityConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_families: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_traffic_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_distribution: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ServiceImportStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterStatus>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ClusterStatus {
    pub cluster: String,
}

/// A port of an exported or imported Service.
#[derive(
    Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default = "tcp")]
    pub protocol: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
    pub port: i32,
}

fn tcp() -> String {
    "TCP".to_owned()
}

/// What one cluster exports, as its peers read it: every valid export,
/// with the Service's properties and endpoints as the exporting cluster
/// sees them (its own pod addresses).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Exports {
    /// The exporting cluster's ID.
    pub cluster_id: String,
    #[serde(default)]
    pub services: Vec<ExportedService>,
}

/// One exported Service.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportedService {
    pub namespace: String,
    pub name: String,
    /// When the ServiceExport was made (RFC 3339): the oldest export wins
    /// a conflict.
    pub since: String,
    #[serde(default)]
    pub headless: bool,
    #[serde(default)]
    pub ports: Vec<Port>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity_config: Option<SessionAffinityConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_traffic_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_distribution: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_families: Vec<String>,
    /// The ServiceExport's exported labels and annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Its endpoints, at the exporting cluster's own pod addresses.
    #[serde(default)]
    pub endpoints: Vec<ExportedEndpoint>,
}

/// One endpoint of an exported Service.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportedEndpoint {
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default = "yes")]
    pub ready: bool,
    /// The endpoint ports (name, protocol, port) it serves, when they
    /// differ from the Service's ports (its target ports).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
}

fn yes() -> bool {
    true
}

/// The exports of one cluster, with how this cluster reaches its pods
/// (`None`: this cluster itself, or at their own addresses).
#[derive(Debug, Clone)]
pub struct Constituent<'a> {
    pub exports: &'a Exports,
    pub remap: Option<Remap>,
}

/// One Service of the clusterset as one cluster imports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Import {
    pub namespace: String,
    pub name: String,
    pub spec: ServiceImportSpec,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Per exporting cluster, its endpoints as this cluster reaches them,
    /// and the ports they serve.
    pub slices: Vec<ImportedSlice>,
    /// The clusters that export it, oldest first.
    pub clusters: Vec<String>,
}

/// The endpoints of one exporting cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportedSlice {
    pub cluster_id: String,
    pub endpoints: Vec<ExportedEndpoint>,
    pub ports: Vec<Port>,
}

/// What an export's `Conflict` condition says: the reason and message
/// when it differs from the export that won, none when it does not.
pub type ConflictReport = BTreeMap<(String, String, String), (String, String)>;

/// The imports every cluster of the clusterset makes of `constituents`
/// (this cluster's own exports among them), and for each export of each
/// cluster, keyed by (cluster, namespace, name), its conflict if it has
/// one.
pub fn merge(constituents: &[Constituent<'_>]) -> (Vec<Import>, ConflictReport) {
    let mut by_service: BTreeMap<(String, String), Vec<(&ExportedService, &Constituent<'_>)>> =
        BTreeMap::new();
    for c in constituents {
        for service in &c.exports.services {
            by_service
                .entry((service.namespace.clone(), service.name.clone()))
                .or_default()
                .push((service, c));
        }
    }
    let mut imports = Vec::new();
    let mut conflicts = ConflictReport::new();
    for ((namespace, name), mut exports) in by_service {
        // The oldest export wins; equal times, the smaller cluster ID.
        exports.sort_by(|(a, ca), (b, cb)| {
            (a.since.as_str(), ca.exports.cluster_id.as_str())
                .cmp(&(b.since.as_str(), cb.exports.cluster_id.as_str()))
        });
        let (winner, _) = exports[0];
        // Ports: the union by name and protocol; a port the winner (or an
        // older export) defines otherwise is a conflict.
        let mut ports: Vec<Port> = Vec::new();
        for (service, c) in &exports {
            let mut reasons: Vec<(&str, String)> = Vec::new();
            for port in &service.ports {
                match ports
                    .iter()
                    .find(|p| p.name == port.name && p.protocol == port.protocol)
                {
                    Some(have) if have == port => {}
                    Some(have) => reasons.push((
                        conditions::REASON_PORT,
                        format!(
                            "port {} ({}) is {} in the export that wins, {} here",
                            port.name.as_deref().unwrap_or(""),
                            port.protocol,
                            have.port,
                            port.port
                        ),
                    )),
                    None => ports.push(port.clone()),
                }
            }
            if !std::ptr::eq(*service, winner) {
                if service.ports != winner.ports && reasons.is_empty() {
                    reasons.push((
                        conditions::REASON_PORT,
                        "its ports differ from the export that wins: the import has the union"
                            .to_owned(),
                    ));
                }
                let differs: [(&str, bool, &str); 6] = [
                    (
                        conditions::REASON_TYPE,
                        service.headless != winner.headless,
                        "headless in one export and not in another",
                    ),
                    (
                        conditions::REASON_SESSION_AFFINITY,
                        service.session_affinity != winner.session_affinity,
                        "its session affinity differs",
                    ),
                    (
                        conditions::REASON_SESSION_AFFINITY_CONFIG,
                        service.session_affinity_config != winner.session_affinity_config,
                        "its session affinity config differs",
                    ),
                    (
                        conditions::REASON_INTERNAL_TRAFFIC_POLICY,
                        service.internal_traffic_policy != winner.internal_traffic_policy,
                        "its internal traffic policy differs",
                    ),
                    (
                        conditions::REASON_LABELS,
                        service.labels != winner.labels,
                        "its exported labels differ",
                    ),
                    (
                        conditions::REASON_ANNOTATIONS,
                        service.annotations != winner.annotations,
                        "its exported annotations differ",
                    ),
                ];
                for (reason, differ, what) in differs {
                    if differ {
                        reasons.push((reason, format!("{what} from the export that wins")));
                    }
                }
            }
            if let Some((reason, message)) = reasons.first() {
                conflicts.insert(
                    (
                        c.exports.cluster_id.clone(),
                        namespace.clone(),
                        name.clone(),
                    ),
                    ((*reason).to_owned(), message.clone()),
                );
            }
        }
        // An export that differs makes every export of it conflicting.
        let any_conflict = exports.iter().any(|(_, c)| {
            conflicts.contains_key(&(
                c.exports.cluster_id.clone(),
                namespace.clone(),
                name.clone(),
            ))
        });
        if any_conflict {
            let why = exports
                .iter()
                .find_map(|(_, c)| {
                    conflicts
                        .get(&(
                            c.exports.cluster_id.clone(),
                            namespace.clone(),
                            name.clone(),
                        ))
                        .cloned()
                })
                .unwrap_or_default();
            for (_, c) in &exports {
                conflicts
                    .entry((
                        c.exports.cluster_id.clone(),
                        namespace.clone(),
                        name.clone(),
                    ))
                    .or_insert_with(|| why.clone());
            }
        }
        ports.sort();
        let slices = exports
            .iter()
            // A constituent of the other type serves no endpoints under
            // the winner's type.
            .filter(|(service, _)| service.headless == winner.headless)
            .map(|(service, c)| ImportedSlice {
                cluster_id: c.exports.cluster_id.clone(),
                endpoints: service
                    .endpoints
                    .iter()
                    .map(|e| ExportedEndpoint {
                        addresses: e
                            .addresses
                            .iter()
                            .map(|a| c.remap.map_or_else(|| a.clone(), |r| r.address(a)))
                            .collect(),
                        // A pod without a hostname is named after its
                        // address in DNS: after the one its own cluster
                        // knows, so that every cluster names it alike,
                        // wherever it reaches it.
                        hostname: e.hostname.clone().or_else(|| {
                            c.remap
                                .and(e.addresses.first())
                                .map(|a| a.replace(['.', ':'], "-"))
                        }),
                        ..e.clone()
                    })
                    .collect(),
                ports: service.ports.clone(),
            })
            .collect();
        imports.push(Import {
            namespace,
            name,
            spec: ServiceImportSpec {
                ports,
                ips: Vec::new(),
                type_: if winner.headless {
                    "Headless"
                } else {
                    "ClusterSetIP"
                }
                .to_owned(),
                session_affinity: winner.session_affinity.clone(),
                session_affinity_config: winner.session_affinity_config.clone(),
                ip_families: winner.ip_families.clone(),
                internal_traffic_policy: winner.internal_traffic_policy.clone(),
                traffic_distribution: winner.traffic_distribution.clone(),
            },
            labels: winner.labels.clone(),
            annotations: winner.annotations.clone(),
            slices,
            clusters: exports
                .iter()
                .map(|(_, c)| c.exports.cluster_id.clone())
                .collect(),
        });
    }
    (imports, conflicts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_names_however_long_the_service() {
        assert_eq!(derived_name("hello"), "liqo-mcs-hello");
        let long = "a".repeat(63);
        let derived = derived_name(&long);
        assert!(derived.len() <= 63, "{derived}");
        assert_ne!(derived, derived_name(&"a".repeat(62)));
        let slice = imported_slice_name(&long, "cluster-a");
        assert!(slice.len() <= 63, "{slice}");
        assert_ne!(slice, imported_slice_name(&long, "cluster-b"));
        assert_ne!(
            imported_slice_name("web", "cluster-a"),
            imported_slice_name("web", "cluster-b")
        );
    }

    fn port(name: &str, protocol: &str, number: i32) -> Port {
        Port {
            name: Some(name.to_owned()),
            protocol: protocol.to_owned(),
            app_protocol: None,
            port: number,
        }
    }

    fn hello(since: &str) -> ExportedService {
        ExportedService {
            namespace: "shop".to_owned(),
            name: "hello".to_owned(),
            since: since.to_owned(),
            ports: vec![port("http", "TCP", 80)],
            session_affinity: Some("None".to_owned()),
            ip_families: vec!["IPv4".to_owned()],
            endpoints: vec![ExportedEndpoint {
                addresses: vec!["10.200.0.5".to_owned()],
                hostname: None,
                ready: true,
                ports: vec![port("http", "TCP", 8080)],
            }],
            ..ExportedService::default()
        }
    }

    fn exports(cluster: &str, services: Vec<ExportedService>) -> Exports {
        Exports {
            cluster_id: cluster.to_owned(),
            services,
        }
    }

    fn conflict_of<'a>(c: &'a ConflictReport, cluster: &str) -> Option<&'a str> {
        c.get(&(cluster.to_owned(), "shop".to_owned(), "hello".to_owned()))
            .map(|(reason, _)| reason.as_str())
    }

    #[test]
    fn an_export_without_a_spec_reads() {
        let export: ServiceExport = serde_json::from_value(serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
            "metadata": { "name": "web", "namespace": "shop" },
        }))
        .expect("an export");
        assert!(export.spec.exported_labels.is_empty() && export.status.is_none());
        use kube::Resource as _;
        assert_eq!(
            ServiceExport::api_version(&()),
            "multicluster.x-k8s.io/v1beta1"
        );
    }

    #[test]
    fn one_export_is_one_import_with_its_endpoints_as_this_cluster_reaches_them() {
        let a = exports("a", vec![hello("2026-01-01T00:00:00Z")]);
        let remap = Remap {
            real: "10.200.0.0/16".parse().expect("a CIDR"),
            seen_as: "100.64.0.0/16".parse().expect("a CIDR"),
        };
        let (imports, conflicts) = merge(&[Constituent {
            exports: &a,
            remap: Some(remap),
        }]);
        assert!(conflicts.is_empty());
        let [import] = &imports[..] else {
            panic!("one import: {imports:?}");
        };
        assert_eq!(import.spec.type_, "ClusterSetIP");
        assert_eq!(import.spec.ports, [port("http", "TCP", 80)]);
        assert_eq!(import.slices[0].endpoints[0].addresses, ["100.64.0.5"]);
        assert_eq!(
            import.slices[0].endpoints[0].hostname.as_deref(),
            Some("10-200-0-5"),
            "named after the address its own cluster knows"
        );
        assert_eq!(import.clusters, ["a"]);
    }

    #[test]
    fn the_oldest_export_wins_and_every_export_of_a_conflict_says_so() {
        let mut newer = hello("2026-02-01T00:00:00Z");
        newer.headless = true;
        let a = exports("a", vec![hello("2026-01-01T00:00:00Z")]);
        let b = exports("b", vec![newer]);
        let both = [
            Constituent {
                exports: &b,
                remap: None,
            },
            Constituent {
                exports: &a,
                remap: None,
            },
        ];
        let (imports, conflicts) = merge(&both);
        assert_eq!(imports[0].spec.type_, "ClusterSetIP", "a's, the oldest");
        assert_eq!(imports[0].clusters, ["a", "b"]);
        assert_eq!(conflict_of(&conflicts, "a"), Some(conditions::REASON_TYPE));
        assert_eq!(conflict_of(&conflicts, "b"), Some(conditions::REASON_TYPE));
        assert_eq!(
            imports[0].slices.len(),
            1,
            "the headless one serves no endpoints"
        );
    }

    #[test]
    fn ports_are_the_union_and_a_port_defined_otherwise_keeps_the_winners() {
        let mut more = hello("2026-02-01T00:00:00Z");
        more.ports.push(port("stcp", "SCTP", 142));
        let a = exports("a", vec![hello("2026-01-01T00:00:00Z")]);
        let b = exports("b", vec![more]);
        let (imports, conflicts) = merge(&[
            Constituent {
                exports: &a,
                remap: None,
            },
            Constituent {
                exports: &b,
                remap: None,
            },
        ]);
        assert_eq!(
            imports[0].spec.ports,
            [port("http", "TCP", 80), port("stcp", "SCTP", 142)]
        );
        assert_eq!(conflict_of(&conflicts, "b"), Some(conditions::REASON_PORT));
        assert_eq!(conflict_of(&conflicts, "a"), Some(conditions::REASON_PORT));

        let mut other = hello("2026-02-01T00:00:00Z");
        other.ports = vec![port("http", "TCP", 81)];
        let c = exports("c", vec![other]);
        let (imports, conflicts) = merge(&[
            Constituent {
                exports: &c,
                remap: None,
            },
            Constituent {
                exports: &a,
                remap: None,
            },
        ]);
        assert_eq!(imports[0].spec.ports, [port("http", "TCP", 80)]);
        assert_eq!(conflict_of(&conflicts, "c"), Some(conditions::REASON_PORT));
    }

    #[test]
    fn the_same_export_twice_is_no_conflict_and_labels_that_differ_are() {
        let a = exports("a", vec![hello("2026-01-01T00:00:00Z")]);
        let b = exports("b", vec![hello("2026-01-02T00:00:00Z")]);
        let (imports, conflicts) = merge(&[
            Constituent {
                exports: &a,
                remap: None,
            },
            Constituent {
                exports: &b,
                remap: None,
            },
        ]);
        assert!(conflicts.is_empty(), "{conflicts:?}");
        assert_eq!(imports[0].slices.len(), 2);

        let mut labelled = hello("2026-01-02T00:00:00Z");
        labelled.labels.insert("tier".to_owned(), "web".to_owned());
        let c = exports("c", vec![labelled]);
        let (imports, conflicts) = merge(&[
            Constituent {
                exports: &a,
                remap: None,
            },
            Constituent {
                exports: &c,
                remap: None,
            },
        ]);
        assert!(imports[0].labels.is_empty(), "the winner's labels");
        assert_eq!(
            conflict_of(&conflicts, "c"),
            Some(conditions::REASON_LABELS)
        );
    }
}
