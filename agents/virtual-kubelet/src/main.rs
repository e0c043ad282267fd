//! `liqo-virtual-kubelet`: the virtual node of one outgoing peering, run
//! on the consumer, one per provider.
//!
//! What runs today: the node is registered from its ForeignCluster
//! (labels, taint, cost, capacity = the grant), keeps a heartbeat Lease,
//! and is Ready while the provider's API answers as the expected cluster
//! ([`provider`]). Pods on the node come with the offloading issue, beside
//! [`node`] and on the client of [`provider`]. The agent keeps no state of
//! its own: everything comes from the API and the mounted kubeconfig.

mod forge;
mod node;
mod provider;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use kube::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use liqo_agent_runtime::Readiness;
use liqo_agent_runtime::follow::follow;
use liqo_api::core::ForeignCluster;
use tokio::sync::watch;

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
    tokio::select! {
        result = liqo_agent_runtime::serve_health(listener, readiness.clone()) => result?,
        () = follow_peers => {}
        () = provider::keep_client(args.provider_kubeconfig, client_tx) => {}
        () = provider::keep_checking(client_rx, peers, fc_ref, health_tx) => {}
        () = keeper.run(readiness.clone()) => {}
        () = node::lease::keep_lease(client, args.node_name, registered_rx) => {}
        () = liqo_agent_runtime::shutdown_signal() => {}
    }
    Ok(())
}
