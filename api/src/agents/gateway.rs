//! The gateway agent's flags (`liqo-gateway` without a subcommand).

use std::path::PathBuf;

use ipnet::IpNet;

use super::{DEFAULT_HEALTH_ADDR, ListenAddr, PortRange, env, parse_args};
use crate::names;
use crate::networking::GatewayServiceType;

/// The UDP ports of incoming peerings' tunnels, when not told otherwise.
pub const DEFAULT_TUNNEL_PORTS: PortRange = PortRange {
    first: 51820,
    last: 51899,
};

/// WireGuard's overhead on an IPv6 underlay (IPv6 40, UDP 8, WireGuard's
/// header and tag 32): the largest, so one MTU fits either underlay.
pub const WIREGUARD_OVERHEAD: u16 = 40 + 8 + 32;

/// The tunnel devices' MTU on a 1500-byte node network.
pub const DEFAULT_MTU: u16 = 1500 - WIREGUARD_OVERHEAD;

/// What `--endpoint-address` is when install was not given one: the
/// node's address, from the downward API.
pub const NODE_ADDRESS: &str = "$(HOST_IP)";

#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct GatewayFlags {
    /// Where to serve /healthz and /readyz.
    #[arg(long, env = env::HEALTH_ADDR, default_value_t = DEFAULT_HEALTH_ADDR)]
    pub health_addr: ListenAddr,
    /// The namespace of liqo-rs's objects (the pod's own).
    #[arg(long, env = env::POD_NAMESPACE, default_value = names::NAMESPACE)]
    pub namespace: String,
    /// Announce the cluster on the LAN with mDNS (off unless given:
    /// announcing multicasts on the node's networks).
    #[arg(long, requires = "advertise_address")]
    pub announce: bool,
    /// The URL of the API server that peers should use, announced with
    /// --announce.
    #[arg(long, value_name = "URL")]
    pub advertise_address: Option<String>,
    /// The host (address or DNS name) peers dial to reach this gateway's
    /// tunnels; without it, a listening connection publishes no endpoint.
    #[arg(long, value_name = "HOST")]
    pub endpoint_address: Option<String>,
    /// The tunnels are exposed by the Service `liqo-gateway` of this type
    /// in the agent's namespace: the endpoint published to peers is its
    /// node port (NodePort) or its load balancer's address (LoadBalancer,
    /// unless --endpoint-address names one).
    #[arg(long, value_name = "NodePort|LoadBalancer")]
    pub expose: Option<GatewayServiceType>,
    /// The UDP ports the tunnels of incoming peerings listen on, one each
    /// (51820-51899 unless given: `tunnel_ports()`).
    #[arg(long, value_name = "FIRST-LAST")]
    pub tunnel_ports: Option<PortRange>,
    /// Where the CIDRs that overlapping peers are seen under are taken from.
    /// Its default when parsed; liqoctl leaves it out when empty.
    #[arg(long, value_delimiter = ',', default_value = crate::networking::DEFAULT_REMAP_POOL)]
    pub remap_pool: Vec<IpNet>,
    /// The tunnel devices' MTU: the node network's less WireGuard's overhead.
    #[arg(long, default_value_t = DEFAULT_MTU)]
    pub mtu: u16,
    /// Run the tunnels (devices, sockets, routes, NAT tables) in this
    /// network namespace (a path such as /run/netns/NAME) rather than the
    /// agent's: to keep the peers' traffic in a namespace of its own, as
    /// the tests do with one namespace per simulated node.
    #[arg(long, value_name = "PATH")]
    pub tunnel_netns: Option<PathBuf>,
}

impl GatewayFlags {
    /// The flags liqoctl gives a gateway it installs: its health address
    /// on the pod's IP, everything else left to the agent's defaults.
    pub fn for_pod(health_port: u16) -> Self {
        Self {
            health_addr: ListenAddr::PodIp { port: health_port },
            namespace: names::NAMESPACE.to_owned(),
            announce: false,
            advertise_address: None,
            endpoint_address: None,
            expose: None,
            tunnel_ports: None,
            remap_pool: Vec::new(),
            mtu: DEFAULT_MTU,
            tunnel_netns: None,
        }
    }

    /// The ports of incoming tunnels ([`DEFAULT_TUNNEL_PORTS`] unless set).
    pub fn tunnel_ports(&self) -> PortRange {
        self.tunnel_ports.unwrap_or(DEFAULT_TUNNEL_PORTS)
    }

    /// The container's `args`: each flag that differs from what the agent
    /// does without it (the namespace comes from the environment).
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![format!("--health-addr={}", self.health_addr)];
        if let Some(address) = &self.advertise_address {
            args.push(format!("--advertise-address={address}"));
        }
        if self.announce {
            args.push("--announce".to_owned());
        }
        if let Some(address) = &self.endpoint_address {
            args.push(format!("--endpoint-address={address}"));
        }
        if let Some(kind) = self.expose {
            args.push(format!("--expose={}", kind.as_str()));
        }
        if let Some(ports) = self.tunnel_ports {
            args.push(format!("--tunnel-ports={ports}"));
        }
        if !self.remap_pool.is_empty() {
            let pool: Vec<String> = self.remap_pool.iter().map(IpNet::to_string).collect();
            args.push(format!("--remap-pool={}", pool.join(",")));
        }
        if self.mtu != DEFAULT_MTU {
            args.push(format!("--mtu={}", self.mtu));
        }
        if let Some(netns) = &self.tunnel_netns {
            args.push(format!("--tunnel-netns={}", netns.display()));
        }
        args
    }

    /// The flags of an installed gateway, from its container's `args`:
    /// what liqoctl keeps when it installs again. Flags the agent would
    /// default are as `to_args` leaves them out.
    pub fn from_args(args: &[String]) -> Result<Self, clap::Error> {
        let given = |flag: &str| args.iter().any(|a| a.starts_with(flag));
        let mut flags: Self = parse_args("liqo-gateway", args)?;
        if !given("--remap-pool") {
            flags.remap_pool.clear();
        }
        Ok(flags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn what_liqoctl_renders_the_agent_parses_back() {
        let mut flags = GatewayFlags::for_pod(names::HEALTH_PORT);
        assert_eq!(flags.to_args(), args(&["--health-addr=$(POD_IP):8081"]));
        flags.advertise_address = Some("https://10.0.0.1:6443".to_owned());
        flags.announce = true;
        flags.endpoint_address = Some(NODE_ADDRESS.to_owned());
        flags.expose = Some(GatewayServiceType::NodePort);
        flags.tunnel_ports = Some(PortRange { first: 5, last: 6 });
        flags.remap_pool = vec![
            "100.64.0.0/16".parse().expect("net"),
            "10.99.0.0/16".parse().expect("net"),
        ];
        let rendered = flags.to_args();
        assert_eq!(
            rendered,
            args(&[
                "--health-addr=$(POD_IP):8081",
                "--advertise-address=https://10.0.0.1:6443",
                "--announce",
                "--endpoint-address=$(HOST_IP)",
                "--expose=NodePort",
                "--tunnel-ports=5-6",
                "--remap-pool=100.64.0.0/16,10.99.0.0/16",
            ])
        );
        assert_eq!(GatewayFlags::from_args(&rendered).expect("parses"), flags);
    }

    #[test]
    fn flags_left_out_take_the_agents_defaults() {
        let flags =
            GatewayFlags::from_args(&args(&["--health-addr=$(POD_IP):8081"])).expect("parses");
        assert_eq!(flags, GatewayFlags::for_pod(names::HEALTH_PORT));
        assert_eq!(flags.tunnel_ports(), DEFAULT_TUNNEL_PORTS);
        assert!(GatewayFlags::from_args(&args(&["--tunnel-ports=9-1"])).is_err());
    }
}
