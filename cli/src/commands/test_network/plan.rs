//! What the check makes, and where: the providers it checks (each with
//! both ends of its tunnel), the names of its pods, the targets each
//! client is given, and the netcheck pods themselves, placed on the
//! consumer's nodes or on a provider's virtual node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, EnvVarSource, NodeAffinity, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector, Pod, PodSpec, SeccompProfile,
    SecurityContext, Toleration,
};
use kube::api::{Api, ListParams, ObjectMeta};
use liqo_api::ClusterId;
use liqo_api::names::{self, labels};
use liqo_api::netcheck::{self, Target};
use liqo_api::networking::Connection;

use super::ROLE_LABEL;
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::peering::outgoing::Outgoing;

/// What the check makes, and where.
pub(super) struct Plan {
    pub(super) namespace: String,
    pub(super) image: String,
    pub(super) node_selector: BTreeMap<String, String>,
    pub(super) tolerations: Vec<Toleration>,
}

/// A provider to check, with both ends of its tunnel.
pub(super) struct Peer {
    pub(super) peering: Outgoing,
    /// The consumer's end (in `liqo`): where the consumer sees the
    /// provider's pods.
    pub(super) here: Connection,
    /// The provider's end (in the tenant namespace): where the provider
    /// sees the consumer's pods.
    pub(super) there: Connection,
}

impl Peer {
    pub(super) fn id(&self) -> &str {
        self.peering.provider_id.as_str()
    }

    /// The provider's name, for people to read.
    pub(super) fn name(&self) -> &str {
        &self.peering.provider_name
    }
}

/// The outgoing peerings to check: those named, or every one whose
/// networks are linked. A peering without a tunnel, or whose tunnel is
/// down, is refused before anything is made.
pub(super) async fn peers(
    consumer: &ClusterClient,
    consumer_id: &ClusterId,
    named: &[ClusterId],
) -> anyhow::Result<Vec<Peer>> {
    let connections: Api<Connection> = Api::namespaced(consumer.client.clone(), names::NAMESPACE);
    let ids: Vec<ClusterId> = if named.is_empty() {
        let list = Api::<liqo_api::core::ForeignCluster>::all(consumer.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| consumer.explain(e, "listing the peerings"))?;
        list.items
            .into_iter()
            .filter(|fc| fc.spec.outgoing)
            .filter_map(|fc| ClusterId::new(fc.metadata.name?).ok())
            .collect()
    } else {
        named.to_vec()
    };
    if ids.is_empty() {
        return Err(UserError::NotFound(format!(
            "cluster {} has no outgoing peering to check; `liqoctl peer` makes one",
            consumer.name
        ))
        .into());
    }
    let mut peers = Vec::new();
    for id in ids {
        let peering = Outgoing::reach(consumer.clone(), id.clone()).await?;
        let here = connections
            .get_opt(id.as_str())
            .await
            .map_err(|e| consumer.explain(e, &format!("reading the tunnel to {id}")))?
            .ok_or_else(|| {
                UserError::Refused(format!(
                    "the pod networks of clusters {} and {id} are not linked: `liqoctl network \
                     connect --cluster-id {id}` links them",
                    consumer.name
                ))
            })?;
        if !here.is_established() {
            return Err(UserError::Refused(format!(
                "the tunnel between clusters {} and {id} is down ({}); see `liqoctl info peer {id}`",
                consumer.name,
                condition_message(&here)
            ))
            .into());
        }
        let there = Api::<Connection>::namespaced(
            peering.provider.client.clone(),
            &peering.tenant_namespace,
        )
        .get_opt(consumer_id.as_str())
        .await
        .map_err(|e| {
            peering
                .provider
                .explain(e, "reading the provider's end of the tunnel")
        })?
        .ok_or_else(|| {
            UserError::Refused(format!(
                "cluster {id} has no end of the tunnel with {}: `liqoctl network connect \
                 --cluster-id {id}` writes it again",
                consumer.name
            ))
        })?;
        peers.push(Peer {
            peering,
            here,
            there,
        });
    }
    Ok(peers)
}

pub(super) fn condition_message(connection: &Connection) -> String {
    connection
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Established"))
        .map(|c| c.message.clone())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "no status from the gateway yet".into())
}

/// Our labels, the component saying which part of the check it is.
pub(super) fn managed_labels(component: &str) -> BTreeMap<String, String> {
    crate::manifests::common_labels(&format!("test-network-{component}"))
}

/// The servers' addresses, as the cluster each runs on gives them.
pub(super) struct Servers {
    /// The namespace they run in, on the consumer.
    pub(super) namespace: String,
    /// The consumer's server pod, at its own address.
    pub(super) local_pod_ip: String,
    /// Each provider's server: its pod address as the consumer sees it, and
    /// the ClusterIP of its Service on the consumer.
    pub(super) remote: Vec<(String, String)>,
    /// Each provider's server pod at its own address in its cluster.
    pub(super) remote_real: Vec<Option<String>>,
}

pub(super) fn server_name(index: Option<usize>) -> String {
    match index {
        None => "server-local".into(),
        Some(i) => format!("server-remote-{i}"),
    }
}

pub(super) fn client_name(index: Option<usize>) -> String {
    match index {
        None => "client-local".into(),
        Some(i) => format!("client-remote-{i}"),
    }
}

/// The clients, each named and given its targets.
pub(super) struct Client {
    pub(super) name: String,
    /// `None` for the consumer's client, else the provider's index.
    pub(super) side: Option<usize>,
}

pub(super) fn target(name: &str, host: &str) -> Target {
    let address = if host.contains(':') {
        format!("[{host}]:{}", netcheck::PORT)
    } else {
        format!("{host}:{}", netcheck::PORT)
    };
    Target {
        name: name.to_owned(),
        address,
    }
}

/// A netcheck pod of the plan: on the consumer's nodes where the plan
/// says, or on a provider's virtual node.
pub(super) fn test_pod(plan: &Plan, name: &str, args: Vec<String>, provider: Option<&str>) -> Pod {
    let mut tolerations = plan.tolerations.clone();
    let (node_selector, affinity) = match provider {
        Some(id) => {
            tolerations.push(Toleration {
                key: Some(names::VIRTUAL_NODE_TAINT.to_owned()),
                operator: Some("Exists".into()),
                ..Default::default()
            });
            let selector = BTreeMap::from([
                (labels::VIRTUAL_NODE.to_owned(), "true".to_owned()),
                (labels::PEER_CLUSTER_ID.to_owned(), id.to_owned()),
            ]);
            (Some(selector), None)
        }
        None => {
            // Never on a virtual node: this is the consumer's own side.
            let off_virtual_nodes = NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: labels::VIRTUAL_NODE.to_owned(),
                            operator: "DoesNotExist".into(),
                            values: None,
                        }]),
                        match_fields: None,
                    }],
                }),
                ..Default::default()
            };
            (
                (!plan.node_selector.is_empty()).then(|| plan.node_selector.clone()),
                Some(k8s_openapi::api::core::v1::Affinity {
                    node_affinity: Some(off_virtual_nodes),
                    ..Default::default()
                }),
            )
        }
    };
    let mut pod_labels = managed_labels("pod");
    pod_labels.insert(ROLE_LABEL.to_owned(), name.to_owned());
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(pod_labels),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "netcheck".into(),
                image: Some(plan.image.clone()),
                args: Some(args),
                // What Pod Security's `restricted` level asks, so that the
                // check runs in clusters that enforce it on new namespaces.
                security_context: Some(SecurityContext {
                    run_as_non_root: Some(true),
                    run_as_user: Some(65532),
                    allow_privilege_escalation: Some(false),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".into()]),
                        ..Default::default()
                    }),
                    seccomp_profile: Some(SeccompProfile {
                        type_: "RuntimeDefault".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                env: Some(vec![EnvVar {
                    name: "POD_NAME".into(),
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "metadata.name".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            node_selector,
            affinity,
            tolerations: (!tolerations.is_empty()).then_some(tolerations),
            termination_grace_period_seconds: Some(1),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            namespace: "liqo-test-network-x".into(),
            image: "img:1".into(),
            node_selector: BTreeMap::from([("role".into(), "edge".into())]),
            tolerations: vec![Toleration {
                key: Some("dedicated".into()),
                operator: Some("Exists".into()),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn local_pods_stay_off_virtual_nodes_and_remote_ones_go_to_their_provider() {
        let local = test_pod(&plan(), "server-local", vec![], None);
        let spec = local.spec.expect("spec");
        assert_eq!(spec.node_selector, Some(plan().node_selector));
        let security = spec.containers[0]
            .security_context
            .clone()
            .expect("restricted");
        assert_eq!(
            (
                security.run_as_non_root,
                security.allow_privilege_escalation
            ),
            (Some(true), Some(false))
        );
        let terms = spec
            .affinity
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required_during_scheduling_ignored_during_execution)
            .expect("a required affinity")
            .node_selector_terms;
        let requirement = &terms[0].match_expressions.as_ref().expect("expressions")[0];
        assert_eq!(
            (requirement.key.as_str(), requirement.operator.as_str()),
            (labels::VIRTUAL_NODE, "DoesNotExist")
        );

        let remote = test_pod(&plan(), "server-remote-0", vec![], Some("p1"));
        let spec = remote.spec.expect("spec");
        let selector = spec.node_selector.expect("a node selector");
        assert_eq!(selector[labels::PEER_CLUSTER_ID], "p1");
        assert_eq!(selector[labels::VIRTUAL_NODE], "true");
        let tolerated: Vec<_> = spec
            .tolerations
            .expect("tolerations")
            .into_iter()
            .filter_map(|t| t.key)
            .collect();
        assert_eq!(tolerated, ["dedicated", names::VIRTUAL_NODE_TAINT]);
        let pod_labels = remote.metadata.labels.expect("labels");
        assert_eq!(pod_labels[ROLE_LABEL], "server-remote-0");
        assert_eq!(pod_labels[labels::MANAGED_BY], labels::MANAGED_BY_VALUE);
    }

    #[test]
    fn targets_bracket_ipv6_addresses() {
        assert_eq!(target("pod", "10.0.0.1").address, "10.0.0.1:8080");
        assert_eq!(target("pod", "fd00::1").address, "[fd00::1]:8080");
    }
}
