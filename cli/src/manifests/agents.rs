//! The agents install runs: the gateway (its account, rights, Deployment
//! and the Service in front of its tunnels, with the flags install reads
//! back to keep them), and what every agent's pod has in common, which the
//! virtual kubelets' Deployments share (`crate::peering::virtual_kubelet`).

use ipnet::IpNet;
use k8s_openapi::api::apps::v1::Deployment;
use liqo_api::agents::PortRange;
use liqo_api::agents::gateway::{DEFAULT_TUNNEL_PORTS, GatewayFlags, NODE_ADDRESS};
use liqo_api::images;
use liqo_api::names;
use liqo_api::networking::GatewayServiceType;
use serde_json::json;

use super::{Manifest, Options, cluster_meta, common_labels, from_json, meta, selector_labels};

/// How the gateway's tunnels are reached and address their peers; each
/// `None` (or empty) leaves the gateway's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TunnelSettings {
    /// The host peers dial; by default the gateway node's address.
    pub endpoint_address: Option<String>,
    /// The UDP ports of incoming peerings' tunnels.
    pub ports: Option<PortRange>,
    /// Where overlapping peers' CIDRs are remapped to.
    pub remap_pool: Vec<IpNet>,
    /// The Service in front of the tunnels, if any.
    pub service_type: Option<GatewayServiceType>,
}

/// How the installed gateway announces and runs tunnels, read from its
/// Deployment's args.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GatewayArgs {
    pub announce: bool,
    pub advertise_address: Option<String>,
    pub tunnels: TunnelSettings,
}

impl GatewayArgs {
    /// The flags a gateway is given for these settings.
    fn flags(&self) -> GatewayFlags {
        let tunnels = &self.tunnels;
        // Behind a load balancer, peers dial its address unless one is
        // given; otherwise the node's.
        let endpoint_address = match (&tunnels.endpoint_address, tunnels.service_type) {
            (Some(address), _) => Some(address.clone()),
            (None, Some(GatewayServiceType::LoadBalancer)) => None,
            (None, _) => Some(NODE_ADDRESS.to_owned()),
        };
        GatewayFlags {
            advertise_address: self.advertise_address.clone(),
            announce: self.announce,
            endpoint_address,
            expose: tunnels.service_type,
            tunnel_ports: tunnels.ports,
            remap_pool: tunnels.remap_pool.clone(),
            // Health on the pod's IP, which on the node's network is the
            // node's.
            ..GatewayFlags::for_pod(names::HEALTH_PORT)
        }
    }
}

/// The settings an installed gateway runs with, from its Deployment's
/// args (parsed as the agent parses them); the defaults when they do not
/// parse, as if it had been given none.
pub fn gateway_args_of(deployment: &Deployment) -> GatewayArgs {
    let args = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.iter().find(|c| c.name == "gateway"))
        .and_then(|c| c.args.clone())
        .unwrap_or_default();
    let Ok(flags) = GatewayFlags::from_args(&args) else {
        return GatewayArgs::default();
    };
    GatewayArgs {
        announce: flags.announce,
        advertise_address: flags.advertise_address,
        tunnels: TunnelSettings {
            endpoint_address: flags.endpoint_address.filter(|a| a != NODE_ADDRESS),
            ports: flags.tunnel_ports,
            remap_pool: flags.remap_pool,
            service_type: flags.expose,
        },
    }
}

/// The Service in front of the gateway's tunnels: one UDP port per tunnel
/// port, to the gateway pod (on the node's network, so the target port is
/// the tunnel's own).
fn gateway_service(
    kind: GatewayServiceType,
    tunnels: &TunnelSettings,
    component: &str,
) -> Manifest {
    let range = tunnels.ports.unwrap_or(DEFAULT_TUNNEL_PORTS);
    let ports: Vec<_> = (range.first..=range.last)
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
pub(super) fn gateway(options: &Options) -> Vec<Manifest> {
    let name = names::GATEWAY;
    let component = "gateway";
    let subject =
        json!([{ "kind": "ServiceAccount", "name": name, "namespace": names::NAMESPACE }]);
    let mut pod_labels = selector_labels(component);
    pod_labels.extend(common_labels(component));
    let args = GatewayArgs {
        announce: options.announce,
        advertise_address: options.advertise_address.as_ref().map(ToString::to_string),
        tunnels: options.tunnels.clone(),
    }
    .flags()
    .to_args();
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
    if let Some(kind) = options.tunnels.service_type {
        out.push(gateway_service(kind, &options.tunnels, component));
    }
    out
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
