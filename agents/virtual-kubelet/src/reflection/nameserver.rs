//! The way offloaded pods reach the names server ([`crate::dns`]): in
//! every twin, the Service [`NAMESERVER_SERVICE`] (no selector, port 53
//! over UDP and TCP) and its one EndpointSlice, whose endpoint is this
//! agent's pod IP as the provider sees it through the tunnel. The
//! Service's cluster IP outlives the agent's restarts, so it is what the
//! offloaded pods are given as their nameserver
//! ([`crate::forge::pod::dns`]); the slice follows the agent's address.
//!
//! Published per offloaded namespace ([`Nameservers`]): the address the
//! twin's pods are given, or [`Nameserver::Provider`] when there is no
//! tunnel (or no names server): those pods use the provider's DNS, which
//! resolves the short names of the Services copied into their twin.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, PostParams};
use kube::core::ObjectMeta;
use liqo_api::names::labels;
use tokio::sync::watch;

use super::namespace::{PeeringContext, Twins};
use super::{Error, Kind, Next, NotYet};
use crate::forge::exposition::{
    ENDPOINTSLICE_MANAGED_BY, ENDPOINTSLICE_MANAGER, SERVICE_NAME_LABEL,
};

/// The Service of the names server in every twin: a name the consumer's
/// Services may not take in an offloaded namespace (one that does is not
/// copied, docs/offloading.md, "Names").
pub const NAMESERVER_SERVICE: &str = "liqo-dns";

/// How often a twin's Service and slice are looked at again: the
/// provider's side is not watched for them.
const VERIFY_PERIOD: Duration = Duration::from_secs(30);
/// How long the pods of a namespace wait for its names server (the
/// provider to say where it sees this cluster's pods, the twin's Service
/// to be made) before they are given the provider's DNS.
const PATIENCE: Duration = Duration::from_secs(30);

/// Where the pods of an offloaded namespace resolve names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nameserver {
    /// At this cluster IP of their twin: the names server, as at home.
    At(IpAddr),
    /// With the provider's DNS.
    Provider,
}

/// Per offloaded namespace, where its pods resolve names; a namespace
/// not in it was not looked at yet.
pub type Nameservers = BTreeMap<String, Nameserver>;

/// The Kind that keeps the twins' Services of the names server.
#[allow(missing_debug_implementations)] // PeeringContext holds clients.
pub struct NameserverServices {
    pub peering: PeeringContext,
    pub twins: watch::Receiver<Twins>,
    /// This agent's pod IP and the port of its names server, when it
    /// serves names.
    pub serving: Option<(IpAddr, u16)>,
    pub published: watch::Sender<Nameservers>,
    /// When each namespace was first looked at.
    pub first_seen: std::sync::Mutex<BTreeMap<String, std::time::Instant>>,
}

impl NameserverServices {
    fn publish(&self, namespace: &str, nameserver: Nameserver) {
        self.published.send_if_modified(|all| {
            all.insert(namespace.to_owned(), nameserver) != Some(nameserver)
        });
    }
}

impl Kind for NameserverServices {
    type Key = String;
    const NAME: &'static str = "nameservers";

    fn keys(&self) -> Vec<String> {
        let twins = self.twins.borrow().clone();
        self.published.send_if_modified(|all| {
            let before = all.len();
            all.retain(|ns, _| twins.contains_key(ns));
            all.len() != before
        });
        twins.into_keys().collect()
    }

    async fn converge(&self, namespace: &String) -> Result<Next, Error> {
        let Some(twin) = self.twins.borrow().get(namespace).cloned() else {
            return Ok(Next::Done);
        };
        let since = *self
            .first_seen
            .lock()
            .map_err(|_| NotYet::Nameserver(namespace.clone()))?
            .entry(namespace.clone())
            .or_insert_with(std::time::Instant::now);
        let patient = since.elapsed() < PATIENCE;
        let seen = *self.peering.seen_there.borrow();
        // An address no peer can be sent to (a pod of the host's
        // loopback): no names server for the provider's pods.
        let serving = self
            .serving
            .filter(|(ip, _)| !(ip.is_loopback() || ip.is_unspecified()));
        let (Some((ip, port)), Some(seen)) = (serving, seen) else {
            // A tunnel set up here whose far end has not spoken yet (an
            // agent just started): its pods wait a while for it.
            let tunnel_here = self
                .peering
                .tunnel
                .as_ref()
                .is_some_and(|t| !t.store.state().is_empty());
            if serving.is_some() && tunnel_here && patient {
                return Ok(Next::After(Duration::from_secs(1)));
            }
            self.publish(namespace, Nameserver::Provider);
            return Ok(Next::After(VERIFY_PERIOD));
        };
        let seen_at: IpAddr = seen.address(&ip.to_string()).parse().unwrap_or(ip);
        match self.keep(&twin, seen_at, port).await {
            Ok(nameserver) => {
                self.publish(namespace, nameserver);
                Ok(Next::After(VERIFY_PERIOD))
            }
            // While it may still come (the twin's share of the grant not
            // written yet), its pods wait; then they go on with the
            // provider's DNS, and the next ones get it once it comes.
            Err(error) if patient => Err(error),
            Err(error) => {
                let undecided = self.published.borrow().get(namespace).is_none();
                if undecided {
                    tracing::warn!(%twin, %error, "no names server in the twin: its pods use the provider's DNS");
                    self.publish(namespace, Nameserver::Provider);
                }
                Ok(Next::After(VERIFY_PERIOD))
            }
        }
    }
}

impl NameserverServices {
    /// Keeps the names server's Service and slice in `twin`, the slice on
    /// `address`:`port`; returns where the twin's pods resolve names.
    async fn keep(&self, twin: &str, address: IpAddr, port: u16) -> Result<Nameserver, Error> {
        let client = self.peering.provider_client()?;
        let services: Api<Service> = Api::namespaced(client.clone(), twin);
        let slices: Api<EndpointSlice> = Api::namespaced(client, twin);
        let failed = |source: kube::Error| Error::Nameserver {
            twin: twin.to_owned(),
            source,
        };
        let service = match services.get_opt(NAMESERVER_SERVICE).await.map_err(failed)? {
            Some(found) if is_ours(&found.metadata) => found,
            Some(_) => {
                tracing::warn!(%twin, "{NAMESERVER_SERVICE} in the twin is not ours: its pods use the provider's DNS");
                return Ok(Nameserver::Provider);
            }
            None => services
                .create(&PostParams::default(), &service(twin))
                .await
                .map_err(failed)?,
        };
        let want = slice(twin, address, port);
        match slices.get_opt(NAMESERVER_SERVICE).await.map_err(failed)? {
            Some(have) if !is_ours(&have.metadata) => {
                tracing::warn!(%twin, "the EndpointSlice {NAMESERVER_SERVICE} in the twin is not ours");
                return Ok(Nameserver::Provider);
            }
            Some(have) if have.endpoints == want.endpoints && have.ports == want.ports => {}
            Some(have) => {
                let mut put = want;
                put.metadata.resource_version = have.metadata.resource_version;
                slices
                    .replace(NAMESERVER_SERVICE, &PostParams::default(), &put)
                    .await
                    .map_err(failed)?;
            }
            None => {
                slices
                    .create(&PostParams::default(), &want)
                    .await
                    .map_err(failed)?;
            }
        }
        Ok(service
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.as_deref())
            .and_then(|ip| ip.parse().ok())
            .map_or(Nameserver::Provider, Nameserver::At))
    }
}

fn is_ours(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(labels::MANAGED_BY))
        .is_some_and(|v| v == labels::MANAGED_BY_VALUE)
}

fn ours() -> BTreeMap<String, String> {
    BTreeMap::from([(
        labels::MANAGED_BY.to_owned(),
        labels::MANAGED_BY_VALUE.to_owned(),
    )])
}

const PROTOCOLS: [(&str, &str); 2] = [("dns", "UDP"), ("dns-tcp", "TCP")];

/// The Service of the names server in `twin`: port 53, no selector.
fn service(twin: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(NAMESERVER_SERVICE.to_owned()),
            namespace: Some(twin.to_owned()),
            labels: Some(ours()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            ports: Some(
                PROTOCOLS
                    .iter()
                    .map(|(name, protocol)| ServicePort {
                        name: Some((*name).to_owned()),
                        protocol: Some((*protocol).to_owned()),
                        port: 53,
                        target_port: Some(IntOrString::Int(53)),
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// Its EndpointSlice: the names server at `address` (as the provider
/// sees it), `port`.
fn slice(twin: &str, address: IpAddr, port: u16) -> EndpointSlice {
    let mut labels = ours();
    labels.insert(SERVICE_NAME_LABEL.to_owned(), NAMESERVER_SERVICE.to_owned());
    labels.insert(
        ENDPOINTSLICE_MANAGED_BY.to_owned(),
        ENDPOINTSLICE_MANAGER.to_owned(),
    );
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(NAMESERVER_SERVICE.to_owned()),
            namespace: Some(twin.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        address_type: if address.is_ipv4() { "IPv4" } else { "IPv6" }.to_owned(),
        endpoints: vec![Endpoint {
            addresses: vec![address.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            ..Endpoint::default()
        }],
        ports: Some(
            PROTOCOLS
                .iter()
                .map(|(name, protocol)| EndpointPort {
                    name: Some((*name).to_owned()),
                    protocol: Some((*protocol).to_owned()),
                    port: Some(i32::from(port)),
                    app_protocol: None,
                })
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_twins_nameserver_is_a_service_without_selector_and_a_slice_of_this_agent() {
        let svc = service("shop-home");
        let spec = svc.spec.as_ref().expect("a spec");
        assert!(spec.selector.is_none(), "no selector: the slice is ours");
        let ports: Vec<_> = spec
            .ports
            .iter()
            .flatten()
            .map(|p| (p.protocol.as_deref(), p.port))
            .collect();
        assert_eq!(ports, [(Some("UDP"), 53), (Some("TCP"), 53)]);
        assert!(is_ours(&svc.metadata));

        let s = slice("shop-home", "10.71.0.3".parse().expect("an address"), 10053);
        assert_eq!(s.address_type, "IPv4");
        assert_eq!(s.endpoints[0].addresses, ["10.71.0.3"]);
        let labels = s.metadata.labels.as_ref().expect("labels");
        assert_eq!(
            labels.get(SERVICE_NAME_LABEL).map(String::as_str),
            Some(NAMESERVER_SERVICE)
        );
        assert_eq!(
            labels.get(ENDPOINTSLICE_MANAGED_BY).map(String::as_str),
            Some(ENDPOINTSLICE_MANAGER),
            "the provider's EndpointSlice controller leaves it alone"
        );
        // Not a copy: the mirror's selector (ours, with an origin) does
        // not follow it, so it is never taken for a copy to delete.
        assert!(!labels.contains_key(labels::ORIGIN_NAMESPACE));
        assert_eq!(
            s.ports.iter().flatten().map(|p| p.port).collect::<Vec<_>>(),
            [Some(10053), Some(10053)]
        );
    }
}
