//! Where peers dial a listening tunnel: the host given to the agent, or
//! what the Service in front of the tunnels says; and where the tunnels
//! bind.

use k8s_openapi::api::core::v1::Service;
use liqo_api::networking::GatewayServiceType;

/// Why a listening tunnel has no endpoint to publish: what the Service in
/// front of the tunnels lacks, and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotExposed {
    #[error("Service {} does not exist: install again", liqo_api::names::GATEWAY)]
    NoService,
    #[error(
        "Service {} is of type {actual}, not {}: install again",
        liqo_api::names::GATEWAY,
        wanted.as_str()
    )]
    WrongType {
        actual: String,
        wanted: GatewayServiceType,
    },
    #[error(
        "Service {} has no UDP port {port}: install again with the same --tunnel-ports",
        liqo_api::names::GATEWAY
    )]
    NoPort { port: u16 },
    #[error("Service {} has no node port for {port} yet", liqo_api::names::GATEWAY)]
    NoNodePort { port: u16 },
    #[error(
        "waiting for Service {}'s load balancer to be given an address",
        liqo_api::names::GATEWAY
    )]
    NoAddress,
}

/// Where peers dial a listening tunnel on `port`: `host` at that port, or,
/// with a Service in front (`exposed`), at the node port it maps the port
/// to (NodePort), or at the load balancer's address unless `host` names
/// one (LoadBalancer). `None` when there is no host to publish; an error
/// says what the Service lacks.
pub fn published_endpoint(
    host: Option<&str>,
    exposed: Option<(GatewayServiceType, Option<&Service>)>,
    port: u16,
) -> Result<Option<String>, NotExposed> {
    let Some((kind, service)) = exposed else {
        return Ok(host.map(|h| join_host_port(h, port)));
    };
    let service = service.ok_or(NotExposed::NoService)?;
    let spec = service.spec.as_ref();
    let actual = spec.and_then(|s| s.type_.as_deref()).unwrap_or("ClusterIP");
    if actual != kind.as_str() {
        return Err(NotExposed::WrongType {
            actual: actual.to_owned(),
            wanted: kind,
        });
    }
    let entry = spec
        .and_then(|s| s.ports.as_ref())
        .and_then(|ports| {
            ports.iter().find(|p| {
                p.port == i32::from(port) && p.protocol.as_deref().unwrap_or("TCP") == "UDP"
            })
        })
        .ok_or(NotExposed::NoPort { port })?;
    match kind {
        GatewayServiceType::NodePort => {
            let node_port = entry
                .node_port
                .and_then(|p| u16::try_from(p).ok())
                .ok_or(NotExposed::NoNodePort { port })?;
            Ok(host.map(|h| join_host_port(h, node_port)))
        }
        GatewayServiceType::LoadBalancer => {
            if let Some(host) = host {
                return Ok(Some(join_host_port(host, port)));
            }
            let ingress = service
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .and_then(|i| i.first())
                .and_then(|i| i.ip.clone().or_else(|| i.hostname.clone()))
                .ok_or(NotExposed::NoAddress)?;
            Ok(Some(join_host_port(&ingress, port)))
        }
    }
}

/// Where tunnels bind for an endpoint host (see
/// [`Settings::listen_address`]): the host itself when it is an address
/// this node can bind.
pub fn listen_address(endpoint_host: Option<&str>) -> std::net::IpAddr {
    endpoint_host
        .and_then(|h| h.parse::<std::net::IpAddr>().ok())
        .filter(|ip| std::net::UdpSocket::bind((*ip, 0)).is_ok())
        .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into())
}

/// `host:port`, with an IPv6 address in brackets.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(kind: &str, node_port: Option<i32>, ingress: Option<&str>) -> Service {
        use k8s_openapi::api::core::v1::{
            LoadBalancerIngress, LoadBalancerStatus, ServicePort, ServiceSpec, ServiceStatus,
        };
        Service {
            spec: Some(ServiceSpec {
                type_: Some(kind.into()),
                ports: Some(vec![ServicePort {
                    port: 51820,
                    protocol: Some("UDP".into()),
                    node_port,
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: ingress.map(|ip| ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(vec![LoadBalancerIngress {
                        ip: Some(ip.into()),
                        ..Default::default()
                    }]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Host, Service in front, port, and the endpoint or error expected.
    type Case<'a> = (
        Option<&'a str>,
        Option<(GatewayServiceType, Option<&'a Service>)>,
        u16,
        Result<Option<&'a str>, &'a str>,
    );

    #[test]
    fn the_published_endpoint_follows_the_service_in_front() {
        use GatewayServiceType::{LoadBalancer, NodePort};
        let node_port = service("NodePort", Some(31000), None);
        let balanced = service("LoadBalancer", Some(31000), Some("203.0.113.7"));
        let pending = service("LoadBalancer", None, None);
        let cases: [Case; 9] = [
            (Some("192.0.2.1"), None, 51820, Ok(Some("192.0.2.1:51820"))),
            (None, None, 51820, Ok(None)),
            (Some("fd00::1"), None, 51820, Ok(Some("[fd00::1]:51820"))),
            (
                Some("192.0.2.1"),
                Some((NodePort, Some(&node_port))),
                51820,
                Ok(Some("192.0.2.1:31000")),
            ),
            (
                None,
                Some((LoadBalancer, Some(&balanced))),
                51820,
                Ok(Some("203.0.113.7:51820")),
            ),
            // An address given by the administrator wins over the ingress.
            (
                Some("gw.example.com"),
                Some((LoadBalancer, Some(&balanced))),
                51820,
                Ok(Some("gw.example.com:51820")),
            ),
            (
                None,
                Some((LoadBalancer, Some(&pending))),
                51820,
                Err("waiting for Service liqo-gateway's load balancer to be given an address"),
            ),
            (
                Some("192.0.2.1"),
                Some((NodePort, Some(&node_port))),
                51821,
                Err(
                    "Service liqo-gateway has no UDP port 51821: install again with the same --tunnel-ports",
                ),
            ),
            (
                Some("192.0.2.1"),
                Some((NodePort, None)),
                51820,
                Err("Service liqo-gateway does not exist: install again"),
            ),
        ];
        for (host, exposed, port, want) in cases {
            let got = published_endpoint(host, exposed, port);
            assert_eq!(
                got.as_ref()
                    .map(|e| e.as_deref())
                    .map_err(ToString::to_string),
                want.map_err(str::to_owned),
                "{host:?} {:?} {port}",
                exposed.map(|(k, _)| k)
            );
        }
        let wrong = published_endpoint(Some("h"), Some((LoadBalancer, Some(&node_port))), 51820);
        assert_eq!(
            wrong.map_err(|e| e.to_string()),
            Err("Service liqo-gateway is of type NodePort, not LoadBalancer: install again".into())
        );
    }

    #[test]
    fn ipv6_hosts_are_bracketed() {
        assert_eq!(join_host_port("192.0.2.1", 5), "192.0.2.1:5");
        assert_eq!(join_host_port("2001:db8::1", 5), "[2001:db8::1]:5");
        assert_eq!(join_host_port("gw.example.com", 5), "gw.example.com:5");
    }
}
