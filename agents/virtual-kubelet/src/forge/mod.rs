//! Pure functions that build the objects the virtual kubelet writes: the
//! virtual Node (metadata and spec), its status (capacity, allocatable and
//! conditions) and its heartbeat Lease. No IO and no clock: the time is an
//! argument, so that every rule here is unit-tested. Pods are translated
//! in [`pod`], twin namespaces in [`offloading`], ConfigMaps and Secrets
//! in [`reflected`], Services and EndpointSlices in [`exposition`];
//! service account tokens in [`token`], remote pods' Events in [`event`]; [`references`] says whether a pod's ConfigMaps and
//! Secrets let it start.

pub mod claim;
pub mod event;
pub mod exposition;
pub mod offloading;
pub mod pod;
pub mod references;
pub mod reflected;
pub mod token;

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference, Time};
use kube::core::ObjectMeta;
use kube::{Resource, ResourceExt};
use liqo_api::core::ForeignCluster;
use liqo_api::names::{self, labels};
use liqo_api::sharing::{Cost, Resources};

/// The namespace of the nodes' heartbeat Leases, as for every kubelet.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// How long a Lease lasts without renewal, as a kubelet's does.
pub const LEASE_DURATION_SECONDS: i32 = 40;

/// The provider, as the last health checks saw it; what the Ready
/// condition says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderState {
    /// A check succeeded recently enough (see [`crate::provider`]).
    Reachable,
    /// No recent successful check: the API did not answer, or answered
    /// with an error other than the ones below. The message says what.
    Unreachable(String),
    /// The API answered, but is not the provider of the ForeignCluster (or
    /// holds no valid liqo identity).
    Mismatch(String),
    /// The API refused the consumer's identity (401 or 403).
    Forbidden(String),
}

impl ProviderState {
    /// The Ready condition's status, reason and message.
    fn ready(&self) -> (&'static str, &'static str, String) {
        match self {
            Self::Reachable => (
                "True",
                "ProviderReachable",
                "the provider's API answers as the expected cluster".to_owned(),
            ),
            Self::Unreachable(m) => ("False", "ProviderUnreachable", m.clone()),
            Self::Mismatch(m) => ("False", "ProviderMismatch", m.clone()),
            Self::Forbidden(m) => ("False", "ProviderForbidden", m.clone()),
        }
    }
}

/// The tunnel to the provider, as its Connection's status says; what the
/// NetworkUnavailable condition says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkState {
    /// Peered without a network (`--no-network`): pods run, unlinked.
    NotLinked,
    /// A session with the provider's gateway is live.
    Up,
    /// The tunnel is configured but down; the gateway's message says why.
    Down(String),
}

impl NetworkState {
    pub fn of(tunnel: Option<&liqo_api::networking::Connection>) -> Self {
        match tunnel {
            None => Self::NotLinked,
            Some(c) if c.is_established() => Self::Up,
            Some(c) => Self::Down(
                c.status
                    .iter()
                    .flat_map(|s| &s.conditions)
                    .find(|c| c.status != "True")
                    .map_or_else(
                        || "the gateway has not reported on the tunnel yet".to_owned(),
                        |c| c.message.clone(),
                    ),
            ),
        }
    }

    /// The NetworkUnavailable condition's status, reason and message. A
    /// peering without a network is not reported unavailable: its pods run
    /// (the node lifecycle controller would taint the node otherwise).
    fn unavailable(&self) -> (&'static str, &'static str, String) {
        match self {
            Self::NotLinked => (
                "False",
                "NetworkNotLinked",
                "the pod networks are not linked (`liqoctl network connect`): offloaded pods run \
                 but cannot reach this cluster's pods"
                    .to_owned(),
            ),
            Self::Up => (
                "False",
                "TunnelEstablished",
                "the tunnel to the provider's gateway is up".to_owned(),
            ),
            Self::Down(m) => ("True", "TunnelDown", m.clone()),
        }
    }
}

/// Implements [`kube::Resource`] for `$ty`, a compact form of the API's
/// `$of` that the agent stores instead of it (its own fields, and an
/// `ObjectMeta` named `metadata`): the same kind, group, version and
/// plural, so that an `Api<$ty>` reads and watches `$of`s.
macro_rules! compact_resource {
    ($ty:ty, $of:ty) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;

            fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
                <$of as kube::Resource>::kind(dt)
            }
            fn group(dt: &()) -> std::borrow::Cow<'_, str> {
                <$of as kube::Resource>::group(dt)
            }
            fn version(dt: &()) -> std::borrow::Cow<'_, str> {
                <$of as kube::Resource>::version(dt)
            }
            fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
                <$of as kube::Resource>::plural(dt)
            }
            fn meta(&self) -> &kube::core::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut kube::core::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use compact_resource;

/// A digest of `bytes` for comparisons within this process (the stores
/// keep digests of what they need not keep whole; never written to the
/// API, so the hash need not be stable across builds). A number: eight
/// bytes inline, where a text of it took 24 and an allocation.
pub fn digest(bytes: &[u8]) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// The virtual node's labels: the provider's cluster labels, then ours,
/// which win on a clash so that selectors on them cannot be fooled.
pub fn node_labels(node_name: &str, fc: &ForeignCluster) -> BTreeMap<String, String> {
    let mut out = fc.spec.cluster_labels.clone();
    out.extend([
        (labels::VIRTUAL_NODE.to_owned(), "true".to_owned()),
        (
            labels::PEER_CLUSTER_ID.to_owned(),
            fc.spec.cluster_id.to_string(),
        ),
        (
            labels::PEER_CLUSTER_NAME.to_owned(),
            fc.spec.cluster_name.clone(),
        ),
        ("type".to_owned(), "virtual-kubelet".to_owned()),
        ("kubernetes.io/hostname".to_owned(), node_name.to_owned()),
        (
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        ),
    ]);
    // The provider's largest free node, as its record says it (through
    // the ForeignCluster's status): the placement policy keeps pods that
    // ask more off this node.
    let status = fc.status.as_ref();
    let amounts = |r: Option<&liqo_api::sharing::Resources>| {
        r.and_then(|r| liqo_api::sharing::Amounts::from_resources(r).ok())
    };
    out.extend(liqo_api::capacity::room_labels(
        amounts(status.and_then(|s| s.largest_free_node.as_ref())),
        amounts(status.and_then(|s| s.grant.as_ref())),
    ));
    // The Pod Security level the provider holds this cluster's pods to:
    // the placement policy keeps a pod that does not meet it off this
    // node. A provider that states no terms decides alone (privileged
    // here); until they are read, nothing is sent anyway.
    let level = status
        .and_then(|s| s.admission.as_ref())
        .map_or(liqo_api::pod_security::Level::Privileged, |a| {
            a.pod_security
        });
    out.insert(labels::POD_SECURITY.to_owned(), level.as_str().to_owned());
    out
}

/// Only pods that tolerate it (those of offloaded namespaces) may run on a
/// virtual node; NoExecute so that none stays there by accident.
pub fn node_taints() -> Vec<Taint> {
    vec![Taint {
        key: names::VIRTUAL_NODE_TAINT.to_owned(),
        value: Some("true".to_owned()),
        effect: "NoExecute".to_owned(),
        time_added: None,
    }]
}

/// The cost annotation's value, when the provider stated a cost.
pub fn cost_annotation(cost: Option<&Cost>) -> Option<String> {
    // A Cost is strings only: serializing it cannot fail.
    cost.and_then(|c| serde_json::to_string(c).ok())
}

/// The node's capacity (and allocatable): exactly the grant; a resource
/// the grant does not name is absent, so nothing is scheduled against it.
pub fn capacity(grant: Option<&Resources>) -> BTreeMap<String, Quantity> {
    let Some(grant) = grant else {
        return BTreeMap::new();
    };
    [
        ("cpu", &grant.cpu),
        ("memory", &grant.memory),
        ("pods", &grant.pods),
    ]
    .into_iter()
    .filter_map(|(k, q)| q.clone().map(|q| (k.to_owned(), q)))
    .collect()
}

/// An owner reference to the ForeignCluster, so that the garbage collector
/// removes the node when the peering is deleted.
pub fn foreign_cluster_owner(fc: &ForeignCluster) -> OwnerReference {
    OwnerReference {
        api_version: ForeignCluster::api_version(&()).into_owned(),
        kind: ForeignCluster::kind(&()).into_owned(),
        name: fc.name_any(),
        uid: fc.metadata.uid.clone().unwrap_or_default(),
        controller: None,
        block_owner_deletion: None,
    }
}

/// The Node as the agent applies it (metadata and spec; the status goes
/// through its subresource, see [`node_status`]).
pub fn node(node_name: &str, fc: &ForeignCluster) -> Node {
    let annotations = cost_annotation(fc.status.as_ref().and_then(|s| s.cost.as_ref()))
        .map(|cost| BTreeMap::from([(names::COST_ANNOTATION.to_owned(), cost)]));
    Node {
        metadata: ObjectMeta {
            name: Some(node_name.to_owned()),
            labels: Some(node_labels(node_name, fc)),
            annotations,
            owner_references: Some(vec![foreign_cluster_owner(fc)]),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: Some(node_taints()),
            ..NodeSpec::default()
        }),
        status: None,
    }
}

/// The node's conditions as a kubelet reports them: Ready from the
/// provider's state, and no pressure of any kind (the provider enforces
/// the grant). A condition keeps its `lastTransitionTime` from `previous`
/// while its status does not change; every one gets `now` as heartbeat.
pub fn conditions(
    state: &ProviderState,
    network: &NetworkState,
    now: &Time,
    previous: &[NodeCondition],
) -> Vec<NodeCondition> {
    let (status, reason, message) = state.ready();
    let mut out = vec![condition("Ready", status, reason, message, now, previous)];
    let (status, reason, message) = network.unavailable();
    out.push(condition(
        "NetworkUnavailable",
        status,
        reason,
        message,
        now,
        previous,
    ));
    for (type_, reason, message) in [
        (
            "MemoryPressure",
            "ProviderHasSufficientMemory",
            "the provider enforces the granted memory",
        ),
        (
            "DiskPressure",
            "ProviderHasNoDiskPressure",
            "the provider manages its own disks",
        ),
        (
            "PIDPressure",
            "ProviderHasSufficientPID",
            "the provider manages its own processes",
        ),
    ] {
        out.push(condition(
            type_,
            "False",
            reason,
            message.to_owned(),
            now,
            previous,
        ));
    }
    out
}

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: &Time,
    previous: &[NodeCondition],
) -> NodeCondition {
    let transition = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    NodeCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(transition),
    }
}

/// Where the node's kubelet API is served: the address the API server
/// connects to (an `InternalIP`, the agent's pod IP) and the port bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubeletEndpoint {
    pub ip: std::net::IpAddr,
    pub port: u16,
}

/// The node's status as the agent applies it to the status subresource.
/// It always holds every field the agent owns (capacity, conditions and,
/// when the kubelet API is served, the address and port the API server
/// reaches it at), since server-side apply removes an owned field an
/// apply leaves out. Only an `InternalIP` is given, no `Hostname`: the
/// API server tries a hostname first by default, and the node's name
/// resolves nowhere.
pub fn node_status(
    node_name: &str,
    grant: Option<&Resources>,
    conditions: Vec<NodeCondition>,
    endpoint: Option<KubeletEndpoint>,
) -> Node {
    let capacity = capacity(grant);
    let addresses = endpoint.map(|e| {
        vec![NodeAddress {
            type_: "InternalIP".to_owned(),
            address: e.ip.to_string(),
        }]
    });
    let daemon_endpoints = endpoint.map(|e| NodeDaemonEndpoints {
        kubelet_endpoint: Some(DaemonEndpoint {
            port: i32::from(e.port),
        }),
    });
    Node {
        metadata: ObjectMeta {
            name: Some(node_name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus {
            allocatable: Some(capacity.clone()),
            capacity: Some(capacity),
            conditions: Some(conditions),
            addresses,
            daemon_endpoints,
            ..NodeStatus::default()
        }),
    }
}

/// The node's heartbeat, owned by the node so that it goes with it.
pub fn lease(node_name: &str, node_uid: &str, now: &MicroTime) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(node_name.to_owned()),
            namespace: Some(LEASE_NAMESPACE.to_owned()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Node".to_owned(),
                name: node_name.to_owned(),
                uid: node_uid.to_owned(),
                controller: None,
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node_name.to_owned()),
            lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
            renew_time: Some(now.clone()),
            ..LeaseSpec::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use liqo_api::ClusterId;
    use liqo_api::core::{ForeignClusterSpec, ForeignClusterStatus};

    fn fc() -> ForeignCluster {
        let mut fc = ForeignCluster::new(
            "prov-1",
            ForeignClusterSpec {
                cluster_id: ClusterId::new("prov-1").expect("valid"),
                cluster_name: "rome".to_owned(),
                api_server_url: None,
                outgoing: true,
                incoming: false,
                cluster_labels: BTreeMap::from([
                    ("region".to_owned(), "eu".to_owned()),
                    // A clash with ours: ours wins.
                    ("type".to_owned(), "bogus".to_owned()),
                ]),
                request: None,
            },
        );
        fc.metadata.uid = Some("uid-1".to_owned());
        fc.status = Some(ForeignClusterStatus {
            grant: Some(Resources {
                cpu: Some(Quantity("2".to_owned())),
                memory: Some(Quantity("4Gi".to_owned())),
                pods: Some(Quantity("20".to_owned())),
                ..Resources::default()
            }),
            cost: Some(Cost {
                cpu_hour: Some("0.05".to_owned()),
                memory_gib_hour: None,
                currency: "EUR".to_owned(),
            }),
            ..ForeignClusterStatus::default()
        });
        fc
    }

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).expect("valid"))
    }

    #[test]
    fn labels_are_ours_plus_the_providers() {
        let labels = node_labels("liqo-prov-1", &fc());
        let want = [
            ("liqo.io/virtual-node", "true"),
            ("liqo.io/remote-cluster-id", "prov-1"),
            ("liqo.io/remote-cluster-name", "rome"),
            ("type", "virtual-kubelet"),
            ("kubernetes.io/hostname", "liqo-prov-1"),
            ("app.kubernetes.io/managed-by", "liqoctl"),
            ("region", "eu"),
            // The grant's, while the largest free node is not known.
            ("liqo.io/largest-free-cpu-millis", "2000"),
            ("liqo.io/largest-free-memory-bytes", "4294967296"),
            // Its terms not read yet: the provider decides alone.
            ("liqo.io/pod-security", "privileged"),
        ];
        for (k, v) in want {
            assert_eq!(labels.get(k).map(String::as_str), Some(v), "{k}");
        }
        assert_eq!(labels.len(), want.len());
        let mut known = fc();
        if let Some(status) = known.status.as_mut() {
            status.largest_free_node = Some(Resources {
                cpu: Some(Quantity("500m".to_owned())),
                memory: Some(Quantity("1Mi".to_owned())),
                ..Resources::default()
            });
        }
        if let Some(status) = known.status.as_mut() {
            status.admission = Some(liqo_api::admission::Admission::default());
        }
        let labels = node_labels("liqo-prov-1", &known);
        assert_eq!(labels["liqo.io/pod-security"], "baseline");
        assert_eq!(labels["liqo.io/largest-free-cpu-millis"], "500");
        assert_eq!(labels["liqo.io/largest-free-memory-bytes"], "1048576");
    }

    #[test]
    fn node_is_tainted_annotated_and_owned() {
        let node = node("liqo-prov-1", &fc());
        let taints = node.spec.and_then(|s| s.taints).expect("taints");
        assert_eq!(taints.len(), 1);
        assert_eq!(taints[0].key, "virtual-node.liqo.io/not-allowed");
        assert_eq!(taints[0].value.as_deref(), Some("true"));
        assert_eq!(taints[0].effect, "NoExecute");
        let cost = node
            .metadata
            .annotations
            .and_then(|a| a.get("liqo.io/cost").cloned())
            .expect("cost annotation");
        let cost: serde_json::Value = serde_json::from_str(&cost).expect("JSON");
        assert_eq!(
            cost,
            serde_json::json!({ "cpuHour": "0.05", "currency": "EUR" })
        );
        let owners = node.metadata.owner_references.expect("owners");
        assert_eq!(owners[0].api_version, "liqo.io/v1alpha1");
        assert_eq!(owners[0].kind, "ForeignCluster");
        assert_eq!(owners[0].name, "prov-1");
        assert_eq!(owners[0].uid, "uid-1");
        assert!(node.status.is_none(), "the status has its own subresource");
    }

    #[test]
    fn no_cost_no_annotation() {
        let mut fc = fc();
        if let Some(s) = fc.status.as_mut() {
            s.cost = None;
        }
        assert!(node("n", &fc).metadata.annotations.is_none());
        assert_eq!(cost_annotation(None), None);
    }

    #[test]
    fn capacity_is_the_grant() {
        let grant = fc().status.and_then(|s| s.grant);
        let cap = capacity(grant.as_ref());
        assert_eq!(cap.get("cpu"), Some(&Quantity("2".to_owned())));
        assert_eq!(cap.get("memory"), Some(&Quantity("4Gi".to_owned())));
        assert_eq!(cap.get("pods"), Some(&Quantity("20".to_owned())));
        assert_eq!(cap.len(), 3);
        // Nothing granted yet: nothing to schedule against.
        assert!(capacity(None).is_empty());
        let partial = Resources {
            cpu: Some(Quantity("500m".to_owned())),
            ..Resources::default()
        };
        assert_eq!(capacity(Some(&partial)).len(), 1);
        let status = node_status("n", grant.as_ref(), Vec::new(), None)
            .status
            .expect("status");
        assert_eq!(status.capacity, status.allocatable);
        assert_eq!(status.capacity, Some(cap));
        assert_eq!(status.addresses, None);
        assert_eq!(status.daemon_endpoints, None);
        let endpoint = KubeletEndpoint {
            ip: std::net::IpAddr::from([127, 0, 3, 4]),
            port: 10250,
        };
        let served = node_status("n", grant.as_ref(), Vec::new(), Some(endpoint))
            .status
            .expect("status");
        let addresses = served.addresses.expect("addresses");
        assert_eq!(addresses.len(), 1);
        assert_eq!(addresses[0].type_, "InternalIP");
        assert_eq!(addresses[0].address, "127.0.3.4");
        let port = served
            .daemon_endpoints
            .and_then(|d| d.kubelet_endpoint)
            .map(|k| k.port);
        assert_eq!(port, Some(10250));
    }

    #[test]
    fn conditions_by_state() {
        let cases = [
            (ProviderState::Reachable, "True", "ProviderReachable"),
            (
                ProviderState::Unreachable("no answer".into()),
                "False",
                "ProviderUnreachable",
            ),
            (
                ProviderState::Mismatch("other cluster".into()),
                "False",
                "ProviderMismatch",
            ),
            (
                ProviderState::Forbidden("401".into()),
                "False",
                "ProviderForbidden",
            ),
        ];
        for (state, status, reason) in cases {
            let cs = conditions(&state, &NetworkState::Up, &at(100), &[]);
            let types: Vec<&str> = cs.iter().map(|c| c.type_.as_str()).collect();
            assert_eq!(
                types,
                [
                    "Ready",
                    "NetworkUnavailable",
                    "MemoryPressure",
                    "DiskPressure",
                    "PIDPressure"
                ]
            );
            assert_eq!(cs[0].status, status);
            assert_eq!(cs[0].reason.as_deref(), Some(reason));
            assert!(cs[1..].iter().all(|c| c.status == "False"));
            assert!(cs.iter().all(|c| c.last_heartbeat_time == Some(at(100))
                && c.last_transition_time == Some(at(100))));
        }
        let cs = conditions(
            &ProviderState::Unreachable("x".into()),
            &NetworkState::Up,
            &at(100),
            &[],
        );
        assert_eq!(cs[0].message.as_deref(), Some("x"));
    }

    /// The tunnel down is NetworkUnavailable=True with the gateway's
    /// reason; up, or never linked, is False (a peering without a network
    /// still runs pods).
    #[test]
    fn network_unavailable_follows_the_tunnel() {
        let cases = [
            (NetworkState::Up, "False", "TunnelEstablished"),
            (NetworkState::NotLinked, "False", "NetworkNotLinked"),
            (
                NetworkState::Down("no handshake".into()),
                "True",
                "TunnelDown",
            ),
        ];
        for (network, status, reason) in cases {
            let cs = conditions(&ProviderState::Reachable, &network, &at(100), &[]);
            let c = cs
                .iter()
                .find(|c| c.type_ == "NetworkUnavailable")
                .expect("the condition");
            assert_eq!(
                (c.status.as_str(), c.reason.as_deref()),
                (status, Some(reason))
            );
        }
        assert_eq!(NetworkState::of(None), NetworkState::NotLinked);
    }

    #[test]
    fn transition_time_moves_only_on_a_change() {
        let first = conditions(&ProviderState::Reachable, &NetworkState::Up, &at(100), &[]);
        let same = conditions(
            &ProviderState::Reachable,
            &NetworkState::Up,
            &at(120),
            &first,
        );
        assert_eq!(same[0].last_transition_time, Some(at(100)));
        assert_eq!(same[0].last_heartbeat_time, Some(at(120)));
        let down = conditions(
            &ProviderState::Unreachable("x".into()),
            &NetworkState::Up,
            &at(140),
            &same,
        );
        assert_eq!(down[0].last_transition_time, Some(at(140)));
        // The pressure conditions did not change.
        assert_eq!(down[1].last_transition_time, Some(at(100)));
    }

    #[test]
    fn lease_is_the_nodes() {
        let now = MicroTime(Timestamp::from_second(5).expect("valid"));
        let lease = lease("liqo-prov-1", "node-uid", &now);
        assert_eq!(lease.metadata.namespace.as_deref(), Some("kube-node-lease"));
        let spec = lease.spec.expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("liqo-prov-1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert_eq!(spec.renew_time, Some(now));
        let owner = &lease.metadata.owner_references.expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Node", "node-uid")
        );
    }
}
