//! `liqo-gateway`: links the pod networks of peered clusters over a
//! userspace WireGuard tunnel.
//!
//! What runs today: the gateway reads the cluster's identity and follows
//! the peers (ForeignClusters), under the RBAC `liqoctl install` gives it,
//! and is ready once it knows both. The tunnel comes with the network
//! issue. It keeps no state of its own: everything comes from the API.

use std::net::SocketAddr;

use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use liqo_agent_runtime::Readiness;
use liqo_api::ClusterIdentity;
use liqo_api::names;
use liqo_api::core::ForeignCluster;

#[derive(Parser, Debug)]
#[command(version = liqo_api::VERSION, about = "The liqo-rs network gateway")]
struct Args {
    /// Where to serve /healthz and /readyz.
    #[arg(long, env = "LIQO_HEALTH_ADDR", default_value = "0.0.0.0:8081")]
    health_addr: SocketAddr,
    /// The namespace of liqo-rs's objects (the pod's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = names::NAMESPACE)]
    namespace: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    liqo_agent_runtime::init_logging();
    let args = Args::parse();
    let readiness = Readiness::default();
    let listener = liqo_agent_runtime::bind_health(args.health_addr).await?;
    tracing::info!(version = liqo_api::VERSION, health = %args.health_addr, "gateway starting");
    // KUBECONFIG when set, else the pod's service account.
    let client = kube::Client::try_default().await?;
    tokio::select! {
        result = liqo_agent_runtime::serve_health(listener, readiness.clone()) => result?,
        result = follow(client, &args.namespace, readiness) => result?,
        () = liqo_agent_runtime::shutdown_signal() => {}
    }
    Ok(())
}

/// Follows the identity and the peers; ready while both are known.
async fn follow(client: kube::Client, namespace: &str, readiness: Readiness) -> anyhow::Result<()> {
    // The RBAC grants this one ConfigMap by name, so the watch must name it.
    let identity_config =
        watcher::Config::default().fields(&format!("metadata.name={}", names::IDENTITY_CONFIGMAP));
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut identities = watcher(maps, identity_config)
        .default_backoff()
        .applied_objects()
        .boxed();
    let peers: Api<ForeignCluster> = Api::all(client);
    let mut peer_events = watcher(peers, watcher::Config::default())
        .default_backoff()
        .boxed();

    let mut identity: Option<ClusterIdentity> = None;
    let mut peers_synced = false;
    loop {
        tokio::select! {
            next = identities.try_next() => match next {
                Ok(Some(map)) => {
                    match ClusterIdentity::from_data(&map.data.unwrap_or_default()) {
                        Ok(id) => {
                            tracing::info!(cluster_id = %id.cluster_id, name = %id.cluster_name, "identity");
                            identity = Some(id);
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "the identity ConfigMap is damaged");
                            identity = None;
                        }
                    }
                }
                Ok(None) => anyhow::bail!("the identity watch ended"),
                // Retried with backoff by the stream; not ready meanwhile.
                Err(e) => {
                    tracing::warn!(error = %e, "watching the identity");
                    identity = None;
                }
            },
            next = peer_events.try_next() => match next {
                Ok(Some(event)) => match event {
                    watcher::Event::InitDone => peers_synced = true,
                    watcher::Event::Apply(fc) | watcher::Event::InitApply(fc) => {
                        tracing::info!(peer = %fc.spec.cluster_name, cluster_id = %fc.spec.cluster_id, "peer");
                    }
                    watcher::Event::Delete(fc) => {
                        tracing::info!(peer = %fc.spec.cluster_name, "peer removed");
                    }
                    watcher::Event::Init => {}
                },
                Ok(None) => anyhow::bail!("the peers watch ended"),
                Err(e) => {
                    tracing::warn!(error = %e, "watching the peers");
                    peers_synced = false;
                }
            },
        }
        readiness.set(identity.is_some() && peers_synced);
    }
}
