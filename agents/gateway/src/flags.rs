//! The gateway's flags: the agent's, and each subcommand's. Only clap's
//! types live here, so that they can move as one.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;

use clap::Parser;
use ipnet::IpNet;
use liqo_api::agents::gateway::{DEFAULT_MTU, GatewayFlags};
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

/// The TUN device `tunnel` creates unless told.
const DEFAULT_INTERFACE: &str = "liqo0";
/// Where `tunnel` listens unless told: WireGuard's port on every address.
const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 51820));

/// `liqo-gateway tunnel`'s flags: typed, as the agent's supervisor starts
/// a tunnel process with them ([`TunnelArgs::to_args`]).
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub(crate) struct TunnelArgs {
    /// The TUN device to create.
    #[arg(long, default_value = DEFAULT_INTERFACE)]
    pub(crate) interface: String,
    /// The device's address and prefix (the prefix's route goes through
    /// the tunnel); none by default: the peer's pods are routed by
    /// --peer-cidr.
    #[arg(long)]
    pub(crate) address: Option<ipnet::Ipv4Net>,
    /// The device's MTU: the link's less WireGuard's overhead.
    #[arg(long, default_value_t = DEFAULT_MTU)]
    pub(crate) mtu: u16,
    /// The UDP address to listen on.
    #[arg(long, default_value_t = DEFAULT_LISTEN)]
    pub(crate) listen: SocketAddr,
    /// A file holding this side's private key (as `wg genkey` writes it);
    /// `-` reads it from standard input.
    #[arg(long)]
    pub(crate) private_key_file: PathBuf,
    /// The peer's public key.
    #[arg(long)]
    pub(crate) peer_public_key: tunnel::Key,
    /// Where the peer listens; without it, wait to be contacted.
    #[arg(long)]
    pub(crate) peer_endpoint: Option<SocketAddr>,
    /// Addresses the peer may send from and that are sent to it (the
    /// peer's pod CIDR, given with --peer-cidr, is added).
    #[arg(long, value_delimiter = ',')]
    pub(crate) allowed_ips: Vec<IpNet>,
    /// The peer's pod CIDR, as the peer knows it: routed into the tunnel
    /// (or its remapped CIDR is), and allowed from and to the peer.
    #[arg(long)]
    pub(crate) peer_cidr: Option<IpNet>,
    /// This cluster's pod CIDR: when the peer's overlaps it, the peer's
    /// pods are seen under a remapped CIDR taken from --remap-pool.
    #[arg(long, requires = "peer_cidr")]
    pub(crate) local_cidr: Option<IpNet>,
    /// Other networks of this cluster that the peer's pod CIDR must not
    /// overlap either, and that a remapped CIDR must avoid (the service
    /// CIDR, other peers' CIDRs as seen here).
    #[arg(long, value_delimiter = ',', requires = "local_cidr")]
    pub(crate) avoid: Vec<IpNet>,
    /// Where this cluster sees the peer's pods, instead of choosing from
    /// --remap-pool: the gateway translates with nftables (host part kept).
    #[arg(long, requires = "peer_cidr")]
    pub(crate) peer_remapped_cidr: Option<IpNet>,
    /// Where remapped CIDRs are taken from.
    #[arg(long, value_delimiter = ',', default_value = liqo_api::networking::DEFAULT_REMAP_POOL)]
    pub(crate) remap_pool: Vec<IpNet>,
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

impl TunnelArgs {
    /// A tunnel to `peer_public_key` on the device `interface`, its private
    /// key read from `private_key_file`, everything else as the flags'
    /// defaults have it.
    pub(crate) fn new(
        interface: String,
        private_key_file: PathBuf,
        peer_public_key: tunnel::Key,
    ) -> Self {
        Self {
            interface,
            address: None,
            mtu: DEFAULT_MTU,
            listen: DEFAULT_LISTEN,
            private_key_file,
            peer_public_key,
            peer_endpoint: None,
            allowed_ips: Vec::new(),
            peer_cidr: None,
            local_cidr: None,
            avoid: Vec::new(),
            peer_remapped_cidr: None,
            remap_pool: vec![liqo_api::networking::default_remap_pool()],
            persistent_keepalive: None,
            no_offload: false,
            report: false,
        }
    }

    /// The flags after `tunnel` that parse back into these arguments: each
    /// one that differs from its default.
    pub(crate) fn to_args(&self) -> Vec<String> {
        let list = |nets: &[IpNet]| {
            nets.iter()
                .map(IpNet::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut args = vec![
            format!("--private-key-file={}", self.private_key_file.display()),
            format!("--peer-public-key={}", self.peer_public_key.expose()),
        ];
        if self.interface != DEFAULT_INTERFACE {
            args.push(format!("--interface={}", self.interface));
        }
        if let Some(address) = self.address {
            args.push(format!("--address={address}"));
        }
        if self.mtu != DEFAULT_MTU {
            args.push(format!("--mtu={}", self.mtu));
        }
        if self.listen != DEFAULT_LISTEN {
            args.push(format!("--listen={}", self.listen));
        }
        if let Some(endpoint) = self.peer_endpoint {
            args.push(format!("--peer-endpoint={endpoint}"));
        }
        if !self.allowed_ips.is_empty() {
            args.push(format!("--allowed-ips={}", list(&self.allowed_ips)));
        }
        if let Some(cidr) = self.peer_cidr {
            args.push(format!("--peer-cidr={cidr}"));
        }
        if let Some(cidr) = self.local_cidr {
            args.push(format!("--local-cidr={cidr}"));
        }
        if !self.avoid.is_empty() {
            args.push(format!("--avoid={}", list(&self.avoid)));
        }
        if let Some(cidr) = self.peer_remapped_cidr {
            args.push(format!("--peer-remapped-cidr={cidr}"));
        }
        if self.remap_pool != [liqo_api::networking::default_remap_pool()] {
            args.push(format!("--remap-pool={}", list(&self.remap_pool)));
        }
        if let Some(seconds) = self.persistent_keepalive {
            args.push(format!("--persistent-keepalive={seconds}"));
        }
        if self.no_offload {
            args.push("--no-offload".to_owned());
        }
        if self.report {
            args.push("--report".to_owned());
        }
        args
    }
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

    /// What the supervisor starts a tunnel with parses back as it was, in
    /// its barest form and with every flag away from its default.
    #[test]
    fn tunnel_args_parse_back_from_their_flags() {
        let key: tunnel::Key = "YjJmMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
            .parse()
            .expect("key");
        let bare = TunnelArgs::new(DEFAULT_INTERFACE.into(), "-".into(), key.clone());
        let mut full = TunnelArgs::new("liqo-3f2a".into(), "/run/key".into(), key);
        full.address = Some("10.200.0.1/30".parse().expect("address"));
        full.mtu = 1380;
        full.listen = "192.0.2.1:51830".parse().expect("listen");
        full.peer_endpoint = Some("198.51.100.7:51820".parse().expect("endpoint"));
        full.allowed_ips = vec![
            "10.9.0.0/24".parse().expect("net"),
            "10.8.0.0/24".parse().expect("net"),
        ];
        full.peer_cidr = Some("10.244.0.0/16".parse().expect("net"));
        full.local_cidr = Some("10.244.0.0/16".parse().expect("net"));
        full.avoid = vec!["10.96.0.0/12".parse().expect("net")];
        full.peer_remapped_cidr = Some("100.64.0.0/16".parse().expect("net"));
        full.remap_pool = vec!["172.30.0.0/15".parse().expect("net")];
        full.persistent_keepalive = Some(10);
        full.no_offload = true;
        full.report = true;
        for args in [bare, full] {
            let flags = args.to_args();
            let parsed = Cli::try_parse_from(
                ["liqo-gateway", "tunnel"]
                    .into_iter()
                    .map(String::from)
                    .chain(flags.clone()),
            )
            .unwrap_or_else(|e| panic!("{flags:?}: {e}"));
            let Some(Command::Tunnel(back)) = parsed.command else {
                panic!("not a tunnel: {flags:?}");
            };
            assert_eq!(back, args, "{flags:?}");
        }
    }

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
