//! Namespace offloading: which namespaces run on which peers, and how.

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
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
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
    pub cluster_ids: Vec<crate::ClusterId>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceOffloadingStatus {
    /// The twin namespace's name on the peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
