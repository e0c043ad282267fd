//! The contract between `liqoctl` and the in-cluster agents: the names,
//! labels and resource types both sides read and write, split by concern.
//! No IO lives here.
//!
//! - [`core`]: the cluster's identity and its peers (ForeignCluster);
//! - [`discovery`]: how a cluster is announced and found (DNS-SD records);
//! - [`authentication`]: how a peer is known to a provider;
//! - [`admission`]: what a provider admits from a peer beyond its quota;
//! - [`pod_security`]: the Pod Security Standards, as pure checks;
//! - [`offloading`]: which namespaces run on which peers;
//! - [`sharing`]: what a provider shares, at what cost, and its policy;
//! - [`capacity`]: a provider's free capacity, which shares are shares of;
//! - [`following`]: how a grant follows that free capacity;
//! - [`shares`]: how a grant is split across the namespaces a tenant runs pods in;
//! - [`images`]: the agents' images and how a cluster's nodes get them;
//! - [`networking`]: the networks clusters bring, and their arithmetic;
//! - [`netcheck`]: what `liqoctl test network`'s probe pods report;
//! - [`names`] and [`validation`]: well-known names, and the checks the API
//!   server applies to names and labels.

pub mod admission;
pub mod agents;
pub mod authentication;
pub mod capacity;
pub mod clusterset;
pub mod core;
pub mod discovery;
pub mod following;
pub mod home_level;
pub mod images;
pub mod names;
pub mod netcheck;
pub mod networking;
pub mod offloading;
pub mod pod_security;
pub mod shares;
pub mod sharing;
pub mod tether;
pub mod token;
pub mod validation;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

pub use crate::core::{ClusterId, ClusterIdentity};

/// The version of liqo-rs this crate belongs to; `liqoctl`, the agents and
/// the image tags in `manifests/` all carry it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Every CRD liqo-rs installs, in the order they are applied. Their
/// schemas are generated from the types (`manifests/crds.yaml` is checked
/// against them by a test).
pub fn crds() -> Vec<CustomResourceDefinition> {
    use kube::CustomResourceExt as _;
    vec![
        core::ForeignCluster::crd(),
        offloading::NamespaceOffloading::crd(),
        authentication::Tenant::crd(),
        sharing::SharingPolicy::crd(),
        networking::Connection::crd(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crds_are_in_our_group_and_served() {
        for crd in crds() {
            assert_eq!(crd.spec.group, names::GROUP);
            let version = &crd.spec.versions[0];
            assert!(version.served && version.storage);
            // A policy is only written by people: it has no status.
            if crd.spec.names.kind == "SharingPolicy" {
                continue;
            }
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
