//! How liqoctl starts the agents: the flags and environment each one
//! takes, with their defaults, written once. Each agent parses its flags
//! with clap from these structs; liqoctl renders the same structs into a
//! container's `args` with `to_args()` and reads an installed agent's back
//! with `from_args()`, so that a flag renamed on one side does not compile
//! or parse on the other.

pub mod gateway;
pub mod virtual_kubelet;

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::str::FromStr;

/// Where an agent serves `/healthz` and `/readyz` unless told: port 8081
/// on every address.
pub const DEFAULT_HEALTH_ADDR: ListenAddr = ListenAddr::Socket(SocketAddr::V4(SocketAddrV4::new(
    Ipv4Addr::UNSPECIFIED,
    8081,
)));

/// The environment variables the agents read, as liqoctl sets them.
pub mod env {
    /// The pod's IP (downward API `status.podIP`).
    pub const POD_IP: &str = "POD_IP";
    /// The node's IP (downward API `status.hostIP`).
    pub const HOST_IP: &str = "HOST_IP";
    /// The pod's namespace (downward API `metadata.namespace`).
    pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
    /// Where an agent serves `/healthz` and `/readyz`.
    pub const HEALTH_ADDR: &str = "LIQO_HEALTH_ADDR";
    /// The virtual kubelet's ForeignCluster.
    pub const FOREIGN_CLUSTER: &str = "LIQO_FOREIGN_CLUSTER";
    /// The virtual kubelet's identity Secret, which reaches the provider.
    pub const PROVIDER_SECRET: &str = "LIQO_PROVIDER_SECRET";
    /// The virtual node's name.
    pub const NODE_NAME: &str = "LIQO_NODE_NAME";
    /// The consumer's API as the provider's pods reach it.
    pub const CONSUMER_API_ADDRESS: &str = "LIQO_CONSUMER_API_ADDRESS";
    /// Where the virtual kubelet serves the kubelet API.
    pub const KUBELET_ADDR: &str = "LIQO_KUBELET_ADDR";
    /// Where the virtual kubelet serves the placement webhook.
    pub const PLACEMENT_ADDR: &str = "LIQO_PLACEMENT_ADDR";
    /// Where the virtual kubelet serves names to the offloaded pods.
    pub const DNS_ADDR: &str = "LIQO_DNS_ADDR";
}

/// An address an agent listens on: one given as it is, or its pod's IP
/// with a port, which the kubelet expands from the container's environment
/// (`$(POD_IP)`) before the agent starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenAddr {
    Socket(SocketAddr),
    PodIp { port: u16 },
}

/// How a manifest writes the pod's IP for the kubelet to expand.
const POD_IP_REFERENCE: &str = "$(POD_IP)";

impl ListenAddr {
    /// The address to bind; an unexpanded `$(POD_IP)` is an error (the
    /// container has no `POD_IP` in its environment).
    pub fn socket_addr(self) -> Result<SocketAddr, UnexpandedPodIp> {
        match self {
            Self::Socket(addr) => Ok(addr),
            Self::PodIp { port } => Err(UnexpandedPodIp { port }),
        }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Socket(addr) => addr.fmt(f),
            Self::PodIp { port } => write!(f, "{POD_IP_REFERENCE}:{port}"),
        }
    }
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(port) = s
            .strip_prefix(POD_IP_REFERENCE)
            .and_then(|r| r.strip_prefix(':'))
        {
            return port
                .parse()
                .map(|port| Self::PodIp { port })
                .map_err(|_| format!("{port:?} is not a port"));
        }
        s.parse()
            .map(Self::Socket)
            .map_err(|_| format!("{s:?} is not an address and port (IP:PORT)"))
    }
}

/// The error of [`ListenAddr::socket_addr`].
#[derive(Debug, thiserror::Error)]
#[error(
    "the address {POD_IP_REFERENCE}:{port} was not expanded: give the container POD_IP from the downward API"
)]
pub struct UnexpandedPodIp {
    port: u16,
}

/// `FIRST-LAST` (or one port): a range of ports, each 1-65535.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    /// How many ports it holds.
    pub fn len(self) -> usize {
        usize::from(self.last - self.first) + 1
    }

    /// A range always holds a port.
    pub fn is_empty(self) -> bool {
        false
    }

    pub fn contains(self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl FromStr for PortRange {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let (first, last) = value.split_once('-').unwrap_or((value, value));
        let port = |p: &str| {
            p.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("{p:?} is not a port (1-65535)"))
        };
        let (first, last) = (port(first)?, port(last)?);
        if first > last {
            return Err(format!(
                "{first}-{last} is empty: give FIRST-LAST, FIRST <= LAST"
            ));
        }
        Ok(Self { first, last })
    }
}

/// Parses `args` (a container's, without the program) as `T`'s flags,
/// without reading the environment: what an installed agent was given.
fn parse_args<T: clap::Args>(program: &'static str, args: &[String]) -> Result<T, clap::Error> {
    let command = T::augment_args(clap::Command::new(program).no_binary_name(true));
    let mut matches = command.try_get_matches_from(args)?;
    T::from_arg_matches_mut(&mut matches)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listen_address_is_an_address_or_the_pods_ip_with_a_port() {
        for (text, want) in [
            (
                "0.0.0.0:8081",
                ListenAddr::Socket(([0, 0, 0, 0], 8081).into()),
            ),
            ("$(POD_IP):10250", ListenAddr::PodIp { port: 10250 }),
        ] {
            let parsed: ListenAddr = text.parse().expect("parses");
            assert_eq!(parsed, want);
            assert_eq!(parsed.to_string(), text);
        }
        assert!("$(POD_IP)".parse::<ListenAddr>().is_err());
        assert!("$(POD_IP):x".parse::<ListenAddr>().is_err());
        assert!("localhost:80".parse::<ListenAddr>().is_err());
        let unexpanded = ListenAddr::PodIp { port: 1 }.socket_addr();
        assert!(unexpanded.is_err_and(|e| e.to_string().contains("POD_IP")));
    }

    #[test]
    fn a_port_range_is_one_port_or_first_to_last() {
        assert_eq!(
            "51820-51899".parse(),
            Ok(PortRange {
                first: 51820,
                last: 51899
            })
        );
        assert_eq!("7".parse(), Ok(PortRange { first: 7, last: 7 }));
        assert_eq!(PortRange { first: 7, last: 9 }.len(), 3);
        for bad in ["0-5", "9-7", "x", "1-70000", ""] {
            assert!(bad.parse::<PortRange>().is_err(), "{bad}");
        }
    }
}
