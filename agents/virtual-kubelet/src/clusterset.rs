//! Carries the clusterset's exports across this peering (docs/services.md):
//! the provider's, which its gateway writes in the status of this
//! cluster's Connection in the tenant namespace there, into the status
//! of the tunnel to the provider here (`peerExports`); and this
//! cluster's, which the local gateway writes in `liqo/liqo-exports`, into
//! that Connection's spec there. The gateways merge and import; this agent only carries, since it
//! holds the one credential that reaches the provider.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams};
use liqo_api::clusterset::Exports;
use liqo_api::names;
use liqo_api::networking::Connection;
use serde_json::json;
use tokio::sync::watch;

use crate::provider::ProviderClient;

/// How often both sides are read; and while neither exports anything.
const PERIOD: Duration = Duration::from_secs(1);
const IDLE_PERIOD: Duration = Duration::from_secs(2);

/// Carries the exports, forever.
pub async fn carry(
    local: kube::Client,
    provider: watch::Receiver<ProviderClient>,
    tenant_namespace: String,
    provider_id: String,
) {
    let mut failing = false;
    let mut period = PERIOD;
    loop {
        tokio::time::sleep(period).await;
        let Ok(remote) = provider.borrow().clone() else {
            continue;
        };
        match once(&local, remote, &tenant_namespace, &provider_id).await {
            Ok(busy) => {
                failing = false;
                period = if busy { PERIOD } else { IDLE_PERIOD };
            }
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(%error, "carrying the clusterset's exports");
            }
            Err(error) => tracing::debug!(%error, "carrying the clusterset's exports"),
        }
    }
}

async fn once(
    local: &kube::Client,
    remote: kube::Client,
    tenant_namespace: &str,
    provider_id: &str,
) -> anyhow::Result<bool> {
    let connections: Api<Connection> = Api::namespaced(remote, tenant_namespace);
    let Some(connection) = connections
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .next()
    else {
        return Ok(false);
    };
    let maps: Api<ConfigMap> = Api::namespaced(local.clone(), names::NAMESPACE);
    // Theirs, here: in the status of the tunnel to the provider.
    let theirs = connection.status.as_ref().and_then(|s| s.exports.clone());
    let here: Api<Connection> = Api::namespaced(local.clone(), names::NAMESPACE);
    if let Some(tunnel) = here.get_opt(provider_id).await? {
        let have = tunnel.status.as_ref().and_then(|s| s.peer_exports.clone());
        if have != theirs {
            here.patch_status(
                provider_id,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": { "peerExports": theirs } })),
            )
            .await?;
        }
    }
    // Ours, there.
    let ours: Option<Exports> = maps
        .get_opt(names::CLUSTERSET_EXPORTS)
        .await?
        .and_then(|m| m.data?.remove(names::CLUSTERSET_EXPORTS_KEY))
        .and_then(|text| serde_json::from_str(&text).ok());
    if ours.is_some() && connection.spec.exports != ours {
        let name = connection.metadata.name.clone().unwrap_or_default();
        connections
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "exports": ours } })),
            )
            .await?;
    }
    let exporting = |e: Option<&Exports>| e.is_some_and(|e| !e.services.is_empty());
    Ok(exporting(ours.as_ref()) || exporting(theirs.as_ref()))
}
