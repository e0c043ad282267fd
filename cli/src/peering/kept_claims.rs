//! Claims whose data is kept on a provider (docs/storage.md), and what
//! ending an offloading or a peering does with them: never deleted by
//! surprise. A command that would end where such claims hold data
//! refuses, naming them, unless told [`RemoteData::Keep`] or
//! [`RemoteData::Delete`].
//!
//! On the consumer they are the volumes the virtual kubelets made, one per
//! claim (labelled ours and with the provider's cluster ID); on the
//! provider, the claims labelled ours in the tenant's twin namespaces.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams};
use liqo_api::ClusterId;
use liqo_api::names::labels;
use liqo_api::sharing::{format_bytes, parse_bytes};

use crate::error::UserError;
use crate::factory::ClusterClient;

use liqo_api::names::REMOTE_CLAIM_ANNOTATION as REMOTE_CLAIM;

/// What to do with the data of claims kept on a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteData {
    /// Not said: refuse while there is any.
    Unsaid,
    /// Leave the claims on the provider, for a later offload.
    Keep,
    /// Delete them.
    Delete,
}

impl RemoteData {
    pub fn of(keep: bool, delete: bool) -> Self {
        match (keep, delete) {
            (true, _) => Self::Keep,
            (_, true) => Self::Delete,
            _ => Self::Unsaid,
        }
    }
}

/// One claim kept on a provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// The consumer's namespace and claim.
    pub claim: String,
    /// The provider's cluster ID.
    pub provider: String,
    pub size: String,
}

/// The consumer's volumes of claims kept on providers (on `provider`,
/// when given) whose claim is of `namespace` (when given).
async fn kept_volumes(
    cluster: &ClusterClient,
    namespace: Option<&str>,
    provider: Option<&ClusterId>,
) -> anyhow::Result<Vec<PersistentVolume>> {
    let mut selector = format!("{}={}", labels::MANAGED_BY, labels::MANAGED_BY_VALUE);
    match provider {
        Some(id) => selector.push_str(&format!(",{}={id}", labels::PEER_CLUSTER_ID)),
        None => selector.push_str(&format!(",{}", labels::PEER_CLUSTER_ID)),
    }
    let volumes = match Api::<PersistentVolume>::all(cluster.client.clone())
        .list(&ListParams::default().labels(&selector))
        .await
    {
        Ok(list) => list.items,
        // Not allowed to read volumes: none of ours can be there either.
        Err(kube::Error::Api(s)) if s.code == 403 => Vec::new(),
        Err(e) => return Err(cluster.explain(e, "listing the volumes of kept claims")),
    };
    Ok(volumes
        .into_iter()
        .filter(|v| {
            let claim_ns = v
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|c| c.namespace.as_deref());
            let ours = v
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(REMOTE_CLAIM));
            ours && namespace.is_none_or(|n| claim_ns == Some(n))
        })
        .collect())
}

/// The claims of the consumer `cluster` kept on providers: those of
/// namespace `namespace`, on provider `provider`, when given.
pub async fn on_consumer(
    cluster: &ClusterClient,
    namespace: Option<&str>,
    provider: Option<&ClusterId>,
) -> anyhow::Result<Vec<Kept>> {
    let mut kept: Vec<Kept> = kept_volumes(cluster, namespace, provider)
        .await?
        .iter()
        .filter_map(|v| {
            let claim = v.spec.as_ref()?.claim_ref.as_ref()?;
            Some(Kept {
                claim: format!("{}/{}", claim.namespace.clone()?, claim.name.clone()?),
                provider: v
                    .metadata
                    .labels
                    .as_ref()?
                    .get(labels::PEER_CLUSTER_ID)?
                    .clone(),
                size: size_of(v.spec.as_ref()?.capacity.as_ref()),
            })
        })
        .collect();
    kept.sort_by(|a, b| a.claim.cmp(&b.claim));
    Ok(kept)
}

/// The claims the tenant `consumer` keeps on the provider `cluster`: ours,
/// in its twin namespaces.
pub async fn on_provider(
    cluster: &ClusterClient,
    consumer: &ClusterId,
) -> anyhow::Result<Vec<Kept>> {
    let twins = Api::<k8s_openapi::api::core::v1::Namespace>::all(cluster.client.clone())
        .list(&ListParams::default().labels(&format!("{}={consumer}", labels::TENANT)))
        .await
        .map_err(|e| cluster.explain(e, "listing the tenant's twin namespaces"))?;
    let mut kept = Vec::new();
    for twin in twins
        .items
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
    {
        kept.extend(in_twin(cluster, twin).await?.iter().map(|c| Kept {
            claim: format!("{twin}/{}", c.metadata.name.clone().unwrap_or_default()),
            provider: cluster.name.clone(),
            size: size_of(c.status.as_ref().and_then(|s| s.capacity.as_ref())),
        }));
    }
    Ok(kept)
}

/// The claims kept for a consumer in the twin namespace `twin` (labelled
/// ours, with their origin), on the provider `cluster`.
pub async fn in_twin(
    cluster: &ClusterClient,
    twin: &str,
) -> anyhow::Result<Vec<PersistentVolumeClaim>> {
    let ours = format!(
        "{}={},{}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE,
        labels::ORIGIN_NAMESPACE
    );
    Ok(
        Api::<PersistentVolumeClaim>::namespaced(cluster.client.clone(), twin)
            .list(&ListParams::default().labels(&ours))
            .await
            .map_err(|e| cluster.explain(e, &format!("listing the claims of {twin}")))?
            .items,
    )
}

fn size_of(capacity: Option<&std::collections::BTreeMap<String, Quantity>>) -> String {
    capacity.and_then(|c| c.get("storage")).map_or_else(
        || "?".to_owned(),
        |q| parse_bytes(&q.0).map_or_else(|| q.0.clone(), format_bytes),
    )
}

/// The one line that refuses `what` while `kept` hold data.
pub fn refusal(what: &str, kept: &[Kept]) -> UserError {
    let shown: Vec<String> = kept
        .iter()
        .take(5)
        .map(|k| format!("{} ({} on {})", k.claim, k.size, k.provider))
        .collect();
    let more = kept.len().saturating_sub(shown.len());
    UserError::Refused(format!(
        "{what} would delete the data of {} claim{} kept on providers: {}{}; \
         --keep-remote-data leaves them there for a later offload, --delete-remote-data deletes them",
        kept.len(),
        if kept.len() == 1 { "" } else { "s" },
        shown.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    ))
}

/// Deletes the consumer's volumes of claims whose data was deleted on the
/// provider (of `namespace`, on `provider`, when given): Kubernetes keeps
/// each until its claim is deleted too.
pub async fn forget_volumes(
    cluster: &ClusterClient,
    namespace: Option<&str>,
    provider: Option<&ClusterId>,
) -> anyhow::Result<usize> {
    let api: Api<PersistentVolume> = Api::all(cluster.client.clone());
    let mut deleted = 0;
    for v in kept_volumes(cluster, namespace, provider).await? {
        let Some(name) = v.metadata.name.as_deref() else {
            continue;
        };
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => deleted += 1,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(cluster.explain(e, &format!("deleting volume {name}"))),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_the_claims_and_both_ways_on() {
        let kept: Vec<Kept> = (0..7)
            .map(|i| Kept {
                claim: format!("shop/data-db-{i}"),
                provider: "rome".to_owned(),
                size: "1Gi".to_owned(),
            })
            .collect();
        let line = refusal("unoffloading shop", &kept).to_string();
        assert!(line.contains("7 claims"), "{line}");
        assert!(line.contains("shop/data-db-0 (1Gi on rome)"), "{line}");
        assert!(line.contains("and 2 more"), "{line}");
        assert!(line.contains("--keep-remote-data") && line.contains("--delete-remote-data"));
        assert!(!line.contains('\n'));
        assert_eq!(RemoteData::of(false, false), RemoteData::Unsaid);
        assert_eq!(RemoteData::of(true, false), RemoteData::Keep);
        assert_eq!(RemoteData::of(false, true), RemoteData::Delete);
    }
}
