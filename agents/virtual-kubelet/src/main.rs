//! `liqo-virtual-kubelet`: the virtual node of one outgoing peering.
//!
//! The pod reflection comes with the offloading issue; this binary already
//! takes its configuration the way it will in a cluster.

use clap::Parser;

#[derive(Parser, Debug)]
#[command(version = liqo_api::VERSION, about = "The virtual node of one outgoing liqo-rs peering")]
struct Args {
    /// The peer cluster's ID whose resources this node offers.
    #[arg(long, env = "LIQO_PEER_CLUSTER_ID")]
    peer_cluster_id: String,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().init();
    let args = Args::parse();
    anyhow::bail!(
        "the virtual kubelet for peer {} cannot run yet: pod offloading is not implemented",
        args.peer_cluster_id
    )
}
