//! Peering: what `liqoctl peer` and `unpeer` do on both clusters, as
//! steps. Each step applies objects idempotently and is recorded in a
//! [`Journal`]; when a later step fails, the objects this run created are
//! deleted again in reverse order, on whichever cluster they were made, so
//! that a failed peer leaves nothing new behind, and a re-run resumes from
//! what earlier runs left.
//!
//! Every way of peering (`peer` with both kubeconfigs, `peer --token`,
//! `peer request|accept|complete`) composes the same pieces: the [`plan`]
//! and its steps on the provider, the [`consumer`]'s side, and the
//! [`report`]. The objects themselves are built by pure functions
//! ([`tenant`], [`virtual_kubelet`], [`token`], [`admission`]).

pub mod admission;
pub mod capacity;
pub mod consumer;
pub mod identity;
pub mod network;
pub mod outgoing;
pub mod plan;
pub mod report;
pub mod tenant;
pub mod terms;
pub mod token;
pub mod tokens;
pub mod virtual_kubelet;

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;

use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::apply::{self, Change};
use crate::kube::ownership;
use crate::kube::wait::{self, Waited};
use crate::manifests::Manifest;

/// How long a rollback waits for each namespace it deleted to be gone.
const NAMESPACE_GONE: Duration = Duration::from_secs(60);

/// Which side of the peering an object is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Consumer,
    Provider,
}

/// The objects a run created, to undo them if the run fails.
#[derive(Debug, Default)]
pub struct Journal {
    created: Vec<(Side, Manifest)>,
}

impl Journal {
    /// Applies `manifest` on `cluster`, recording it if this created it.
    pub async fn apply(
        &mut self,
        side: Side,
        cluster: &ClusterClient,
        manifest: Manifest,
    ) -> anyhow::Result<Change> {
        let change = apply::apply(cluster, &manifest).await?;
        if change == Change::Created {
            self.created.push((side, manifest));
        }
        Ok(change)
    }

    /// Deletes what this run created, newest first; returns what could not
    /// be deleted (the cluster gone meanwhile), as `Kind/name on side`.
    pub async fn roll_back(
        self,
        consumer: &ClusterClient,
        provider: &ClusterClient,
    ) -> Vec<String> {
        let mut left = Vec::new();
        let mut namespaces = Vec::new();
        for (side, manifest) in self.created.into_iter().rev() {
            let cluster = match side {
                Side::Consumer => consumer,
                Side::Provider => provider,
            };
            match apply::delete(cluster, &manifest).await {
                Ok(_) => {
                    if let Manifest::Namespace(ns) = &manifest {
                        namespaces.push((cluster, ns.metadata.name.clone().unwrap_or_default()));
                    }
                }
                Err(e) => {
                    tracing::warn!("rolling back {}: {e:#}", manifest.describe());
                    left.push(format!(
                        "{} on cluster {}",
                        manifest.describe(),
                        cluster.name
                    ));
                }
            }
        }
        // A namespace goes once the namespace controller has emptied it:
        // until then a re-run could not make it again.
        for (cluster, name) in namespaces {
            let api: Api<Namespace> = Api::all(cluster.client.clone());
            let gone = wait::until(
                cluster,
                api,
                &name,
                |n: Option<&Namespace>| n.is_none(),
                NAMESPACE_GONE,
                &format!("waiting for namespace {name} to be deleted"),
            )
            .await;
            if !matches!(gone, Ok(Waited::Done(_))) {
                left.push(format!(
                    "Namespace/{name} on cluster {} (still terminating)",
                    cluster.name
                ));
            }
        }
        left
    }
}

/// Refuses, naming them, objects of the names the peering uses that
/// liqoctl did not make.
/// What a refusal of a peering's namesakes tells the user to do next.
pub(crate) const PEER_AGAIN: &str = "peer again";

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

/// Same major and minor version (a 0.x minor is a major).
pub(crate) fn compatible(version: &str) -> bool {
    let key = |v: &str| -> Option<(u64, u64)> {
        let mut parts = v.split('.');
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    };
    key(version).is_some() && key(version) == key(liqo_api::VERSION)
}
