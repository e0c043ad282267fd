//! The Multi-Cluster Services API's CRDs, shared with whoever installed
//! them already.

use super::*;

/// The MCS API's CRDs: created where missing, updated where ours, and
/// someone else's left as they are; returns the names of those left.
pub(super) async fn share_mcs_crds(
    cluster: &ClusterClient,
    deadline: tokio::time::Instant,
    timeout_flag: u64,
) -> anyhow::Result<Vec<String>> {
    let mut kept = Vec::new();
    for manifest in manifests::mcs::crds() {
        if ownership::of(cluster, &manifest).await? == Ownership::Foreign {
            kept.push(manifest.name().to_owned());
            continue;
        }
        let change = apply::apply(cluster, &manifest).await?;
        if change != Change::Unchanged {
            tracing::info!("{} {change}", manifest.describe());
        }
        if let Manifest::Crd(crd) = &manifest {
            wait_established(cluster, crd, deadline, timeout_flag).await?;
        }
    }
    Ok(kept)
}

pub(super) async fn wait_established(
    cluster: &ClusterClient,
    crd: &CustomResourceDefinition,
    deadline: tokio::time::Instant,
    timeout_flag: u64,
) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    let name = crd.metadata.name.as_deref().unwrap_or_default();
    let waited = wait::until(
        cluster,
        api,
        name,
        conditions::is_crd_established(),
        wait::left(deadline),
        &format!("waiting for the CRD {name}"),
    )
    .await?;
    match waited {
        Waited::Done(_) => Ok(()),
        Waited::TimedOut => Err(UserError::Timeout(format!(
            "the CRD {name} is not established after {timeout_flag}s; see `kubectl get crd {name} -o yaml`, then run install again"
        ))
        .into()),
    }
}
