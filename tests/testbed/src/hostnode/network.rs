//! The addresses of the host node and its pods, and where each pod meets
//! the network: loopback addresses of the cluster's own /24 without a pod
//! network; in the pod-network mode, addresses of the node's pod CIDR and
//! a network namespace of each pod's own (see [`crate::podnet`]).

use std::collections::HashSet;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Pod;

use super::{HostNodeConfig, pod};
use crate::podnet::relay::Relay;
use crate::podnet::{self, PodNet};
use crate::{Error, io_error};

/// The loopback /24 of the pods of the cluster whose API server listens on
/// `api_port`: unique among the clusters running on the machine, as ports
/// are, and clear of `127.0.0.0/16` since ports below 256 are not used.
pub(crate) fn loopback_subnet(api_port: u16) -> [u8; 3] {
    let [high, low] = api_port.to_be_bytes();
    [127, high, low]
}

/// The host node's own address in its cluster's loopback /24: `.1`. It
/// is the node's InternalIP, every pod's hostIP, and host-network pods'
/// IP, so that two clusters' host-network agents (gateways) bind apart.
pub(crate) fn node_address(subnet: [u8; 3]) -> Ipv4Addr {
    let [a, b, c] = subnet;
    Ipv4Addr::new(a, b, c, 1)
}

/// The first three bytes of the /24 that a node's pods get their
/// addresses from, out of its pod CIDR.
pub(super) fn pod_subnet(cidr: &str) -> Option<[u8; 3]> {
    let net: ipnet::Ipv4Net = cidr.parse().ok()?;
    let [a, b, c, _] = net.network().octets();
    (net.prefix_len() <= 24).then_some([a, b, c])
}

/// Where a pod with address `ip` meets the network: in the pod-network
/// mode, the node's namespace for a host-network pod, else a namespace of
/// its own, made now; otherwise the host's.
pub(super) fn network(
    config: &HostNodeConfig,
    pod: &Pod,
    ip: Ipv4Addr,
) -> Result<pod::Network, Error> {
    let host_ip = config.node_ip;
    let Some(net) = &config.pod_network else {
        return Ok(pod::Network {
            host_ip,
            netns: None,
            own: None,
        });
    };
    if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
        return Ok(pod::Network {
            host_ip,
            netns: Some(podnet::netns_path(&net.node_netns)),
            own: None,
        });
    }
    let own = PodNet::new(net.api_port, &net.node_netns, host_ip, ip)?;
    let relay = Relay::start(&own.path()).map_err(io_error(&own.path()))?;
    Ok(pod::Network {
        host_ip,
        netns: Some(own.path()),
        own: Some((own, relay)),
    })
}

/// The addresses of a node's pods, handed out in turn so that a freed one is
/// not reused at once.
#[derive(Debug)]
pub(super) struct IpPool {
    subnet: [u8; 3],
    /// Host-network pods' address.
    node: Ipv4Addr,
    used: HashSet<u8>,
    next: u8,
}

impl IpPool {
    const FIRST: u8 = 2;
    const LAST: u8 = 254;

    pub(super) fn new(subnet: [u8; 3], node: Ipv4Addr) -> Self {
        Self {
            subnet,
            node,
            used: HashSet::new(),
            next: Self::FIRST,
        }
    }

    /// An address for `pod`: the node's for a host-network pod, else a
    /// free one of the subnet, if any is left.
    pub(super) fn take(&mut self, pod: &Pod) -> Option<Ipv4Addr> {
        if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
            return Some(self.node);
        }
        let span = Self::LAST - Self::FIRST + 1;
        let host = (0..span)
            .map(|i| Self::FIRST + (self.next - Self::FIRST + i) % span)
            .find(|h| !self.used.contains(h))?;
        self.used.insert(host);
        self.next = if host == Self::LAST {
            Self::FIRST
        } else {
            host + 1
        };
        let [a, b, c] = self.subnet;
        Some(Ipv4Addr::new(a, b, c, host))
    }

    pub(super) fn give_back(&mut self, ip: Ipv4Addr) {
        let [a, b, c, host] = ip.octets();
        if [a, b, c] == self.subnet {
            self.used.remove(&host);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(host_network: bool) -> Pod {
        serde_json::from_value(json!({ "spec": { "containers": [], "hostNetwork": host_network } }))
            .expect("pod")
    }

    #[test]
    fn pods_take_the_first_slash_24_of_the_node_pod_cidr() {
        assert_eq!(pod_subnet("10.201.3.0/24"), Some([10, 201, 3]));
        assert_eq!(pod_subnet("10.201.0.0/16"), Some([10, 201, 0]));
        assert_eq!(pod_subnet("10.201.3.0/26"), None, "too small");
        assert_eq!(pod_subnet("fd00::/64"), None);
    }

    #[test]
    fn loopback_subnets_follow_the_api_port() {
        assert_eq!(loopback_subnet(0x9c41), [127, 0x9c, 0x41]);
    }

    #[test]
    fn ip_pool_hands_out_in_turn_and_takes_back() {
        let mut pool = IpPool::new([127, 1, 2], node_address([127, 1, 2]));
        let a = pool.take(&pod(false)).expect("first");
        let b = pool.take(&pod(false)).expect("second");
        assert_eq!(a, Ipv4Addr::new(127, 1, 2, 2));
        assert_eq!(b, Ipv4Addr::new(127, 1, 2, 3));
        pool.give_back(a);
        assert_eq!(pool.take(&pod(false)), Some(Ipv4Addr::new(127, 1, 2, 4)));
        // A host-network pod has the node's address, which is never lent.
        assert_eq!(pool.take(&pod(true)), Some(Ipv4Addr::new(127, 1, 2, 1)));
        pool.give_back(Ipv4Addr::new(127, 1, 2, 1));
        for _ in 5..=254 {
            assert!(pool.take(&pod(false)).is_some());
        }
        assert_eq!(
            pool.take(&pod(false)),
            Some(a),
            "wraps around to the freed one"
        );
        assert_eq!(pool.take(&pod(false)), None, "full");
    }
}
