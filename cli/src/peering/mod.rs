//! Peering: what `liqoctl peer` and `unpeer` do on both clusters, as one
//! list of named [`phases`], run forward through a [`journal`] that undoes
//! a failed run, and backwards to unpeer.
//!
//! Before anything is written, the provider's [`agreement`] is checked;
//! the phases then build their objects with pure functions (in
//! `crate::manifests`: `tenant`, `virtual_kubelet`, `peering_token`; and
//! [`identity`]) and wait for the [`consumer`]'s virtual node; the
//! [`report`] says what was made.

pub mod agreement;
pub mod by_kubeconfigs;
pub mod by_token;
pub mod capacity;
pub mod consumer;
pub mod held_tokens;
pub mod identity;
pub mod journal;
pub mod kept_claims;
pub mod network;
pub mod offloading;
pub mod outgoing;
pub mod phases;
pub mod refused;
pub mod report;
pub mod terms;
pub mod tether;

use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::ownership;
use crate::manifests::Manifest;

/// What a refusal of a peering's namesakes tells the user to do next.
pub(crate) const PEER_AGAIN: &str = "peer again";

/// Refuses, naming them, objects of the names the peering uses that
/// liqoctl did not make; `then` says what to do once they are gone.
pub(crate) async fn refuse_foreign(
    cluster: &ClusterClient,
    objects: &[Manifest],
    then: &str,
) -> anyhow::Result<()> {
    let foreign = ownership::foreign(cluster, objects).await?;
    if foreign.is_empty() {
        return Ok(());
    }
    Err(UserError::Refused(format!(
        "cluster {} already has {}, which liqoctl did not create; remove or rename it, then {then}",
        cluster.name,
        foreign.join(", ")
    ))
    .into())
}

/// Refuses a cluster (called `name`) that runs a liqo-rs `version` this
/// liqoctl cannot peer: another major and minor (a 0.x minor is a major).
pub(crate) fn check_compatible(name: &str, version: &str) -> Result<(), UserError> {
    let key = |v: &str| -> Option<(u64, u64)> {
        let mut parts = v.split('.');
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    };
    if key(version).is_some() && key(version) == key(liqo_api::VERSION) {
        return Ok(());
    }
    Err(UserError::Refused(format!(
        "cluster {name} runs liqo-rs {version}, which liqoctl {} cannot peer; upgrade it with \
         `liqoctl install`",
        liqo_api::VERSION
    )))
}
