//! What a name asks for in the consumer's cluster domain, and the records
//! that answer it, with nothing read from anywhere: the names server
//! ([`super`]) looks the Service up and hands it here.
//!
//! The names are those cluster DNS serves for Services (the Kubernetes DNS
//! specification): `<service>.<namespace>.svc.<domain>` (A or AAAA: the
//! cluster IP, or the ready endpoints of a headless Service),
//! `<hostname>.<service>.<namespace>.svc.<domain>` (an endpoint of a
//! headless Service) and `_<port>._<protocol>.<service>.<namespace>.svc.<domain>`
//! (SRV of a named port).

use std::net::IpAddr;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{A, AAAA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// How long an answer may be cached: short, since a Service's copy on the
/// provider can be made again with another address.
pub const TTL: u32 = 5;

/// What a name asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// `<service>.<namespace>.svc.<domain>`.
    Service { service: String, namespace: String },
    /// `<hostname>.<service>.<namespace>.svc.<domain>`.
    Endpoint {
        hostname: String,
        service: String,
        namespace: String,
    },
    /// `_<port>._<protocol>.<service>.<namespace>.svc.<domain>`.
    Port {
        port: String,
        protocol: String,
        service: String,
        namespace: String,
    },
    /// Another name of the cluster domain (pods, a search path tried with
    /// a name that was complete already): there is none such here.
    NoSuchName,
    /// A name outside the cluster domain.
    Elsewhere,
}

impl Asked {
    /// The namespace whose Service is asked for, if any.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Self::Service { namespace, .. }
            | Self::Endpoint { namespace, .. }
            | Self::Port { namespace, .. } => Some(namespace),
            Self::NoSuchName | Self::Elsewhere => None,
        }
    }

    /// The Service asked for, if any.
    pub fn service(&self) -> Option<&str> {
        match self {
            Self::Service { service, .. }
            | Self::Endpoint { service, .. }
            | Self::Port { service, .. } => Some(service),
            Self::NoSuchName | Self::Elsewhere => None,
        }
    }
}

/// Where a name is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zone {
    /// The consumer's cluster domain: its Services.
    Cluster,
    /// `clusterset.local`: the Services the consumer imports from its
    /// clusterset (ClusterSetIP ones: their clusterset IP is the cluster
    /// IP of a Service of the consumer's, whose copy answers here).
    Clusterset,
}

impl Zone {
    /// The Service that answers for `service` of this zone.
    pub fn service_name(self, service: &str) -> String {
        match self {
            Self::Cluster => service.to_owned(),
            Self::Clusterset => liqo_api::clusterset::derived_name(service),
        }
    }
}

/// What `name` (lower case, with or without its final dot) asks for, in
/// the cluster domain `domain` or the clusterset's zone, and in which.
pub fn asked_in_zones(name: &str, domain: &str) -> (Asked, Zone) {
    match asked(name, domain) {
        Asked::Elsewhere => (asked(name, liqo_api::clusterset::DOMAIN), Zone::Clusterset),
        found => (found, Zone::Cluster),
    }
}

/// What `name` (lower case, with or without its final dot) asks for in
/// the domain `domain`.
pub fn asked(name: &str, domain: &str) -> Asked {
    let name = name.trim_end_matches('.');
    let domain = domain.trim_end_matches('.');
    let in_domain = name == domain || name.ends_with(&format!(".{domain}"));
    if !in_domain {
        return Asked::Elsewhere;
    }
    let Some(rest) = name.strip_suffix(&format!(".svc.{domain}")) else {
        return Asked::NoSuchName;
    };
    let labels: Vec<&str> = rest.split('.').collect();
    let owned = |s: &str| s.to_owned();
    match labels.as_slice() {
        [service, namespace] => Asked::Service {
            service: owned(service),
            namespace: owned(namespace),
        },
        [hostname, service, namespace] if !hostname.starts_with('_') => Asked::Endpoint {
            hostname: owned(hostname),
            service: owned(service),
            namespace: owned(namespace),
        },
        [port, protocol, service, namespace] => {
            match (port.strip_prefix('_'), protocol.strip_prefix('_')) {
                (Some(port), Some(protocol)) if !port.is_empty() && !protocol.is_empty() => {
                    Asked::Port {
                        port: owned(port),
                        protocol: owned(protocol),
                        service: owned(service),
                        namespace: owned(namespace),
                    }
                }
                _ => Asked::NoSuchName,
            }
        }
        _ => Asked::NoSuchName,
    }
}

/// A Service as the names server sees its copy on the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceView {
    /// Its cluster IPs there; empty for a headless Service.
    pub cluster_ips: Vec<IpAddr>,
    /// Its ports: name, protocol, port.
    pub ports: Vec<(String, String, u16)>,
}

/// A ready endpoint of a headless Service, as the provider's pods reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointView {
    pub hostname: Option<String>,
    pub addresses: Vec<IpAddr>,
}

/// An answer: its code and records.
#[derive(Debug, Default)]
pub struct Answer {
    pub code: ResponseCode,
    pub answers: Vec<Record>,
    pub additionals: Vec<Record>,
}

impl Answer {
    fn no_such_name() -> Self {
        Self {
            code: ResponseCode::NXDomain,
            ..Self::default()
        }
    }
}

/// The answer to a question of `kind` about `name`, which asks for
/// `asked` of `service` (none: no such Service), whose ready endpoints are
/// `endpoints` when it is headless.
pub fn answer(
    name: &Name,
    kind: RecordType,
    asked: &Asked,
    service: Option<&ServiceView>,
    endpoints: &[EndpointView],
    domain: &str,
) -> Answer {
    let Some(service) = service else {
        return Answer::no_such_name();
    };
    let headless = service.cluster_ips.is_empty();
    let mut out = Answer::default();
    match asked {
        Asked::Service { .. } => {
            let ips: Vec<IpAddr> = if headless {
                endpoints
                    .iter()
                    .flat_map(|e| e.addresses.iter().copied())
                    .collect()
            } else {
                service.cluster_ips.clone()
            };
            out.answers = addresses(name, kind, &ips);
        }
        Asked::Endpoint { hostname, .. } => {
            let Some(endpoint) = endpoints
                .iter()
                .find(|e| headless && endpoint_label(e).as_deref() == Some(hostname.as_str()))
            else {
                return Answer::no_such_name();
            };
            out.answers = addresses(name, kind, &endpoint.addresses);
        }
        Asked::Port {
            port,
            protocol,
            service: svc,
            namespace,
        } => {
            let Some((_, _, number)) = service
                .ports
                .iter()
                .find(|(n, p, _)| n == port && p.eq_ignore_ascii_case(protocol))
            else {
                return Answer::no_such_name();
            };
            if kind != RecordType::SRV && kind != RecordType::ANY {
                return out;
            }
            let base = format!("{svc}.{namespace}.svc.{domain}.");
            let targets: Vec<(String, Vec<IpAddr>)> = if headless {
                endpoints
                    .iter()
                    .filter_map(|e| {
                        Some((
                            format!("{}.{base}", endpoint_label(e)?),
                            e.addresses.clone(),
                        ))
                    })
                    .collect()
            } else {
                vec![(base, service.cluster_ips.clone())]
            };
            let weight = u16::try_from(100 / targets.len().max(1)).unwrap_or(100);
            for (target, ips) in targets {
                let Ok(target) = Name::from_ascii(&target) else {
                    continue;
                };
                out.answers.push(Record::from_rdata(
                    name.clone(),
                    TTL,
                    RData::SRV(SRV::new(0, weight, *number, target.clone())),
                ));
                out.additionals
                    .extend(addresses(&target, RecordType::ANY, &ips));
            }
        }
        Asked::NoSuchName | Asked::Elsewhere => return Answer::no_such_name(),
    }
    out
}

/// The label an endpoint of a headless Service is named by: its hostname,
/// or its first address with dashes (as cluster DNS names them).
fn endpoint_label(endpoint: &EndpointView) -> Option<String> {
    endpoint.hostname.clone().or_else(|| {
        endpoint
            .addresses
            .first()
            .map(|ip| ip.to_string().replace(['.', ':'], "-"))
    })
}

/// The A or AAAA records of `ips` that a question of `kind` asks for.
fn addresses(name: &Name, kind: RecordType, ips: &[IpAddr]) -> Vec<Record> {
    ips.iter()
        .filter_map(|ip| {
            let rdata = match (ip, kind) {
                (IpAddr::V4(ip), RecordType::A | RecordType::ANY) => RData::A(A(*ip)),
                (IpAddr::V6(ip), RecordType::AAAA | RecordType::ANY) => RData::AAAA(AAAA(*ip)),
                _ => return None,
            };
            Some(Record::from_rdata(name.clone(), TTL, rdata))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOMAIN: &str = "cluster.local";

    fn service(s: &str, ns: &str) -> Asked {
        Asked::Service {
            service: s.to_owned(),
            namespace: ns.to_owned(),
        }
    }

    #[test]
    fn names_of_the_cluster_domain_are_read_as_cluster_dns_reads_them() {
        let table = [
            ("web.shop.svc.cluster.local.", service("web", "shop")),
            ("web.shop.svc.cluster.local", service("web", "shop")),
            (
                "db-0.db.shop.svc.cluster.local.",
                Asked::Endpoint {
                    hostname: "db-0".to_owned(),
                    service: "db".to_owned(),
                    namespace: "shop".to_owned(),
                },
            ),
            (
                "_http._tcp.web.shop.svc.cluster.local.",
                Asked::Port {
                    port: "http".to_owned(),
                    protocol: "tcp".to_owned(),
                    service: "web".to_owned(),
                    namespace: "shop".to_owned(),
                },
            ),
            // A search path tried with a name complete already.
            (
                "web.shop.svc.cluster.local.shop.svc.cluster.local.",
                Asked::NoSuchName,
            ),
            ("10-0-0-1.shop.pod.cluster.local.", Asked::NoSuchName),
            ("shop.svc.cluster.local.", Asked::NoSuchName),
            ("cluster.local.", Asked::NoSuchName),
            ("_http.web.shop.svc.cluster.local.", Asked::NoSuchName),
            ("http.tcp.web.shop.svc.cluster.local.", Asked::NoSuchName),
            ("example.com.", Asked::Elsewhere),
            ("notcluster.local.", Asked::Elsewhere),
            ("web.shop.svc.clusterset.local.", Asked::Elsewhere),
        ];
        for (name, want) in table {
            assert_eq!(asked(name, DOMAIN), want, "{name}");
        }
        assert_eq!(
            asked("web.shop.svc.corp.example.", "corp.example"),
            service("web", "shop")
        );
    }

    #[test]
    fn clusterset_names_are_answered_by_the_service_of_the_clusterset_ip() {
        let table = [
            (
                "web.shop.svc.cluster.local.",
                service("web", "shop"),
                Zone::Cluster,
                "web",
            ),
            (
                "web.shop.svc.clusterset.local.",
                service("web", "shop"),
                Zone::Clusterset,
                "liqo-mcs-web",
            ),
            (
                "_http._tcp.web.shop.svc.clusterset.local",
                Asked::Port {
                    port: "http".to_owned(),
                    protocol: "tcp".to_owned(),
                    service: "web".to_owned(),
                    namespace: "shop".to_owned(),
                },
                Zone::Clusterset,
                "liqo-mcs-web",
            ),
            // A headless import's endpoint: no Service holds it here.
            (
                "db-0.cluster-a.db.shop.svc.clusterset.local.",
                Asked::NoSuchName,
                Zone::Clusterset,
                "",
            ),
            ("example.com.", Asked::Elsewhere, Zone::Clusterset, ""),
        ];
        for (text, want, zone, answered_by) in table {
            let (got, got_zone) = asked_in_zones(text, DOMAIN);
            assert_eq!((&got, got_zone), (&want, zone), "{text}");
            if let Some(service) = got.service() {
                assert_eq!(zone.service_name(service), answered_by, "{text}");
            }
        }
    }

    #[test]
    fn a_clusterset_srv_record_names_the_clusterset_name() {
        let asked = Asked::Port {
            port: "http".to_owned(),
            protocol: "tcp".to_owned(),
            service: "web".to_owned(),
            namespace: "shop".to_owned(),
        };
        let view = ServiceView {
            cluster_ips: vec![ip("10.96.0.7")],
            ports: vec![("http".to_owned(), "TCP".to_owned(), 80)],
        };
        let out = answer(
            &name("_http._tcp.web.shop.svc.clusterset.local."),
            RecordType::SRV,
            &asked,
            Some(&view),
            &[],
            liqo_api::clusterset::DOMAIN,
        );
        assert_eq!(rdata(&out), ["0 100 80 web.shop.svc.clusterset.local."]);
    }

    fn name(s: &str) -> Name {
        Name::from_ascii(s).expect("a name")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    fn rdata(answer: &Answer) -> Vec<String> {
        answer
            .answers
            .iter()
            .map(|r| r.data().to_string())
            .collect()
    }

    #[test]
    fn a_service_is_its_cluster_ip_and_a_headless_one_its_ready_endpoints() {
        let asked = service("web", "shop");
        let n = name("web.shop.svc.cluster.local.");
        let clustered = ServiceView {
            cluster_ips: vec![ip("10.96.0.7")],
            ports: vec![],
        };
        let got = answer(&n, RecordType::A, &asked, Some(&clustered), &[], DOMAIN);
        assert_eq!(got.code, ResponseCode::NoError);
        assert_eq!(rdata(&got), ["10.96.0.7"]);
        // Asked for IPv6 of an IPv4 Service: the name is there, no record.
        let got = answer(&n, RecordType::AAAA, &asked, Some(&clustered), &[], DOMAIN);
        assert_eq!((got.code, got.answers.len()), (ResponseCode::NoError, 0));

        let headless = ServiceView {
            cluster_ips: vec![],
            ports: vec![],
        };
        let endpoints = [
            EndpointView {
                hostname: Some("db-0".to_owned()),
                addresses: vec![ip("10.71.0.4")],
            },
            EndpointView {
                hostname: None,
                addresses: vec![ip("10.202.0.9")],
            },
        ];
        let got = answer(
            &n,
            RecordType::A,
            &asked,
            Some(&headless),
            &endpoints,
            DOMAIN,
        );
        assert_eq!(rdata(&got), ["10.71.0.4", "10.202.0.9"]);

        let one = |host: &str| Asked::Endpoint {
            hostname: host.to_owned(),
            service: "web".to_owned(),
            namespace: "shop".to_owned(),
        };
        let got = answer(
            &n,
            RecordType::A,
            &one("db-0"),
            Some(&headless),
            &endpoints,
            DOMAIN,
        );
        assert_eq!(rdata(&got), ["10.71.0.4"]);
        let got = answer(
            &n,
            RecordType::A,
            &one("10-202-0-9"),
            Some(&headless),
            &endpoints,
            DOMAIN,
        );
        assert_eq!(rdata(&got), ["10.202.0.9"]);
        let got = answer(
            &n,
            RecordType::A,
            &one("db-1"),
            Some(&headless),
            &endpoints,
            DOMAIN,
        );
        assert_eq!(got.code, ResponseCode::NXDomain);
        // An endpoint name of a Service that has a cluster IP: none.
        let got = answer(
            &n,
            RecordType::A,
            &one("db-0"),
            Some(&clustered),
            &endpoints,
            DOMAIN,
        );
        assert_eq!(got.code, ResponseCode::NXDomain);

        let got = answer(&n, RecordType::A, &asked, None, &[], DOMAIN);
        assert_eq!(got.code, ResponseCode::NXDomain);
    }

    #[test]
    fn a_named_port_is_a_srv_record_to_the_service_or_each_endpoint() {
        let port = Asked::Port {
            port: "http".to_owned(),
            protocol: "tcp".to_owned(),
            service: "web".to_owned(),
            namespace: "shop".to_owned(),
        };
        let n = name("_http._tcp.web.shop.svc.cluster.local.");
        let view = ServiceView {
            cluster_ips: vec![ip("10.96.0.7")],
            ports: vec![("http".to_owned(), "TCP".to_owned(), 8080)],
        };
        let got = answer(&n, RecordType::SRV, &port, Some(&view), &[], DOMAIN);
        assert_eq!(rdata(&got), ["0 100 8080 web.shop.svc.cluster.local."]);
        assert_eq!(
            got.additionals
                .iter()
                .map(|r| r.data().to_string())
                .collect::<Vec<_>>(),
            ["10.96.0.7"]
        );
        let headless = ServiceView {
            cluster_ips: vec![],
            ..view.clone()
        };
        let endpoints = [EndpointView {
            hostname: Some("db-0".to_owned()),
            addresses: vec![ip("10.71.0.4")],
        }];
        let got = answer(
            &n,
            RecordType::SRV,
            &port,
            Some(&headless),
            &endpoints,
            DOMAIN,
        );
        assert_eq!(rdata(&got), ["0 100 8080 db-0.web.shop.svc.cluster.local."]);
        let udp = Asked::Port {
            port: "http".to_owned(),
            protocol: "udp".to_owned(),
            service: "web".to_owned(),
            namespace: "shop".to_owned(),
        };
        let got = answer(&n, RecordType::SRV, &udp, Some(&view), &[], DOMAIN);
        assert_eq!(got.code, ResponseCode::NXDomain);
    }
}
