//! Networks: the CIDRs clusters bring to a peering, and the arithmetic on
//! them that routing and NAT rely on: whether a peer's pod CIDR must be
//! remapped, into what ([`remap`]), and an address's image under a remap
//! ([`translate`]); and the gateway's own resource, [`Connection`]: one
//! tunnel to one peer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ClusterId;

/// One WireGuard tunnel to one peer cluster, as the local gateway must run
/// it. Written by `liqoctl` (`peer`, `network connect`) from what both
/// sides published; the gateway runs a tunnel for each and reports on it
/// in the status. Nothing secret is in it: each side's private key stays
/// in a Secret of its own cluster.
///
/// Where it lives says which side it is:
/// - on a consumer, in the `liqo` namespace, named after the provider: the
///   consumer's gateway dials the provider's endpoint;
/// - on a provider, in the consumer's tenant namespace, named after the
///   consumer: the provider's gateway listens on a port of its own for it
///   and publishes where in the status. The consumer's identity may write
///   it there, and the provider's gateway decides everything that matters
///   to the provider itself (port, remapping), whatever the spec says.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "liqo.io",
    derive = "PartialEq",
    version = "v1alpha1",
    kind = "Connection",
    plural = "connections",
    namespaced,
    status = "ConnectionStatus",
    printcolumn = r#"{"name":"Peer","type":"string","jsonPath":".spec.clusterName"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".spec.endpoint"}"#,
    printcolumn = r#"{"name":"Established","type":"string","jsonPath":".status.conditions[?(@.type==\"Established\")].status"}"#,
    printcolumn = r#"{"name":"Seen As","type":"string","jsonPath":".status.peerSeenAs"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionSpec {
    /// The peer's cluster ID.
    pub cluster_id: ClusterId,
    /// The peer's human name.
    pub cluster_name: String,
    /// The peer gateway's WireGuard public key (base64 of 32 bytes).
    pub public_key: String,
    /// Where the peer's gateway listens, `HOST:PORT`; absent on the side
    /// that listens and waits to be contacted (the provider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The peer's pod CIDR, as the peer knows it.
    pub pod_cidr: String,
    /// On a provider, in a tenant's Connection: what the consumer exports
    /// to the clusterset (written by its virtual kubelet; docs/services.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exports: Option<crate::clusterset::Exports>,
}

/// What the gateway decided and observed for one connection.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionStatus {
    /// `Established`: a handshake within the last three minutes (a
    /// WireGuard session's lifetime); `Configured`: the tunnel runs as the
    /// spec says, or why not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// This side's WireGuard public key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// Where this side listens for the peer, `HOST:PORT` (on a provider:
    /// what the consumer must dial).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The UDP port this side's tunnel listens on; the endpoint's port
    /// differs when a NodePort or a load balancer is in front.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen_port: Option<u16>,
    /// This side's pod CIDR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_cidr: Option<String>,
    /// Where this cluster sees the peer's pods: a CIDR of the remap pool
    /// when the peer's pod CIDR overlaps one of ours, else the peer's own.
    /// Kept once chosen, while it stays free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_seen_as: Option<String>,
    /// The tunnel's network device on the gateway's node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// When the last handshake completed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handshake: Option<String>,
    /// Bytes sent to and received from the peer since the tunnel started.
    #[serde(default)]
    pub tx_bytes: u64,
    #[serde(default)]
    pub rx_bytes: u64,
    /// The round-trip time of the last probe through the tunnel, in
    /// milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_ms: Option<f64>,
    /// On a provider, in a tenant's Connection: what this cluster exports
    /// to the clusterset, for the consumer to read (docs/services.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exports: Option<crate::clusterset::Exports>,
    /// On a consumer, in the Connection to a provider: what the provider
    /// exports, carried here by the virtual kubelet of the peering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_exports: Option<crate::clusterset::Exports>,
}

/// What stands in front of the gateway's listening tunnels, when peers do
/// not dial the node's address (`liqoctl install --gateway-service-type`):
/// the Service `liqo/liqo-gateway`, one UDP port per tunnel port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayServiceType {
    /// Peers dial the node's address (or `--gateway-address`) at the
    /// node port the Service maps the tunnel's port to.
    NodePort,
    /// Peers dial the load balancer's address (or `--gateway-address`) at
    /// the tunnel's own port.
    LoadBalancer,
}

impl GatewayServiceType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NodePort => "NodePort",
            Self::LoadBalancer => "LoadBalancer",
        }
    }
}

impl std::str::FromStr for GatewayServiceType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "NodePort" => Ok(Self::NodePort),
            "LoadBalancer" => Ok(Self::LoadBalancer),
            other => Err(format!("{other:?} is neither NodePort nor LoadBalancer")),
        }
    }
}

/// The condition types of a [`ConnectionStatus`].
pub mod conditions {
    pub const ESTABLISHED: &str = "Established";
    pub const CONFIGURED: &str = "Configured";
    /// `Configured`'s reason while the tunnel's process keeps ending
    /// (its message says why: a port taken, no TUN device, ...).
    pub const FAILING: &str = "Failing";
}

impl Connection {
    /// Why the gateway cannot keep this tunnel running, if it cannot.
    pub fn failing(&self) -> Option<&str> {
        self.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| {
                    c.type_ == conditions::CONFIGURED
                        && c.status == "False"
                        && c.reason == conditions::FAILING
                })
                .map(|c| c.message.as_str())
        })
    }

    /// Whether the gateway last reported a live session.
    pub fn is_established(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == conditions::ESTABLISHED && c.status == "True")
        })
    }
}

/// How one cluster sees another's pods: addresses in `real` (the peer's
/// pod CIDR) are reached at the same host part of `seen_as`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Remap {
    pub real: IpNet,
    pub seen_as: IpNet,
}

impl Remap {
    /// The remap a connection's gateway decided, if the peer's pods are
    /// seen elsewhere than at their own addresses.
    pub fn of(connection: &Connection) -> Option<Self> {
        Self::seen(connection).filter(|r| r.real != r.seen_as)
    }

    /// Where a connection's gateway sees the peer's pods, remapped or not
    /// (`seen_as` is `real` then), once it has said so.
    pub fn seen(connection: &Connection) -> Option<Self> {
        let real: IpNet = connection.spec.pod_cidr.parse().ok()?;
        let seen_as: IpNet = connection
            .status
            .as_ref()?
            .peer_seen_as
            .as_deref()?
            .parse()
            .ok()?;
        Some(Self {
            real: real.trunc(),
            seen_as: seen_as.trunc(),
        })
    }

    /// `address` as this cluster reaches it, when it is one of the peer's
    /// pods; `None` for any other address.
    pub fn pod_address(&self, address: &str) -> Option<String> {
        let a = address.parse::<IpAddr>().ok()?;
        translate(a, self.real, self.seen_as).map(|a| a.to_string())
    }

    /// `address` as this cluster reaches it: translated when it is one of
    /// the peer's pods, else unchanged (a host-network pod's node address,
    /// or text that is no address).
    pub fn address(&self, address: &str) -> String {
        address
            .parse::<IpAddr>()
            .ok()
            .and_then(|a| translate(a, self.real, self.seen_as))
            .map_or_else(|| address.to_owned(), |a| a.to_string())
    }
}

/// The tunnel device of a connection: `liqo-` and ten characters of a
/// hash (an interface name has at most 15), stable across restarts.
/// A consumer's connections (in `liqo`) get one per provider; a
/// provider's get one per tenant namespace, whatever cluster ID the
/// tenant wrote in it, so that a tenant can only ever clash with itself.
/// `local` (the gateway's own public key) is in the hash too: several
/// clusters' gateways may share a host's network (the testbed's do), and
/// their peers' names, even their own cluster IDs, may be the same.
pub fn device_name(local: &str, namespace: &str, peer: &ClusterId) -> String {
    use sha2::Digest as _;
    let of = if namespace == crate::names::NAMESPACE {
        format!("{local}/peer/{peer}")
    } else {
        format!("{local}/namespace/{namespace}")
    };
    let digest = sha2::Sha256::digest(of.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("liqo-{}", &hex[..10])
}

/// Parses an IPv4 or IPv6 CIDR such as `10.200.0.0/16`, normalised to its
/// network address; `what` names it in the error.
pub fn parse_cidr(what: &str, value: &str) -> Result<IpNet, String> {
    let net: IpNet = value
        .trim()
        .parse()
        .map_err(|_| format!("{what} {value:?} is not a CIDR such as 10.0.0.0/16"))?;
    Ok(net.trunc())
}

/// Whether two networks share an address.
pub fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(b) || b.contains(a)
}

/// Ranges that cannot carry pod or service traffic between clusters, with
/// what they are.
const RESERVED: [(&str, &str); 7] = [
    ("0.0.0.0/8", "the unspecified network 0.0.0.0/8"),
    ("127.0.0.0/8", "the loopback network 127.0.0.0/8"),
    ("169.254.0.0/16", "the link-local network 169.254.0.0/16"),
    ("224.0.0.0/4", "the multicast network 224.0.0.0/4"),
    ("::1/128", "the loopback address ::1"),
    ("fe80::/10", "the link-local network fe80::/10"),
    ("ff00::/8", "the multicast network ff00::/8"),
];

/// The reserved range `net` overlaps, if any.
pub fn reserved_overlap(net: &IpNet) -> Option<&'static str> {
    RESERVED.iter().find_map(|(cidr, what)| {
        let reserved: IpNet = cidr.parse().expect("invariant: the table holds CIDRs");
        overlap(net, &reserved).then_some(*what)
    })
}

/// Where remapped pod CIDRs are taken from unless configured otherwise:
/// RFC 6598's shared address space, 100.64.0.0/10 (64 prefixes of /16).
/// It is reserved for carrier-grade NAT between a provider and its
/// customers, so no Kubernetes default sits in it (kubeadm, kind and
/// flannel's pods 10.244.0.0/16 and services 10.96.0.0/12, k3s's
/// 10.42.0.0/16 and 10.43.0.0/16, Calico's 192.168.0.0/16, OpenShift's
/// 10.128.0.0/14 and 172.30.0.0/16, Docker's 172.17.0.0/16), whereas any
/// part of 10.0.0.0/8 is some distribution's default (10.224.0.0/11 holds
/// 10.244.0.0/16). What uses it anyway (EKS custom networking's secondary
/// CIDRs, Tailscale) is a reason to configure another pool; a pool that
/// overlaps the cluster's own CIDRs is still safe, since [`remap`] skips
/// what is taken.
pub const DEFAULT_REMAP_POOL: &str = "100.64.0.0/10";

/// [`DEFAULT_REMAP_POOL`], parsed.
pub fn default_remap_pool() -> IpNet {
    DEFAULT_REMAP_POOL
        .parse()
        .expect("invariant: the default pool is a CIDR")
}

/// Why no remapped CIDR could be chosen; each says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemapError {
    #[error(
        "the peer's pod CIDR {peer} overlaps this cluster's networks, and no prefix of the \
         remapping pool ({pool}) is as large as it: add a pool of at least /{prefix}",
        pool = list(pool),
        prefix = peer.prefix_len()
    )]
    PoolTooSmall { peer: IpNet, pool: Vec<IpNet> },
    #[error(
        "the peer's pod CIDR {peer} overlaps this cluster's networks, and every /{prefix} of the \
         remapping pool ({pool}) is taken: widen the pool or add one",
        pool = list(pool),
        prefix = peer.prefix_len()
    )]
    PoolExhausted { peer: IpNet, pool: Vec<IpNet> },
}

fn list(nets: &[IpNet]) -> String {
    if nets.is_empty() {
        return "empty".to_owned();
    }
    nets.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The CIDR under which this cluster will see a peer's pods, if it cannot
/// see them under their own: `None` when `peer` overlaps neither `local`
/// (this cluster's pod CIDR) nor anything `taken` (its service CIDR, the
/// CIDRs other peers are seen under). Otherwise the first prefix of the
/// peer's length, in the order of `pool`, that overlaps none of `local`,
/// `peer` and `taken`. Deterministic: the same inputs give the same
/// answer, so a decision can be recomputed rather than stored.
pub fn remap(
    local: IpNet,
    peer: IpNet,
    pool: &[IpNet],
    taken: &[IpNet],
) -> Result<Option<IpNet>, RemapError> {
    let (local, peer) = (local.trunc(), peer.trunc());
    if !overlap(&peer, &local) && !taken.iter().any(|t| overlap(&peer, t)) {
        return Ok(None);
    }
    let avoid: Vec<IpNet> = [local, peer]
        .into_iter()
        .chain(taken.iter().map(IpNet::trunc))
        .collect();
    let fitting: Vec<IpNet> = pool
        .iter()
        .map(IpNet::trunc)
        .filter(|p| same_family(p, &peer) && p.prefix_len() <= peer.prefix_len())
        .collect();
    if fitting.is_empty() {
        return Err(RemapError::PoolTooSmall {
            peer,
            pool: pool.to_vec(),
        });
    }
    let size_bits = u32::from(peer.max_prefix_len() - peer.prefix_len());
    for range in fitting {
        let end = to_u128(range.broadcast());
        let mut start = to_u128(range.network());
        // Each step either answers or jumps past one CIDR to avoid: as
        // both are aligned prefixes and one contains the other, the end of
        // the larger is aligned to the peer's size. No walk through every
        // prefix of a large (IPv6) pool.
        loop {
            let candidate = net_at(&peer, start);
            match avoid.iter().find(|a| overlap(a, &candidate)) {
                None => return Ok(Some(candidate)),
                Some(a) => {
                    let past = to_u128(candidate.broadcast()).max(to_u128(a.broadcast()));
                    match past.checked_add(1) {
                        Some(next) if next <= end && next >> size_bits << size_bits == next => {
                            start = next;
                        }
                        _ => break,
                    }
                }
            }
        }
    }
    Err(RemapError::PoolExhausted {
        peer,
        pool: pool.to_vec(),
    })
}

/// `addr`'s image when `from` is seen as `to`: the same host part in the
/// other network. `None` unless `addr` is in `from` and both networks are
/// of one family and one length.
pub fn translate(addr: IpAddr, from: IpNet, to: IpNet) -> Option<IpAddr> {
    if !from.contains(&addr) || !same_family(&from, &to) || from.prefix_len() != to.prefix_len() {
        return None;
    }
    let host = to_u128(addr) & to_u128(from.hostmask());
    Some(net_at(&to, to_u128(to.network()) | host).addr())
}

fn same_family(a: &IpNet, b: &IpNet) -> bool {
    matches!(
        (a, b),
        (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_))
    )
}

fn to_u128(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The address `value` of `like`'s family, with `like`'s prefix length.
fn net_at(like: &IpNet, value: u128) -> IpNet {
    let addr = match like {
        // Truncation is what is wanted: an IPv4 value fits in 32 bits.
        IpNet::V4(_) => IpAddr::V4(Ipv4Addr::from(value as u32)),
        IpNet::V6(_) => IpAddr::V6(Ipv6Addr::from(value)),
    };
    IpNet::new(addr, like.prefix_len()).expect("invariant: the prefix length is the network's")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Interface names: at most 15 characters, one per peer (a consumer's)
    /// or tenant namespace (a provider's), and apart for two clusters
    /// whose peers have the same names.
    #[test]
    fn device_names_are_short_and_distinct() {
        let id = |s: &str| ClusterId::new(s).expect("id");
        let (a, b, p) = ("key-a", "key-b", id("provider-1"));
        let names = [
            device_name(a, "liqo", &p),
            device_name(b, "liqo", &p),
            device_name(a, "liqo-tenant-x", &p),
            device_name(a, "liqo-tenant-y", &p),
            device_name(a, "liqo", &id("provider-2")),
        ];
        for (i, n) in names.iter().enumerate() {
            assert!(n.len() <= 15 && n.starts_with("liqo-"), "{n}");
            assert!(!names[i + 1..].contains(n), "{n} twice");
        }
        assert_eq!(
            device_name(a, "liqo-tenant-x", &p),
            device_name(a, "liqo-tenant-x", &id("other"))
        );
    }

    #[test]
    fn remaps_come_from_a_connection_and_translate_only_the_peers_pods() {
        let mut c = Connection::new(
            "p",
            ConnectionSpec {
                cluster_id: ClusterId::new("p").expect("id"),
                cluster_name: "p".into(),
                public_key: String::new(),
                endpoint: None,
                pod_cidr: "10.200.0.0/16".into(),
                exports: None,
            },
        );
        assert_eq!(Remap::of(&c), None, "no decision yet");
        c.status = Some(ConnectionStatus {
            peer_seen_as: Some("10.200.0.0/16".into()),
            ..Default::default()
        });
        assert_eq!(Remap::of(&c), None, "seen as it is");
        c.status = Some(ConnectionStatus {
            peer_seen_as: Some("100.64.0.0/16".into()),
            ..Default::default()
        });
        let remap = Remap::of(&c).expect("remapped");
        assert_eq!(remap.address("10.200.2.3"), "100.64.2.3");
        assert_eq!(remap.address("192.168.1.5"), "192.168.1.5");
        assert_eq!(remap.address("not an address"), "not an address");
    }

    fn net(s: &str) -> IpNet {
        s.parse().expect("cidr")
    }

    #[test]
    fn cidrs_are_normalised_and_bad_ones_named() {
        assert_eq!(parse_cidr("x", "10.1.2.3/16"), Ok(net("10.1.0.0/16")));
        assert_eq!(parse_cidr("x", "fd00::1/64"), Ok(net("fd00::/64")));
        let err = parse_cidr("--pod-cidr", "10.0.0.0").expect_err("no prefix");
        assert!(err.contains("--pod-cidr"), "{err}");
    }

    #[test]
    fn overlaps_both_ways_and_reserved_ranges() {
        assert!(overlap(&net("10.0.0.0/8"), &net("10.200.0.0/16")));
        assert!(overlap(&net("10.200.0.0/16"), &net("10.0.0.0/8")));
        assert!(!overlap(&net("10.200.0.0/16"), &net("10.201.0.0/16")));
        assert!(!overlap(&net("10.0.0.0/8"), &net("fd00::/8")));
        assert_eq!(reserved_overlap(&net("10.200.0.0/16")), None);
        assert!(reserved_overlap(&net("0.0.0.0/0")).is_some());
        assert!(reserved_overlap(&net("127.1.0.0/16")).is_some());
        assert!(reserved_overlap(&net("fe80::/64")).is_some());
    }

    #[test]
    fn remap_by_table() {
        let pool = [net("10.224.0.0/14"), net("100.64.0.0/10")];
        // (local, peer, taken, expected)
        let cases: [(&str, &str, &[&str], Option<&str>); 11] = [
            // Disjoint: seen as they are.
            ("10.200.0.0/16", "10.201.0.0/16", &["10.96.0.0/12"], None),
            // Identical: the first /16 of the pool.
            ("10.200.0.0/16", "10.200.0.0/16", &[], Some("10.224.0.0/16")),
            // The peer's inside ours, or ours inside the peer's.
            ("10.0.0.0/8", "10.200.0.0/16", &[], Some("100.64.0.0/16")),
            ("10.200.1.0/24", "10.200.0.0/16", &[], Some("10.224.0.0/16")),
            // Overlapping our service CIDR only.
            (
                "10.200.0.0/16",
                "10.96.0.0/16",
                &["10.96.0.0/12"],
                Some("10.224.0.0/16"),
            ),
            // What other peers are seen under is skipped, large or small.
            (
                "10.200.0.0/16",
                "10.200.0.0/16",
                &["10.224.0.0/16", "10.225.0.0/16"],
                Some("10.226.0.0/16"),
            ),
            (
                "10.200.0.0/16",
                "10.200.0.0/16",
                &["10.224.0.0/15"],
                Some("10.226.0.0/16"),
            ),
            (
                "10.200.0.0/16",
                "10.200.0.0/16",
                &["10.224.3.0/24"],
                Some("10.225.0.0/16"),
            ),
            // The first pool full: the next one.
            (
                "10.200.0.0/16",
                "10.200.0.0/16",
                &["10.224.0.0/14"],
                Some("100.64.0.0/16"),
            ),
            // A pool overlapping our own CIDR: that part is skipped.
            ("10.224.0.0/16", "10.224.0.0/16", &[], Some("10.225.0.0/16")),
            // Host bits in the input are ignored.
            ("10.200.0.5/16", "10.200.7.7/16", &[], Some("10.224.0.0/16")),
        ];
        for (local, peer, taken, expected) in cases {
            let taken: Vec<IpNet> = taken.iter().map(|t| net(t)).collect();
            assert_eq!(
                remap(net(local), net(peer), &pool, &taken),
                Ok(expected.map(net)),
                "local {local}, peer {peer}, taken {taken:?}"
            );
        }
    }

    #[test]
    fn remap_ipv6_jumps_instead_of_walking() {
        // 2^64 candidates: only works if taken prefixes are jumped over.
        let pool = [net("fd00::/48")];
        let got = remap(
            net("fd00::/112"),
            net("fd00::/112"),
            &pool,
            &[net("fd00::/49")],
        );
        assert_eq!(got, Ok(Some(net("fd00:0:0:8000::/112"))));
        // Families do not mix: an IPv4 pool cannot hold an IPv6 peer.
        let got = remap(
            net("fd00::/64"),
            net("fd00::/64"),
            &[net("100.64.0.0/10")],
            &[],
        );
        assert!(
            matches!(got, Err(RemapError::PoolTooSmall { .. })),
            "{got:?}"
        );
    }

    #[test]
    fn remap_errors_say_what_to_do() {
        let too_small = remap(
            net("10.0.0.0/8"),
            net("10.0.0.0/8"),
            &[net("100.64.0.0/10")],
            &[],
        )
        .expect_err("a /8 does not fit in a /10");
        assert_eq!(
            too_small.to_string(),
            "the peer's pod CIDR 10.0.0.0/8 overlaps this cluster's networks, and no prefix of \
             the remapping pool (100.64.0.0/10) is as large as it: add a pool of at least /8"
        );
        let exhausted = remap(
            net("10.200.0.0/16"),
            net("10.200.0.0/16"),
            &[net("10.224.0.0/15")],
            &[net("10.224.0.0/16"), net("10.225.0.0/16")],
        )
        .expect_err("both /16 taken");
        assert_eq!(
            exhausted.to_string(),
            "the peer's pod CIDR 10.200.0.0/16 overlaps this cluster's networks, and every /16 \
             of the remapping pool (10.224.0.0/15) is taken: widen the pool or add one"
        );
        // Exhausted at the very end of the address space: no overflow.
        let last = remap(
            net("255.255.255.0/24"),
            net("255.255.255.0/24"),
            &[net("255.255.254.0/23")],
            &[],
        );
        assert_eq!(last, Ok(Some(net("255.255.254.0/24"))));
        let none_left = remap(
            net("255.255.254.0/24"),
            net("255.255.254.0/24"),
            &[net("255.255.254.0/23")],
            &[net("255.255.255.0/24")],
        );
        assert!(
            matches!(none_left, Err(RemapError::PoolExhausted { .. })),
            "{none_left:?}"
        );
        assert_eq!(
            remap(net("10.0.0.0/16"), net("10.0.0.0/16"), &[], &[]),
            Err(RemapError::PoolTooSmall {
                peer: net("10.0.0.0/16"),
                pool: vec![]
            })
        );
    }

    #[test]
    fn the_default_pool_avoids_common_defaults() {
        let pool = default_remap_pool();
        for common in [
            "10.244.0.0/16",
            "10.96.0.0/12",
            "10.42.0.0/16",
            "10.43.0.0/16",
            "192.168.0.0/16",
            "10.128.0.0/14",
            "172.30.0.0/16",
            "172.17.0.0/16",
            "10.0.0.0/8",
        ] {
            assert!(!overlap(&pool, &net(common)), "{common}");
        }
    }

    #[test]
    fn translate_by_table() {
        // (addr, from, to, expected)
        let cases: [(&str, &str, &str, Option<&str>); 8] = [
            (
                "10.200.3.4",
                "10.200.0.0/16",
                "10.201.0.0/16",
                Some("10.201.3.4"),
            ),
            (
                "10.201.3.4",
                "10.201.0.0/16",
                "10.200.0.0/16",
                Some("10.200.3.4"),
            ),
            (
                "10.200.255.255",
                "10.200.0.0/16",
                "100.64.0.0/16",
                Some("100.64.255.255"),
            ),
            ("10.1.2.3", "10.0.0.0/8", "100.0.0.0/8", Some("100.1.2.3")),
            (
                "fd00::1:2",
                "fd00::/64",
                "fd01:0:0:7::/64",
                Some("fd01:0:0:7::1:2"),
            ),
            // Outside `from`, lengths or families that differ: no image.
            ("10.9.3.4", "10.200.0.0/16", "10.201.0.0/16", None),
            ("10.200.3.4", "10.200.0.0/16", "10.201.0.0/24", None),
            ("10.200.3.4", "10.200.0.0/16", "fd00::/16", None),
        ];
        for (addr, from, to, expected) in cases {
            let addr: IpAddr = addr.parse().expect("address");
            assert_eq!(
                translate(addr, net(from), net(to)),
                expected.map(|e| e.parse().expect("address")),
                "{addr} from {from} to {to}"
            );
        }
    }
}
