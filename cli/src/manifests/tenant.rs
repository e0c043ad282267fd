//! What a consumer gets on its provider, as typed manifests built by pure
//! functions: the tenant namespace, the least-privilege RBAC of its
//! identity, the ResourceQuota that enforces the grant, and the Tenant
//! record; and the rights to create twin namespaces for offloading and act
//! in them. All of it is enforced by the API server itself (RBAC,
//! ResourceQuota, and the admission policies of `manifests::
//! twin_namespaces`): nothing of ours needs to run on the provider.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use liqo_api::admission::Admission;
use liqo_api::authentication::{Tenant, TenantSpec, peer_user};
use liqo_api::names::{self, labels, peering};
use liqo_api::sharing::{Cost, Resources};
use liqo_api::{ClusterId, ClusterIdentity};

use crate::manifests::peer_admission;
use crate::manifests::{Manifest, common_labels, rbac};

/// What the consumer's identity may do in each of its twin namespaces
/// (the ClusterRole it binds there): what offloading pods and the objects
/// they need takes, nothing cluster-wide, nothing about certificates.
/// Each right, and why it is needed, is in docs/offloading.md ("The
/// tenant's rights"). No ServiceAccounts (its pods run as the twin's
/// default account, with no token mounted), no pod status (the provider's
/// kubelets write it), no writing Events (they are reflected to the
/// consumer, never from it). Claims are bounded by the grant's storage
/// and the terms' classes (`liqo-peer-claims`); no PersistentVolume.
const TENANT_RULES: [(&str, &[&str]); 4] = [
    (
        "",
        &[
            "pods",
            "configmaps",
            "secrets",
            "services",
            "persistentvolumeclaims",
        ],
    ),
    ("apps", &["replicasets"]),
    // Offloaded pods meant to end (restartPolicy OnFailure or Never) run
    // as Jobs of one.
    ("batch", &["jobs"]),
    ("discovery.k8s.io", &["endpointslices"]),
];

/// What else the tenant may do in its twin namespaces: read the provider's
/// Events about its pods (reflected to the consumer), read the remote
/// pods' logs (`kubectl logs` on the consumer, through its virtual
/// kubelet), run commands in them (`kubectl exec`: get over WebSockets,
/// create over SPDY), and read their figures (the virtual node's
/// `/stats/summary`).
const TENANT_LIMITED_RULES: [(&str, &[&str], &[&str]); 5] = [
    ("", &["events"], &["get", "list", "watch"]),
    ("events.k8s.io", &["events"], &["get", "list", "watch"]),
    ("", &["pods/log"], &["get"]),
    ("", &["pods/exec"], &["get", "create"]),
    ("metrics.k8s.io", &["pods"], &["get", "list"]),
];

const ALL_VERBS: [&str; 8] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// The labels of every object of the tenant: ours, and the consumer's ID.
fn tenant_labels(consumer: &ClusterId) -> BTreeMap<String, String> {
    let mut l = common_labels("tenant");
    l.insert(labels::PEER_CLUSTER_ID.to_owned(), consumer.to_string());
    l
}

/// The provider-side objects of a tenant, in the order they are applied.
/// The Tenant record comes last: it says the tenant is complete.
pub fn manifests(
    consumer: &ClusterIdentity,
    request: Option<&Resources>,
    grant: &Resources,
    cost: Option<&Cost>,
    admission: &Admission,
) -> Vec<Manifest> {
    let id = &consumer.cluster_id;
    let namespace = peering::tenant_namespace(id);
    let name = peering::tenant_role(id);
    let namespaces_role = peering::tenant_namespaces_role(id);
    let user = peer_user(id);
    let labels = tenant_labels(id);
    let meta = |ns: &str, name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(ns.to_owned()),
        labels: Some(labels.clone()),
        ..Default::default()
    };
    let cluster_meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(labels.clone()),
        ..Default::default()
    };
    let subject = || Some(vec![rbac::user(&user)]);
    let rules: Vec<_> = TENANT_RULES
        .iter()
        .map(|(group, resources)| rbac::rule(&[group], resources, &ALL_VERBS))
        .chain(
            TENANT_LIMITED_RULES
                .iter()
                .map(|(group, resources, verbs)| rbac::rule(&[group], resources, verbs)),
        )
        .collect();
    // In the tenant namespace, only its end of the tunnel: the provider's
    // gateway listens for it there (docs/network.md). No pods nor anything
    // else: those run in twin namespaces, under their rules.
    let tenant_rules = vec![rbac::rule(
        &[names::GROUP],
        &["connections"],
        &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ],
    )];
    let hard = {
        let mut hard = BTreeMap::new();
        if let Some(cpu) = &grant.cpu {
            hard.insert("requests.cpu".to_owned(), cpu.clone());
            hard.insert("limits.cpu".to_owned(), cpu.clone());
        }
        if let Some(memory) = &grant.memory {
            hard.insert("requests.memory".to_owned(), memory.clone());
            hard.insert("limits.memory".to_owned(), memory.clone());
        }
        if let Some(pods) = &grant.pods {
            hard.insert("pods".to_owned(), pods.clone());
        }
        // No storage granted: none at all (shares say the same).
        let none = || k8s_openapi::apimachinery::pkg::api::resource::Quantity("0".to_owned());
        hard.insert(
            "requests.storage".to_owned(),
            grant.storage.clone().unwrap_or_else(none),
        );
        hard.insert(
            "persistentvolumeclaims".to_owned(),
            grant.claims.clone().unwrap_or_else(none),
        );
        hard
    };
    let mut out = vec![Manifest::Namespace(Namespace {
        metadata: cluster_meta(&namespace),
        ..Default::default()
    })];
    // What the provider admits from it, before any of its rights.
    out.extend(peer_admission::bindings(id, &labels));
    out.extend([
        Manifest::Role(Role {
            metadata: meta(&namespace, &name),
            rules: Some(tenant_rules),
        }),
        Manifest::RoleBinding(RoleBinding {
            metadata: meta(&namespace, &name),
            role_ref: rbac::role_ref("Role", &name),
            subjects: subject(),
        }),
        // The virtual kubelet checks the provider is who it should be.
        Manifest::Role(Role {
            metadata: meta(names::NAMESPACE, &name),
            rules: Some(vec![rbac::named_rule(
                &[""],
                &["configmaps"],
                &[names::IDENTITY_CONFIGMAP],
                &["get"],
            )]),
        }),
        Manifest::RoleBinding(RoleBinding {
            metadata: meta(names::NAMESPACE, &name),
            role_ref: rbac::role_ref("Role", &name),
            subjects: subject(),
        }),
        // Twin namespaces (docs/offloading.md): the rules the tenant gets
        // in each, as a ClusterRole it binds there with a RoleBinding.
        Manifest::ClusterRole(ClusterRole {
            metadata: cluster_meta(&name),
            rules: Some(rules),
            ..Default::default()
        }),
        // Creating, changing and deleting namespaces and creating
        // RoleBindings anywhere is what RBAC can say; the admission policies
        // install puts on every cluster confine it to namespaces labelled
        // for this tenant and to binding the ClusterRole above to itself.
        Manifest::ClusterRole(ClusterRole {
            metadata: cluster_meta(&namespaces_role),
            rules: Some(vec![
                // No list or watch: reads are not seen by admission, so
                // they could not be confined to the tenant's namespaces; a
                // get by name shows one namespace the peer already names.
                rbac::rule(
                    &[""],
                    &["namespaces"],
                    &["create", "get", "update", "patch", "delete"],
                ),
                rbac::rule(
                    &["rbac.authorization.k8s.io"],
                    &["rolebindings"],
                    &["create"],
                ),
                rbac::named_rule(
                    &["rbac.authorization.k8s.io"],
                    &["clusterroles"],
                    &[&name],
                    &["bind"],
                ),
                // Its own record: the virtual kubelet reads what the
                // provider admits from it.
                rbac::named_rule(&[names::GROUP], &["tenants"], &[id.as_str()], &["get"]),
            ]),
            ..Default::default()
        }),
        Manifest::ClusterRoleBinding(ClusterRoleBinding {
            metadata: cluster_meta(&namespaces_role),
            role_ref: rbac::role_ref("ClusterRole", &namespaces_role),
            subjects: subject(),
        }),
        Manifest::ResourceQuota(ResourceQuota {
            metadata: meta(&namespace, "liqo-grant"),
            spec: Some(ResourceQuotaSpec {
                hard: Some(hard),
                ..Default::default()
            }),
            ..Default::default()
        }),
        Manifest::Tenant(Box::new(Tenant {
            metadata: kube::core::ObjectMeta {
                name: Some(id.to_string()),
                labels: Some(labels.clone()),
                ..Default::default()
            },
            spec: TenantSpec {
                cluster_id: id.clone(),
                cluster_name: consumer.cluster_name.clone(),
                namespace: namespace.clone(),
                user,
                request: request.cloned(),
                grant: grant.clone(),
                cost: cost.cloned(),
                admission: admission.clone(),
                pod_cidr: Some(consumer.pod_cidr.to_string()),
            },
            status: None,
        })),
    ]);
    out
}

/// The tenant's objects for what is known without its consumer: their
/// kinds and names, to delete them.
pub fn names_of(consumer: &ClusterId) -> Vec<Manifest> {
    let stand_in = ClusterIdentity {
        cluster_id: consumer.clone(),
        cluster_name: consumer.to_string(),
        labels: BTreeMap::new(),
        pod_cidr: "10.0.0.0/16".parse().expect("invariant: a CIDR"),
        service_cidr: "10.1.0.0/16".parse().expect("invariant: a CIDR"),
        version: liqo_api::VERSION.to_owned(),
    };
    manifests(
        &stand_in,
        None,
        &Resources::default(),
        None,
        &Admission::default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn consumer() -> ClusterIdentity {
        ClusterIdentity {
            cluster_id: ClusterId::new("home-1").expect("valid"),
            cluster_name: "home".into(),
            labels: BTreeMap::new(),
            pod_cidr: "10.200.0.0/16".parse().expect("cidr"),
            service_cidr: "10.100.0.0/16".parse().expect("cidr"),
            version: liqo_api::VERSION.into(),
        }
    }

    #[test]
    fn a_tenant_is_confined_to_its_namespace_and_the_identity_by_name() {
        let grant = Resources {
            cpu: Some(Quantity("2".into())),
            memory: Some(Quantity("4Gi".into())),
            pods: Some(Quantity("20".into())),
            ..Resources::default()
        };
        let all = manifests(&consumer(), None, &grant, None, &Admission::default());
        for m in &all {
            let v = serde_json::to_value(m).expect("serialize");
            assert_eq!(
                v["metadata"]["labels"][labels::PEER_CLUSTER_ID],
                "home-1",
                "{}",
                m.describe()
            );
            if let Manifest::Role(role) = m {
                let ns = role.metadata.namespace.as_deref();
                for rule in role.rules.iter().flatten() {
                    if ns == Some(names::NAMESPACE) {
                        assert_eq!(
                            rule.resource_names.as_deref(),
                            Some(&[names::IDENTITY_CONFIGMAP.to_owned()][..])
                        );
                        assert_eq!(rule.verbs, ["get"]);
                    } else {
                        assert_eq!(ns, Some("liqo-tenant-home-1"));
                        let resources = rule.resources.iter().flatten();
                        assert!(
                            resources
                                .clone()
                                .all(|r| !r.contains("certificate") && !r.contains("role")),
                            "{rule:?}"
                        );
                    }
                }
            }
            if let Manifest::ResourceQuota(q) = m {
                let hard = q.spec.as_ref().and_then(|s| s.hard.clone()).expect("hard");
                assert_eq!(hard.get("requests.cpu"), Some(&Quantity("2".into())));
                assert_eq!(hard.get("pods"), Some(&Quantity("20".into())));
            }
        }
        assert!(matches!(all.last(), Some(Manifest::Tenant(_))));
    }
}
