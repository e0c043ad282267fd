//! liqo-rs's custom resources. Their CRDs are generated from these types
//! (`manifests/crds.yaml` is checked against them by a test).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A peer cluster as the local cluster knows it: one object per peer,
/// whichever way resources flow.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "liqo.io",
    version = "v1alpha1",
    kind = "ForeignCluster",
    plural = "foreignclusters",
    shortname = "fc",
    status = "ForeignClusterStatus",
    printcolumn = r#"{"name":"Cluster ID","type":"string","jsonPath":".spec.clusterId"}"#,
    printcolumn = r#"{"name":"Outgoing","type":"boolean","jsonPath":".spec.outgoing"}"#,
    printcolumn = r#"{"name":"Incoming","type":"boolean","jsonPath":".spec.incoming"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ForeignClusterSpec {
    /// The peer's cluster ID.
    pub cluster_id: String,
    /// The peer's human name.
    pub cluster_name: String,
    /// The peer's API server URL, as the local cluster reaches it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server_url: Option<String>,
    /// The local cluster consumes the peer's resources (a virtual node here).
    #[serde(default)]
    pub outgoing: bool,
    /// The peer consumes the local cluster's resources.
    #[serde(default)]
    pub incoming: bool,
}

/// What the agents and liqoctl observed of a peering.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForeignClusterStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

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

/// How the twin namespace on a peer is named.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum NamespaceMappingStrategy {
    /// `<namespace>-<local cluster name>`, which cannot clash with the
    /// peer's own namespaces.
    #[default]
    DefaultName,
    /// The same name as the local namespace.
    EnforceSameName,
}

/// Offloads the namespace it lives in to peer clusters. At most one per
/// namespace, named [`crate::names::NAMESPACE_OFFLOADING`].
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "liqo.io",
    version = "v1alpha1",
    kind = "NamespaceOffloading",
    plural = "namespaceoffloadings",
    shortname = "nso",
    namespaced,
    status = "NamespaceOffloadingStatus",
    printcolumn = r#"{"name":"Pods","type":"string","jsonPath":".spec.podOffloadingStrategy"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceOffloadingSpec {
    #[serde(default)]
    pub pod_offloading_strategy: PodOffloadingStrategy,
    #[serde(default)]
    pub namespace_mapping_strategy: NamespaceMappingStrategy,
    /// The peers (cluster IDs) to offload to; empty means every outgoing peer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_ids: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceOffloadingStatus {
    /// The twin namespace's name on the peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A condition in the Kubernetes convention: a type, a status, and why.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// RFC 3339 time of the last change of status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// Every CRD liqo-rs installs, in the order they are applied.
pub fn crds() -> Vec<CustomResourceDefinition> {
    use kube::CustomResourceExt as _;
    vec![ForeignCluster::crd(), NamespaceOffloading::crd()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crds_are_in_our_group_and_served() {
        for crd in crds() {
            assert_eq!(crd.spec.group, crate::names::GROUP);
            let version = &crd.spec.versions[0];
            assert!(version.served && version.storage);
            assert!(
                version
                    .subresources
                    .as_ref()
                    .and_then(|s| s.status.as_ref())
                    .is_some()
            );
        }
    }
}
