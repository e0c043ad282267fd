//! Namespace offloading: which namespaces run on which peers, and how.
//!
//! This module owns the contract between `liqoctl offload` (which declares a
//! [`NamespaceOffloading`]) and the virtual kubelets (which create the twin
//! namespaces on the providers and write the status): the resource type,
//! the twin namespace's name ([`remote_namespace`]), which providers an
//! offloading selects ([`selects`]) and the labels twin namespaces carry.
//! See docs/offloading.md.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which of a namespace's pods may run on peers.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PodOffloadingStrategy {
    /// Pods run on local nodes and on peers' virtual nodes.
    #[default]
    LocalAndRemote,
    /// Pods run only on peers' virtual nodes.
    Remote,
    /// Pods run only on local nodes; other objects are still reflected.
    Local,
}

impl PodOffloadingStrategy {
    pub const ALL: [Self; 3] = [Self::LocalAndRemote, Self::Remote, Self::Local];

    /// The name as it is written in the spec and in the placement label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LocalAndRemote => "LocalAndRemote",
            Self::Remote => "Remote",
            Self::Local => "Local",
        }
    }
}

/// How the twin namespace on a peer is named.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum NamespaceMappingStrategy {
    /// `<namespace>-<local cluster name>`, which cannot clash with the
    /// peer's own namespaces.
    #[default]
    DefaultName,
    /// The same name as the local namespace.
    EnforceSameName,
    /// The name given in `remoteNamespaceName`.
    SelectedName,
}

impl NamespaceMappingStrategy {
    pub const ALL: [Self; 3] = [Self::DefaultName, Self::EnforceSameName, Self::SelectedName];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::DefaultName => "DefaultName",
            Self::EnforceSameName => "EnforceSameName",
            Self::SelectedName => "SelectedName",
        }
    }
}

/// Offloads the namespace it lives in to peer clusters. At most one per
/// namespace, named [`crate::names::NAMESPACE_OFFLOADING`].
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "liqo.io",
    derive = "PartialEq",
    version = "v1alpha1",
    kind = "NamespaceOffloading",
    plural = "namespaceoffloadings",
    shortname = "nso",
    namespaced,
    status = "NamespaceOffloadingStatus",
    printcolumn = r#"{"name":"Pods","type":"string","jsonPath":".spec.podOffloadingStrategy"}"#,
    printcolumn = r#"{"name":"Mapping","type":"string","jsonPath":".spec.namespaceMappingStrategy"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceOffloadingSpec {
    #[serde(default)]
    pub pod_offloading_strategy: PodOffloadingStrategy,
    #[serde(default)]
    pub namespace_mapping_strategy: NamespaceMappingStrategy,
    /// The twin namespace's name with `SelectedName` (required there,
    /// ignored otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_namespace_name: Option<String>,
    /// Which providers, as a node selector over their virtual nodes'
    /// labels (Liqo's shape): a provider is selected when its virtual node
    /// matches any term. Absent or without terms: every outgoing peer.
    /// The placement policy turns the terms into the pods' required node
    /// affinity, so pods land only on selected virtual nodes.
    /// `matchFields` is not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<NodeSelector>,
}

/// What the virtual kubelets report, one entry per selected provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceOffloadingStatus {
    /// One entry per selected provider, written (patched) by that
    /// provider's virtual kubelet, removed by it when the twin namespace
    /// is gone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterOffloadingStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterOffloadingStatus {
    /// The provider's cluster ID.
    pub cluster_id: crate::ClusterId,
    /// The twin namespace's name on that provider.
    pub remote_namespace: String,
    /// The twin namespace exists and the consumer may act in it.
    pub ready: bool,
    /// Why not, in CamelCase (e.g. `AlreadyExists`, `Forbidden`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The longest Kubernetes namespace name (a DNS label).
const MAX_NAMESPACE: usize = 63;

/// The twin namespace's name on a provider for local namespace `local_ns`
/// of the consumer named `consumer_cluster_name`. Always a DNS label when
/// the inputs are: DefaultName names that would be too long keep a prefix
/// and end with a hash of the whole name, so two namespaces never share a
/// twin. SelectedName without a name falls back to DefaultName (the CLI
/// and the CRD's users are told it is required).
pub fn remote_namespace(
    local_ns: &str,
    spec: &NamespaceOffloadingSpec,
    consumer_cluster_name: &str,
) -> String {
    match spec.namespace_mapping_strategy {
        NamespaceMappingStrategy::EnforceSameName => local_ns.to_owned(),
        NamespaceMappingStrategy::SelectedName if spec.remote_namespace_name.is_some() => spec
            .remote_namespace_name
            .clone()
            .unwrap_or_else(|| local_ns.to_owned()),
        _ => default_name(local_ns, consumer_cluster_name),
    }
}

fn default_name(local_ns: &str, cluster: &str) -> String {
    // A cluster name may hold characters a DNS label may not.
    let cluster: String = cluster
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let full = format!("{local_ns}-{}", cluster.trim_matches('-'));
    if full.len() <= MAX_NAMESPACE {
        return full;
    }
    let hash = format!("{:08x}", fnv1a(full.as_bytes()) as u32);
    let keep = MAX_NAMESPACE - hash.len() - 1;
    let prefix = full[..keep].trim_end_matches('-');
    format!("{prefix}-{hash}")
}

/// FNV-1a, 64 bits: stable across versions and platforms (the twin's name
/// must not change when liqo-rs is rebuilt), no dependency needed.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed label selector in kubectl's syntax: requirements separated by
/// commas, all of which must hold (`a=b`, `a==b`, `a!=b`, `a`, `!a`,
/// `a in (x,y)`, `a notin (x,y)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

impl std::str::FromStr for LabelSelector {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        let mut rest = s.trim();
        if rest.is_empty() {
            return Err("an empty selector".into());
        }
        while !rest.is_empty() {
            // A requirement ends at the first comma outside parentheses.
            let mut depth = 0i32;
            let end = rest
                .char_indices()
                .find(|(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        ',' if depth == 0 => return true,
                        _ => {}
                    }
                    false
                })
                .map_or(rest.len(), |(i, _)| i);
            reqs.push(parse_requirement(rest[..end].trim())?);
            rest = rest[end..].strip_prefix(',').unwrap_or("").trim();
        }
        Ok(Self(reqs))
    }
}

fn check_key(k: &str) -> Result<String, String> {
    let ok = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    if ok {
        Ok(k.to_owned())
    } else {
        Err(format!("{k:?} is not a label key"))
    }
}

fn check_value(v: &str) -> Result<String, String> {
    let v = v.trim();
    if v.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        Ok(v.to_owned())
    } else {
        Err(format!("{v:?} is not a label value"))
    }
}

fn parse_requirement(r: &str) -> Result<Requirement, String> {
    if r.is_empty() {
        return Err("an empty requirement".into());
    }
    if let Some(k) = r.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(check_key(k.trim())?));
    }
    if let Some((k, v)) = r.split_once("!=") {
        return Ok(Requirement::NotIn(
            check_key(k.trim())?,
            vec![check_value(v)?],
        ));
    }
    if let Some((k, v)) = r.split_once("==").or_else(|| r.split_once('=')) {
        return Ok(Requirement::In(check_key(k.trim())?, vec![check_value(v)?]));
    }
    let words: Vec<&str> = r.splitn(2, char::is_whitespace).collect();
    if let [k, set] = words[..] {
        let set = set.trim();
        let (op, list) = if let Some(l) = set.strip_prefix("notin") {
            (false, l)
        } else if let Some(l) = set.strip_prefix("in") {
            (true, l)
        } else {
            return Err(format!("{r:?}: expected in or notin"));
        };
        let list = list
            .trim()
            .strip_prefix('(')
            .and_then(|l| l.strip_suffix(')'))
            .ok_or_else(|| format!("{r:?}: the values must be in parentheses"))?;
        let values = list
            .split(',')
            .map(check_value)
            .collect::<Result<Vec<_>, _>>()?;
        let key = check_key(k)?;
        return Ok(if op {
            Requirement::In(key, values)
        } else {
            Requirement::NotIn(key, values)
        });
    }
    Ok(Requirement::Exists(check_key(r)?))
}

impl LabelSelector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }

    /// The node selector term that says the same of a node's labels.
    pub fn to_term(&self) -> NodeSelectorTerm {
        let requirement = |key: &str, operator: &str, values: &[String]| NodeSelectorRequirement {
            key: key.to_owned(),
            operator: operator.to_owned(),
            values: (!values.is_empty()).then(|| values.to_vec()),
        };
        let expressions = self
            .0
            .iter()
            .map(|r| match r {
                Requirement::In(k, vs) => requirement(k, "In", vs),
                Requirement::NotIn(k, vs) => requirement(k, "NotIn", vs),
                Requirement::Exists(k) => requirement(k, "Exists", &[]),
                Requirement::DoesNotExist(k) => requirement(k, "DoesNotExist", &[]),
            })
            .collect();
        NodeSelectorTerm {
            match_expressions: Some(expressions),
            match_fields: None,
        }
    }
}

/// The node selector of `--selector` flags: one term per selector, ORed.
/// None for no selector (every peer).
/// Why the pods of namespace `name` (with `namespace_labels`) must stay
/// on this cluster, or `None` when it may be offloaded: liqo-rs's own
/// (its agents would offload themselves), the cluster's system
/// namespaces, and those of the consumers' pods run here (tenant and twin
/// namespaces).
pub fn stays_home(name: &str, namespace_labels: &BTreeMap<String, String>) -> Option<&'static str> {
    if name == crate::names::NAMESPACE {
        Some("runs liqo-rs's own agents")
    } else if name.starts_with("kube-") {
        Some("is one of the cluster's system namespaces")
    } else if name.starts_with(crate::names::peering::TENANT_NAMESPACE_PREFIX)
        || namespace_labels.contains_key(crate::names::labels::TENANT)
    {
        Some("holds a consumer's pods")
    } else {
        None
    }
}

pub fn cluster_selector(selectors: &[LabelSelector]) -> Option<NodeSelector> {
    (!selectors.is_empty()).then(|| NodeSelector {
        node_selector_terms: selectors.iter().map(LabelSelector::to_term).collect(),
    })
}

/// A node selector term in kubectl's selector syntax, for people to read
/// (`liqoctl info`); the inverse of [`LabelSelector::to_term`].
pub fn term_to_string(term: &NodeSelectorTerm) -> String {
    let requirements: Vec<String> = term
        .match_expressions
        .iter()
        .flatten()
        .map(|r| {
            let values = r.values.as_deref().unwrap_or_default();
            match (r.operator.as_str(), values) {
                ("In", [one]) => format!("{}={one}", r.key),
                ("NotIn", [one]) => format!("{}!={one}", r.key),
                ("In", many) => format!("{} in ({})", r.key, many.join(",")),
                ("NotIn", many) => format!("{} notin ({})", r.key, many.join(",")),
                ("Exists", _) => r.key.clone(),
                ("DoesNotExist", _) => format!("!{}", r.key),
                (op, values) => format!("{} {op} ({})", r.key, values.join(",")),
            }
        })
        .collect();
    requirements.join(",")
}

/// Whether a node selector requirement holds for `labels`, as the
/// scheduler decides it: `NotIn` and `DoesNotExist` hold when the label is
/// absent; `Gt` and `Lt` compare integers.
fn requirement_holds(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&r.key);
    let values = r.values.as_deref().unwrap_or_default();
    let compare = |ord: std::cmp::Ordering| {
        let parsed = (
            value.and_then(|v| v.parse::<i64>().ok()),
            values.first().and_then(|v| v.parse::<i64>().ok()),
        );
        values.len() == 1 && matches!(parsed, (Some(have), Some(bound)) if have.cmp(&bound) == ord)
    };
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => compare(std::cmp::Ordering::Greater),
        "Lt" => compare(std::cmp::Ordering::Less),
        _ => false,
    }
}

/// Whether an offloading selects the provider whose virtual node carries
/// `node_labels`: any term matches (a term with `matchFields`, which are
/// not used, or with no requirement, matches nothing, as for the
/// scheduler), or there is no term at all.
pub fn selects(spec: &NamespaceOffloadingSpec, node_labels: &BTreeMap<String, String>) -> bool {
    let terms = spec
        .cluster_selector
        .as_ref()
        .map(|s| s.node_selector_terms.as_slice())
        .unwrap_or_default();
    terms.is_empty()
        || terms.iter().any(|t| {
            let expressions = t.match_expressions.as_deref().unwrap_or_default();
            t.match_fields.as_deref().unwrap_or_default().is_empty()
                && !expressions.is_empty()
                && expressions
                    .iter()
                    .all(|r| requirement_holds(r, node_labels))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(m: NamespaceMappingStrategy, name: Option<&str>) -> NamespaceOffloadingSpec {
        NamespaceOffloadingSpec {
            namespace_mapping_strategy: m,
            remote_namespace_name: name.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn remote_namespace_by_strategy() {
        use NamespaceMappingStrategy::*;
        let long = "n".repeat(60);
        let table: [(&str, NamespaceOffloadingSpec, &str, &str); 6] = [
            ("shop", spec(DefaultName, None), "home", "shop-home"),
            (
                "shop",
                spec(DefaultName, Some("x")),
                "Home_1",
                "shop-home-1",
            ),
            ("shop", spec(EnforceSameName, None), "home", "shop"),
            ("shop", spec(SelectedName, Some("store")), "home", "store"),
            ("shop", spec(SelectedName, None), "home", "shop-home"),
            (&long, spec(DefaultName, None), "home", ""),
        ];
        for (ns, spec, cluster, want) in table {
            let got = remote_namespace(ns, &spec, cluster);
            assert!(got.len() <= 63 && !got.ends_with('-'), "{got}");
            if want.is_empty() {
                assert!(got.starts_with(&"n".repeat(50)), "{got}");
                // Stable, and distinct for names that share the prefix.
                assert_eq!(got, remote_namespace(ns, &spec, cluster));
                assert_ne!(got, remote_namespace(ns, &spec, "other"));
            } else {
                assert_eq!(got, want, "{ns} {spec:?}");
            }
        }
    }

    #[test]
    fn selectors_parse_and_match_like_kubectl() {
        let labels: BTreeMap<String, String> = [("region", "eu"), ("liqo.io/virtual-node", "true")]
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        let table = [
            ("region=eu", true),
            ("region==eu", true),
            ("region!=eu", false),
            ("region=us", false),
            ("region", true),
            ("!region", false),
            ("!zone", true),
            ("region in (us, eu)", true),
            ("region notin (us,eu)", false),
            ("region=eu,liqo.io/virtual-node=true", true),
            ("region=eu,zone=a", false),
        ];
        for (sel, want) in table {
            let s: LabelSelector = sel.parse().unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches(&labels), want, "{sel}");
        }
        for bad in ["", "region in eu", "a=b=c", "a b", "region=e u,"] {
            assert!(bad.parse::<LabelSelector>().is_err(), "{bad}");
        }
    }

    #[test]
    fn selectors_become_terms_that_select_as_they_match() {
        let labels: BTreeMap<String, String> = [("region", "eu"), ("size", "10")]
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        let spec = |selectors: &[&str]| NamespaceOffloadingSpec {
            cluster_selector: cluster_selector(
                &selectors
                    .iter()
                    .map(|s| s.parse().expect("selector"))
                    .collect::<Vec<LabelSelector>>(),
            ),
            ..Default::default()
        };
        // Selectors are ORed; each term is the same test as the selector.
        let table: [(&[&str], bool); 9] = [
            (&[], true),
            (&["region=us", "region=eu"], true),
            (&["region=us"], false),
            (&["region!=us"], true),
            (&["region notin (eu,us)"], false),
            (&["!zone,region"], true),
            (&["zone", "region in (eu)"], true),
            (&["zone!=a"], true),
            (&["region=eu,size=10,!zone"], true),
        ];
        for (selectors, want) in table {
            assert_eq!(selects(&spec(selectors), &labels), want, "{selectors:?}");
            for s in selectors {
                let parsed: LabelSelector = s.parse().expect("selector");
                let back = term_to_string(&parsed.to_term());
                assert_eq!(back.parse::<LabelSelector>(), Ok(parsed), "{s} -> {back}");
            }
        }
        // Operators only a hand-written selector has.
        let term = |op: &str, values: &[&str]| NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: "size".into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
            }]),
            match_fields: None,
        };
        let with = |terms: Vec<NodeSelectorTerm>| NamespaceOffloadingSpec {
            cluster_selector: Some(NodeSelector {
                node_selector_terms: terms,
            }),
            ..Default::default()
        };
        let table = [
            (term("Gt", &["9"]), true),
            (term("Gt", &["10"]), false),
            (term("Lt", &["11"]), true),
            (term("Lt", &["x"]), false),
            (term("Bogus", &["10"]), false),
            (NodeSelectorTerm::default(), false),
        ];
        for (t, want) in table {
            assert_eq!(selects(&with(vec![t.clone()]), &labels), want, "{t:?}");
        }
        assert!(selects(&with(Vec::new()), &labels), "no term: every peer");
    }
}
