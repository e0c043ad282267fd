//! What every command does with a cluster's API: apply and delete our
//! objects ([`apply`]), tell ours from someone else's ([`ownership`]), and
//! wait for a state with a deadline ([`wait`]), and for our agents to be
//! ready ([`agents`]); and what commands read of an installation
//! ([`cluster`]) and of its DNS ([`cluster_dns`]).

pub mod apply;
pub mod cluster;
pub mod cluster_dns;
pub mod ownership;
pub mod rollout;
pub mod wait;

use kube::api::{Api, DynamicObject};

use crate::factory::ClusterClient;
use crate::manifests::Manifest;

/// The API of the object a manifest names, untyped: for what is the same
/// for every kind (who owns it, deleting it, putting it back).
pub fn api_of(cluster: &ClusterClient, manifest: &Manifest) -> Api<DynamicObject> {
    let (resource, namespace) = manifest.api_resource();
    match namespace {
        Some(ns) => Api::namespaced_with(cluster.client.clone(), ns, &resource),
        None => Api::all_with(cluster.client.clone(), &resource),
    }
}
