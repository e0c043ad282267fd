//! How a peer is known to a provider's API server: the user name and group
//! of the x509 identity a consumer cluster gets. The peering's own
//! resources (tenants, CSRs) will live here.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ClusterId;
use crate::admission::Admission;
use crate::sharing::{Cost, Resources};

/// A consumer, as its provider records it: one per consumer, named by the
/// consumer's cluster ID, cluster-scoped. Written by `liqoctl peer` with the
/// provider's credentials; the consumer's identity may not write it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "liqo.io",
    derive = "PartialEq",
    version = "v1alpha1",
    kind = "Tenant",
    plural = "tenants",
    status = "TenantStatus",
    printcolumn = r#"{"name":"Consumer","type":"string","jsonPath":".spec.clusterName"}"#,
    printcolumn = r#"{"name":"Namespace","type":"string","jsonPath":".spec.namespace"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TenantSpec {
    pub cluster_id: ClusterId,
    pub cluster_name: String,
    /// The tenant namespace, where the consumer's identity may act.
    pub namespace: String,
    /// The x509 user name of the consumer's identity.
    pub user: String,
    /// What the consumer asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<Resources>,
    /// What the provider granted (enforced by a ResourceQuota).
    pub grant: Resources,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    /// What the provider's API server admits from the consumer beyond its
    /// quota: the parameter of the provider's admission policies
    /// (docs/offloading.md), which the consumer's virtual kubelet reads.
    #[serde(default)]
    pub admission: Admission,
    /// The consumer's pod CIDR as it stated it at peering time: the one
    /// network its end of the tunnel may name (docs/network.md), fixed by
    /// the provider; only the provider's administrator changes it. Absent
    /// in records of older versions, whose tunnels keep what they said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_cidr: Option<String>,
}

impl Tenant {
    /// The pod CIDR the consumer is fixed to, if the provider fixed one.
    pub fn pinned_pod_cidr(&self) -> Option<&str> {
        self.spec
            .pod_cidr
            .as_deref()
            .or_else(|| self.status.as_ref()?.pod_cidr.as_deref())
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The provider's largest free node, resource by resource
    /// (`crate::capacity::largest_free`), as its gateway last wrote it:
    /// the consumer's virtual kubelet refuses a pod that asks more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest_free_node: Option<Resources>,
    /// The consumer's pod CIDR where the spec does not say it (a tenant
    /// made for a peering token): the first its end of the tunnel named,
    /// as the provider's gateway saw it; fixed from then on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_cidr: Option<String>,
}

/// The group of every peer identity; RBAC may name it, no human is in it.
pub const PEER_GROUP: &str = "liqo.io:peers";

/// The x509 common name (the Kubernetes user name) of the consumer cluster
/// `consumer` on a provider.
pub fn peer_user(consumer: &ClusterId) -> String {
    format!("liqo.io:peer:{consumer}")
}

/// The consumer a user name stands for, if it is a peer identity.
pub fn peer_of(user: &str) -> Option<ClusterId> {
    let id = user.strip_prefix("liqo.io:peer:")?;
    ClusterId::new(id).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_users_round_trip_and_others_are_not_peers() {
        let id = ClusterId::new("c1-home").expect("valid");
        assert_eq!(peer_of(&peer_user(&id)), Some(id));
        for other in [
            "system:admin",
            "liqo.io:peer:",
            "liqo.io:peer:Bad_ID",
            "x:liqo.io:peer:a",
        ] {
            assert_eq!(peer_of(other), None, "{other}");
        }
    }
}
