//! What `liqoctl install` applies, built as typed objects by pure functions.
//! `manifests/` holds these objects rendered with the default options, and a
//! test fails when it drifts from them.

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
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ApiResource;
use kube::core::ObjectMeta;
use liqo_api::ClusterIdentity;
use liqo_api::authentication::Tenant;
use liqo_api::core::ForeignCluster;
use liqo_api::discovery::ApiAddress;
use liqo_api::images::{self, ImageSource};
use liqo_api::names::{self, labels};
use liqo_api::networking::{Connection, GatewayServiceType};
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

/// How the gateway's tunnels are reached and address their peers; each
/// `None` leaves the gateway's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TunnelSettings {
    /// The host peers dial; by default the gateway node's address.
    pub endpoint_address: Option<String>,
    /// `FIRST-LAST`: the UDP ports of incoming peerings' tunnels.
    pub ports: Option<String>,
    /// `CIDR[,CIDR...]`: where overlapping peers' CIDRs are remapped to.
    pub remap_pool: Option<String>,
    /// The Service in front of the tunnels, if any.
    pub service_type: Option<GatewayServiceType>,
}

/// The tunnel ports install uses when not told otherwise (the gateway's
/// own default).
pub const DEFAULT_TUNNEL_PORTS: &str = "51820-51899";

/// The gateway's flags that install sets; install reads them back from
/// the installed Deployment to keep them (see [`gateway_args_of`]).
pub const ANNOUNCE_FLAG: &str = "--announce";
pub const ADVERTISE_ADDRESS_FLAG: &str = "--advertise-address=";
pub const ENDPOINT_ADDRESS_FLAG: &str = "--endpoint-address=";
pub const TUNNEL_PORTS_FLAG: &str = "--tunnel-ports=";
pub const REMAP_POOL_FLAG: &str = "--remap-pool=";
pub const EXPOSE_FLAG: &str = "--expose=";
/// What `--endpoint-address` is when install was not given one: the
/// node's address, from the downward API.
const NODE_ADDRESS: &str = "$(HOST_IP)";

/// How the installed gateway announces and runs tunnels, read from its
/// Deployment's args.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GatewayArgs {
    pub announce: bool,
    pub advertise_address: Option<String>,
    pub tunnels: TunnelSettings,
}

pub fn gateway_args_of(deployment: &Deployment) -> GatewayArgs {
    let args = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.iter().find(|c| c.name == "gateway"))
        .and_then(|c| c.args.clone())
        .unwrap_or_default();
    let flag = |prefix: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(prefix))
            .map(str::to_owned)
    };
    GatewayArgs {
        announce: args.iter().any(|a| a == ANNOUNCE_FLAG),
        advertise_address: flag(ADVERTISE_ADDRESS_FLAG),
        tunnels: TunnelSettings {
            endpoint_address: flag(ENDPOINT_ADDRESS_FLAG).filter(|a| a != NODE_ADDRESS),
            ports: flag(TUNNEL_PORTS_FLAG),
            remap_pool: flag(REMAP_POOL_FLAG),
            service_type: flag(EXPOSE_FLAG).and_then(|t| t.parse().ok()),
        },
    }
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
    out.extend(twin_namespace_policies());
    out.extend(crate::peering::admission::policies());
    out.extend(peering_token_policy());
    if !options.without_placement_policy {
        out.extend(placement_policies());
    } else if let Some(ca) = &options.placement_webhook_ca {
        out.extend(placement_webhook(ca));
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
    out.extend(placement_webhook_objects());
    out
}

/// The placement webhook's objects and its Secret, by kind and name.
pub fn placement_webhook_objects() -> Vec<Manifest> {
    let mut out = placement_webhook("");
    out.push(Manifest::Secret(from_json(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta(PLACEMENT_TLS_SECRET, "placement"),
    }))));
    out
}

/// The placement webhook's Service and configuration.
pub const PLACEMENT_WEBHOOK: &str = "liqo-placement";
/// The Secret with its serving certificate (`tls.crt`, `tls.key`,
/// `ca.crt`), made by install, read by the virtual kubelets.
pub const PLACEMENT_TLS_SECRET: &str = "liqo-placement-tls";
/// The port the virtual kubelets serve the webhook on.
pub const PLACEMENT_PORT: u16 = 9443;

/// Placement where MutatingAdmissionPolicy is not served (docs/
/// offloading.md, "Placement"): the same mutations, by a webhook that
/// every virtual kubelet serves behind the Service `liqo-placement`. One
/// entry per strategy, selecting namespaces by their labels as the
/// policies do, so the path tells the strategy. `Ignore` on failure: a
/// pod the webhook did not see tolerates no virtual node and stays local
/// (with no peering there is no virtual kubelet to answer).
fn placement_webhook(ca_pem: &str) -> Vec<Manifest> {
    use base64::Engine as _;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let entry = |name: &str, strategy: &str, path: &str| {
        json!({
            "name": name,
            "clientConfig": {
                "service": {
                    "namespace": names::NAMESPACE,
                    "name": PLACEMENT_WEBHOOK,
                    "path": path,
                    "port": 443,
                },
                "caBundle": ca_bundle,
            },
            "rules": [{
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }],
            "namespaceSelector": { "matchExpressions": [
                { "key": labels::OFFLOADING, "operator": "In", "values": ["true"] },
                { "key": labels::POD_OFFLOADING_STRATEGY, "operator": "In", "values": [strategy] },
            ] },
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
            "reinvocationPolicy": "Never",
        })
    };
    vec![
        Manifest::Service(Box::new(from_json(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(PLACEMENT_WEBHOOK, "placement"),
            "spec": {
                // Every virtual kubelet, whichever provider it stands for.
                "selector": selector_labels("virtual-kubelet"),
                "ports": [{ "name": "webhook", "port": 443, "targetPort": PLACEMENT_PORT }],
            },
        })))),
        Manifest::MutatingWebhookConfiguration(Box::new(from_json(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": cluster_meta(PLACEMENT_WEBHOOK, "placement"),
            "webhooks": [
                entry("remote.placement.liqo.io", "Remote", "/placement/remote"),
                entry(
                    "local-and-remote.placement.liqo.io",
                    "LocalAndRemote",
                    "/placement/local-and-remote",
                ),
            ],
        })))),
    ]
}

/// The prefix of every peer identity's user name (see
/// `liqo_api::authentication::peer_user`); CEL takes the cluster ID after it.
const PEER_PREFIX: &str = "liqo.io:peer:";

/// What a peer's identity may do with namespaces and RoleBindings on this
/// cluster when it is a provider, beyond what RBAC can say (docs/offloading.md):
/// RBAC lets a peer create any namespace and RoleBinding; these policies,
/// enforced by the API server itself, confine it to namespaces labelled as
/// its own, and to binding its own ClusterRole to itself there. Installed
/// on every cluster, as any cluster may become a provider.
pub fn twin_namespace_policies() -> Vec<Manifest> {
    let tenant = labels::TENANT;
    let prefix = PEER_PREFIX;
    let is_peer = json!([{
        "name": "is-a-peer",
        "expression": format!("request.userInfo.username.startsWith('{prefix}')"),
    }]);
    let variables = json!([{
        "name": "tenant",
        "expression": format!("request.userInfo.username.substring({})", prefix.len()),
    }]);
    // A namespace's tenant label, or "" when it has none.
    let label_of = |obj: &str| {
        format!(
            "(has({obj}.metadata.labels) && '{tenant}' in {obj}.metadata.labels \
             ? {obj}.metadata.labels['{tenant}'] : '')"
        )
    };
    let namespaces = "liqo-peer-namespaces";
    let rolebindings = "liqo-peer-rolebindings";
    let binding = |policy: &str| {
        Manifest::ValidatingAdmissionPolicyBinding(Box::new(from_json(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": cluster_meta(policy, "admission"),
            "spec": { "policyName": policy, "validationActions": ["Deny"] },
        }))))
    };
    vec![
        Manifest::ValidatingAdmissionPolicy(Box::new(from_json(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": cluster_meta(namespaces, "admission"),
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": { "resourceRules": [{
                    "apiGroups": [""],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE", "DELETE"],
                    "resources": ["namespaces", "namespaces/*"],
                }] },
                "matchConditions": is_peer,
                "variables": variables,
                "validations": [
                    {
                        "expression": format!(
                            "request.operation != 'CREATE' || {} == variables.tenant",
                            label_of("object")
                        ),
                        "messageExpression": format!(
                            "'a peer may only create namespaces labelled {tenant}=' + variables.tenant"
                        ),
                        "reason": "Forbidden",
                    },
                    {
                        // The existing namespace decides, so that nobody
                        // else's can be taken over by labelling it.
                        "expression": format!(
                            "request.operation == 'CREATE' || {} == variables.tenant",
                            label_of("oldObject")
                        ),
                        "messageExpression": format!(
                            "'a peer may only change or delete namespaces labelled {tenant}=' + variables.tenant"
                        ),
                        "reason": "Forbidden",
                    },
                    {
                        "expression": format!(
                            "request.operation != 'UPDATE' || {} == variables.tenant",
                            label_of("object")
                        ),
                        "messageExpression": format!(
                            "'a peer may not remove or change the {tenant} label'"
                        ),
                        "reason": "Forbidden",
                    },
                ],
            },
        })))),
        binding(namespaces),
        Manifest::ValidatingAdmissionPolicy(Box::new(from_json(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": cluster_meta(rolebindings, "admission"),
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": { "resourceRules": [{
                    "apiGroups": ["rbac.authorization.k8s.io"],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["rolebindings"],
                }] },
                "matchConditions": is_peer,
                "variables": variables,
                "validations": [
                    {
                        "expression": format!("{} == variables.tenant", label_of("namespaceObject")),
                        "messageExpression": format!(
                            "'a peer may only bind in namespaces labelled {tenant}=' + variables.tenant"
                        ),
                        "reason": "Forbidden",
                    },
                    {
                        "expression": format!(
                            "object.roleRef.apiGroup == 'rbac.authorization.k8s.io' && \
                             object.roleRef.kind == 'ClusterRole' && \
                             object.roleRef.name == 'liqo-tenant-' + variables.tenant"
                        ),
                        "messageExpression": "'a peer may only bind the ClusterRole liqo-tenant-' + variables.tenant",
                        "reason": "Forbidden",
                    },
                    {
                        "expression": "has(object.subjects) && size(object.subjects) == 1 && \
                             object.subjects[0].kind == 'User' && \
                             object.subjects[0].name == request.userInfo.username",
                        "messageExpression": "'a peer may only bind itself'",
                        "reason": "Forbidden",
                    },
                ],
            },
        })))),
        binding(rolebindings),
        share_policy(),
        Manifest::ValidatingAdmissionPolicyBinding(Box::new(from_json(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": cluster_meta(SHARE_POLICY, "admission"),
            "spec": {
                "policyName": SHARE_POLICY,
                "validationActions": ["Deny"],
                // The namespace's own share, found by the labels the
                // gateway gives it (a tenant cannot make quotas).
                "paramRef": {
                    "selector": { "matchLabels": {
                        labels::MANAGED_BY: labels::MANAGED_BY_VALUE,
                        labels::COMPONENT: "gateway",
                    } },
                    "parameterNotFoundAction": "Deny",
                },
            },
        })))),
    ]
}

/// The admission policy that refuses pods in a twin namespace until it
/// has its share of the grant (the ResourceQuota the provider's gateway
/// makes): a new twin is not usable before the grant bounds it.
pub const SHARE_POLICY: &str = "liqo-twin-share";

fn share_policy() -> Manifest {
    let share = liqo_api::shares::SHARE_QUOTA;
    Manifest::ValidatingAdmissionPolicy(Box::new(from_json(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": cluster_meta(SHARE_POLICY, "admission"),
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": { "apiVersion": "v1", "kind": "ResourceQuota" },
            "matchConstraints": {
                "namespaceSelector": { "matchExpressions": [
                    { "key": labels::TENANT, "operator": "Exists" },
                ] },
                "resourceRules": [{
                    "apiGroups": [""],
                    "apiVersions": ["*"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                }],
            },
            "validations": [{
                "expression": format!("params.metadata.name == '{share}'"),
                "messageExpression": format!(
                    "'pods in a twin namespace need its share of the grant (ResourceQuota {share}), \
                     which the provider\\'s liqo-gateway makes'"
                ),
                "reason": "Forbidden",
            }],
        },
    }))))
}

/// What a peering token's bootstrap credential may do beyond its RBAC
/// (docs/tokens.md): RBAC lets it create Secrets in `liqo` and mint the
/// credential of its own tenants' accounts; this policy narrows that to
/// creating the claim Secrets of its own token, and to minting only
/// credentials bound to such a claim by UID, which only the claimant learns
/// (from its create). A claimed tenant cannot be claimed again (the Secret
/// exists), and its credential cannot be minted again by another holder of
/// the token (the UID is unknown to it).
pub fn peering_token_policy() -> Vec<Manifest> {
    use liqo_api::token::{CLAIM_SECRET_TYPE, bootstrap_user, objects};
    let name = "liqo-peering-tokens";
    let prefix = bootstrap_user("");
    let peer_prefix = objects::PEER_PREFIX;
    let claim_prefix = objects::CLAIM_PREFIX;
    vec![
        Manifest::ValidatingAdmissionPolicy(Box::new(from_json(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": cluster_meta(name, "admission"),
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": { "resourceRules": [{
                    "apiGroups": [""],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE", "DELETE"],
                    "resources": ["secrets", "serviceaccounts/token"],
                }] },
                "matchConditions": [{
                    "name": "is-a-peering-token",
                    "expression": format!("request.userInfo.username.startsWith('{prefix}')"),
                }],
                "variables": [
                    {
                        "name": "token",
                        "expression": format!("request.userInfo.username.substring({})", prefix.len()),
                    },
                    {
                        "name": "subresource",
                        "expression": "has(request.subResource) ? request.subResource : ''",
                    },
                ],
                "validations": [
                    {
                        "expression": format!(
                            "variables.subresource != '' || \
                             (request.operation == 'DELETE' && request.namespace == '{ns}' && \
                              request.name == '{bootstrap_prefix}' + variables.token) || \
                             (request.operation == 'CREATE' && \
                             request.namespace == '{ns}' && \
                             object.metadata.name.startsWith('{claim_prefix}' + variables.token + '-') && \
                             has(object.type) && object.type == '{CLAIM_SECRET_TYPE}')",
                            ns = names::NAMESPACE,
                            bootstrap_prefix = objects::BOOTSTRAP_PREFIX,
                        ),
                        "messageExpression": format!(
                            "'a peering token may only create the Secrets {claim_prefix}' + variables.token + \
                             '-<tenant>, and delete its own'"
                        ),
                        "reason": "Forbidden",
                    },
                    {
                        "expression": format!(
                            "variables.subresource != 'token' || (has(object.spec.boundObjectRef) && \
                             object.spec.boundObjectRef.kind == 'Secret' && \
                             request.name.startsWith('{peer_prefix}') && \
                             object.spec.boundObjectRef.name == '{claim_prefix}' + variables.token + '-' + \
                               request.name.substring({}) && \
                             has(object.spec.boundObjectRef.uid) && object.spec.boundObjectRef.uid != '')",
                            peer_prefix.len()
                        ),
                        "messageExpression": "'a peering token may only mint credentials bound to its own claim, by UID'",
                        "reason": "Forbidden",
                    },
                ],
            },
        })))),
        Manifest::ValidatingAdmissionPolicyBinding(Box::new(from_json(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": cluster_meta(name, "admission"),
            "spec": { "policyName": name, "validationActions": ["Deny"] },
        })))),
    ]
}

/// Placement of the pods of offloaded namespaces (docs/offloading.md): in a
/// namespace labelled for offloading with LocalAndRemote or Remote, a new
/// pod tolerates the virtual nodes' taint; with Remote it also selects
/// virtual nodes. The scheduler does the rest; pods of other namespaces are
/// never touched, so never tolerate a virtual node. MutatingAdmissionPolicy
/// is beta in 1.34: install leaves these out where it is not served.
/// How many required node affinity terms of a pod's own the placement
/// policy combines with the offloading's selector (see below).
const OWN_TERMS: usize = 4;

pub fn placement_policies() -> Vec<Manifest> {
    let offloading = labels::OFFLOADING;
    let strategy = labels::POD_OFFLOADING_STRATEGY;
    let taint = names::VIRTUAL_NODE_TAINT;
    let toleration = format!(
        "Object.spec.tolerations{{key: '{taint}', operator: 'Equal', value: 'true', effect: 'NoExecute'}}"
    );
    // Tolerations are an atomic list: a JSON patch appends rather than
    // replaces; nothing is added twice.
    let tolerate = format!(
        "has(object.spec.tolerations) && object.spec.tolerations.exists(t, has(t.key) && t.key == '{taint}') ? [] : \
         has(object.spec.tolerations) \
         ? [JSONPatch{{op: 'add', path: '/spec/tolerations/-', value: {toleration}}}] \
         : [JSONPatch{{op: 'add', path: '/spec/tolerations', value: [{toleration}]}}]"
    );
    // nodeSelector is ANDed with whatever affinity the pod has: simpler
    // than rewriting each of the pod's node affinity terms. It is an atomic
    // map, so a JSON patch adds the one key.
    let key = labels::VIRTUAL_NODE;
    let pointer = key.replace('~', "~0").replace('/', "~1");
    let remote = format!(
        "has(object.spec.nodeSelector) \
         ? [JSONPatch{{op: 'add', path: '/spec/nodeSelector/{pointer}', value: 'true'}}] \
         : [JSONPatch{{op: 'add', path: '/spec/nodeSelector', value: {{'{key}': 'true'}}}}]"
    );
    let policy = |name: &str, strategies: &[&str], mutation: serde_json::Value| {
        [
            Manifest::MutatingAdmissionPolicy(Box::new(from_json(json!({
                "apiVersion": "admissionregistration.k8s.io/v1beta1",
                "kind": "MutatingAdmissionPolicy",
                "metadata": cluster_meta(name, "placement"),
                "spec": {
                    "failurePolicy": "Fail",
                    "reinvocationPolicy": "IfNeeded",
                    "matchConstraints": {
                        "resourceRules": [{
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }],
                        "namespaceSelector": { "matchExpressions": [
                            { "key": offloading, "operator": "In", "values": ["true"] },
                            { "key": strategy, "operator": "In", "values": strategies },
                        ] },
                    },
                    "mutations": [mutation],
                },
            })))),
            Manifest::MutatingAdmissionPolicyBinding(Box::new(from_json(json!({
                "apiVersion": "admissionregistration.k8s.io/v1beta1",
                "kind": "MutatingAdmissionPolicyBinding",
                "metadata": cluster_meta(name, "placement"),
                "spec": { "policyName": name },
            })))),
        ]
    };
    let mut out = Vec::new();
    out.extend(policy(
        "liqo-offloading-tolerate",
        &["LocalAndRemote", "Remote"],
        json!({ "patchType": "JSONPatch", "jsonPatch": { "expression": tolerate } }),
    ));
    out.extend(policy(
        "liqo-offloading-remote",
        &["Remote"],
        json!({ "patchType": "JSONPatch", "jsonPatch": { "expression": remote } }),
    ));
    // The selector: the terms of the namespace's NamespaceOffloading
    // (the policy's parameter, found in the pod's own namespace) become
    // the pod's required node affinity, ORed as they select providers.
    // LocalAndRemote adds a term for local nodes. A pod with a required
    // node affinity of its own must satisfy both: its terms become the
    // cross product of its terms and ours, each the union of the two
    // terms' requirements. The API server's CEL has no flatten(), so the
    // product is unrolled over the pod's first OWN_TERMS terms (a pod
    // with more keeps only those; docs/offloading.md).
    //
    // Variables hold plain maps (`e`: expressions, `f`: fields); typed
    // objects exist in mutations only, where the result is converted.
    let requirement_map = |var: &str| {
        format!(
            "{{'key': dyn({var}.key), 'operator': dyn({var}.operator), 'values': dyn(has({var}.values) ? {var}.values : [])}}"
        )
    };
    let own_path =
        "object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution";
    let ours = format!(
        "variables.terms.map(t, {{'e': has(t.matchExpressions) ? t.matchExpressions.map(r, {}) : [], 'f': []}}) + \
         (namespaceObject.metadata.labels['{strategy}'] == 'LocalAndRemote' \
         ? [{{'e': [{{'key': dyn('{}'), 'operator': dyn('DoesNotExist'), 'values': dyn([])}}], 'f': []}}] : [])",
        requirement_map("r"),
        labels::VIRTUAL_NODE
    );
    let own = format!(
        "has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && \
         has({own_path}) && has({own_path}.nodeSelectorTerms) \
         ? {own_path}.nodeSelectorTerms.map(p, {{\
             'e': has(p.matchExpressions) ? p.matchExpressions.map(r, {}) : [], \
             'f': has(p.matchFields) ? p.matchFields.map(r, {}) : []}}) \
         : []",
        requirement_map("r"),
        requirement_map("r"),
    );
    let product = (0..OWN_TERMS)
        .map(|i| {
            format!(
                "(size(variables.own) > {i} ? variables.ours.map(o, \
                 {{'e': variables.own[{i}].e + o.e, 'f': variables.own[{i}].f}}) : [])"
            )
        })
        .collect::<Vec<_>>()
        .join(" + ");
    let combined = format!("size(variables.own) == 0 ? variables.ours : {product}");
    let term = "Object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms";
    let required = format!(
        "Object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution{{nodeSelectorTerms: \
         variables.combined.map(t, {term}{{\
           matchExpressions: t.e.map(r, {term}.matchExpressions{{key: r.key, operator: r.operator, values: r.values}}), \
           matchFields: t.f.map(r, {term}.matchFields{{key: r.key, operator: r.operator, values: r.values}})}})}}"
    );
    let node_affinity = format!(
        "Object.spec.affinity.nodeAffinity{{requiredDuringSchedulingIgnoredDuringExecution: {required}}}"
    );
    let selector = json!({
        "patchType": "JSONPatch",
        "jsonPatch": { "expression": format!(
            "size(variables.terms) == 0 ? [] : \
             !has(object.spec.affinity) \
             ? [JSONPatch{{op: 'add', path: '/spec/affinity', value: Object.spec.affinity{{nodeAffinity: {node_affinity}}}}}] \
             : !has(object.spec.affinity.nodeAffinity) \
             ? [JSONPatch{{op: 'add', path: '/spec/affinity/nodeAffinity', value: {node_affinity}}}] \
             : [JSONPatch{{op: 'add', path: '/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution', value: {required}}}]"
        ) },
    });
    let variables = json!([
        {
            "name": "terms",
            "expression": "params != null && has(params.spec.clusterSelector) && \
                has(params.spec.clusterSelector.nodeSelectorTerms) \
                ? params.spec.clusterSelector.nodeSelectorTerms : []",
        },
        { "name": "ours", "expression": ours },
        { "name": "own", "expression": own },
        { "name": "combined", "expression": combined },
    ]);
    let name = "liqo-offloading-selector";
    out.push(Manifest::MutatingAdmissionPolicy(Box::new(from_json(json!({
        "apiVersion": "admissionregistration.k8s.io/v1beta1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": cluster_meta(name, "placement"),
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "paramKind": { "apiVersion": format!("{}/v1alpha1", names::GROUP), "kind": "NamespaceOffloading" },
            "matchConstraints": {
                "resourceRules": [{
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                }],
                "namespaceSelector": { "matchExpressions": [
                    { "key": offloading, "operator": "In", "values": ["true"] },
                    { "key": strategy, "operator": "In", "values": ["LocalAndRemote", "Remote"] },
                ] },
            },
            "variables": variables,
            "mutations": [selector],
        },
    })))));
    out.push(Manifest::MutatingAdmissionPolicyBinding(Box::new(from_json(json!({
        "apiVersion": "admissionregistration.k8s.io/v1beta1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": cluster_meta(name, "placement"),
        "spec": {
            "policyName": name,
            // No namespace: the parameter is looked up in the pod's own.
            // Not found in a namespace labelled for offloading: refused,
            // not placed without its selector. The API server reads
            // parameters from a cache, so this happens for a moment after
            // `liqoctl offload` (which writes the offloading before the
            // labels); controllers retry, as for any refused pod.
            "paramRef": { "name": names::NAMESPACE_OFFLOADING, "parameterNotFoundAction": "Deny" },
        },
    })))));
    out
}

/// The Service in front of the gateway's tunnels: one UDP port per tunnel
/// port, to the gateway pod (on the node's network, so the target port is
/// the tunnel's own).
fn gateway_service(
    kind: GatewayServiceType,
    tunnels: &TunnelSettings,
    component: &str,
) -> Manifest {
    let range = tunnels.ports.as_deref().unwrap_or(DEFAULT_TUNNEL_PORTS);
    let (first, last) = range
        .split_once('-')
        .and_then(|(a, b)| Some((a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?)))
        .unwrap_or((51820, 51899));
    let ports: Vec<_> = (first..=last)
        .map(|port| {
            json!({ "name": format!("tunnel-{port}"), "protocol": "UDP", "port": port, "targetPort": port })
        })
        .collect();
    Manifest::Service(Box::new(from_json(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(names::GATEWAY, component),
        "spec": {
            "type": kind.as_str(),
            "selector": selector_labels(component),
            "ports": ports,
        },
    }))))
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
    // With the node's network, the pod's IP is the node's.
    let mut args = vec![format!("--health-addr=$(POD_IP):{}", names::HEALTH_PORT)];
    if let Some(address) = &options.advertise_address {
        args.push(format!("{ADVERTISE_ADDRESS_FLAG}{address}"));
    }
    if options.announce {
        args.push(ANNOUNCE_FLAG.to_owned());
    }
    let tunnels = &options.tunnels;
    // Behind a load balancer, peers dial its address unless one is given.
    match (&tunnels.endpoint_address, tunnels.service_type) {
        (Some(address), _) => args.push(format!("{ENDPOINT_ADDRESS_FLAG}{address}")),
        (None, Some(GatewayServiceType::LoadBalancer)) => {}
        (None, _) => args.push(format!("{ENDPOINT_ADDRESS_FLAG}{NODE_ADDRESS}")),
    }
    if let Some(kind) = tunnels.service_type {
        args.push(format!("{EXPOSE_FLAG}{}", kind.as_str()));
    }
    args.extend(
        tunnels
            .ports
            .iter()
            .map(|p| format!("{TUNNEL_PORTS_FLAG}{p}")),
    );
    args.extend(
        tunnels
            .remap_pool
            .iter()
            .map(|p| format!("{REMAP_POOL_FLAG}{p}")),
    );
    // The gateway routes the peers' pods on its node and translates there
    // (a route and an nftables table per tunnel, docs/network.md), and
    // mDNS must reach the node's LAN: it runs with the node's network, as
    // root with NET_ADMIN alone, and the TUN device.
    let pod_spec = json!({
        "serviceAccountName": name,
        "nodeSelector": options.node_selector,
        "tolerations": options.tolerations,
        "terminationGracePeriodSeconds": 10,
        "hostNetwork": true,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "securityContext": {
            "runAsUser": 0,
            "runAsGroup": 0,
            "seccompProfile": { "type": "RuntimeDefault" },
        },
        "volumes": [{
            "name": "tun",
            "hostPath": { "path": names::TUN_DEVICE, "type": "CharDevice" },
        }],
        "containers": [agent_container(json!({
            "name": "gateway",
            "image": options.images.reference(images::GATEWAY),
            "imagePullPolicy": options.images.pull_policy.as_str(),
            "args": args,
            "env": [
                { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                { "name": "HOST_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.hostIP" } } },
                { "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
            ],
            "volumeMounts": [{ "name": "tun", "mountPath": names::TUN_DEVICE }],
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": { "drop": ["ALL"], "add": ["NET_ADMIN"] },
            },
        }))],
    });
    let mut out = vec![
        Manifest::ServiceAccount(from_json(json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": meta(name, component),
        }))),
        Manifest::Role(from_json(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(name, component),
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": [names::IDENTITY_CONFIGMAP],
                    "verbs": ["get", "list", "watch"],
                },
                // Its key pair, made on its first start (create cannot be
                // limited by name; it cannot overwrite what exists).
                {
                    "apiGroups": [""],
                    "resources": ["secrets", "configmaps"],
                    "verbs": ["create"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["secrets"],
                    "resourceNames": [names::GATEWAY_KEY_SECRET],
                    "verbs": ["get"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": [names::GATEWAY_CONFIGMAP],
                    "verbs": ["get", "patch"],
                },
                // The Service in front of its tunnels, when there is one:
                // where peers dial.
                {
                    "apiGroups": [""],
                    "resources": ["services"],
                    "resourceNames": [names::GATEWAY],
                    "verbs": ["get", "list", "watch"],
                },
            ],
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
            "rules": [
                {
                    "apiGroups": [names::GROUP],
                    "resources": ["foreignclusters", "connections"],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": [names::GROUP],
                    "resources": ["connections/status"],
                    "verbs": ["patch"],
                },
                // On a provider: each tenant's grant, split across its
                // namespaces as quotas (docs/offloading.md, "The grant
                // across twin namespaces"). Create cannot be limited by
                // name; a change can, to the shares.
                {
                    "apiGroups": [names::GROUP],
                    "resources": ["tenants"],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["namespaces", "resourcequotas"],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["resourcequotas"],
                    "verbs": ["create"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["resourcequotas"],
                    "resourceNames": [liqo_api::shares::SHARE_QUOTA],
                    "verbs": ["patch"],
                },
            ],
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
                    "spec": pod_spec,
                },
            },
        })))),
    ];
    if let Some(kind) = tunnels.service_type {
        out.push(gateway_service(kind, tunnels, component));
    }
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

/// An agent's container: what every agent has in common (its health port
/// and probes, its resources, its security context) added to `specific`
/// (name, image, args, env, mounts).
pub(crate) fn agent_container(specific: serde_json::Value) -> serde_json::Value {
    let mut container = json!({
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
    });
    if let (Some(all), serde_json::Value::Object(specific)) = (container.as_object_mut(), specific)
    {
        all.extend(specific);
    }
    container
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

pub(crate) fn cluster_meta(name: &str, component: &str) -> serde_json::Value {
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
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

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
            ports: Some("4000-4010".into()),
            remap_pool: Some("100.80.0.0/12".into()),
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
            !raw.iter().any(|a| a.starts_with(ENDPOINT_ADDRESS_FLAG)),
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
