//! The gateway's flags: the agent's, and each subcommand's. Only clap's
//! types live here, so that they can move as one.

use std::net::SocketAddr;

use clap::Parser;
use liqo_api::agents::gateway::GatewayFlags;
use liqo_api::discovery::{ApiAddress, DiscoveryError};

use crate::{netcheck, tunnel};

#[derive(Parser, Debug)]
#[command(version = liqo_api::VERSION, about = "The liqo-rs network gateway")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    /// The agent's own flags: liqoctl's contract with it
    /// (`liqo_api::agents::gateway`).
    #[command(flatten)]
    pub(crate) agent: GatewayFlags,
}

#[derive(clap::Subcommand, Debug)]
pub(crate) enum Command {
    /// Runs one WireGuard tunnel configured by flags, without a cluster.
    Tunnel(TunnelArgs),
    /// Announces one cluster on the LAN with mDNS, configured by flags,
    /// without a cluster; until stopped, then says goodbye.
    Announce(AnnounceArgs),
    /// The pods of `liqoctl test network`: a server that says who called,
    /// and a prober that reports what answered.
    #[command(subcommand)]
    Netcheck(netcheck::Command),
}

#[derive(clap::Args, Debug)]
pub(crate) struct AnnounceArgs {
    /// The cluster ID to announce.
    #[arg(long)]
    pub(crate) cluster_id: String,
    /// The cluster name to announce (the mDNS instance name).
    #[arg(long)]
    pub(crate) cluster_name: String,
    /// A cluster label to announce, KEY=VALUE (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub(crate) labels: Vec<String>,
    /// The URL of the cluster's API server, as peers should reach it.
    #[arg(long, value_name = "URL")]
    pub(crate) api_address: String,
    /// Announce on this interface only (default: every interface).
    #[arg(long, value_name = "IFACE")]
    pub(crate) interface: Option<String>,
}

#[derive(clap::Args, Debug)]
pub(crate) struct TunnelArgs {
    /// The TUN device to create.
    #[arg(long, default_value = "liqo0")]
    pub(crate) interface: String,
    /// The device's address and prefix (the prefix's route goes through
    /// the tunnel); none by default: the peer's pods are routed by
    /// --peer-cidr.
    #[arg(long)]
    pub(crate) address: Option<ipnet::Ipv4Net>,
    /// The device's MTU: the link's less WireGuard's overhead.
    #[arg(long, default_value_t = 1500 - tunnel::OVERHEAD_V6)]
    pub(crate) mtu: u16,
    /// The UDP address to listen on.
    #[arg(long, default_value = "0.0.0.0:51820")]
    pub(crate) listen: SocketAddr,
    /// A file holding this side's private key (as `wg genkey` writes it);
    /// `-` reads it from standard input.
    #[arg(long)]
    pub(crate) private_key_file: std::path::PathBuf,
    /// The peer's public key.
    #[arg(long)]
    pub(crate) peer_public_key: tunnel::Key,
    /// Where the peer listens; without it, wait to be contacted.
    #[arg(long)]
    pub(crate) peer_endpoint: Option<SocketAddr>,
    /// Addresses the peer may send from and that are sent to it (the
    /// peer's pod CIDR, given with --peer-cidr, is added).
    #[arg(long, value_delimiter = ',')]
    pub(crate) allowed_ips: Vec<ipnet::IpNet>,
    /// The peer's pod CIDR, as the peer knows it: routed into the tunnel
    /// (or its remapped CIDR is), and allowed from and to the peer.
    #[arg(long)]
    pub(crate) peer_cidr: Option<ipnet::IpNet>,
    /// This cluster's pod CIDR: when the peer's overlaps it, the peer's
    /// pods are seen under a remapped CIDR taken from --remap-pool.
    #[arg(long, requires = "peer_cidr")]
    pub(crate) local_cidr: Option<ipnet::IpNet>,
    /// Other networks of this cluster that the peer's pod CIDR must not
    /// overlap either, and that a remapped CIDR must avoid (the service
    /// CIDR, other peers' CIDRs as seen here).
    #[arg(long, value_delimiter = ',', requires = "local_cidr")]
    pub(crate) avoid: Vec<ipnet::IpNet>,
    /// Where this cluster sees the peer's pods, instead of choosing from
    /// --remap-pool: the gateway translates with nftables (host part kept).
    #[arg(long, requires = "peer_cidr")]
    pub(crate) peer_remapped_cidr: Option<ipnet::IpNet>,
    /// Where remapped CIDRs are taken from.
    #[arg(long, value_delimiter = ',', default_value = liqo_api::networking::DEFAULT_REMAP_POOL)]
    pub(crate) remap_pool: Vec<ipnet::IpNet>,
    /// Seconds between keepalives (none by default).
    #[arg(long)]
    pub(crate) persistent_keepalive: Option<u16>,
    /// Do not ask the kernel for TUN offloads (GSO/GRO).
    #[arg(long)]
    pub(crate) no_offload: bool,
    /// Print the tunnel's counters on standard output every second, one
    /// JSON object a line (how the agent follows the tunnels it runs).
    #[arg(long)]
    pub(crate) report: bool,
}

/// Where the API server is said to be when the agent announces; `None`
/// when it does not.
pub(crate) fn announcement(args: &GatewayFlags) -> Result<Option<ApiAddress>, DiscoveryError> {
    if !args.announce {
        return Ok(None);
    }
    let url = args.advertise_address.as_deref().unwrap_or_default();
    Ok(Some(ApiAddress::parse(url)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Announcing is off by default: the agent starts no mDNS responder
    /// unless `liqoctl install --announce` gave it the flag.
    #[test]
    fn the_agent_announces_only_with_announce() {
        let cli = Cli::try_parse_from(["liqo-gateway"]).expect("no flags");
        assert_eq!(announcement(&cli.agent).expect("valid"), None);
        let cli =
            Cli::try_parse_from(["liqo-gateway", "--advertise-address=https://10.0.0.1:6443"])
                .expect("an address alone");
        assert_eq!(announcement(&cli.agent).expect("valid"), None);
        let cli = Cli::try_parse_from([
            "liqo-gateway",
            "--announce",
            "--advertise-address=https://10.0.0.1:6443",
        ])
        .expect("both");
        let api = announcement(&cli.agent).expect("valid").expect("announces");
        assert_eq!(api.port(), 6443);
        assert!(Cli::try_parse_from(["liqo-gateway", "--announce"]).is_err());
    }
}
