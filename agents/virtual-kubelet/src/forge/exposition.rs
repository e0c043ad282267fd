//! Pure translation of the consumer's Services and EndpointSlices of an
//! offloaded namespace into the twin namespace.
//!
//! A Service keeps its ports (without node ports), selector, session
//! affinity and `publishNotReadyAddresses`; its cluster IP is the
//! provider's own (a headless Service stays headless). Every type becomes
//! ClusterIP, but ExternalName, which is not copied: the Service is there for the offloaded
//! pods inside the provider, and opening node ports or load balancers on
//! the provider's nodes is for its admin to decide. Offloaded pods keep
//! their labels on the provider, so the provider's own EndpointSlice
//! controller lists them for the remote Service.
//!
//! What that controller cannot see is the endpoints that are not on this
//! provider (pods on the consumer's real nodes, or on other providers):
//! every local EndpointSlice is copied without the endpoints of this
//! virtual node (the provider lists those itself), node names and target
//! references (they name the consumer's objects), and marked as managed by
//! us so that the provider's controller leaves it alone.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::reflected::{Reflected, Target};
use crate::reflection::nameserver::NAMESERVER_SERVICE;

/// The label of an EndpointSlice that names its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label of an EndpointSlice that says which controller owns it.
pub const ENDPOINTSLICE_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// Our value of [`ENDPOINTSLICE_MANAGED_BY`] on the remote slices.
pub const ENDPOINTSLICE_MANAGER: &str = "virtual-kubelet.liqo.io";

fn remote_ports(ports: Option<&Vec<ServicePort>>) -> Option<Vec<ServicePort>> {
    ports.map(|ports| {
        ports
            .iter()
            .map(|p| ServicePort {
                name: p.name.clone(),
                protocol: p.protocol.clone(),
                port: p.port,
                target_port: p.target_port.clone(),
                app_protocol: p.app_protocol.clone(),
                node_port: None,
            })
            .collect()
    })
}

/// A Service spec as far as the remote copy is concerned, with the API
/// server's defaults filled in, for comparison.
type ServiceView = (
    String,
    bool,
    Option<String>,
    BTreeMap<String, String>,
    Vec<(Option<String>, String, i32, IntOrString, Option<String>)>,
    String,
    bool,
);

fn service_view(spec: Option<&ServiceSpec>) -> ServiceView {
    let default = ServiceSpec::default();
    let spec = spec.unwrap_or(&default);
    let ports = spec
        .ports
        .iter()
        .flatten()
        .map(|p| {
            (
                p.name.clone(),
                p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
                p.port,
                p.target_port.clone().unwrap_or(IntOrString::Int(p.port)),
                p.app_protocol.clone(),
            )
        })
        .collect();
    (
        spec.type_.clone().unwrap_or_else(|| "ClusterIP".to_owned()),
        spec.cluster_ip.as_deref() == Some("None"),
        spec.external_name.clone(),
        spec.selector.clone().unwrap_or_default(),
        ports,
        spec.session_affinity
            .clone()
            .unwrap_or_else(|| "None".to_owned()),
        spec.publish_not_ready_addresses.unwrap_or(false),
    )
}

impl Reflected for Service {
    const NAME: &'static str = "services";
    fn content(&self, _target: &Target<'_>) -> Option<Self> {
        // The twin's Service of the names server takes that name.
        if self.metadata.name.as_deref() == Some(NAMESERVER_SERVICE) {
            return None;
        }
        let spec = self.spec.as_ref()?;
        // An ExternalName Service stays here: providers refuse them from
        // peers (an alias in their DNS may name any host they reach).
        if spec.type_.as_deref() == Some("ExternalName") {
            return None;
        }
        let spec = ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            cluster_ip: (spec.cluster_ip.as_deref() == Some("None")).then(|| "None".to_owned()),
            selector: spec.selector.clone(),
            ports: remote_ports(spec.ports.as_ref()),
            session_affinity: spec.session_affinity.clone(),
            publish_not_ready_addresses: spec.publish_not_ready_addresses,
            ..ServiceSpec::default()
        };
        Some(Self {
            spec: Some(spec),
            ..Self::default()
        })
    }
    fn same_content(&self, other: &Self) -> bool {
        service_view(self.spec.as_ref()) == service_view(other.spec.as_ref())
    }
}

fn port_view(ports: Option<&Vec<EndpointPort>>) -> Vec<(Option<String>, String, Option<i32>)> {
    ports
        .iter()
        .copied()
        .flatten()
        .map(|p| {
            (
                p.name.clone(),
                p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
                p.port,
            )
        })
        .collect()
}

impl Reflected for EndpointSlice {
    const NAME: &'static str = "endpointslices";
    fn content(&self, target: &Target<'_>) -> Option<Self> {
        // Only slices of a Service: the provider's Service finds them by
        // this label.
        let service = self
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))?;
        if service == NAMESERVER_SERVICE {
            return None;
        }
        // Only this cluster's pods, where the provider reaches them: the
        // provider admits no other address from a peer (not its nodes',
        // nor another provider's pods), and none before a tunnel.
        let seen = target.seen?;
        let endpoints: Vec<Endpoint> = self
            .endpoints
            .iter()
            .filter(|e| e.node_name.as_deref() != Some(target.node_name))
            .filter_map(|e| {
                let addresses: Vec<String> = e
                    .addresses
                    .iter()
                    .filter_map(|a| seen.pod_address(a))
                    .collect();
                (!addresses.is_empty()).then(|| Endpoint {
                    addresses,
                    conditions: e.conditions.clone(),
                    hostname: e.hostname.clone(),
                    zone: e.zone.clone(),
                    ..Endpoint::default()
                })
            })
            .collect();
        if endpoints.is_empty() {
            return None;
        }
        Some(Self {
            address_type: self.address_type.clone(),
            endpoints,
            ports: self.ports.clone(),
            ..Self::default()
        })
    }
    fn same_content(&self, other: &Self) -> bool {
        self.address_type == other.address_type
            && self.endpoints == other.endpoints
            && port_view(self.ports.as_ref()) == port_view(other.ports.as_ref())
    }
    fn adjust_labels(labels: &mut BTreeMap<String, String>) {
        labels.insert(
            ENDPOINTSLICE_MANAGED_BY.to_owned(),
            ENDPOINTSLICE_MANAGER.to_owned(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge::reflected::{in_sync, remote};
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::EndpointConditions;
    use kube::core::ObjectMeta;
    use liqo_api::names::labels;
    use serde_json::json;

    const NODE: &str = "liqo-prov";

    fn service(spec: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": { "name": "web", "namespace": "shop", "uid": "u" },
            "spec": spec,
        }))
        .expect("service")
    }

    #[test]
    fn service_table() {
        let ports = json!([{ "name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP" }]);
        let remote_ports =
            json!([{ "name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP" }]);
        let cases = [
            (
                "ClusterIP: its IP is the provider's",
                json!({ "type": "ClusterIP", "clusterIP": "10.0.0.1", "clusterIPs": ["10.0.0.1"], "selector": { "app": "web" }, "ports": ports }),
                json!({ "type": "ClusterIP", "selector": { "app": "web" }, "ports": remote_ports }),
            ),
            (
                "NodePort: no node port on the provider",
                json!({ "type": "NodePort", "clusterIP": "10.0.0.1", "selector": { "app": "web" }, "ports": ports }),
                json!({ "type": "ClusterIP", "selector": { "app": "web" }, "ports": remote_ports }),
            ),
            (
                "LoadBalancer: nor a load balancer",
                json!({ "type": "LoadBalancer", "selector": { "app": "web" }, "ports": ports, "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000 }),
                json!({ "type": "ClusterIP", "selector": { "app": "web" }, "ports": remote_ports }),
            ),
            (
                "headless stays headless",
                json!({ "clusterIP": "None", "selector": { "app": "web" }, "publishNotReadyAddresses": true, "sessionAffinity": "ClientIP" }),
                json!({ "type": "ClusterIP", "clusterIP": "None", "selector": { "app": "web" }, "publishNotReadyAddresses": true, "sessionAffinity": "ClientIP" }),
            ),
        ];
        let alias = service(json!({ "type": "ExternalName", "externalName": "db.example.org" }));
        assert!(
            remote(&alias, "shop-c", NODE).is_none(),
            "ExternalName stays here"
        );
        let mut taken =
            service(json!({ "type": "ClusterIP", "selector": { "app": "web" }, "ports": ports }));
        taken.metadata.name = Some(NAMESERVER_SERVICE.to_owned());
        assert!(
            remote(&taken, "shop-c", NODE).is_none(),
            "the names server's Service takes its name in the twin"
        );
        for (what, local, want) in cases {
            let copy = remote(&service(local), "shop-c", NODE).expect("reflected");
            assert_eq!(
                serde_json::to_value(copy.spec).expect("json"),
                want,
                "{what}"
            );
            assert!(copy.status.is_none(), "{what}");
        }
    }

    #[test]
    fn service_in_sync_despite_the_providers_defaults() {
        let want = remote(
            &service(json!({ "selector": { "app": "web" }, "ports": [{ "port": 80 }] })),
            "shop-c",
            NODE,
        )
        .expect("reflected");
        let mut have = want.clone();
        have.spec = Some(
            serde_json::from_value(json!({
                "type": "ClusterIP", "clusterIP": "10.9.0.4", "clusterIPs": ["10.9.0.4"],
                "selector": { "app": "web" }, "sessionAffinity": "None",
                "ports": [{ "port": 80, "targetPort": 80, "protocol": "TCP" }],
                "ipFamilies": ["IPv4"], "internalTrafficPolicy": "Cluster",
            }))
            .expect("spec"),
        );
        assert!(in_sync(&want, &have));
        have.spec.as_mut().expect("spec").selector = None;
        assert!(!in_sync(&want, &have));
    }

    fn endpoint(ip: &str, node: Option<&str>) -> Endpoint {
        Endpoint {
            addresses: vec![ip.to_owned()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                ..EndpointConditions::default()
            }),
            node_name: node.map(str::to_owned),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".to_owned()),
                name: Some(format!("pod-{ip}")),
                ..ObjectReference::default()
            }),
            ..Endpoint::default()
        }
    }

    fn slice(service: Option<&str>, endpoints: Vec<Endpoint>) -> EndpointSlice {
        let mut l = BTreeMap::from([(
            ENDPOINTSLICE_MANAGED_BY.to_owned(),
            "endpointslice-controller.k8s.io".to_owned(),
        )]);
        if let Some(s) = service {
            l.insert(SERVICE_NAME_LABEL.to_owned(), s.to_owned());
        }
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some("web-abcde".to_owned()),
                namespace: Some("shop".to_owned()),
                labels: Some(l),
                ..ObjectMeta::default()
            },
            address_type: "IPv4".to_owned(),
            endpoints,
            ports: Some(vec![EndpointPort {
                name: Some("http".to_owned()),
                port: Some(8080),
                protocol: Some("TCP".to_owned()),
                ..EndpointPort::default()
            }]),
        }
    }

    #[test]
    fn endpoint_slice_table() {
        let local_node = endpoint("10.1.0.5", Some("worker-1"));
        let offloaded = endpoint("10.2.0.7", Some(NODE));
        let elsewhere = endpoint("10.3.0.9", Some("liqo-other"));
        let cases = [
            (
                "local endpoints are copied; other providers' pods are not",
                slice(
                    Some("web"),
                    vec![local_node.clone(), offloaded.clone(), elsewhere.clone()],
                ),
                Some(vec!["10.1.0.5"]),
            ),
            (
                "only other providers' pods: no copy",
                slice(Some("web"), vec![elsewhere]),
                None,
            ),
            (
                "only this provider's pods: no copy",
                slice(Some("web"), vec![offloaded]),
                None,
            ),
            ("no endpoints: no copy", slice(Some("web"), vec![]), None),
            ("not a Service's slice", slice(None, vec![local_node]), None),
        ];
        for (what, local, want) in cases {
            let copy = remote(&local, "shop-c", linked());
            let ips = copy.as_ref().map(|c| {
                c.endpoints
                    .iter()
                    .map(|e| e.addresses[0].as_str())
                    .collect::<Vec<_>>()
            });
            assert_eq!(ips, want, "{what}");
            let Some(copy) = copy else { continue };
            for e in &copy.endpoints {
                assert_eq!(e.node_name, None, "{what}: the consumer's node");
                assert_eq!(e.target_ref, None, "{what}: the consumer's pod");
                assert_eq!(e.conditions.as_ref().and_then(|c| c.ready), Some(true));
            }
            let l = copy.metadata.labels.clone().expect("labels");
            assert_eq!(l[SERVICE_NAME_LABEL], "web");
            assert_eq!(l[ENDPOINTSLICE_MANAGED_BY], ENDPOINTSLICE_MANAGER);
            assert_eq!(l[labels::MANAGED_BY], labels::MANAGED_BY_VALUE);
            assert_eq!(copy.metadata.name.as_deref(), Some("web-abcde"));
            assert_eq!(copy.ports, local.ports);
            assert!(in_sync(&copy, &copy.clone()));
        }
    }

    /// A provider linked by a tunnel that sees this cluster's pods
    /// (10.1.0.0/16) at their own addresses.
    fn linked() -> Target<'static> {
        let own = "10.1.0.0/16".parse().expect("cidr");
        Target {
            node_name: NODE,
            seen: Some(liqo_api::networking::Remap {
                real: own,
                seen_as: own,
            }),
        }
    }

    #[test]
    fn no_endpoints_are_copied_before_a_tunnel() {
        let local = slice(Some("web"), vec![endpoint("10.1.0.5", Some("worker-1"))]);
        assert!(remote(&local, "shop-c", NODE).is_none());
        assert!(remote(&local, "shop-c", linked()).is_some());
    }

    /// When the provider sees this cluster's pods under a remapped CIDR,
    /// the copied endpoints are there, host part kept; other addresses
    /// (another provider's pods, a node's) are dropped.
    #[test]
    fn endpoints_are_copied_where_the_provider_sees_them() {
        let local = slice(
            Some("web"),
            vec![
                endpoint("10.1.0.5", Some("worker-1")),
                endpoint("10.3.0.9", Some("liqo-other")),
            ],
        );
        let target = Target {
            node_name: NODE,
            seen: Some(liqo_api::networking::Remap {
                real: "10.1.0.0/16".parse().expect("cidr"),
                seen_as: "100.64.0.0/16".parse().expect("cidr"),
            }),
        };
        let copy = remote(&local, "shop-c", target).expect("reflected");
        let ips: Vec<&str> = copy
            .endpoints
            .iter()
            .map(|e| e.addresses[0].as_str())
            .collect();
        assert_eq!(ips, ["100.64.0.5"]);
    }
}
