//! The names server of the offloaded pods: DNS over UDP and TCP on the
//! agent's pod IP, which the offloaded pods reach through the tunnel
//! (by the Service [`crate::reflection::nameserver`] keeps in each
//! twin), so that they resolve the consumer's names as they would at
//! home, whatever their twin namespace is called (docs/offloading.md,
//! "Names").
//!
//! - `<service>.<namespace>.svc.<domain>` and the other names of a
//!   Service ([`query`]) of a namespace offloaded to this provider: the
//!   address of its copy in the twin (the provider's cluster IP, or the
//!   ready endpoints of a headless Service as the provider lists them).
//! - `<service>.<namespace>.svc.clusterset.local` (and its ports' SRV
//!   names) of a ClusterSetIP Service the consumer imports into such a
//!   namespace: the address of the copy of the Service that holds its
//!   clusterset IP there (`liqo-mcs-<service>`), so that the endpoints
//!   the provider reaches answer.
//! - Any other name of the cluster domain or of `clusterset.local`: no
//!   such name (the consumer's other Services are not reachable from the
//!   provider).
//! - Names outside it: relayed as they are to this pod's own resolver
//!   (the first `nameserver` of its `/etc/resolv.conf`), which answers as
//!   it would at home.
//!
//! It keeps nothing: every answer is read from the stores of the
//! reflection (the twins, the copies of the Services) or, for a headless
//! Service's endpoints, from the provider's API.

pub mod query;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{Semaphore, watch};

use crate::provider::ProviderClient;
use crate::reflection::namespace::Twins;
use crate::reflection::stores::PerNamespace;
use query::{Asked, EndpointView, ServiceView, Zone};

/// How long a question relayed to this pod's resolver, or a read of the
/// provider's API, may take.
const PATIENCE: Duration = Duration::from_secs(2);
/// How many questions are answered at once; more wait.
const AT_ONCE: usize = 256;
/// The largest message over UDP.
const UDP_SIZE: usize = 4096;

/// What the names are read from.
#[allow(missing_debug_implementations)] // kube::Client is not Debug.
pub struct Names {
    pub domain: String,
    pub twins: watch::Receiver<Twins>,
    /// The copies of the Services in the twins.
    pub services: Arc<PerNamespace<Service>>,
    pub provider: watch::Receiver<ProviderClient>,
    /// This pod's own resolver, for names outside the cluster domain.
    pub upstream: Option<SocketAddr>,
}

/// The first `nameserver` of a `resolv.conf`.
pub fn upstream_of(resolv_conf: &str) -> Option<SocketAddr> {
    resolv_conf.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("nameserver"))
            .then(|| words.next()?.parse::<IpAddr>().ok())
            .flatten()
            .map(|ip| SocketAddr::new(ip, 53))
    })
}

/// Serves `names` on `addr` (UDP and TCP) until the process ends.
pub async fn serve(addr: SocketAddr, names: Names) -> anyhow::Result<()> {
    let udp = Arc::new(
        UdpSocket::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("binding the names server to {addr}/udp: {e}"))?,
    );
    let tcp = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding the names server to {addr}/tcp: {e}"))?;
    tracing::info!(%addr, domain = %names.domain, "names server listening");
    let names = Arc::new(names);
    let slots = Arc::new(Semaphore::new(AT_ONCE));
    let over_udp = {
        let (names, slots, udp) = (names.clone(), slots.clone(), udp.clone());
        async move {
            let mut buf = vec![0u8; UDP_SIZE];
            loop {
                let Ok((n, from)) = udp.recv_from(&mut buf).await else {
                    continue;
                };
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let question = buf[..n].to_vec();
                let (names, udp) = (names.clone(), udp.clone());
                tokio::spawn(async move {
                    if let Some(reply) = names.reply(&question, false).await {
                        let _ = udp.send_to(&reply, from).await;
                    }
                    drop(slot);
                });
            }
        }
    };
    let over_tcp = async move {
        loop {
            let Ok((mut stream, _)) = tcp.accept().await else {
                continue;
            };
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let names = names.clone();
            tokio::spawn(async move {
                // One question after another on a connection, each with
                // its two-byte length, as DNS over TCP frames them.
                while let Ok(Ok(len)) = tokio::time::timeout(PATIENCE * 5, stream.read_u16()).await
                {
                    let mut question = vec![0u8; usize::from(len)];
                    if stream.read_exact(&mut question).await.is_err() {
                        break;
                    }
                    let Some(reply) = names.reply(&question, true).await else {
                        break;
                    };
                    let Ok(len) = u16::try_from(reply.len()) else {
                        break;
                    };
                    if stream.write_u16(len).await.is_err()
                        || stream.write_all(&reply).await.is_err()
                    {
                        break;
                    }
                }
                drop(slot);
            });
        }
    };
    tokio::join!(over_udp, over_tcp);
    Ok(())
}

impl Names {
    /// The reply to the message `question`, or none for what is not a
    /// question.
    async fn reply(&self, question: &[u8], tcp: bool) -> Option<Vec<u8>> {
        let message = Message::from_vec(question).ok()?;
        if message.message_type() != MessageType::Query {
            return None;
        }
        let Some(query) = message.queries().first() else {
            return respond(&message, ResponseCode::FormErr, query::Answer::default());
        };
        let name = query.name().to_lowercase();
        let (asked, zone) = query::asked_in_zones(&name.to_ascii(), &self.domain);
        if asked == Asked::Elsewhere {
            return Some(match self.relay(question, tcp).await {
                Some(reply) => reply,
                None => respond(&message, ResponseCode::ServFail, query::Answer::default())?,
            });
        }
        let (service, endpoints) = match self.service_of(&asked, zone).await {
            Ok(found) => found,
            Err(()) => {
                return respond(&message, ResponseCode::ServFail, query::Answer::default());
            }
        };
        let answer = query::answer(
            query.name(),
            query.query_type(),
            &asked,
            service.as_ref(),
            &endpoints,
            match zone {
                Zone::Cluster => &self.domain,
                Zone::Clusterset => liqo_api::clusterset::DOMAIN,
            },
        );
        respond(&message, answer.code, answer)
    }

    /// The Service `asked` names, as its copy on the provider is, and its
    /// ready endpoints there when it is headless; `Err` when the provider
    /// could not say.
    async fn service_of(
        &self,
        asked: &Asked,
        zone: Zone,
    ) -> Result<(Option<ServiceView>, Vec<EndpointView>), ()> {
        let (Some(namespace), Some(name)) = (asked.namespace(), asked.service()) else {
            return Ok((None, Vec::new()));
        };
        let name = zone.service_name(name);
        let name = name.as_str();
        let Some(twin) = self.twins.borrow().get(namespace).cloned() else {
            return Ok((None, Vec::new()));
        };
        let Some(store) = self.services.current(&twin) else {
            return Err(());
        };
        let Some(copy) = store.store.get(&twin, name) else {
            return Ok((None, Vec::new()));
        };
        let view = service_view(&copy);
        if !view.cluster_ips.is_empty() {
            return Ok((Some(view), Vec::new()));
        }
        let endpoints = self.ready_endpoints(&twin, name).await?;
        Ok((Some(view), endpoints))
    }

    /// The ready endpoints of Service `name` of `twin`, from every
    /// EndpointSlice of it there (the provider's own, for the offloaded
    /// pods, and the copies of the consumer's).
    async fn ready_endpoints(&self, twin: &str, name: &str) -> Result<Vec<EndpointView>, ()> {
        let Ok(client) = self.provider.borrow().clone() else {
            return Err(());
        };
        let api: Api<EndpointSlice> = Api::namespaced(client, twin);
        let params = ListParams::default().labels(&format!("kubernetes.io/service-name={name}"));
        let list = tokio::time::timeout(PATIENCE, api.list(&params))
            .await
            .map_err(|_| ())?
            .map_err(|_| ())?;
        Ok(list
            .items
            .iter()
            .flat_map(|slice| slice.endpoints.iter())
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
            .map(|e| EndpointView {
                hostname: e.hostname.clone(),
                addresses: e.addresses.iter().filter_map(|a| a.parse().ok()).collect(),
            })
            .collect())
    }

    /// `question` relayed as it is to this pod's resolver, and its reply.
    async fn relay(&self, question: &[u8], tcp: bool) -> Option<Vec<u8>> {
        let upstream = self.upstream?;
        let ask = async {
            if tcp {
                let mut stream = tokio::net::TcpStream::connect(upstream).await.ok()?;
                stream
                    .write_u16(u16::try_from(question.len()).ok()?)
                    .await
                    .ok()?;
                stream.write_all(question).await.ok()?;
                let len = stream.read_u16().await.ok()?;
                let mut reply = vec![0u8; usize::from(len)];
                stream.read_exact(&mut reply).await.ok()?;
                Some(reply)
            } else {
                let local: SocketAddr = if upstream.is_ipv4() {
                    ([0, 0, 0, 0], 0).into()
                } else {
                    (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
                };
                let socket = UdpSocket::bind(local).await.ok()?;
                socket.send_to(question, upstream).await.ok()?;
                let mut reply = vec![0u8; UDP_SIZE];
                loop {
                    let (n, from) = socket.recv_from(&mut reply).await.ok()?;
                    if from == upstream {
                        reply.truncate(n);
                        return Some(reply);
                    }
                }
            }
        };
        tokio::time::timeout(PATIENCE, ask).await.ok().flatten()
    }
}

/// What the names server reads of a Service's copy.
fn service_view(service: &Service) -> ServiceView {
    let spec = service.spec.as_ref();
    let cluster_ips = spec
        .and_then(|s| {
            s.cluster_ips
                .clone()
                .or_else(|| s.cluster_ip.clone().map(|ip| vec![ip]))
        })
        .unwrap_or_default()
        .iter()
        .filter_map(|ip| ip.parse().ok())
        .collect();
    let ports = spec
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some((
                p.name.clone()?,
                p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
                u16::try_from(p.port).ok()?,
            ))
        })
        .collect();
    ServiceView { cluster_ips, ports }
}

/// The reply to `question` with `code` and `answer`'s records, as the
/// authority of the cluster domain.
fn respond(question: &Message, code: ResponseCode, answer: query::Answer) -> Option<Vec<u8>> {
    let mut reply = Message::new();
    reply
        .set_id(question.id())
        .set_message_type(MessageType::Response)
        .set_op_code(question.op_code())
        .set_recursion_desired(question.recursion_desired())
        .set_recursion_available(true)
        .set_authoritative(true)
        .set_response_code(code);
    reply.add_queries(question.queries().iter().cloned());
    reply.add_answers(answer.answers);
    reply.add_additionals(answer.additionals);
    reply.to_vec().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::RecordType;

    #[test]
    fn the_resolver_is_the_first_nameserver_of_resolv_conf() {
        let conf = "search shop.svc.cluster.local svc.cluster.local\n\
                    # a comment\n\
                    nameserver 10.96.0.10\n\
                    nameserver 10.96.0.11\n\
                    options ndots:5\n";
        assert_eq!(
            upstream_of(conf),
            Some("10.96.0.10:53".parse().expect("an address"))
        );
        assert_eq!(
            upstream_of("nameserver fd00::a\n"),
            Some("[fd00::a]:53".parse().expect("an address"))
        );
        assert_eq!(upstream_of("search x\n"), None);
        assert_eq!(upstream_of("nameserver not-an-ip\n"), None);
    }

    #[test]
    fn a_reply_answers_the_question_it_was_asked() {
        let mut question = Message::new();
        question.set_id(4242).set_recursion_desired(true);
        question.add_query(hickory_proto::op::Query::query(
            hickory_proto::rr::Name::from_ascii("web.shop.svc.cluster.local.").expect("a name"),
            RecordType::A,
        ));
        let reply =
            respond(&question, ResponseCode::NXDomain, query::Answer::default()).expect("a reply");
        let reply = Message::from_vec(&reply).expect("a message");
        assert_eq!(reply.id(), 4242);
        assert_eq!(reply.message_type(), MessageType::Response);
        assert_eq!(reply.response_code(), ResponseCode::NXDomain);
        assert!(reply.authoritative() && reply.recursion_desired());
        assert_eq!(reply.queries(), question.queries());
    }
}
