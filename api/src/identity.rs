//! The local cluster's liqo identity: who it is to its peers. Stored in the
//! [`crate::names::IDENTITY_CONFIGMAP`] ConfigMap, written by `liqoctl
//! install` and read by the agents.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A cluster ID: chosen at install, never changed afterwards. A DNS-1123
/// label, so that it can name objects and label values.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ClusterId(String);

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{kind} {value:?} is not valid: {why}")]
    Invalid {
        kind: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("the identity ConfigMap lacks the key {0:?}")]
    MissingKey(&'static str),
    #[error("the identity ConfigMap's {key:?} is not valid JSON")]
    BadJson {
        key: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl ClusterId {
    pub fn new(value: impl Into<String>) -> Result<Self, IdentityError> {
        let value = value.into();
        check_dns_label("cluster ID", &value)?;
        Ok(Self(value))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ClusterId {
    type Error = IdentityError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<ClusterId> for String {
    fn from(id: ClusterId) -> Self {
        id.0
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks a DNS-1123 label: 1 to 63 lowercase letters, digits and dashes,
/// starting and ending with a letter or digit.
pub fn check_dns_label(kind: &'static str, value: &str) -> Result<(), IdentityError> {
    let invalid = |why| IdentityError::Invalid {
        kind,
        value: value.to_owned(),
        why,
    };
    if value.is_empty() || value.len() > 63 {
        return Err(invalid("it must be 1 to 63 characters long"));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(invalid(
            "it may hold only lowercase letters, digits and '-'",
        ));
    }
    if value.starts_with('-') || value.ends_with('-') {
        return Err(invalid("it must start and end with a letter or digit"));
    }
    Ok(())
}

/// Who the cluster is to its peers, and the networks it brings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterIdentity {
    pub cluster_id: ClusterId,
    /// A human name, shown to peers and in virtual node names.
    pub cluster_name: String,
    /// Labels the peers put on the virtual node that stands for this cluster.
    pub labels: BTreeMap<String, String>,
    pub pod_cidr: String,
    pub service_cidr: String,
    /// The liqo-rs version that wrote the identity.
    pub version: String,
}

mod keys {
    pub(super) const CLUSTER_ID: &str = "cluster-id";
    pub(super) const CLUSTER_NAME: &str = "cluster-name";
    pub(super) const LABELS: &str = "cluster-labels";
    pub(super) const POD_CIDR: &str = "pod-cidr";
    pub(super) const SERVICE_CIDR: &str = "service-cidr";
    pub(super) const VERSION: &str = crate::names::IDENTITY_VERSION_KEY;
}

impl ClusterIdentity {
    /// The identity as the ConfigMap's `data`.
    pub fn to_data(&self) -> BTreeMap<String, String> {
        let labels = serde_json::to_string(&self.labels)
            .expect("invariant: a map of strings always serializes");
        BTreeMap::from([
            (keys::CLUSTER_ID.to_owned(), self.cluster_id.to_string()),
            (keys::CLUSTER_NAME.to_owned(), self.cluster_name.clone()),
            (keys::LABELS.to_owned(), labels),
            (keys::POD_CIDR.to_owned(), self.pod_cidr.clone()),
            (keys::SERVICE_CIDR.to_owned(), self.service_cidr.clone()),
            (keys::VERSION.to_owned(), self.version.clone()),
        ])
    }

    /// Reads the identity back from the ConfigMap's `data`.
    pub fn from_data(data: &BTreeMap<String, String>) -> Result<Self, IdentityError> {
        let get = |key: &'static str| data.get(key).cloned().ok_or(IdentityError::MissingKey(key));
        let labels = match data.get(keys::LABELS) {
            Some(json) => serde_json::from_str(json).map_err(|e| IdentityError::BadJson {
                key: keys::LABELS,
                source: e,
            })?,
            None => BTreeMap::new(),
        };
        Ok(Self {
            cluster_id: ClusterId::new(get(keys::CLUSTER_ID)?)?,
            cluster_name: get(keys::CLUSTER_NAME)?,
            labels,
            pod_cidr: get(keys::POD_CIDR)?,
            service_cidr: get(keys::SERVICE_CIDR)?,
            version: get(keys::VERSION)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_round_trips_through_configmap_data() {
        let identity = ClusterIdentity {
            cluster_id: ClusterId::new("a1b2-c3").expect("valid"),
            cluster_name: "home".to_owned(),
            labels: BTreeMap::from([("region".to_owned(), "eu-west".to_owned())]),
            pod_cidr: "10.200.0.0/16".to_owned(),
            service_cidr: "10.100.0.0/16".to_owned(),
            version: "0.1.0".to_owned(),
        };
        let back = ClusterIdentity::from_data(&identity.to_data()).expect("round trip");
        assert_eq!(back, identity);
    }

    #[test]
    fn cluster_ids_must_be_dns_labels() {
        for bad in [
            "",
            "Upper",
            "under_score",
            "-lead",
            "trail-",
            &"x".repeat(64),
        ] {
            assert!(ClusterId::new(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["a", "home-1", "0f3c9a1e-7d2b-4c55-9e61-1b2c3d4e5f60"] {
            assert!(ClusterId::new(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn missing_keys_are_named() {
        let err = ClusterIdentity::from_data(&BTreeMap::new()).expect_err("empty data");
        assert!(
            matches!(err, IdentityError::MissingKey("cluster-id")),
            "{err}"
        );
    }
}
