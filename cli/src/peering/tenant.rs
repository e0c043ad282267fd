//! What a consumer gets on its provider, as typed manifests built by pure
//! functions: the tenant namespace, the least-privilege RBAC of its
//! identity, the ResourceQuota that enforces the grant, and the Tenant
//! record; and the rights to create twin namespaces for offloading and act
//! in them. All of it is enforced by the API server itself (RBAC,
//! ResourceQuota, and the admission policies of `manifests::
//! twin_namespaces`): nothing of ours needs to run on the provider.

use std::collections::BTreeMap;

use liqo_api::admission::Admission;
use liqo_api::authentication::{Tenant, TenantSpec, peer_user};
use liqo_api::names::{self, labels, peering};
use liqo_api::sharing::{Cost, Resources};
use liqo_api::{ClusterId, ClusterIdentity};
use serde_json::json;

use super::admission;
use crate::manifests::{Manifest, common_labels, from_json};

/// What the consumer's identity may do in each of its twin namespaces
/// (the ClusterRole it binds there): what offloading pods and the objects
/// they need takes, nothing cluster-wide, nothing about certificates.
/// Each right, and why it is needed, is in docs/offloading.md ("The
/// tenant's rights"). No ServiceAccounts (its pods run as the twin's
/// default account, with no token mounted), no pod status (the provider's
/// kubelets write it), no writing Events (they are reflected to the
/// consumer, never from it).
const TENANT_RULES: [(&str, &[&str]); 4] = [
    ("", &["pods", "configmaps", "secrets", "services"]),
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
    let meta = |ns: &str| json!({ "name": name, "namespace": ns, "labels": labels });
    let subject =
        json!([{ "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user }]);
    let rules: Vec<_> = TENANT_RULES
        .iter()
        .map(|(group, resources)| json!({ "apiGroups": [group], "resources": resources, "verbs": ALL_VERBS }))
        .chain(TENANT_LIMITED_RULES.iter().map(|(group, resources, verbs)| {
            json!({ "apiGroups": [group], "resources": resources, "verbs": verbs })
        }))
        .collect();
    // In the tenant namespace, only its end of the tunnel: the provider's
    // gateway listens for it there (docs/network.md). No pods nor anything
    // else: those run in twin namespaces, under their rules.
    let tenant_rules = [json!({
        "apiGroups": [names::GROUP],
        "resources": ["connections"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    })];
    let hard = {
        let mut hard = BTreeMap::new();
        if let Some(cpu) = &grant.cpu {
            hard.insert("requests.cpu", cpu.0.clone());
            hard.insert("limits.cpu", cpu.0.clone());
        }
        if let Some(memory) = &grant.memory {
            hard.insert("requests.memory", memory.0.clone());
            hard.insert("limits.memory", memory.0.clone());
        }
        if let Some(pods) = &grant.pods {
            hard.insert("pods", pods.0.clone());
        }
        hard
    };
    let mut out = vec![Manifest::Namespace(from_json(json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": { "name": namespace, "labels": labels },
    })))];
    // What the provider admits from it, before any of its rights.
    out.extend(admission::bindings(id, &json!(labels)));
    out.extend([
        Manifest::Role(from_json(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(&namespace),
            "rules": tenant_rules,
        }))),
        Manifest::RoleBinding(from_json(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(&namespace),
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
            "subjects": subject,
        }))),
        // The virtual kubelet checks the provider is who it should be.
        Manifest::Role(from_json(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(names::NAMESPACE),
            "rules": [{
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [names::IDENTITY_CONFIGMAP],
                "verbs": ["get"],
            }],
        }))),
        Manifest::RoleBinding(from_json(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(names::NAMESPACE),
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
            "subjects": subject,
        }))),
        // Twin namespaces (docs/offloading.md): the rules the tenant gets
        // in each, as a ClusterRole it binds there with a RoleBinding.
        Manifest::ClusterRole(from_json(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": { "name": name, "labels": labels },
            "rules": rules,
        }))),
        // Creating, changing and deleting namespaces and creating
        // RoleBindings anywhere is what RBAC can say; the admission policies
        // install puts on every cluster confine it to namespaces labelled
        // for this tenant and to binding the ClusterRole above to itself.
        Manifest::ClusterRole(from_json(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": { "name": namespaces_role, "labels": labels },
            "rules": [
                // No list or watch: reads are not seen by admission, so
                // they could not be confined to the tenant's namespaces; a
                // get by name shows one namespace the peer already names.
                {
                    "apiGroups": [""],
                    "resources": ["namespaces"],
                    "verbs": ["create", "get", "update", "patch", "delete"],
                },
                {
                    "apiGroups": ["rbac.authorization.k8s.io"],
                    "resources": ["rolebindings"],
                    "verbs": ["create"],
                },
                {
                    "apiGroups": ["rbac.authorization.k8s.io"],
                    "resources": ["clusterroles"],
                    "resourceNames": [name],
                    "verbs": ["bind"],
                },
                // Its own record: the virtual kubelet reads what the
                // provider admits from it.
                {
                    "apiGroups": [names::GROUP],
                    "resources": ["tenants"],
                    "resourceNames": [id.as_str()],
                    "verbs": ["get"],
                },
            ],
        }))),
        Manifest::ClusterRoleBinding(from_json(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": { "name": namespaces_role, "labels": labels },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": namespaces_role },
            "subjects": subject,
        }))),
        Manifest::ResourceQuota(from_json(json!({
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": { "name": "liqo-grant", "namespace": namespace, "labels": labels },
            "spec": { "hard": hard },
        }))),
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
