//! A gateway that cannot run a tunnel (here: its UDP port is taken by
//! another program) makes `liqoctl peer` stop at once with one line that
//! says why, leaves nothing of the peering in either cluster, and the same
//! command peers once the port is free.

use anyhow::{Context, Result, ensure};
use kube::api::{Api, ListParams};
use liqo_api::authentication::Tenant;
use liqo_api::core::ForeignCluster;
use liqo_e2e::fixture::{Pair, Stage};

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_tunnel_port_is_told_and_freeing_it_lets_the_same_peer_through() -> Result<()> {
    // Another program holds the one port the provider's tunnels may use.
    let squatter = std::net::UdpSocket::bind("0.0.0.0:0")?;
    let port = squatter.local_addr()?.port();
    let pair = Pair::at(Stage::Started).await?;
    let (consumer, provider) = (pair.consumer(), pair.provider());
    liqo_e2e::install(consumer, "consumer-1", "10.201.0.0/16", &[]).success();
    let ports = format!("--tunnel-ports={port}-{port}");
    liqo_e2e::install(provider, "provider-1", "10.202.0.0/16", &[&ports]).success();
    let remote = provider.kubeconfig_path().to_str().context("path")?;
    let peer = || pair.on_consumer(&["peer", "--remote-kubeconfig", remote, "--timeout=120"]);

    let refused = peer().user_error(6);
    let line = refused.error_line();
    for part in [
        "the gateway of cluster provider cannot run the tunnel: ",
        &format!(":{port}"),
        "in use",
        "run the same command again",
    ] {
        ensure!(line.contains(part), "{part:?} not in: {line}");
    }
    // Rolled back on both sides.
    let consumer_client = consumer.client().await?;
    let provider_client = provider.client().await?;
    let peers = Api::<ForeignCluster>::all(consumer_client.clone())
        .list(&ListParams::default())
        .await?;
    ensure!(peers.items.is_empty(), "{:?}", peers.items);
    let tenants = Api::<Tenant>::all(provider_client.clone())
        .list(&ListParams::default())
        .await?;
    ensure!(tenants.items.is_empty(), "{:?}", tenants.items);

    // The port freed, the same command peers, the tunnel up.
    drop(squatter);
    peer().success();
    let peers = Api::<ForeignCluster>::all(consumer_client)
        .list(&ListParams::default())
        .await?;
    ensure!(peers.items.len() == 1, "{:?}", peers.items);
    Ok(())
}
