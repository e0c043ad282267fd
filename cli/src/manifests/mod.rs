//! What `liqoctl install` applies, built as typed objects by pure functions:
//! the [`Manifest`] every command applies, the rendering of an installation
//! in the order it is applied, and the helpers every object uses (labels,
//! metadata, typed [`rbac`] and [`validation`] pieces). One file per
//! concern: the [`agents`], the admission policies ([`peer_admission`], [`twin_namespaces`],
//! [`token_admission`], [`placement`]), the placement [`webhook`], and the
//! Multi-Cluster Services API's CRDs ([`mcs`]), which install shares; and
//! what the other commands make: a consumer's objects on its provider
//! ([`tenant`]), a peering token's ([`peering_token`]), and an outgoing
//! peering's virtual kubelet ([`virtual_kubelet`]).
//! `manifests/` holds these objects rendered with the default options, and
//! a test fails when it drifts from them.

pub mod agents;
pub mod mcs;
pub mod peer_admission;
pub mod peering_token;
pub mod placement;
pub mod rbac;
pub mod storage;
pub mod tenant;
pub mod token_admission;
pub mod twin_namespaces;
pub mod validation;
pub mod virtual_kubelet;
pub mod webhook;

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::admissionregistration::v1beta1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, ResourceQuota, Secret, Service, ServiceAccount, Toleration,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, OwnerReference};
use kube::api::ApiResource;
use kube::core::ObjectMeta;
use liqo_api::ClusterIdentity;
use liqo_api::authentication::Tenant;
use liqo_api::core::ForeignCluster;
use liqo_api::discovery::ApiAddress;
use liqo_api::images::ImageSource;
use liqo_api::names::{self, labels};
use liqo_api::networking::{Connection, GatewayServiceType};
use liqo_api::sharing::SharingPolicy;
use serde::Serialize;

use agents::TunnelSettings;

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
    Service(Box<Service>),
    Tenant(Box<Tenant>),
    ForeignCluster(Box<ForeignCluster>),
    SharingPolicy(Box<SharingPolicy>),
    Connection(Box<Connection>),
    ValidatingAdmissionPolicy(Box<ValidatingAdmissionPolicy>),
    ValidatingAdmissionPolicyBinding(Box<ValidatingAdmissionPolicyBinding>),
    MutatingAdmissionPolicy(Box<MutatingAdmissionPolicy>),
    MutatingAdmissionPolicyBinding(Box<MutatingAdmissionPolicyBinding>),
    MutatingWebhookConfiguration(Box<MutatingWebhookConfiguration>),
    StorageClass(Box<StorageClass>),
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
            Self::Service(o) => ("Service", &o.metadata),
            Self::Tenant(o) => ("Tenant", &o.metadata),
            Self::ForeignCluster(o) => ("ForeignCluster", &o.metadata),
            Self::SharingPolicy(o) => ("SharingPolicy", &o.metadata),
            Self::Connection(o) => ("Connection", &o.metadata),
            Self::ValidatingAdmissionPolicy(o) => ("ValidatingAdmissionPolicy", &o.metadata),
            Self::ValidatingAdmissionPolicyBinding(o) => {
                ("ValidatingAdmissionPolicyBinding", &o.metadata)
            }
            Self::MutatingAdmissionPolicy(o) => ("MutatingAdmissionPolicy", &o.metadata),
            Self::MutatingAdmissionPolicyBinding(o) => {
                ("MutatingAdmissionPolicyBinding", &o.metadata)
            }
            Self::MutatingWebhookConfiguration(o) => ("MutatingWebhookConfiguration", &o.metadata),
            Self::StorageClass(o) => ("StorageClass", &o.metadata),
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::Crd(o) => &mut o.metadata,
            Self::Namespace(o) => &mut o.metadata,
            Self::ServiceAccount(o) => &mut o.metadata,
            Self::ClusterRole(o) => &mut o.metadata,
            Self::ClusterRoleBinding(o) => &mut o.metadata,
            Self::Role(o) => &mut o.metadata,
            Self::RoleBinding(o) => &mut o.metadata,
            Self::ConfigMap(o) => &mut o.metadata,
            Self::Deployment(o) => &mut o.metadata,
            Self::Secret(o) => &mut o.metadata,
            Self::ResourceQuota(o) => &mut o.metadata,
            Self::Service(o) => &mut o.metadata,
            Self::Tenant(o) => &mut o.metadata,
            Self::ForeignCluster(o) => &mut o.metadata,
            Self::SharingPolicy(o) => &mut o.metadata,
            Self::Connection(o) => &mut o.metadata,
            Self::ValidatingAdmissionPolicy(o) => &mut o.metadata,
            Self::ValidatingAdmissionPolicyBinding(o) => &mut o.metadata,
            Self::MutatingAdmissionPolicy(o) => &mut o.metadata,
            Self::MutatingAdmissionPolicyBinding(o) => &mut o.metadata,
            Self::MutatingWebhookConfiguration(o) => &mut o.metadata,
            Self::StorageClass(o) => &mut o.metadata,
        }
    }

    /// When the object may be applied among others (`Journal::apply_all`):
    /// objects of a lower rank first, those of one rank together. A
    /// namespace before what it holds; what the API server admits before
    /// anyone is given rights; roles before their bindings (binding a role
    /// that does not exist yet needs the `bind` verb); rights before the
    /// workloads that use them; records, which say a set is complete, last.
    pub fn rank(&self) -> u8 {
        match self {
            Self::Crd(_) | Self::Namespace(_) => 0,
            Self::ValidatingAdmissionPolicy(_) | Self::MutatingAdmissionPolicy(_) => 1,
            Self::ValidatingAdmissionPolicyBinding(_)
            | Self::MutatingAdmissionPolicyBinding(_)
            | Self::MutatingWebhookConfiguration(_) => 2,
            Self::ServiceAccount(_)
            | Self::ClusterRole(_)
            | Self::Role(_)
            | Self::ConfigMap(_)
            | Self::Secret(_)
            | Self::ResourceQuota(_)
            | Self::Service(_)
            | Self::StorageClass(_) => 3,
            Self::ClusterRoleBinding(_) | Self::RoleBinding(_) => 4,
            Self::Deployment(_) => 5,
            Self::Tenant(_)
            | Self::ForeignCluster(_)
            | Self::SharingPolicy(_)
            | Self::Connection(_) => 6,
        }
    }

    /// The same object, owned by `owner`: the API server's garbage
    /// collector deletes it once the owner is gone.
    pub fn owned_by(mut self, owner: OwnerReference) -> Self {
        self.meta_mut().owner_references = Some(vec![owner]);
        self
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
            Self::Service(_) => ApiResource::erase::<Service>(&()),
            Self::Tenant(_) => ApiResource::erase::<Tenant>(&()),
            Self::ForeignCluster(_) => ApiResource::erase::<ForeignCluster>(&()),
            Self::SharingPolicy(_) => ApiResource::erase::<SharingPolicy>(&()),
            Self::Connection(_) => ApiResource::erase::<Connection>(&()),
            Self::ValidatingAdmissionPolicy(_) => {
                ApiResource::erase::<ValidatingAdmissionPolicy>(&())
            }
            Self::ValidatingAdmissionPolicyBinding(_) => {
                ApiResource::erase::<ValidatingAdmissionPolicyBinding>(&())
            }
            Self::MutatingAdmissionPolicy(_) => ApiResource::erase::<MutatingAdmissionPolicy>(&()),
            Self::MutatingAdmissionPolicyBinding(_) => {
                ApiResource::erase::<MutatingAdmissionPolicyBinding>(&())
            }
            Self::MutatingWebhookConfiguration(_) => {
                ApiResource::erase::<MutatingWebhookConfiguration>(&())
            }
            Self::StorageClass(_) => ApiResource::erase::<StorageClass>(&()),
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
    /// Where the nodes get the agents' images.
    pub images: ImageSource,
    /// The cluster does not serve MutatingAdmissionPolicy
    /// (admissionregistration.k8s.io/v1beta1): placement is left out.
    pub without_placement_policy: bool,
    /// With `without_placement_policy`: the CA (PEM) of the placement
    /// webhook's serving certificate, to install the webhook instead.
    pub placement_webhook_ca: Option<String>,
    /// The API server URL peers should use, given to the gateway (which
    /// announces it with `announce`); absent when rendering `manifests/`.
    pub advertise_address: Option<ApiAddress>,
    /// The gateway announces the cluster on the nodes' LAN with mDNS
    /// (docs/discovery.md).
    pub announce: bool,
    /// The gateway's tunnel settings (docs/network.md).
    pub tunnels: TunnelSettings,
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
    out.push(Manifest::Namespace(Namespace {
        metadata: ObjectMeta {
            name: Some(names::NAMESPACE.to_owned()),
            labels: Some(namespace_labels),
            ..Default::default()
        },
        ..Default::default()
    }));
    if let Some(identity) = &options.identity {
        out.push(Manifest::ConfigMap(ConfigMap {
            metadata: meta(names::IDENTITY_CONFIGMAP, "identity"),
            data: Some(identity.to_data()),
            ..Default::default()
        }));
    }
    // Where the gateway publishes this cluster's exports to the
    // clusterset, for the virtual kubelets to carry (docs/services.md).
    out.push(Manifest::ConfigMap(ConfigMap {
        metadata: meta(names::CLUSTERSET_EXPORTS, "clusterset"),
        ..Default::default()
    }));
    out.extend(agents::gateway(options));
    out.extend(twin_namespaces::twin_namespace_policies());
    out.extend(peer_admission::policies());
    out.extend(token_admission::peering_token_policy());
    out.push(storage::storage_class());
    if !options.without_placement_policy {
        out.extend(placement::placement_policies());
        out.extend(storage::claims_policy());
    } else if let Some(ca) = &options.placement_webhook_ca {
        out.extend(webhook::placement_webhook(ca));
    }
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
    // With every optional object: a Service in front of the gateway, and
    // the placement webhook with its Secret (made by install itself).
    let mut out = render(&Options {
        identity: Some(stand_in),
        tunnels: TunnelSettings {
            service_type: Some(GatewayServiceType::NodePort),
            ..TunnelSettings::default()
        },
        ..Options::default()
    });
    out.extend(webhook::placement_webhook_objects());
    out
}

/// The Pod Security Standard of the `liqo` namespace: the gateway needs
/// the node's network, NET_ADMIN and the TUN device, which only
/// `privileged` allows, so that is enforced; `restricted`, which the
/// virtual kubelets meet, is still audited and warned about.
fn pod_security_labels() -> BTreeMap<String, String> {
    ["enforce", "audit", "warn"]
        .into_iter()
        .flat_map(|mode| {
            let level = if mode == "enforce" {
                "privileged"
            } else {
                "restricted"
            };
            [
                (
                    format!("pod-security.kubernetes.io/{mode}"),
                    level.to_owned(),
                ),
                (
                    format!("pod-security.kubernetes.io/{mode}-version"),
                    "v1.34".to_owned(),
                ),
            ]
        })
        .collect()
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

/// The metadata of our object `name` of `component` in `liqo`.
fn meta(name: &str, component: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(names::NAMESPACE.to_owned()),
        ..cluster_meta(name, component)
    }
}

/// The metadata of our cluster-wide object `name` of `component`.
pub(crate) fn cluster_meta(name: &str, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(common_labels(component)),
        ..Default::default()
    }
}

/// Objects whose label `key` has one of `values`.
pub(crate) fn label_in(key: &str, values: &[&str]) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.to_owned(),
        operator: "In".to_owned(),
        values: Some(strings(values)),
    }
}

/// `values` as the owned strings the typed objects hold.
pub(crate) fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| (*v).to_owned()).collect()
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
    use super::agents::{GatewayArgs, gateway_args_of};
    use super::*;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn manifests_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests")
    }

    /// `manifests/` is what install applies with default options. Set
    /// LIQO_UPDATE_MANIFESTS=1 to rewrite it after changing the code.
    #[test]
    fn manifests_folder_matches_the_code() {
        let all = render(&Options::default());
        let (mut crds, rest): (Vec<_>, Vec<_>) =
            all.into_iter().partition(|m| matches!(m, Manifest::Crd(_)));
        crds.extend(mcs::crds());
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
    fn without_policies_the_webhook_places_pods() {
        let ca = "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n";
        let all = render(&Options {
            without_placement_policy: true,
            placement_webhook_ca: Some(ca.to_owned()),
            ..Options::default()
        });
        assert!(
            !all.iter()
                .any(|m| matches!(m, Manifest::MutatingAdmissionPolicy(_)))
        );
        let hook = all
            .iter()
            .find_map(|m| match m {
                Manifest::MutatingWebhookConfiguration(h) => Some(h),
                _ => None,
            })
            .expect("the webhook");
        let v = serde_json::to_value(hook).expect("json");
        for (i, (strategy, path)) in [
            ("Remote", "/placement/remote"),
            ("LocalAndRemote", "/placement/local-and-remote"),
        ]
        .into_iter()
        .enumerate()
        {
            let w = &v["webhooks"][i];
            assert_eq!(w["clientConfig"]["service"]["path"], path);
            assert_eq!(w["failurePolicy"], "Ignore");
            assert_eq!(
                w["namespaceSelector"]["matchExpressions"][1]["values"][0],
                strategy
            );
            use base64::Engine as _;
            let bundle = base64::engine::general_purpose::STANDARD
                .decode(w["clientConfig"]["caBundle"].as_str().expect("bundle"))
                .expect("base64");
            assert_eq!(bundle, ca.as_bytes());
        }
        let service = all
            .iter()
            .find(|m| m.describe() == "Service/liqo-placement")
            .expect("the Service");
        let v = serde_json::to_value(service).expect("json");
        assert_eq!(
            v["spec"]["selector"]["app.kubernetes.io/name"],
            "liqo-virtual-kubelet"
        );
        // Without a certificate (dry runs before install made one), no
        // webhook either.
        let none = render(&Options {
            without_placement_policy: true,
            ..Options::default()
        });
        assert!(
            !none
                .iter()
                .any(|m| matches!(m, Manifest::MutatingWebhookConfiguration(_)))
        );
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
            images: ImageSource::default(),
            without_placement_policy: false,
            placement_webhook_ca: None,
            advertise_address: None,
            announce: false,
            tunnels: TunnelSettings::default(),
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

    fn gateway_of(manifests: &[Manifest]) -> &Deployment {
        manifests
            .iter()
            .find_map(|m| match m {
                Manifest::Deployment(d) if d.metadata.name.as_deref() == Some(names::GATEWAY) => {
                    Some(&**d)
                }
                _ => None,
            })
            .expect("the gateway")
    }

    /// Without --announce the gateway gets no flag to announce; with it,
    /// it does. Either way it runs on the node's network (its tunnels
    /// route there), with NET_ADMIN alone, and the namespace allows it.
    /// The settings install keeps are read back as they were given.
    #[test]
    fn the_gateway_announces_only_when_asked() {
        let address = ApiAddress::parse("https://10.0.0.1:6443").expect("valid");
        let mut options = Options {
            advertise_address: Some(address),
            ..Options::default()
        };
        let quiet = render(&options);
        let gateway = gateway_of(&quiet);
        assert_eq!(
            gateway_args_of(gateway),
            GatewayArgs {
                announce: false,
                advertise_address: Some("https://10.0.0.1:6443".into()),
                tunnels: TunnelSettings::default(),
            }
        );
        let pod = gateway.spec.as_ref().and_then(|s| s.template.spec.as_ref());
        assert_eq!(pod.and_then(|p| p.host_network), Some(true));
        let container = pod.map(|p| &p.containers[0]).expect("a container");
        let caps = container
            .security_context
            .as_ref()
            .and_then(|c| c.capabilities.clone())
            .expect("capabilities");
        assert_eq!(caps.add, Some(vec!["NET_ADMIN".to_owned()]));
        assert_eq!(caps.drop, Some(vec!["ALL".to_owned()]));

        options.announce = true;
        options.tunnels = TunnelSettings {
            endpoint_address: Some("gw.example.com".into()),
            ports: Some("4000-4010".parse().expect("ports")),
            remap_pool: vec!["100.80.0.0/12".parse().expect("cidr")],
            service_type: Some(GatewayServiceType::NodePort),
        };
        let loud = render(&options);
        let gateway = gateway_of(&loud);
        let args = gateway_args_of(gateway);
        assert!(args.announce);
        assert_eq!(args.tunnels, options.tunnels);
        // The Service in front: one UDP port per tunnel port, to the same.
        let Some(Manifest::Service(service)) =
            loud.iter().find(|m| matches!(m, Manifest::Service(_)))
        else {
            panic!("no Service in front of the gateway");
        };
        let spec = service.spec.clone().expect("a spec");
        assert_eq!(spec.type_.as_deref(), Some("NodePort"));
        let ports = spec.ports.expect("ports");
        assert_eq!(ports.len(), 11);
        assert!(ports.iter().all(|p| p.protocol.as_deref() == Some("UDP")
            && p.target_port == Some(IntOrString::Int(p.port))));
        // Behind a load balancer with no address given, the gateway
        // publishes the balancer's: no node address is passed.
        options.tunnels.endpoint_address = None;
        options.tunnels.service_type = Some(GatewayServiceType::LoadBalancer);
        let balanced = render(&options);
        let args = gateway_args_of(gateway_of(&balanced));
        assert_eq!(args.tunnels, options.tunnels);
        let raw = gateway_of(&balanced)
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .map(|p| p.containers[0].args.clone().unwrap_or_default())
            .unwrap_or_default();
        assert!(
            !raw.iter().any(|a| a.starts_with("--endpoint-address=")),
            "{raw:?}"
        );
        assert!(raw.contains(&"--expose=LoadBalancer".to_owned()), "{raw:?}");
        // Without one, no Service.
        options.tunnels.service_type = None;
        assert!(
            !render(&options)
                .iter()
                .any(|m| matches!(m, Manifest::Service(_)))
        );
        let Some(Manifest::Namespace(ns)) =
            loud.iter().find(|m| matches!(m, Manifest::Namespace(_)))
        else {
            panic!("no namespace");
        };
        let labels = ns.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels
                .get("pod-security.kubernetes.io/enforce")
                .map(String::as_str),
            Some("privileged")
        );
        assert_eq!(
            labels
                .get("pod-security.kubernetes.io/warn")
                .map(String::as_str),
            Some("restricted")
        );
    }

    #[test]
    fn images_are_tagged_with_our_version() {
        let yaml = to_yaml(&render(&Options::default())).expect("render");
        assert!(yaml.contains(&format!("{}:{}", names::GATEWAY_IMAGE, liqo_api::VERSION)));
    }

    #[test]
    fn the_gateway_runs_the_image_install_was_told() {
        let images = ImageSource {
            registry: "registry.local:5000/team".into(),
            tag: "rc1".into(),
            pull_policy: liqo_api::images::PullPolicy::Never,
        };
        let manifests = render(&Options {
            images: images.clone(),
            ..Default::default()
        });
        let container = gateway_of(&manifests)
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .map(|p| p.containers[0].clone())
            .expect("a container");
        assert_eq!(
            container.image.as_deref(),
            Some("registry.local:5000/team/liqo-gateway:rc1")
        );
        assert_eq!(container.image_pull_policy.as_deref(), Some("Never"));
    }
}
