//! What `liqoctl install` applies, built as typed objects by pure functions.
//! `manifests/` holds these objects rendered with the default options, and a
//! test fails when it drifts from them.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, ResourceQuota, Secret, ServiceAccount, Toleration,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ApiResource;
use kube::core::ObjectMeta;
use liqo_api::ClusterIdentity;
use liqo_api::authentication::Tenant;
use liqo_api::core::ForeignCluster;
use liqo_api::names::{self, labels};
use liqo_api::sharing::SharingPolicy;
use serde::Serialize;
use serde_json::json;

/// One object to apply. An enum rather than dynamic objects, so that each
/// kind is applied through its typed API.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Manifest {
    Crd(Box<CustomResourceDefinition>),
    Namespace(Namespace),
    ServiceAccount(ServiceAccount),
    ClusterRole(ClusterRole),
    ClusterRoleBinding(ClusterRoleBinding),
    Role(Role),
    RoleBinding(RoleBinding),
    ConfigMap(ConfigMap),
    Deployment(Box<Deployment>),
    Secret(Secret),
    ResourceQuota(ResourceQuota),
    Tenant(Box<Tenant>),
    ForeignCluster(Box<ForeignCluster>),
    SharingPolicy(Box<SharingPolicy>),
}

impl Manifest {
    fn meta(&self) -> (&'static str, &ObjectMeta) {
        match self {
            Self::Crd(o) => ("CustomResourceDefinition", &o.metadata),
            Self::Namespace(o) => ("Namespace", &o.metadata),
            Self::ServiceAccount(o) => ("ServiceAccount", &o.metadata),
            Self::ClusterRole(o) => ("ClusterRole", &o.metadata),
            Self::ClusterRoleBinding(o) => ("ClusterRoleBinding", &o.metadata),
            Self::Role(o) => ("Role", &o.metadata),
            Self::RoleBinding(o) => ("RoleBinding", &o.metadata),
            Self::ConfigMap(o) => ("ConfigMap", &o.metadata),
            Self::Deployment(o) => ("Deployment", &o.metadata),
            Self::Secret(o) => ("Secret", &o.metadata),
            Self::ResourceQuota(o) => ("ResourceQuota", &o.metadata),
            Self::Tenant(o) => ("Tenant", &o.metadata),
            Self::ForeignCluster(o) => ("ForeignCluster", &o.metadata),
            Self::SharingPolicy(o) => ("SharingPolicy", &o.metadata),
        }
    }

    pub fn name(&self) -> &str {
        self.meta().1.name.as_deref().unwrap_or_default()
    }

    /// `Kind/name`, as kubectl prints it.
    pub fn describe(&self) -> String {
        format!("{}/{}", self.meta().0, self.name())
    }

    /// The object's type, and its namespace when it has one, for requests
    /// that do not need the typed object.
    pub fn api_resource(&self) -> (ApiResource, Option<&str>) {
        let namespace = self.meta().1.namespace.as_deref();
        let resource = match self {
            Self::Crd(_) => ApiResource::erase::<CustomResourceDefinition>(&()),
            Self::Namespace(_) => ApiResource::erase::<Namespace>(&()),
            Self::ServiceAccount(_) => ApiResource::erase::<ServiceAccount>(&()),
            Self::ClusterRole(_) => ApiResource::erase::<ClusterRole>(&()),
            Self::ClusterRoleBinding(_) => ApiResource::erase::<ClusterRoleBinding>(&()),
            Self::Role(_) => ApiResource::erase::<Role>(&()),
            Self::RoleBinding(_) => ApiResource::erase::<RoleBinding>(&()),
            Self::ConfigMap(_) => ApiResource::erase::<ConfigMap>(&()),
            Self::Deployment(_) => ApiResource::erase::<Deployment>(&()),
            Self::Secret(_) => ApiResource::erase::<Secret>(&()),
            Self::ResourceQuota(_) => ApiResource::erase::<ResourceQuota>(&()),
            Self::Tenant(_) => ApiResource::erase::<Tenant>(&()),
            Self::ForeignCluster(_) => ApiResource::erase::<ForeignCluster>(&()),
            Self::SharingPolicy(_) => ApiResource::erase::<SharingPolicy>(&()),
        };
        (resource, namespace)
    }
}

/// What changes the objects from one installation to another.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Absent when rendering `manifests/`, which holds no cluster's identity.
    pub identity: Option<ClusterIdentity>,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
}

/// Every object of an installation, in the order they must be applied.
pub fn render(options: &Options) -> Vec<Manifest> {
    let mut out: Vec<Manifest> = liqo_api::crds()
        .into_iter()
        .map(|mut crd| {
            crd.metadata.labels = Some(common_labels("crds"));
            Manifest::Crd(Box::new(crd))
        })
        .collect();
    let mut namespace_labels = common_labels("namespace");
    namespace_labels.extend(pod_security_labels());
    out.push(Manifest::Namespace(from_json(json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": { "name": names::NAMESPACE, "labels": namespace_labels },
    }))));
    if let Some(identity) = &options.identity {
        out.push(Manifest::ConfigMap(from_json(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta(names::IDENTITY_CONFIGMAP, "identity"),
            "data": identity.to_data(),
        }))));
    }
    out.extend(gateway(options));
    out
}

/// Every object an installation may hold, for what is known of them
/// without a cluster: their kinds and names (the identity is a stand-in).
/// Install checks none of them is someone else's; uninstall deletes them.
pub fn every_object() -> Vec<Manifest> {
    let stand_in = ClusterIdentity {
        cluster_id: liqo_api::ClusterId::new("stand-in").expect("invariant: a DNS label"),
        cluster_name: "stand-in".to_owned(),
        labels: BTreeMap::new(),
        pod_cidr: "10.0.0.0/16".parse().expect("invariant: a CIDR"),
        service_cidr: "10.1.0.0/16".parse().expect("invariant: a CIDR"),
        version: liqo_api::VERSION.to_owned(),
    };
    render(&Options {
        identity: Some(stand_in),
        ..Options::default()
    })
}

/// The gateway's account, rights and Deployment. Its rights are what it
/// reads today: the identity and the peers; the tunnel adds its own.
fn gateway(options: &Options) -> Vec<Manifest> {
    let name = names::GATEWAY;
    let component = "gateway";
    let subject =
        json!([{ "kind": "ServiceAccount", "name": name, "namespace": names::NAMESPACE }]);
    let mut pod_labels = selector_labels(component);
    pod_labels.extend(common_labels(component));
    vec![
        Manifest::ServiceAccount(from_json(json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": meta(name, component),
        }))),
        Manifest::Role(from_json(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(name, component),
            "rules": [{
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [names::IDENTITY_CONFIGMAP],
                "verbs": ["get", "list", "watch"],
            }],
        }))),
        Manifest::RoleBinding(from_json(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(name, component),
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
            "subjects": subject,
        }))),
        Manifest::ClusterRole(from_json(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": cluster_meta(name, component),
            "rules": [{
                "apiGroups": [names::GROUP],
                "resources": ["foreignclusters"],
                "verbs": ["get", "list", "watch"],
            }],
        }))),
        Manifest::ClusterRoleBinding(from_json(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": cluster_meta(name, component),
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name },
            "subjects": subject,
        }))),
        Manifest::Deployment(Box::new(from_json(json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta(name, component),
            "spec": {
                "replicas": 1,
                // One gateway at a time: the old one goes before the new
                // one comes, as they would hold the same tunnel endpoint.
                "strategy": { "type": "Recreate" },
                "selector": { "matchLabels": selector_labels(component) },
                "template": {
                    "metadata": { "labels": pod_labels },
                    "spec": {
                        "serviceAccountName": name,
                        "nodeSelector": options.node_selector,
                        "tolerations": options.tolerations,
                        "terminationGracePeriodSeconds": 10,
                        "securityContext": pod_security_context(),
                        "containers": [{
                            "name": "gateway",
                            "image": format!("{}:{}", names::GATEWAY_IMAGE, liqo_api::VERSION),
                            "args": [format!("--health-addr=$(POD_IP):{}", names::HEALTH_PORT)],
                            "env": [
                                { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                                { "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
                            ],
                            "ports": [{ "name": "health", "containerPort": names::HEALTH_PORT }],
                            "readinessProbe": {
                                "httpGet": { "path": "/readyz", "port": "health" },
                                "periodSeconds": 2,
                            },
                            "livenessProbe": {
                                "httpGet": { "path": "/healthz", "port": "health" },
                                "periodSeconds": 10,
                                "failureThreshold": 3,
                            },
                            "resources": {
                                "requests": { "cpu": "50m", "memory": "32Mi" },
                                "limits": { "memory": "128Mi" },
                            },
                            "securityContext": container_security_context(),
                        }],
                    },
                },
            },
        })))),
    ]
}

/// The Pod Security Standard the `liqo` namespace enforces: `restricted`,
/// which the agents meet today. The gateway's tunnel will need NET_ADMIN
/// and a TUN device, which only `privileged` allows (docs/install.md).
fn pod_security_labels() -> BTreeMap<String, String> {
    ["enforce", "audit", "warn"]
        .into_iter()
        .flat_map(|mode| {
            [
                (
                    format!("pod-security.kubernetes.io/{mode}"),
                    "restricted".to_owned(),
                ),
                (
                    format!("pod-security.kubernetes.io/{mode}-version"),
                    "v1.34".to_owned(),
                ),
            ]
        })
        .collect()
}

/// Agents run as an unprivileged user with the runtime's default seccomp
/// profile: nothing they do today needs more.
pub(crate) fn pod_security_context() -> serde_json::Value {
    json!({
        "runAsNonRoot": true,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": { "type": "RuntimeDefault" },
    })
}

pub(crate) fn container_security_context() -> serde_json::Value {
    json!({
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "capabilities": { "drop": ["ALL"] },
    })
}

/// Labels on every object we create, so that they can all be found.
pub(crate) fn common_labels(component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        ),
        (labels::COMPONENT.to_owned(), component.to_owned()),
        (labels::VERSION.to_owned(), liqo_api::VERSION.to_owned()),
    ])
}

/// Labels that select a component's pods: stable across versions, as a
/// Deployment's selector cannot change.
pub(crate) fn selector_labels(component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_owned(),
            format!("liqo-{component}"),
        ),
        ("app.kubernetes.io/part-of".to_owned(), "liqo".to_owned()),
    ])
}

fn meta(name: &str, component: &str) -> serde_json::Value {
    json!({ "name": name, "namespace": names::NAMESPACE, "labels": common_labels(component) })
}

fn cluster_meta(name: &str, component: &str) -> serde_json::Value {
    json!({ "name": name, "labels": common_labels(component) })
}

pub(crate) fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("invariant: the manifests above match their types")
}

/// The objects as a multi-document YAML stream.
pub fn to_yaml(manifests: &[Manifest]) -> anyhow::Result<String> {
    let mut out = String::new();
    for m in manifests {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(m)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifests_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests")
    }

    /// `manifests/` is what install applies with default options. Set
    /// LIQO_UPDATE_MANIFESTS=1 to rewrite it after changing the code.
    #[test]
    fn manifests_folder_matches_the_code() {
        let all = render(&Options::default());
        let (crds, rest): (Vec<_>, Vec<_>) =
            all.into_iter().partition(|m| matches!(m, Manifest::Crd(_)));
        for (file, objects) in [("crds.yaml", crds), ("install.yaml", rest)] {
            let want = format!(
                "# Generated from the Rust types by liqoctl's tests: do not edit.\n{}",
                to_yaml(&objects).expect("render")
            );
            let path = manifests_dir().join(file);
            if std::env::var_os("LIQO_UPDATE_MANIFESTS").is_some() {
                std::fs::write(&path, &want).expect("write manifests");
                continue;
            }
            let have = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                have == want,
                "manifests/{file} differs from the code; run LIQO_UPDATE_MANIFESTS=1 cargo test -p liqoctl manifests"
            );
        }
    }

    #[test]
    fn every_object_carries_our_labels() {
        let options = Options {
            identity: Some(ClusterIdentity {
                cluster_id: liqo_api::ClusterId::new("c1").expect("valid"),
                cluster_name: "c1".into(),
                labels: BTreeMap::new(),
                pod_cidr: "10.0.0.0/16".parse().expect("cidr"),
                service_cidr: "10.1.0.0/16".parse().expect("cidr"),
                version: liqo_api::VERSION.into(),
            }),
            node_selector: BTreeMap::from([("k".into(), "v".into())]),
            tolerations: Vec::new(),
        };
        for m in render(&options) {
            let value = serde_json::to_value(&m).expect("serialize");
            assert_eq!(
                value["metadata"]["labels"][labels::MANAGED_BY],
                labels::MANAGED_BY_VALUE,
                "{}",
                m.describe()
            );
            if let Manifest::Deployment(d) = &m {
                let spec = d
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref())
                    .expect("pod spec");
                assert_eq!(spec.node_selector, Some(options.node_selector.clone()));
            }
        }
    }

    #[test]
    fn images_are_tagged_with_our_version() {
        let yaml = to_yaml(&render(&Options::default())).expect("render");
        assert!(yaml.contains(&format!("{}:{}", names::GATEWAY_IMAGE, liqo_api::VERSION)));
    }
}
