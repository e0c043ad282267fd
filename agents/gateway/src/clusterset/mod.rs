//! The Multi-Cluster Services API on this cluster (docs/services.md): the
//! gateway is the one agent every cluster of a clusterset runs, and the
//! clusterset is what its tunnels link, so it is the one that exports and
//! imports.
//!
//! Every [`PERIOD`], level-triggered, with nothing kept between passes:
//!
//! 1. [`exports`]: this cluster's ServiceExports (not those in a peer's
//!    namespaces), checked (`Valid`) and read with their Services and
//!    endpoints into an [`Exports`];
//! 2. published for the peers: the ConfigMap `liqo/liqo-exports`, which
//!    the virtual kubelets carry to their providers, and the status of
//!    each tenant's Connection, which its consumer reads;
//! 3. the peers' exports, read where they arrive: the status of each
//!    Connection to a provider (`peerExports`, which the peering's
//!    virtual kubelet writes), and the spec of each tenant's Connection,
//!    which its consumer writes; each only
//!    with a connected tunnel, whose remap says where this cluster sees
//!    that peer's pods;
//! 4. merged ([`liqo_api::clusterset::merge`]) and written
//!    ([`imports`]): a ServiceImport, a Service for its clusterset IP and
//!    an EndpointSlice per exporting cluster, in every namespace of that
//!    name here; the ServiceExports' `Ready` and `Conflict` conditions.

mod exports;
mod imports;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use liqo_agent_runtime::follow::Followed;
use liqo_api::ClusterIdentity;
use liqo_api::clusterset::{Constituent, Exports, ServiceExport};
use liqo_api::names;
use liqo_api::networking::{Connection, Remap};
use serde_json::json;

/// How often the clusterset's Services are looked at; and while no
/// cluster of the clusterset exports anything and nothing is imported.
const PERIOD: Duration = Duration::from_secs(1);
const IDLE_PERIOD: Duration = Duration::from_secs(5);
use names::{CLUSTERSET_EXPORTS as EXPORTS_CONFIGMAP, CLUSTERSET_EXPORTS_KEY as EXPORTS_KEY};
/// The field manager of what this writes.
const MANAGER: &str = "liqo-gateway-clusterset";

/// Keeps the clusterset's Services, forever: every [`PERIOD`] while the
/// clusterset has any, else every [`IDLE_PERIOD`] or as soon as a
/// ServiceExport or a Connection (where peers' exports arrive) changes.
pub async fn keep(
    client: kube::Client,
    namespace: String,
    identity: Followed<ConfigMap>,
    connections: Followed<Connection>,
) {
    let (exports, follow_exports) = liqo_agent_runtime::follow::follow(
        Api::<ServiceExport>::all(client.clone()),
        kube::runtime::watcher::Config::default(),
        "service exports",
    );
    let wake = std::sync::Arc::new(tokio::sync::Notify::new());
    let wake_on =
        |mut followed: tokio::sync::watch::Receiver<liqo_agent_runtime::follow::SyncState>| {
            let wake = wake.clone();
            async move {
                while followed.changed().await.is_ok() {
                    wake.notify_one();
                }
            }
        };
    let on_exports = wake_on(exports.state.clone());
    let on_connections = wake_on(connections.state.clone());
    let passes = passes(client, namespace, identity, connections, wake.clone());
    tokio::join!(follow_exports, on_exports, on_connections, passes);
}

async fn passes(
    client: kube::Client,
    namespace: String,
    identity: Followed<ConfigMap>,
    connections: Followed<Connection>,
    wake: std::sync::Arc<tokio::sync::Notify>,
) {
    let mut failing = false;
    let mut period = PERIOD;
    loop {
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = wake.notified() => {
                // What else changed with it comes with it.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let Some(me) =
            identity.store.state().first().and_then(|map| {
                ClusterIdentity::from_data(&map.data.clone().unwrap_or_default()).ok()
            })
        else {
            continue;
        };
        // Said once when it starts failing (an API server starting answers
        // 429 for a while), then quietly until it works again.
        match pass(&client, &namespace, &me, &connections.store.state()).await {
            Ok(busy) => {
                failing = false;
                period = if busy { PERIOD } else { IDLE_PERIOD };
            }
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(%error, "keeping the clusterset's Services");
            }
            Err(error) => tracing::debug!(%error, "keeping the clusterset's Services"),
        }
    }
}

async fn pass(
    client: &kube::Client,
    namespace: &str,
    me: &ClusterIdentity,
    connections: &[std::sync::Arc<Connection>],
) -> anyhow::Result<bool> {
    // The namespaces exports are read from and imports written into:
    // neither liqo's nor a peer's, nor being deleted.
    let open: std::collections::BTreeSet<String> =
        Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .list(&kube::api::ListParams::default())
            .await?
            .items
            .iter()
            .filter(|n| !is_peers_or_ours(n) && n.metadata.deletion_timestamp.is_none())
            .filter_map(|n| n.metadata.name.clone())
            .collect();
    let local = exports::read(client, me, &open).await?;
    publish(client, namespace, &local.exports, connections).await?;
    let peers = peer_exports(namespace, connections);
    let mut constituents = vec![Constituent {
        exports: &local.exports,
        remap: None,
    }];
    constituents.extend(peers.iter().map(|(exports, remap)| Constituent {
        exports,
        remap: *remap,
    }));
    let (merged, conflicts) = liqo_api::clusterset::merge(&constituents);
    let kept = imports::write(client, &merged, &open).await?;
    exports::report(client, me, &local, &merged, &conflicts).await?;
    Ok(!local.all.is_empty() || !merged.is_empty() || kept)
}

/// This cluster's exports where its peers read them.
async fn publish(
    client: &kube::Client,
    namespace: &str,
    exports: &Exports,
    connections: &[std::sync::Arc<Connection>],
) -> anyhow::Result<()> {
    let text = serde_json::to_string(exports)?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let want = ConfigMap {
        metadata: kube::core::ObjectMeta {
            name: Some(EXPORTS_CONFIGMAP.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(crate::control::our_labels()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(EXPORTS_KEY.to_owned(), text)])),
        ..Default::default()
    };
    match maps.get_opt(EXPORTS_CONFIGMAP).await? {
        Some(have) if have.data == want.data => {}
        Some(_) => {
            maps.patch(
                EXPORTS_CONFIGMAP,
                &PatchParams::default(),
                &Patch::Merge(json!({ "data": want.data })),
            )
            .await?;
        }
        None => {
            maps.create(&PostParams::default(), &want).await?;
        }
    }
    // Each consumer reads them in its Connection here.
    for connection in connections.iter().filter(|c| is_tenants(c, namespace)) {
        let have = connection.status.as_ref().and_then(|s| s.exports.as_ref());
        if have == Some(exports) {
            continue;
        }
        let Some(ns) = connection.metadata.namespace.as_deref() else {
            continue;
        };
        let api: Api<Connection> = Api::namespaced(client.clone(), ns);
        let name = connection.metadata.name.clone().unwrap_or_default();
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "exports": exports } })),
        )
        .await?;
    }
    Ok(())
}

/// A tenant's Connection (on a provider): not in the gateway's namespace.
fn is_tenants(connection: &Connection, namespace: &str) -> bool {
    connection.metadata.namespace.as_deref() != Some(namespace)
}

/// The exports of every peer with a connected tunnel, and where this
/// cluster sees its pods. A consumer's are taken only as far as they are
/// its own: its cluster ID, and endpoints in its pod CIDR.
fn peer_exports(
    namespace: &str,
    connections: &[std::sync::Arc<Connection>],
) -> Vec<(Exports, Option<Remap>)> {
    let mut out = Vec::new();
    for connection in connections {
        let Some(seen) = Remap::seen(connection) else {
            continue;
        };
        let peer = connection.spec.cluster_id.to_string();
        let exports = if is_tenants(connection, namespace) {
            connection.spec.exports.clone()
        } else {
            connection
                .status
                .as_ref()
                .and_then(|s| s.peer_exports.clone())
        };
        let Some(mut exports) = exports else {
            continue;
        };
        if exports.cluster_id != peer {
            tracing::debug!(%peer, claimed = %exports.cluster_id, "a peer's exports name another cluster: ignored");
            continue;
        }
        for service in &mut exports.services {
            for endpoint in &mut service.endpoints {
                endpoint.addresses.retain(|a| {
                    a.parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| seen.real.contains(&ip))
                });
            }
            service.endpoints.retain(|e| !e.addresses.is_empty());
        }
        let remap = (seen.real != seen.seen_as).then_some(seen);
        out.push((exports, remap));
    }
    out
}

/// Namespaces whose objects are a peer's or liqo's own: no export there
/// is this cluster's, and no import lands there.
pub fn is_peers_or_ours(namespace: &k8s_openapi::api::core::v1::Namespace) -> bool {
    let name = namespace.metadata.name.as_deref().unwrap_or_default();
    name == names::NAMESPACE
        || name.starts_with(names::peering::TENANT_NAMESPACE_PREFIX)
        || namespace
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(names::labels::TENANT))
}
