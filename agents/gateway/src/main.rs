//! `liqo-gateway`: links the pod networks of peered clusters over a
//! userspace WireGuard tunnel.
//!
//! What runs today: the gateway follows the cluster's identity and the
//! peers (ForeignClusters) with reflectors, under the RBAC `liqoctl
//! install` gives it, and is ready exactly while both are known and
//! current: not while the API cannot be followed, not once the identity is
//! deleted or damaged. The tunnel comes with the network issue. It keeps no
//! state of its own: everything comes from the API.

use std::net::SocketAddr;

use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use liqo_agent_runtime::Readiness;
use liqo_agent_runtime::follow::{Followed, follow};
use liqo_api::ClusterIdentity;
use liqo_api::core::ForeignCluster;
use liqo_api::names;

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

    // The RBAC grants this one ConfigMap by name, so the watch must name it.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
    let (identity, follow_identity) = follow(
        maps,
        watcher::Config::default().fields(&format!("metadata.name={}", names::IDENTITY_CONFIGMAP)),
        "identity",
    );
    let (peers, follow_peers) = follow(
        Api::<ForeignCluster>::all(client),
        watcher::Config::default(),
        "peers",
    );
    let state = State {
        identity,
        identity_ref: ObjectRef::new(names::IDENTITY_CONFIGMAP).within(&args.namespace),
        peers,
    };
    tokio::select! {
        result = liqo_agent_runtime::serve_health(listener, readiness.clone()) => result?,
        () = follow_identity => {}
        () = follow_peers => {}
        () = state.keep_readiness(&readiness) => {}
        () = liqo_agent_runtime::shutdown_signal() => {}
    }
    Ok(())
}

/// What the gateway follows.
struct State {
    identity: Followed<ConfigMap>,
    identity_ref: ObjectRef<ConfigMap>,
    peers: Followed<ForeignCluster>,
}

/// What the gateway knows, as it logs it when it changes.
#[derive(Debug, PartialEq)]
struct Known {
    identity: Result<ClusterIdentity, String>,
    peers: Vec<(String, String)>,
}

impl State {
    /// Re-evaluates readiness whenever either store changes: ready when
    /// both stores are current and the identity is present and valid.
    async fn keep_readiness(mut self, readiness: &Readiness) {
        let mut last: Option<Known> = None;
        loop {
            let known = self.known();
            if last.as_ref() != Some(&known) {
                match &known.identity {
                    Ok(id) => {
                        tracing::info!(cluster_id = %id.cluster_id, name = %id.cluster_name, "identity")
                    }
                    Err(why) => tracing::warn!(%why, "no usable identity"),
                }
                tracing::info!(peers = ?known.peers, "peers");
            }
            readiness.set(
                self.identity.is_current() && self.peers.is_current() && known.identity.is_ok(),
            );
            last = Some(known);
            tokio::select! {
                changed = self.identity.state.changed() => if changed.is_err() { return },
                changed = self.peers.state.changed() => if changed.is_err() { return },
            }
        }
    }

    fn known(&self) -> Known {
        let identity = match self.identity.store.get(&self.identity_ref) {
            None => Err(format!(
                "the ConfigMap {} does not exist",
                names::IDENTITY_CONFIGMAP
            )),
            Some(map) => {
                ClusterIdentity::from_data(&map.data.clone().unwrap_or_default()).map_err(|e| {
                    format!(
                        "the ConfigMap {} is damaged: {e}",
                        names::IDENTITY_CONFIGMAP
                    )
                })
            }
        };
        let mut peers: Vec<(String, String)> = self
            .peers
            .store
            .state()
            .iter()
            .map(|fc| (fc.spec.cluster_name.clone(), fc.spec.cluster_id.to_string()))
            .collect();
        peers.sort();
        Known { identity, peers }
    }
}
