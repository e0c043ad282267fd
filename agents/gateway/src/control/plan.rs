//! The decisions, pure: where the cluster sees each peer's pods (remapped
//! from the pool when the peer's pod CIDR overlaps the local pod or
//! service CIDR, a network of the node, or where another peer is seen),
//! and the UDP port each listening side takes from the configured range.
//! A decision already in a status is kept while it stays valid, so
//! restarts change nothing; everything else is decided again from the
//! API, since the gateway keeps no state of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ipnet::IpNet;
use kube::ResourceExt as _;
use kube::runtime::reflector::ObjectRef;
use liqo_api::ClusterIdentity;
use liqo_api::networking::{Connection, RemapError, device_name, overlap};

use super::Settings;
use crate::tunnel::{Key, KeyError};

/// Why a connection's tunnel cannot run, as its status says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("an older connection in {namespace} stands for the same peer: one tunnel per peer")]
    SamePeer { namespace: String },
    #[error(
        "the peer's Connection names pod CIDR {named}, but it peered with {pinned}: only this \
         cluster's administrator changes that (its Tenant record's spec.podCidr)"
    )]
    PodCidrChanged { named: String, pinned: String },
    #[error("the peer's public key is not a WireGuard key: {0}")]
    PublicKey(KeyError),
    /// The pod CIDR does not parse (the message says what to write).
    #[error("{0}")]
    PodCidr(String),
    #[error("the peer's pod CIDR {cidr} overlaps {what}")]
    Reserved { cidr: IpNet, what: &'static str },
    #[error(transparent)]
    Remap(RemapError),
    #[error("the cluster's identity is not known")]
    IdentityUnknown,
    #[error("every port of {first}-{last} is taken: widen --tunnel-ports")]
    PortsTaken { first: u16, last: u16 },
}

/// What the gateway decided for one connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub object: ObjectRef<Connection>,
    pub peer_id: String,
    /// The tunnel, or why it cannot run.
    pub tunnel: Result<TunnelPlan, Refusal>,
}

/// One tunnel as its process runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelPlan {
    pub device: String,
    pub peer_public_key: Key,
    /// Where to dial (the dialing side); none on the listening side.
    pub endpoint: Option<String>,
    /// The UDP port to listen on: 0 (any) when dialing.
    pub port: u16,
    pub peer_cidr: IpNet,
    /// Where this cluster sees the peer's pods.
    pub seen_as: IpNet,
    /// This cluster's pod CIDR (round-trip probes go from its network
    /// address to the peer's).
    pub local_cidr: Option<IpNet>,
}

/// The local networks a peer's pods must not be seen in.
#[derive(Debug, Clone, Default)]
pub struct LocalNetworks {
    pub pod_cidr: Option<IpNet>,
    pub service_cidr: Option<IpNet>,
    /// The node's own networks (its interfaces').
    pub node: Vec<IpNet>,
}

impl LocalNetworks {
    pub fn of(identity: &ClusterIdentity, node: Vec<IpNet>) -> Self {
        Self {
            pod_cidr: Some(identity.pod_cidr),
            service_cidr: Some(identity.service_cidr),
            node,
        }
    }
}

/// Decides, for every connection, the port it listens on and where the
/// peer's pods are seen. Pure: the same objects give the same plan.
/// Connections are taken oldest first, so a newer one never takes what
/// an older one holds, and a decision in a status is kept while valid.
/// A tenant's connection runs only with the pod CIDR its namespace is
/// pinned to (`pinned`, per namespace), where it is pinned.
pub fn plan(
    local: &LocalNetworks,
    connections: &[Arc<Connection>],
    pinned: &BTreeMap<String, String>,
    settings: &Settings,
) -> Vec<Planned> {
    let mut sorted: Vec<&Arc<Connection>> = connections
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .collect();
    sorted.sort_by_key(|c| {
        (
            c.metadata.creation_timestamp.clone().map(|t| t.0),
            c.namespace(),
            c.name_any(),
        )
    });
    // What a peer may not be seen in: ours, then each planned peer's view.
    let mut taken: Vec<IpNet> = local
        .service_cidr
        .iter()
        .chain(&local.node)
        .copied()
        .collect();
    let mut ports: BTreeSet<u16> = BTreeSet::new();
    let mut devices: BTreeSet<String> = BTreeSet::new();
    // Listening sides keep their port first, so that a newer connection
    // never takes a port an older one held but had not been seen with.
    // (Statuses written before `listenPort` existed have it in the
    // endpoint, which had no Service in front then.)
    let kept_port = |c: &Connection| -> Option<u16> {
        let status = c.status.as_ref()?;
        status
            .listen_port
            .or_else(|| status.endpoint.as_deref()?.rsplit_once(':')?.1.parse().ok())
            .filter(|p| settings.ports.contains(p))
    };
    sorted
        .into_iter()
        .map(|c| {
            let object = ObjectRef::from_obj(c.as_ref());
            let peer_id = c.spec.cluster_id.to_string();
            let tunnel = (|| {
                let namespace = c.namespace().unwrap_or_default();
                let device = device_name(&settings.instance, &namespace, &c.spec.cluster_id);
                if !devices.insert(device.clone()) {
                    return Err(Refusal::SamePeer { namespace });
                }
                // Only connections our administrator wrote dial out: a
                // tenant's connection never makes the provider send anywhere.
                let endpoint = c
                    .spec
                    .endpoint
                    .clone()
                    .filter(|_| namespace == settings.namespace);
                if namespace != settings.namespace
                    && let Some(pin) = pinned.get(&namespace)
                    && *pin != c.spec.pod_cidr
                {
                    return Err(Refusal::PodCidrChanged {
                        named: c.spec.pod_cidr.clone(),
                        pinned: pin.clone(),
                    });
                }
                let peer_public_key: Key = c.spec.public_key.parse().map_err(Refusal::PublicKey)?;
                let peer_cidr =
                    liqo_api::networking::parse_cidr("the peer's pod CIDR", &c.spec.pod_cidr)
                        .map_err(Refusal::PodCidr)?;
                if let Some(what) = liqo_api::networking::reserved_overlap(&peer_cidr) {
                    return Err(Refusal::Reserved {
                        cidr: peer_cidr,
                        what,
                    });
                }
                let ours: Vec<IpNet> = local.pod_cidr.iter().chain(&taken).copied().collect();
                let free = |net: &IpNet| !ours.iter().any(|n| overlap(n, net));
                let kept = c
                    .status
                    .as_ref()
                    .and_then(|s| s.peer_seen_as.as_deref())
                    .and_then(|s| s.parse::<IpNet>().ok())
                    .filter(|s| {
                        s.prefix_len() == peer_cidr.prefix_len()
                            && (*s == peer_cidr || !overlap(s, &peer_cidr))
                            && free(s)
                    });
                let seen_as = match kept {
                    Some(kept) => kept,
                    None => match local.pod_cidr {
                        Some(pod_cidr) => liqo_api::networking::remap(
                            pod_cidr,
                            peer_cidr,
                            &settings.remap_pool,
                            &taken,
                        )
                        .map_err(Refusal::Remap)?
                        .unwrap_or(peer_cidr),
                        None => return Err(Refusal::IdentityUnknown),
                    },
                };
                let port = match &endpoint {
                    Some(_) => 0,
                    None => {
                        let port = kept_port(c)
                            .filter(|p| !ports.contains(p))
                            .or_else(|| settings.ports.clone().find(|p| !ports.contains(p)))
                            .ok_or(Refusal::PortsTaken {
                                first: *settings.ports.start(),
                                last: *settings.ports.end(),
                            })?;
                        ports.insert(port);
                        port
                    }
                };
                taken.push(seen_as);
                Ok(TunnelPlan {
                    device,
                    peer_public_key,
                    endpoint,
                    port,
                    peer_cidr,
                    seen_as,
                    local_cidr: local.pod_cidr,
                })
            })();
            Planned {
                object,
                peer_id,
                tunnel,
            }
        })
        .collect()
}

/// The networks of the node's interfaces, but the tunnels' own and
/// loopback: a peer's pods seen there would shadow the node's neighbours.
pub fn node_networks() -> Vec<IpNet> {
    let Ok(interfaces) = if_addrs::get_if_addrs() else {
        return Vec::new();
    };
    interfaces
        .into_iter()
        .filter(|i| !i.is_loopback() && !i.name.starts_with("liqo-"))
        .filter_map(|i| match i.addr {
            if_addrs::IfAddr::V4(a) => ipnet::Ipv4Net::with_netmask(a.ip, a.netmask)
                .ok()
                .map(|n| IpNet::V4(n.trunc())),
            if_addrs::IfAddr::V6(a) => ipnet::Ipv6Net::with_netmask(a.ip, a.netmask)
                .ok()
                .map(|n| IpNet::V6(n.trunc())),
        })
        .filter(|n| liqo_api::networking::reserved_overlap(n).is_none())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use liqo_api::networking::{ConnectionSpec, ConnectionStatus};

    fn settings() -> Settings {
        Settings {
            endpoint_host: Some("192.0.2.1".into()),
            exposed_by: None,
            listen_address: std::net::Ipv4Addr::UNSPECIFIED.into(),
            instance: "test".into(),
            namespace: "liqo".into(),
            ports: 51820..=51821,
            remap_pool: vec!["100.64.0.0/10".parse().expect("cidr")],
            mtu: 1420,
            netns: None,
        }
    }

    fn local() -> LocalNetworks {
        LocalNetworks {
            pod_cidr: Some("10.200.0.0/16".parse().expect("cidr")),
            service_cidr: Some("10.100.0.0/16".parse().expect("cidr")),
            node: vec!["192.168.1.0/24".parse().expect("cidr")],
        }
    }

    fn connection(
        peer: &str,
        age: i64,
        pod_cidr: &str,
        endpoint: Option<&str>,
        status: Option<ConnectionStatus>,
    ) -> Arc<Connection> {
        let mut c = Connection::new(
            peer,
            ConnectionSpec {
                cluster_id: liqo_api::ClusterId::new(peer).expect("id"),
                cluster_name: peer.into(),
                public_key: "29QfL/gCYN3ASZ39Gf7A/UOqE+SFK1jbHwKLwaTgVhs=".into(),
                endpoint: endpoint.map(str::to_owned),
                pod_cidr: pod_cidr.into(),
                exports: None,
            },
        );
        // A provider's (listening) connections are in tenant namespaces.
        c.metadata.namespace = Some(match endpoint {
            Some(_) => "liqo".into(),
            None => format!("liqo-tenant-{peer}"),
        });
        c.metadata.creation_timestamp = Some(Time(
            Timestamp::from_second(1_700_000_000 + age).expect("time"),
        ));
        c.status = status;
        Arc::new(c)
    }

    fn net(s: &str) -> IpNet {
        s.parse().expect("cidr")
    }

    fn tunnels(planned: &[Planned]) -> Vec<Result<(u16, IpNet), Refusal>> {
        planned
            .iter()
            .map(|p| p.tunnel.clone().map(|t| (t.port, t.seen_as)))
            .collect()
    }

    #[test]
    fn overlapping_peers_are_remapped_oldest_first_and_ports_taken_in_order() {
        let conns = vec![
            // Created later, listed first: still planned second.
            connection("b", 2, "10.200.0.0/16", None, None),
            connection("a", 1, "10.200.0.0/16", None, None),
            connection("c", 3, "10.201.0.0/16", Some("192.0.2.9:51820"), None),
            connection("d", 4, "10.202.0.0/16", None, None),
        ];
        let planned = plan(&local(), &conns, &BTreeMap::new(), &settings());
        let ids: Vec<_> = planned.iter().map(|p| p.peer_id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c", "d"]);
        assert_eq!(
            Refusal::PortsTaken {
                first: 51820,
                last: 51821
            }
            .to_string(),
            "every port of 51820-51821 is taken: widen --tunnel-ports"
        );
        assert_eq!(
            tunnels(&planned),
            vec![
                Ok((51820, net("100.64.0.0/16"))),
                Ok((51821, net("100.65.0.0/16"))),
                // Dialing: any port; disjoint: seen as it is.
                Ok((0, net("10.201.0.0/16"))),
                Err(Refusal::PortsTaken {
                    first: 51820,
                    last: 51821
                }),
            ]
        );
    }

    #[test]
    fn decisions_in_a_status_are_kept_while_valid() {
        let kept = ConnectionStatus {
            endpoint: Some("192.0.2.1:51821".into()),
            peer_seen_as: Some("100.70.0.0/16".into()),
            ..Default::default()
        };
        let planned = plan(
            &local(),
            &[connection("a", 1, "10.200.0.0/16", None, Some(kept))],
            &BTreeMap::new(),
            &settings(),
        );
        assert_eq!(tunnels(&planned), vec![Ok((51821, net("100.70.0.0/16")))]);
        // Behind a NodePort the endpoint's port is the node port: the port
        // kept is the one the tunnel listened on.
        let behind_a_service = ConnectionStatus {
            endpoint: Some("192.0.2.1:31007".into()),
            listen_port: Some(51821),
            peer_seen_as: Some("100.70.0.0/16".into()),
            ..Default::default()
        };
        let planned = plan(
            &local(),
            &[connection(
                "a",
                1,
                "10.200.0.0/16",
                None,
                Some(behind_a_service),
            )],
            &BTreeMap::new(),
            &settings(),
        );
        assert_eq!(tunnels(&planned), vec![Ok((51821, net("100.70.0.0/16")))]);
        // A kept view that now clashes with ours is decided again.
        let clashing = ConnectionStatus {
            peer_seen_as: Some("10.100.0.0/16".into()),
            ..Default::default()
        };
        let planned = plan(
            &local(),
            &[connection("a", 1, "10.200.0.0/16", None, Some(clashing))],
            &BTreeMap::new(),
            &settings(),
        );
        assert_eq!(tunnels(&planned), vec![Ok((51820, net("100.64.0.0/16")))]);
    }

    #[test]
    fn a_tenant_cannot_make_the_provider_dial_nor_take_two_tunnels() {
        let mut dialing = connection("a", 1, "10.1.0.0/16", Some("192.0.2.9:1"), None);
        Arc::make_mut(&mut dialing).metadata.namespace = Some("liqo-tenant-a".into());
        let mut second = connection("b", 2, "10.2.0.0/16", None, None);
        Arc::make_mut(&mut second).metadata.namespace = Some("liqo-tenant-a".into());
        let planned = plan(&local(), &[dialing, second], &BTreeMap::new(), &settings());
        let first = planned[0].tunnel.clone().expect("runs");
        assert_eq!((first.endpoint, first.port), (None, 51820));
        assert!(
            planned[1]
                .tunnel
                .as_ref()
                .is_err_and(|e| e.to_string().contains("one tunnel per peer")),
            "{:?}",
            planned[1].tunnel
        );
    }

    #[test]
    fn a_tenant_runs_only_with_the_pod_cidr_it_peered_with() {
        let pinned = BTreeMap::from([("liqo-tenant-a".to_owned(), "10.1.0.0/16".to_owned())]);
        let moved = connection("a", 1, "10.2.0.0/16", None, None);
        let planned = plan(&local(), &[moved], &pinned, &settings());
        assert!(
            planned[0]
                .tunnel
                .as_ref()
                .is_err_and(|e| e.to_string().contains("peered with 10.1.0.0/16")),
            "{:?}",
            planned[0].tunnel
        );
        let kept = connection("a", 1, "10.1.0.0/16", None, None);
        let planned = plan(&local(), &[kept], &pinned, &settings());
        assert_eq!(tunnels(&planned), vec![Ok((51820, net("10.1.0.0/16")))]);
        // Our own (dialing) connections are the administrator's: no pin.
        let ours = connection("b", 1, "10.3.0.0/16", Some("192.0.2.9:1"), None);
        let pinned = BTreeMap::from([("liqo".to_owned(), "10.9.0.0/16".to_owned())]);
        assert!(
            plan(&local(), &[ours], &pinned, &settings())[0]
                .tunnel
                .is_ok()
        );
    }

    #[test]
    fn a_peer_cannot_claim_our_networks_or_everything() {
        let planned = plan(
            &local(),
            &[
                // The node's LAN: remapped, never routed as it is.
                connection("a", 1, "192.168.1.0/24", None, None),
                connection("b", 2, "0.0.0.0/0", None, None),
                connection("c", 3, "not a cidr", None, None),
            ],
            &BTreeMap::new(),
            &settings(),
        );
        assert_eq!(tunnels(&planned)[0], Ok((51820, net("100.64.0.0/24"))));
        assert!(planned[1].tunnel.is_err(), "{:?}", planned[1].tunnel);
        assert!(planned[2].tunnel.is_err(), "{:?}", planned[2].tunnel);
    }
}
