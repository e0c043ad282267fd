//! What every part of liqo-rs shares: the local cluster's identity and the
//! peers it knows (ForeignClusters).

pub mod identity;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use identity::{ClusterId, ClusterIdentity};

/// A peer cluster as the local cluster knows it: one object per peer,
/// whichever way resources flow.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "liqo.io",
    derive = "PartialEq",
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
    pub cluster_id: ClusterId,
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
    /// The peer's labels, put on the virtual node that stands for it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub cluster_labels: std::collections::BTreeMap<String, String>,
    /// What the local cluster asked the peer for (outgoing peerings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<crate::sharing::Resources>,
}

/// What the agents and liqoctl observed of a peering.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForeignClusterStatus {
    /// Kubernetes conditions, one per aspect of the peering.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// What the peer granted (outgoing peerings): the virtual node's size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<crate::sharing::Resources>,
    /// The cost of the grant, as the peer's policy states it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::sharing::Cost>,
    /// When the local cluster's certificate on the peer expires (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_expiry: Option<String>,
    /// The local cluster's tenant namespace on the peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_namespace: Option<String>,
    /// What the peer admits from the local cluster beyond its grant (its
    /// Pod Security level, ...), as the virtual kubelet last read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<crate::admission::Admission>,
    /// The peer's largest free node (outgoing peerings), as the virtual
    /// kubelet last read it: what one pod may ask at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest_free_node: Option<crate::sharing::Resources>,
}
