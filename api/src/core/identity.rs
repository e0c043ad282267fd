//! The local cluster's liqo identity: who it is to its peers. Stored in the
//! [`crate::names::IDENTITY_CONFIGMAP`] ConfigMap, written by `liqoctl
//! install` and read by the agents. It names virtual nodes, labels them and
//! drives NAT, so it is validated whole before anyone uses it.

use std::collections::BTreeMap;
use std::fmt;

use ipnet::IpNet;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validation;

/// A cluster ID: chosen at install, never changed afterwards. A DNS-1123
/// label, so that it can name objects and be a label value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ClusterId(String);

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{what} {value:?} is not valid: {why}")]
    Invalid {
        what: &'static str,
        value: String,
        why: String,
    },
    #[error("the identity lacks its {0:?}")]
    MissingKey(&'static str),
    #[error("the identity's {key:?} is not valid JSON")]
    BadJson {
        key: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl IdentityError {
    fn invalid(what: &'static str, value: impl fmt::Display, why: impl Into<String>) -> Self {
        Self::Invalid {
            what,
            value: value.to_string(),
            why: why.into(),
        }
    }
}

impl ClusterId {
    pub fn new(value: impl Into<String>) -> Result<Self, IdentityError> {
        let value = value.into();
        validation::dns_label(&value)
            .map_err(|e| IdentityError::invalid("cluster ID", &value, e.0))?;
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

/// In a CRD, a cluster ID is a string the API server checks as a DNS label.
impl JsonSchema for ClusterId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ClusterId".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "minLength": 1,
            "maxLength": 63,
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        })
    }
}

/// Label keys under these prefixes are liqo's to set on virtual nodes; a
/// cluster may not claim them for itself.
const RESERVED_LABEL_DOMAIN: &str = "liqo.io";

/// Who the cluster is to its peers, and the networks it brings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterIdentity {
    pub cluster_id: ClusterId,
    /// A human name, shown to peers and in virtual node names: a DNS label.
    pub cluster_name: String,
    /// Labels the peers put on the virtual node that stands for this cluster.
    pub labels: BTreeMap<String, String>,
    pub pod_cidr: IpNet,
    pub service_cidr: IpNet,
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
    /// Checks everything a peer or an agent relies on: the name is a DNS
    /// label, the labels are valid Kubernetes labels outside liqo's own
    /// domain, and the CIDRs are networks that can be routed and NATed (no
    /// host bits, not loopback, link-local or multicast, not overlapping
    /// each other).
    pub fn validate(&self) -> Result<(), IdentityError> {
        check_cluster_name(&self.cluster_name)?;
        check_labels(&self.labels)?;
        check_cidr("pod CIDR", &self.pod_cidr)?;
        check_cidr("service CIDR", &self.service_cidr)?;
        if crate::networking::overlap(&self.pod_cidr, &self.service_cidr) {
            return Err(IdentityError::invalid(
                "service CIDR",
                self.service_cidr,
                format!("it overlaps the pod CIDR {}", self.pod_cidr),
            ));
        }
        if self.version.is_empty() {
            return Err(IdentityError::MissingKey(keys::VERSION));
        }
        Ok(())
    }

    /// The identity as the ConfigMap's `data`.
    pub fn to_data(&self) -> BTreeMap<String, String> {
        let labels = serde_json::to_string(&self.labels)
            .expect("invariant: a map of strings always serializes");
        BTreeMap::from([
            (keys::CLUSTER_ID.to_owned(), self.cluster_id.to_string()),
            (keys::CLUSTER_NAME.to_owned(), self.cluster_name.clone()),
            (keys::LABELS.to_owned(), labels),
            (keys::POD_CIDR.to_owned(), self.pod_cidr.to_string()),
            (keys::SERVICE_CIDR.to_owned(), self.service_cidr.to_string()),
            (keys::VERSION.to_owned(), self.version.clone()),
        ])
    }

    /// Reads the identity back from the ConfigMap's `data`, and validates it.
    pub fn from_data(data: &BTreeMap<String, String>) -> Result<Self, IdentityError> {
        let get = |key: &'static str| data.get(key).cloned().ok_or(IdentityError::MissingKey(key));
        let cidr = |key: &'static str, what: &'static str| -> Result<IpNet, IdentityError> {
            let value = get(key)?;
            value
                .parse()
                .map_err(|_| IdentityError::invalid(what, &value, "it is not a CIDR"))
        };
        let labels = match data.get(keys::LABELS) {
            Some(json) => serde_json::from_str(json).map_err(|e| IdentityError::BadJson {
                key: keys::LABELS,
                source: e,
            })?,
            None => BTreeMap::new(),
        };
        let identity = Self {
            cluster_id: ClusterId::new(get(keys::CLUSTER_ID)?)?,
            cluster_name: get(keys::CLUSTER_NAME)?,
            labels,
            pod_cidr: cidr(keys::POD_CIDR, "pod CIDR")?,
            service_cidr: cidr(keys::SERVICE_CIDR, "service CIDR")?,
            version: get(keys::VERSION)?,
        };
        identity.validate()?;
        Ok(identity)
    }
}

pub fn check_cluster_name(name: &str) -> Result<(), IdentityError> {
    validation::dns_label(name).map_err(|e| IdentityError::invalid("cluster name", name, e.0))
}

/// Cluster labels: valid Kubernetes labels, none in liqo's own domain.
pub fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), IdentityError> {
    validation::labels(labels).map_err(|e| IdentityError::invalid("cluster labels", "", e.0))?;
    for key in labels.keys() {
        if let Some((prefix, _)) = key.split_once('/')
            && (prefix == RESERVED_LABEL_DOMAIN
                || prefix.ends_with(&format!(".{RESERVED_LABEL_DOMAIN}")))
        {
            return Err(IdentityError::invalid(
                "cluster label",
                key,
                format!("keys under {RESERVED_LABEL_DOMAIN}/ are set by liqo-rs itself"),
            ));
        }
    }
    Ok(())
}

/// A CIDR a cluster may bring: written as its network address, and in no
/// range that cannot carry pod or service traffic between clusters.
pub fn check_cidr(what: &'static str, net: &IpNet) -> Result<(), IdentityError> {
    if net.trunc() != *net {
        return Err(IdentityError::invalid(
            what,
            net,
            format!("it has host bits set; did you mean {}?", net.trunc()),
        ));
    }
    if let Some(reserved) = crate::networking::reserved_overlap(net) {
        return Err(IdentityError::invalid(
            what,
            net,
            format!("it overlaps {reserved}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> ClusterIdentity {
        ClusterIdentity {
            cluster_id: ClusterId::new("a1b2-c3").expect("valid"),
            cluster_name: "home".to_owned(),
            labels: BTreeMap::from([("region".to_owned(), "eu-west".to_owned())]),
            pod_cidr: "10.200.0.0/16".parse().expect("cidr"),
            service_cidr: "10.100.0.0/16".parse().expect("cidr"),
            version: "0.1.0".to_owned(),
        }
    }

    #[test]
    fn identity_round_trips_through_configmap_data() {
        let identity = identity();
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

    /// Every part of a damaged identity is caught, each with its own words.
    #[test]
    fn damaged_identities_are_refused_whole() {
        let cases: [(&str, &str, &str); 9] = [
            ("cluster-name", "Home Sweet", "cluster name"),
            ("cluster-labels", r#"{"bad key":"v"}"#, "label key"),
            ("cluster-labels", r#"{"k":"bad value"}"#, "label value"),
            (
                "cluster-labels",
                r#"{"liqo.io/virtual-node":"x"}"#,
                "set by liqo-rs",
            ),
            ("cluster-labels", "not json", "not valid JSON"),
            ("pod-cidr", "10.200.0.1/16", "host bits"),
            ("pod-cidr", "127.0.0.0/8", "loopback"),
            ("service-cidr", "10.200.128.0/17", "overlaps the pod CIDR"),
            ("service-cidr", "nonsense", "not a CIDR"),
        ];
        for (key, value, expected) in cases {
            let mut data = identity().to_data();
            data.insert(key.to_owned(), value.to_owned());
            let err = ClusterIdentity::from_data(&data).expect_err(value);
            let text = format!(
                "{err} {}",
                std::error::Error::source(&err)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            );
            assert!(text.contains(expected), "{key}={value}: {text}");
        }
    }
}
