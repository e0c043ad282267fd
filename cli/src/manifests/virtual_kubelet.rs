//! The consumer-side objects of one outgoing peering's virtual kubelet:
//! its ServiceAccount, its least-privilege rights (its own Node, Lease and
//! ForeignCluster, by name) and its Deployment, as a pure function. Each
//! carries the managed-by labels and the provider's cluster ID, and, once
//! the ForeignCluster exists, an owner reference to it, so that deleting
//! the peering's ForeignCluster removes them all.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, PodSpec, PodTemplateSpec, ServiceAccount, Toleration,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use liqo_api::ClusterId;
use liqo_api::images::ImageSource;
use liqo_api::names::{self, labels};
use liqo_api::tether;

use crate::manifests::agents::{agent_container, field_env, pod_security_context, recreate};
use crate::manifests::{Manifest, common_labels, rbac, selector_labels};
use liqo_api::agents::virtual_kubelet::{KUBELET_PORT, PLACEMENT_PORT, VirtualKubeletFlags};
use liqo_api::agents::{self, ListenAddr};

const COMPONENT: &str = "virtual-kubelet";

/// Every object of the virtual kubelet for `provider`, in the order they
/// must be applied. `foreign_cluster_uid` is the UID of the local
/// ForeignCluster (named by the provider's cluster ID) that owns them.
pub fn manifests(
    provider: &ClusterId,
    foreign_cluster_uid: Option<&str>,
    node_selector: &BTreeMap<String, String>,
    tolerations: &[Toleration],
    images: &ImageSource,
) -> Vec<Manifest> {
    let name = names::peering::virtual_kubelet(provider);
    let node = names::peering::virtual_node(provider);
    let foreign_cluster = provider.to_string();
    let mut object_labels = common_labels(COMPONENT);
    object_labels.insert(labels::PEER_CLUSTER_ID.to_owned(), provider.to_string());
    let owners = foreign_cluster_uid.map(|uid| {
        vec![OwnerReference {
            api_version: format!("{}/v1alpha1", names::GROUP),
            kind: "ForeignCluster".to_owned(),
            name: foreign_cluster.clone(),
            uid: uid.to_owned(),
            ..Default::default()
        }]
    });
    let meta = |namespace: Option<&str>| ObjectMeta {
        name: Some(name.clone()),
        namespace: namespace.map(str::to_owned),
        labels: Some(object_labels.clone()),
        owner_references: owners.clone(),
        ..Default::default()
    };
    // One Deployment per provider in the same namespace: the provider's
    // ID tells their pods apart.
    let mut selector = selector_labels(COMPONENT);
    selector.insert(labels::PEER_CLUSTER_ID.to_owned(), provider.to_string());
    let mut pod_labels = object_labels.clone();
    pod_labels.extend(selector.clone());
    let identity = names::peering::identity_secret(provider);
    let subject = || Some(vec![rbac::service_account(&name, names::NAMESPACE)]);
    let offloaded_meta = ObjectMeta {
        name: Some(names::peering::virtual_kubelet_offloaded_role(provider)),
        ..meta(None)
    };
    // Its servers on its own pod IP (several virtual kubelets on one host
    // network do not clash), the placement webhook where install made one
    // (docs/offloading.md, "Placement"); the peering's names in its
    // environment, the pod's IP from the downward API.
    let flags = VirtualKubeletFlags {
        foreign_cluster: foreign_cluster.clone(),
        provider_secret: identity.clone(),
        node_name: node.clone(),
        health_addr: ListenAddr::PodIp {
            port: names::HEALTH_PORT,
        },
        consumer_api_address: None,
        kubelet_addr: Some(ListenAddr::PodIp { port: KUBELET_PORT }),
        node_ip: None,
        placement_addr: Some(ListenAddr::PodIp {
            port: PLACEMENT_PORT,
        }),
        unschedulable_timeout: agents::virtual_kubelet::DEFAULT_UNSCHEDULABLE_TIMEOUT,
        dns_addr: Some(ListenAddr::PodIp {
            port: agents::virtual_kubelet::DNS_PORT,
        }),
        cluster_domain: agents::virtual_kubelet::DEFAULT_CLUSTER_DOMAIN.to_owned(),
    };
    let mut env = vec![field_env(agents::env::POD_IP, "status.podIP")];
    env.extend(flags.to_env().into_iter().map(|(name, value)| EnvVar {
        name: name.to_owned(),
        value: Some(value),
        ..Default::default()
    }));
    // Our objects `objects` of `resources`.
    let own = |resources: &[&str], objects: &[&str], verbs: &[&str]| {
        rbac::named_rule(&[names::GROUP], resources, objects, verbs)
    };

    vec![
        Manifest::ServiceAccount(ServiceAccount {
            metadata: meta(Some(names::NAMESPACE)),
            ..Default::default()
        }),
        Manifest::ClusterRole(ClusterRole {
            metadata: meta(None),
            rules: Some(vec![
                // Create cannot be limited by name (the object does not
                // exist yet); everything else names its own node.
                rbac::rule(&[""], &["nodes"], &["create"]),
                rbac::named_rule(
                    &[""],
                    &["nodes", "nodes/status"],
                    &[&node],
                    &["get", "patch", "update"],
                ),
                // List and watch by name need the watch to select
                // `metadata.name=`, as the agent does.
                own(
                    &["foreignclusters"],
                    &[foreign_cluster.as_str()],
                    &["get", "list", "watch"],
                ),
                // Where it says what the provider admits from this cluster.
                own(
                    &["foreignclusters/status"],
                    &[foreign_cluster.as_str()],
                    &["patch"],
                ),
                // The tunnel to its provider (named after it, in `liqo`):
                // the node's NetworkUnavailable condition and where the
                // provider's pods are seen come from its status.
                own(
                    &["connections"],
                    &[foreign_cluster.as_str()],
                    &["get", "list", "watch"],
                ),
                // Offloading: the agent reads every NamespaceOffloading and
                // reports its own provider's entry in their status.
                rbac::rule(
                    &[names::GROUP],
                    &["namespaceoffloadings"],
                    &["get", "list", "watch"],
                ),
                rbac::rule(
                    &[names::GROUP],
                    &["namespaceoffloadings/status"],
                    &["get", "patch"],
                ),
                // Its finalizer on an offloading keeps it until the twin
                // namespace is deleted, even across a restart.
                rbac::rule(&[names::GROUP], &["namespaceoffloadings"], &["patch"]),
                // Pods bound to its node, as a kubelet: RBAC cannot say
                // "bound to this node", the agent's watch selects
                // `spec.nodeName=`; delete is the kubelet's final removal.
                rbac::rule(&[""], &["pods"], &["get", "list", "watch", "delete"]),
                rbac::rule(&[""], &["pods/status"], &["patch"]),
                // Refused pods are said with an Event.
                rbac::rule(&[""], &["events"], &["create"]),
                // The volumes of the claims it keeps on its provider
                // (docs/storage.md): one per claim, bound to it, whose
                // node affinity names its node. RBAC cannot say "its
                // own"; the agent follows only those labelled with its
                // provider and deletes only those.
                rbac::rule(
                    &[""],
                    &["persistentvolumes"],
                    &["get", "list", "watch", "create", "patch", "delete"],
                ),
                // The kubelet API authenticates bearer tokens and
                // authorizes every request as a kubelet in webhook mode.
                rbac::rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
                rbac::rule(
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                    &["create"],
                ),
                // This cluster's identity: its ID names the tenant on the
                // provider, its name the twin namespaces.
                rbac::named_rule(
                    &[""],
                    &["configmaps"],
                    &[names::IDENTITY_CONFIGMAP],
                    &["get"],
                ),
                // The clusterset's Services (docs/services.md): it carries
                // this cluster's exports to its provider, and the
                // provider's back into the status of its tunnel here.
                rbac::named_rule(
                    &[""],
                    &["configmaps"],
                    &[names::CLUSTERSET_EXPORTS],
                    &["get"],
                ),
                own(
                    &["connections/status"],
                    &[foreign_cluster.as_str()],
                    &["patch"],
                ),
            ]),
            ..Default::default()
        }),
        Manifest::ClusterRoleBinding(ClusterRoleBinding {
            metadata: meta(None),
            role_ref: rbac::role_ref("ClusterRole", &name),
            subjects: subject(),
        }),
        // What it may do in an offloaded namespace, bound there by
        // `liqoctl offload` and `liqoctl peer` ([`offloaded_namespace_binding`]):
        // RBAC cannot name "the offloaded namespaces" in one rule, so each
        // gets its RoleBinding, and nothing of a namespace that is not
        // offloaded can be read.
        Manifest::ClusterRole(ClusterRole {
            metadata: offloaded_meta,
            rules: Some(offloaded_rules()),
            ..Default::default()
        }),
        Manifest::Role(Role {
            metadata: meta(Some("kube-node-lease")),
            rules: Some(vec![
                rbac::rule(&["coordination.k8s.io"], &["leases"], &["create"]),
                rbac::named_rule(
                    &["coordination.k8s.io"],
                    &["leases"],
                    &[&node],
                    &["get", "update", "patch"],
                ),
            ]),
        }),
        Manifest::RoleBinding(RoleBinding {
            metadata: meta(Some("kube-node-lease")),
            role_ref: rbac::role_ref("Role", &name),
            subjects: subject(),
        }),
        Manifest::Role(Role {
            metadata: meta(Some(names::NAMESPACE)),
            rules: Some(vec![
                // The placement webhook's serving certificate, by name.
                rbac::named_rule(
                    &[""],
                    &["secrets"],
                    &[crate::manifests::webhook::PLACEMENT_TLS_SECRET],
                    &["get"],
                ),
                // The peering's identity, which reaches the provider: read
                // through the API rather than mounted, so that the agent
                // starts before liqoctl has made it, and follows its
                // renewals at once. List and watch select it by name.
                rbac::named_rule(&[""], &["secrets"], &[&identity], &["get", "list", "watch"]),
            ]),
        }),
        Manifest::RoleBinding(RoleBinding {
            metadata: meta(Some(names::NAMESPACE)),
            role_ref: rbac::role_ref("Role", &name),
            subjects: subject(),
        }),
        // The cluster's client CA (kube-system's
        // extension-apiserver-authentication), through the Role every
        // cluster has for it, to verify the kubelet API's clients.
        Manifest::RoleBinding(RoleBinding {
            metadata: meta(Some("kube-system")),
            role_ref: rbac::role_ref("Role", "extension-apiserver-authentication-reader"),
            subjects: subject(),
        }),
        Manifest::Deployment(Box::new(Deployment {
            metadata: meta(Some(names::NAMESPACE)),
            spec: Some(DeploymentSpec {
                replicas: Some(1),
                // One agent per node at a time: two would both write it.
                strategy: Some(recreate()),
                selector: LabelSelector {
                    match_labels: Some(selector),
                    ..Default::default()
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(pod_labels),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        service_account_name: Some(name.clone()),
                        node_selector: Some(node_selector.clone()),
                        tolerations: Some(tether::agent_tolerations(tolerations)),
                        termination_grace_period_seconds: Some(10),
                        security_context: Some(pod_security_context()),
                        containers: vec![agent_container(Container {
                            name: "virtual-kubelet".to_owned(),
                            image: Some(images.reference(liqo_api::images::VIRTUAL_KUBELET)),
                            image_pull_policy: Some(images.pull_policy.as_str().to_owned()),
                            args: Some(flags.to_args()),
                            env: Some(env),
                            ..Default::default()
                        })],
                        ..Default::default()
                    }),
                },
                ..Default::default()
            }),
            ..Default::default()
        })),
    ]
}

/// What the virtual kubelet may do in an offloaded namespace, through the
/// RoleBinding [`offloaded_namespace_binding`] there: read what it
/// reflects into the twin (list and watch fill its stores; it needs no
/// get and writes nothing of these), follow and update its own copies of
/// the remote pods' Events, and mint the pods' service account tokens.
fn offloaded_rules() -> Vec<PolicyRule> {
    vec![
        // ConfigMaps, Secrets, Services and EndpointSlices are copied into
        // the twins.
        rbac::rule(
            &[""],
            &["configmaps", "secrets", "services"],
            &["list", "watch"],
        ),
        rbac::rule(
            &["discovery.k8s.io"],
            &["endpointslices"],
            &["list", "watch"],
        ),
        // Remote pods' Events are copied onto the local pods (`create` is
        // in the agent's ClusterRole: it also says why a pod is refused);
        // the agent follows its own copies (by label) and updates their
        // counts.
        rbac::rule(&[""], &["events"], &["list", "watch", "patch"]),
        // Claims of the class `liqo` are kept on the provider; their
        // status says the size the provider gave them.
        rbac::rule(
            &[""],
            &["persistentvolumeclaims"],
            &["get", "list", "watch"],
        ),
        rbac::rule(&[""], &["persistentvolumeclaims/status"], &["patch"]),
        // Offloaded pods get a token of their own service account, bound
        // to the pod, as a kubelet requests it. RBAC cannot limit this to
        // the accounts of pods bound to the node (the node authorizer
        // does that for real kubelets only): see docs/offloading.md,
        // "Reflection".
        rbac::rule(&[""], &["serviceaccounts/token"], &["create"]),
    ]
}

/// Selects the virtual kubelets' ServiceAccounts (in `liqo`), one per
/// outgoing peering, each labelled with its provider's cluster ID.
pub fn agents_selector() -> String {
    format!(
        "{}={},{}={COMPONENT}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE,
        labels::COMPONENT
    )
}

/// The RoleBinding that lets the virtual kubelet of `provider` act in the
/// offloaded namespace `namespace` ([`offloaded_rules`]). It is named as
/// the agent and owned by the namespace's NamespaceOffloading
/// (`offloading_uid`), so that it goes when the offloading does, once the
/// agent has removed its finalizer; `liqoctl unpeer` deletes those of its
/// peering.
pub fn offloaded_namespace_binding(
    provider: &ClusterId,
    namespace: &str,
    offloading_uid: Option<&str>,
) -> Manifest {
    let name = names::peering::virtual_kubelet(provider);
    let mut labels = common_labels(COMPONENT);
    labels.insert(labels::PEER_CLUSTER_ID.to_owned(), provider.to_string());
    let owner = offloading_uid.map(|uid| {
        vec![OwnerReference {
            api_version: format!("{}/v1alpha1", names::GROUP),
            kind: "NamespaceOffloading".to_owned(),
            name: names::NAMESPACE_OFFLOADING.to_owned(),
            uid: uid.to_owned(),
            ..Default::default()
        }]
    });
    Manifest::RoleBinding(RoleBinding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            owner_references: owner,
            ..Default::default()
        },
        role_ref: rbac::role_ref(
            "ClusterRole",
            &names::peering::virtual_kubelet_offloaded_role(provider),
        ),
        subjects: Some(vec![rbac::service_account(&name, names::NAMESPACE)]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> ClusterId {
        ClusterId::new("prov-1").expect("valid")
    }

    fn render(uid: Option<&str>) -> Vec<serde_json::Value> {
        let selector = BTreeMap::from([("k".to_owned(), "v".to_owned())]);
        manifests(&provider(), uid, &selector, &[], &ImageSource::default())
            .iter()
            .map(|m| serde_json::to_value(m).expect("serialize"))
            .collect()
    }

    #[test]
    fn every_object_carries_the_labels_and_the_owner() {
        for m in render(Some("fc-uid")) {
            let labels = &m["metadata"]["labels"];
            assert_eq!(labels[labels::MANAGED_BY], labels::MANAGED_BY_VALUE, "{m}");
            assert_eq!(labels[labels::PEER_CLUSTER_ID], "prov-1", "{m}");
            let name = m["metadata"]["name"].as_str().expect("a name");
            assert!(
                ["liqo-vk-prov-1", "liqo-vk-prov-1-offloaded"].contains(&name),
                "{m}"
            );
            let owner = &m["metadata"]["ownerReferences"][0];
            assert_eq!(owner["kind"], "ForeignCluster");
            assert_eq!(owner["apiVersion"], "liqo.io/v1alpha1");
            assert_eq!(owner["name"], "prov-1");
            assert_eq!(owner["uid"], "fc-uid");
        }
        for m in render(None) {
            assert!(m["metadata"]["ownerReferences"].is_null(), "{m}");
        }
    }

    /// Each rule of `role` as (resources, resource names, verbs).
    fn rules_of(role: &serde_json::Value) -> Vec<(String, Option<Vec<String>>, Vec<String>)> {
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        };
        role["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .map(|r| {
                let names = r.get("resourceNames").map(strings);
                (
                    strings(&r["resources"]).join(","),
                    names,
                    strings(&r["verbs"]),
                )
            })
            .collect()
    }

    #[test]
    fn rbac_names_only_the_peerings_own_objects() {
        let all = render(None);
        let role = all
            .iter()
            .find(|m| m["kind"] == "ClusterRole" && m["metadata"]["name"] == "liqo-vk-prov-1")
            .expect("the agent's ClusterRole");
        for (resources, names, verbs) in rules_of(role) {
            let rule = format!("{resources} {names:?} {verbs:?}");
            let pods = resources.starts_with("pods");
            let volumes = resources == "persistentvolumes";
            // Only pods are deleted (the kubelet's final removal), and the
            // volumes of the claims it keeps.
            assert!(
                !verbs.contains(&"*".to_owned())
                    && (pods || volumes || !verbs.contains(&"delete".to_owned())),
                "{rule}"
            );
            match names {
                // Volumes are cluster-wide: the agent follows and deletes
                // only those labelled with its provider.
                None if volumes => assert_eq!(
                    verbs,
                    ["get", "list", "watch", "create", "patch", "delete"],
                    "{rule}"
                ),
                // Pods of any namespace may be bound to the node.
                None if pods => assert!(
                    verbs
                        .iter()
                        .all(|v| ["get", "list", "watch", "delete", "patch"].contains(&v.as_str())),
                    "{rule}"
                ),
                // Offloadings are every namespace's: read them all, write
                // only their status and the agent's finalizer.
                None if resources.starts_with("namespaceoffloadings") => assert!(
                    verbs
                        .iter()
                        .all(|v| ["get", "list", "watch", "patch"].contains(&v.as_str())),
                    "{rule}"
                ),
                // Only create may go unnamed: there is no name yet. No
                // read of any namespace's ConfigMaps, Secrets or Events.
                None => assert_eq!(verbs, ["create"], "{rule}"),
                Some(names) => {
                    // The ForeignCluster and the tunnel's Connection are
                    // named after the provider; of the ConfigMaps, the
                    // identity and the clusterset's exports (read).
                    let want: &[&str] = if resources.starts_with("foreignclusters")
                        || resources.starts_with("connections")
                    {
                        &["prov-1"]
                    } else if resources == "configmaps" && names == [names::IDENTITY_CONFIGMAP] {
                        &[names::IDENTITY_CONFIGMAP]
                    } else if resources == "configmaps" {
                        &[names::CLUSTERSET_EXPORTS]
                    } else {
                        &["liqo-prov-1"]
                    };
                    assert_eq!(names, want, "{rule}");
                }
            }
        }
    }

    #[test]
    fn of_the_secrets_in_liqo_only_its_own_are_readable() {
        let all = render(None);
        let role = all
            .iter()
            .find(|m| m["kind"] == "Role" && m["metadata"]["namespace"] == names::NAMESPACE)
            .expect("the agent's Role in liqo");
        let rules = rules_of(role);
        let want = [
            (
                "secrets".to_owned(),
                Some(vec![
                    crate::manifests::webhook::PLACEMENT_TLS_SECRET.to_owned(),
                ]),
                vec!["get".to_owned()],
            ),
            (
                "secrets".to_owned(),
                Some(vec!["liqo-identity-prov-1".to_owned()]),
                vec!["get".to_owned(), "list".to_owned(), "watch".to_owned()],
            ),
        ];
        assert_eq!(rules, want);
    }

    #[test]
    fn what_offloaded_namespaces_hold_is_read_only_where_it_is_bound() {
        let all = render(Some("fc-uid"));
        let role = all
            .iter()
            .find(|m| m["metadata"]["name"] == "liqo-vk-prov-1-offloaded")
            .expect("the offloaded namespaces' ClusterRole");
        assert_eq!(role["kind"], "ClusterRole");
        // Reflected kinds are read by watching only; the Events' patch is
        // of the agent's own copies.
        let want = [
            ("configmaps,secrets,services", vec!["list", "watch"]),
            ("endpointslices", vec!["list", "watch"]),
            ("events", vec!["list", "watch", "patch"]),
            ("persistentvolumeclaims", vec!["get", "list", "watch"]),
            ("persistentvolumeclaims/status", vec!["patch"]),
            ("serviceaccounts/token", vec!["create"]),
        ];
        let have = rules_of(role);
        assert_eq!(have.len(), want.len(), "{have:?}");
        for ((resources, names, verbs), (want_resources, want_verbs)) in have.iter().zip(want) {
            assert_eq!(resources, want_resources);
            assert_eq!(names, &None);
            assert_eq!(verbs, &want_verbs);
        }
        // Nothing binds it cluster-wide.
        assert!(
            all.iter()
                .all(|m| m["roleRef"]["name"] != "liqo-vk-prov-1-offloaded"),
            "bound by the peering's own objects"
        );

        let binding = serde_json::to_value(offloaded_namespace_binding(
            &provider(),
            "shop",
            Some("off-uid"),
        ))
        .expect("serialize");
        assert_eq!(binding["kind"], "RoleBinding");
        assert_eq!(binding["metadata"]["name"], "liqo-vk-prov-1");
        assert_eq!(binding["metadata"]["namespace"], "shop");
        let labels = &binding["metadata"]["labels"];
        assert_eq!(labels[labels::MANAGED_BY], labels::MANAGED_BY_VALUE);
        assert_eq!(labels[labels::PEER_CLUSTER_ID], "prov-1");
        let owner = &binding["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "NamespaceOffloading");
        assert_eq!(owner["apiVersion"], "liqo.io/v1alpha1");
        assert_eq!(owner["name"], names::NAMESPACE_OFFLOADING);
        assert_eq!(owner["uid"], "off-uid");
        assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
        assert_eq!(binding["roleRef"]["name"], "liqo-vk-prov-1-offloaded");
        assert_eq!(
            binding["subjects"],
            serde_json::json!([{ "kind": "ServiceAccount", "name": "liqo-vk-prov-1", "namespace": "liqo" }])
        );
        let unowned = serde_json::to_value(offloaded_namespace_binding(&provider(), "shop", None))
            .expect("serialize");
        assert!(unowned["metadata"]["ownerReferences"].is_null());
    }

    #[test]
    fn deployment_runs_the_agent_for_this_provider() {
        let all = render(None);
        let deployment = all
            .iter()
            .find(|m| m["kind"] == "Deployment")
            .expect("a Deployment");
        assert_eq!(deployment["metadata"]["namespace"], "liqo");
        assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["nodeSelector"]["k"], "v");
        assert_eq!(pod["serviceAccountName"], "liqo-vk-prov-1");
        // Nothing mounted but its service account's token: the identity
        // is read through the API, so that nothing holds the pod back
        // before liqoctl has made it.
        assert!(pod["volumes"].is_null(), "{pod}");
        let container = &pod["containers"][0];
        assert_eq!(
            container["image"],
            format!("{}:{}", names::VIRTUAL_KUBELET_IMAGE, liqo_api::VERSION)
        );
        assert!(container["volumeMounts"].is_null(), "{container}");
        let env = container["env"].to_string();
        assert!(
            env.contains(r#""LIQO_PROVIDER_SECRET","value":"liqo-identity-prov-1""#),
            "{env}"
        );
        assert!(
            env.contains(r#""LIQO_NODE_NAME","value":"liqo-prov-1""#),
            "{env}"
        );
        assert!(
            env.contains(r#""LIQO_FOREIGN_CLUSTER","value":"prov-1""#),
            "{env}"
        );
        let selector = &deployment["spec"]["selector"]["matchLabels"];
        for (k, v) in selector.as_object().expect("labels") {
            assert_eq!(&pod["containers"][0]["name"], "virtual-kubelet");
            assert_eq!(&deployment["spec"]["template"]["metadata"]["labels"][k], v);
        }
        assert_eq!(selector[labels::PEER_CLUSTER_ID], "prov-1");
    }

    #[test]
    fn the_agent_runs_the_image_the_gateway_was_installed_with() {
        let images = ImageSource {
            registry: "registry.local:5000/team".into(),
            tag: "rc1".into(),
            pull_policy: liqo_api::images::PullPolicy::Always,
        };
        let objects = manifests(&provider(), None, &BTreeMap::new(), &[], &images);
        let deployment = objects
            .iter()
            .map(|m| serde_json::to_value(m).expect("serialize"))
            .find(|o| o["kind"] == "Deployment")
            .expect("a Deployment");
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            container["image"],
            "registry.local:5000/team/liqo-virtual-kubelet:rc1"
        );
        assert_eq!(container["imagePullPolicy"], "Always");
    }

    /// The e2e test (tests/e2e/tests/virtual_node.rs) applies exactly these
    /// objects, for its provider and its host-process node, from a fixture
    /// this test keeps current; LIQO_UPDATE_MANIFESTS=1 rewrites it.
    #[test]
    fn e2e_fixture_matches_the_code() {
        let provider = ClusterId::new("vn-provider").expect("valid");
        let host = "testbed.liqo.io/host-process";
        let selector = BTreeMap::from([(host.to_owned(), "true".to_owned())]);
        let toleration = Toleration {
            key: Some(host.to_owned()),
            operator: Some("Equal".to_owned()),
            value: Some("true".to_owned()),
            effect: Some("NoSchedule".to_owned()),
            toleration_seconds: None,
        };
        let objects = manifests(
            &provider,
            None,
            &selector,
            &[toleration],
            &ImageSource::default(),
        );
        let want = serde_json::to_string_pretty(&objects).expect("serialize") + "\n";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/e2e/fixtures/virtual-kubelet.json");
        if std::env::var_os("LIQO_UPDATE_MANIFESTS").is_some() {
            std::fs::write(&path, &want).expect("write the fixture");
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} differs from the code; run LIQO_UPDATE_MANIFESTS=1 cargo test -p liqoctl virtual_kubelet",
            path.display()
        );
    }
}
