//! `liqo-virtual-kubelet`: the virtual node of one outgoing peering, run
//! on the consumer, one per provider.
//!
//! What runs today: the node is registered from its ForeignCluster
//! (labels, taint, cost, capacity = the grant), keeps a heartbeat Lease,
//! and is Ready while the provider's API answers as the expected cluster
//! ([`provider`]). Offloaded namespaces get their twin on the provider,
//! and pods bound to the node run there as ReplicaSets of one
//! ([`reflection`], translated by [`forge`]). The agent keeps no state of
//! its own: everything comes from the API and the mounted kubeconfig.

mod forge;
mod node;
mod provider;
mod reflection;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use liqo_agent_runtime::Readiness;
use liqo_agent_runtime::follow::{Options, follow, follow_with};
use liqo_api::core::ForeignCluster;
use liqo_api::names;
use liqo_api::offloading::NamespaceOffloading;
use std::sync::Arc;
use tokio::sync::{Notify, watch};

#[derive(Parser, Debug)]
#[command(version = liqo_api::VERSION, about = "The virtual node of one outgoing liqo-rs peering")]
struct Args {
    /// The local ForeignCluster of the provider this node stands for.
    #[arg(long, env = "LIQO_FOREIGN_CLUSTER")]
    foreign_cluster: String,
    /// A kubeconfig that reaches the provider's API as this cluster; re-read
    /// whenever its content changes.
    #[arg(
        long,
        env = "LIQO_PROVIDER_KUBECONFIG",
        default_value = "/etc/liqo/provider/kubeconfig"
    )]
    provider_kubeconfig: PathBuf,
    /// The virtual node's name.
    #[arg(long, env = "LIQO_NODE_NAME")]
    node_name: String,
    /// Where to serve /healthz and /readyz.
    #[arg(long, env = "LIQO_HEALTH_ADDR", default_value = "0.0.0.0:8081")]
    health_addr: SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    liqo_agent_runtime::init_logging();
    let args = Args::parse();
    let readiness = Readiness::default();
    let listener = liqo_agent_runtime::bind_health(args.health_addr).await?;
    tracing::info!(
        version = liqo_api::VERSION,
        health = %args.health_addr,
        foreign_cluster = %args.foreign_cluster,
        node = %args.node_name,
        "virtual kubelet starting"
    );
    // KUBECONFIG when set, else the pod's service account.
    let client = kube::Client::try_default().await?;

    // The RBAC grants this one ForeignCluster by name, so the watch must
    // name it.
    let (peers, follow_peers) = follow(
        Api::<ForeignCluster>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={}", args.foreign_cluster)),
        "foreign cluster",
    );
    let fc_ref = ObjectRef::new(&args.foreign_cluster);

    let (client_tx, client_rx) =
        watch::channel(Err("the provider kubeconfig is not read yet".to_owned()));
    let (health_tx, health_rx) = watch::channel(provider::Health::default());
    let (registered_tx, registered_rx) = watch::channel(None);
    let keeper = node::NodeKeeper {
        client: client.clone(),
        node_name: args.node_name.clone(),
        fc_ref: fc_ref.clone(),
        peers: peers.clone(),
        health: health_rx,
        registered: registered_tx,
    };
    let reflect = reflect(
        client.clone(),
        args.foreign_cluster.clone(),
        args.node_name.clone(),
        client_rx.clone(),
        peers.clone(),
        fc_ref.clone(),
    );
    tokio::select! {
        result = liqo_agent_runtime::serve_health(listener, readiness.clone()) => result?,
        () = reflect => {}
        () = follow_peers => {}
        () = provider::keep_client(args.provider_kubeconfig, client_tx) => {}
        () = provider::keep_checking(client_rx, peers, fc_ref, health_tx) => {}
        () = keeper.run(readiness.clone()) => {}
        () = node::lease::keep_lease(client, args.node_name, registered_rx) => {}
        () = liqo_agent_runtime::shutdown_signal() => {}
    }
    Ok(())
}

/// The consumer's own identity (its cluster ID names the tenant on the
/// provider, its name the twin namespaces), read until it can be.
async fn local_identity(client: &kube::Client) -> liqo_api::ClusterIdentity {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), names::NAMESPACE);
    let mut backoff = std::time::Duration::from_millis(250);
    loop {
        match maps.get(names::IDENTITY_CONFIGMAP).await {
            Ok(map) => match liqo_api::ClusterIdentity::from_data(&map.data.unwrap_or_default()) {
                Ok(identity) => return identity,
                Err(error) => tracing::warn!(%error, "this cluster's identity is damaged"),
            },
            Err(error) => tracing::warn!(%error, "cannot read this cluster's identity"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(std::time::Duration::from_secs(10));
    }
}

/// Twin namespaces and pods: follows the local offloadings and the pods
/// bound to the node, and runs both reflection kinds.
async fn reflect(
    client: kube::Client,
    foreign_cluster: String,
    node_name: String,
    provider: watch::Receiver<provider::ProviderClient>,
    peers: liqo_agent_runtime::follow::Followed<ForeignCluster>,
    fc_ref: ObjectRef<ForeignCluster>,
) {
    let consumer = local_identity(&client).await;
    let provider_id = match liqo_api::ClusterId::new(foreign_cluster) {
        Ok(id) => id,
        Err(error) => {
            tracing::error!(%error, "the ForeignCluster's name is not a cluster ID: nothing to offload to");
            return std::future::pending().await;
        }
    };
    let peering = reflection::namespace::Peering {
        local: client.clone(),
        provider,
        provider_id,
        consumer,
        node_name: node_name.clone(),
    };
    let (offloadings, follow_offloadings) = follow(
        Api::<NamespaceOffloading>::all(client.clone()),
        watcher::Config::default(),
        "namespace offloadings",
    );
    // Only the pods bound to this node, as a kubelet watches; stored
    // trimmed to what the pod reflection reads.
    let (pods, follow_pods) = follow_with(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().fields(&format!("spec.nodeName={node_name}")),
        "local pods",
        Options {
            trim: Some(reflection::pod::trim_local_pod),
            index_label: None,
        },
    );
    let (twins_tx, twins_rx) = watch::channel(Default::default());
    let (synced_tx, synced_rx) = watch::channel(false);
    let ns_wake = Arc::new(Notify::new());
    let pod_wake = Arc::new(Notify::new());
    let namespaces = reflection::namespace::TwinNamespaces {
        peering: peering.clone(),
        offloadings: offloadings.clone(),
        peers: peers.clone(),
        fc_ref,
        twins: twins_tx,
        synced: synced_tx,
        passed_once: Default::default(),
        verified: Default::default(),
    };
    let pod_kind = reflection::pod::Pods::new(
        peering,
        pods.clone(),
        twins_rx.clone(),
        synced_rx,
        pod_wake.clone(),
    );
    let twins_changed = {
        let wake = pod_wake.clone();
        let mut rx = twins_rx;
        async move {
            while rx.changed().await.is_ok() {
                wake.notify_one();
            }
        }
    };
    tokio::join!(
        follow_offloadings,
        follow_pods,
        reflection::wake_on(offloadings, ns_wake.clone()),
        reflection::wake_on(peers, ns_wake.clone()),
        reflection::wake_on(pods, pod_wake.clone()),
        twins_changed,
        reflection::run(namespaces, ns_wake),
        reflection::run(pod_kind, pod_wake),
    );
}
