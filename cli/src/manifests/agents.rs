//! The agents install runs: the gateway (its account, rights, Deployment
//! and the Service in front of its tunnels, with the flags install reads
//! back to keep them), and what every agent's pod has in common, which the
//! virtual kubelets' Deployments share (`crate::manifests::virtual_kubelet`).

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    HostPathVolumeSource, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, Service, ServiceAccount, ServicePort,
    ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use liqo_api::agents::PortRange;
use liqo_api::agents::gateway::{DEFAULT_TUNNEL_PORTS, GatewayFlags, NODE_ADDRESS};
use liqo_api::images;
use liqo_api::names;
use liqo_api::networking::GatewayServiceType;
use liqo_api::tether;

use super::{Manifest, Options, cluster_meta, common_labels, meta, rbac, selector_labels, strings};

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
    let ports = (range.first..=range.last)
        .map(|port| ServicePort {
            name: Some(format!("tunnel-{port}")),
            protocol: Some("UDP".to_owned()),
            port: port.into(),
            target_port: Some(IntOrString::Int(port.into())),
            ..Default::default()
        })
        .collect();
    Manifest::Service(Box::new(Service {
        metadata: meta(names::GATEWAY, component),
        spec: Some(ServiceSpec {
            type_: Some(kind.as_str().to_owned()),
            selector: Some(selector_labels(component)),
            ports: Some(ports),
            ..Default::default()
        }),
        ..Default::default()
    }))
}

/// The gateway's account, rights and Deployment. Its rights are what it
/// reads today: the identity and the peers; the tunnel adds its own.
pub(super) fn gateway(options: &Options) -> Vec<Manifest> {
    let name = names::GATEWAY;
    let component = "gateway";
    let subject = || Some(vec![rbac::service_account(name, names::NAMESPACE)]);
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
    let pod_spec = PodSpec {
        service_account_name: Some(name.to_owned()),
        node_selector: Some(options.node_selector.clone()),
        tolerations: Some(tether::agent_tolerations(&options.tolerations)),
        termination_grace_period_seconds: Some(10),
        host_network: Some(true),
        dns_policy: Some("ClusterFirstWithHostNet".to_owned()),
        security_context: Some(PodSecurityContext {
            run_as_user: Some(0),
            run_as_group: Some(0),
            seccomp_profile: Some(runtime_default_seccomp()),
            ..Default::default()
        }),
        volumes: Some(vec![Volume {
            name: "tun".to_owned(),
            host_path: Some(HostPathVolumeSource {
                path: names::TUN_DEVICE.to_owned(),
                type_: Some("CharDevice".to_owned()),
            }),
            ..Default::default()
        }]),
        containers: vec![agent_container(Container {
            name: "gateway".to_owned(),
            image: Some(options.images.reference(images::GATEWAY)),
            image_pull_policy: Some(options.images.pull_policy.as_str().to_owned()),
            args: Some(args),
            env: Some(vec![
                field_env("POD_IP", "status.podIP"),
                field_env("HOST_IP", "status.hostIP"),
                field_env("POD_NAMESPACE", "metadata.namespace"),
            ]),
            volume_mounts: Some(vec![VolumeMount {
                name: "tun".to_owned(),
                mount_path: names::TUN_DEVICE.to_owned(),
                ..Default::default()
            }]),
            security_context: Some(SecurityContext {
                capabilities: Some(Capabilities {
                    drop: Some(strings(&["ALL"])),
                    add: Some(strings(&["NET_ADMIN"])),
                }),
                ..container_security_context()
            }),
            ..Default::default()
        })],
        ..Default::default()
    };
    let mut out = vec![
        Manifest::ServiceAccount(ServiceAccount {
            metadata: meta(name, component),
            ..Default::default()
        }),
        Manifest::Role(Role {
            metadata: meta(name, component),
            rules: Some(vec![
                rbac::named_rule(
                    &[""],
                    &["configmaps"],
                    &[names::IDENTITY_CONFIGMAP],
                    &["get", "list", "watch"],
                ),
                // Its key pair, made on its first start (create cannot be
                // limited by name; it cannot overwrite what exists).
                rbac::rule(&[""], &["secrets", "configmaps"], &["create"]),
                rbac::named_rule(&[""], &["secrets"], &[names::GATEWAY_KEY_SECRET], &["get"]),
                rbac::named_rule(
                    &[""],
                    &["configmaps"],
                    &[names::GATEWAY_CONFIGMAP, names::CLUSTERSET_EXPORTS],
                    &["get", "patch"],
                ),
                // The Service in front of its tunnels, when there is one:
                // where peers dial.
                rbac::named_rule(
                    &[""],
                    &["services"],
                    &[names::GATEWAY],
                    &["get", "list", "watch"],
                ),
            ]),
        }),
        Manifest::RoleBinding(RoleBinding {
            metadata: meta(name, component),
            role_ref: rbac::role_ref("Role", name),
            subjects: subject(),
        }),
        Manifest::ClusterRole(ClusterRole {
            metadata: cluster_meta(name, component),
            rules: Some(vec![
                rbac::rule(
                    &[names::GROUP],
                    &["foreignclusters", "connections"],
                    &["get", "list", "watch"],
                ),
                rbac::rule(&[names::GROUP], &["connections/status"], &["patch"]),
                // On a provider: each tenant's grant, split across its
                // namespaces as quotas (docs/offloading.md, "The grant
                // across twin namespaces"). Create cannot be limited by
                // name; a change can, to the shares.
                rbac::rule(&[names::GROUP], &["tenants"], &["get", "list", "watch"]),
                rbac::rule(
                    &[""],
                    &["namespaces", "resourcequotas"],
                    &["get", "list", "watch"],
                ),
                rbac::rule(&[""], &["resourcequotas"], &["create"]),
                rbac::named_rule(
                    &[""],
                    &["resourcequotas"],
                    &[liqo_api::shares::SHARE_QUOTA],
                    &["patch"],
                ),
                // On a provider: each tenant's grant follows the free
                // capacity (docs/peering.md, "A grant that follows the
                // load"): the nodes and the pods bound to them, the
                // sharing policies; the grant and its condition in the
                // Tenant record, and an Event of each change.
                rbac::rule(&[""], &["nodes", "pods"], &["list", "watch"]),
                rbac::rule(
                    &[names::GROUP],
                    &["sharingpolicies"],
                    &["get", "list", "watch"],
                ),
                rbac::rule(&[names::GROUP], &["tenants", "tenants/status"], &["patch"]),
                rbac::rule(&[""], &["events"], &["create"]),
                // The clusterset's Services (docs/services.md): this
                // cluster's ServiceExports, their Services and endpoints
                // read and their conditions written; the imports, their
                // Services and EndpointSlices written (only those
                // labelled as ours are changed or deleted).
                rbac::rule(
                    &["multicluster.x-k8s.io"],
                    &["serviceexports"],
                    &["get", "list", "watch"],
                ),
                rbac::rule(
                    &["multicluster.x-k8s.io"],
                    &["serviceexports/status", "serviceimports/status"],
                    &["patch"],
                ),
                rbac::rule(
                    &["multicluster.x-k8s.io"],
                    &["serviceimports"],
                    &["get", "list", "watch", "create", "patch", "delete"],
                ),
                rbac::rule(
                    &["", "discovery.k8s.io"],
                    &["services", "endpointslices"],
                    &["get", "list", "watch", "create", "patch", "delete"],
                ),
            ]),
            ..Default::default()
        }),
        Manifest::ClusterRoleBinding(ClusterRoleBinding {
            metadata: cluster_meta(name, component),
            role_ref: rbac::role_ref("ClusterRole", name),
            subjects: subject(),
        }),
        Manifest::Deployment(Box::new(Deployment {
            metadata: meta(name, component),
            spec: Some(DeploymentSpec {
                replicas: Some(1),
                // One gateway at a time: the old one goes before the new
                // one comes, as they would hold the same tunnel endpoint.
                strategy: Some(recreate()),
                selector: LabelSelector {
                    match_labels: Some(selector_labels(component)),
                    ..Default::default()
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(pod_labels),
                        ..Default::default()
                    }),
                    spec: Some(pod_spec),
                },
                ..Default::default()
            }),
            ..Default::default()
        })),
    ];
    if let Some(kind) = options.tunnels.service_type {
        out.push(gateway_service(kind, &options.tunnels, component));
    }
    out
}

/// The strategy of the agents' Deployments: the old pod goes before the
/// new one comes.
pub(crate) fn recreate() -> DeploymentStrategy {
    DeploymentStrategy {
        type_: Some("Recreate".to_owned()),
        ..Default::default()
    }
}

/// The container runtime's default seccomp profile.
fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_owned(),
        ..Default::default()
    }
}

/// Agents run as an unprivileged user with the runtime's default seccomp
/// profile: nothing they do today needs more.
pub(crate) fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(65532),
        run_as_group: Some(65532),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

/// The environment variable `name`, from the pod's field `field_path`
/// (the downward API).
pub(crate) fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An agent's container: what every agent has in common (its health port
/// and probes, its resources, its security context unless `specific` has
/// its own) added to `specific` (name, image, args, env, mounts).
pub(crate) fn agent_container(specific: Container) -> Container {
    let probe = |path: &str, period: i32, failure_threshold: Option<i32>| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String("health".to_owned()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold,
        ..Default::default()
    };
    let quantities = |pairs: &[(&str, &str)]| -> BTreeMap<String, Quantity> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
            .collect()
    };
    Container {
        ports: Some(vec![ContainerPort {
            name: Some("health".to_owned()),
            container_port: names::HEALTH_PORT.into(),
            ..Default::default()
        }]),
        // Every second: a peering waits for the virtual kubelet's pod to
        // be ready, which the kubelet sees at the first probe after the
        // agent is (at a 2 s period, most of `peer`'s time).
        readiness_probe: Some(probe("/readyz", 1, None)),
        liveness_probe: Some(probe("/healthz", 10, Some(3))),
        resources: Some(ResourceRequirements {
            requests: Some(quantities(&[("cpu", "50m"), ("memory", "32Mi")])),
            limits: Some(quantities(&[("memory", "128Mi")])),
            ..Default::default()
        }),
        security_context: specific
            .security_context
            .or_else(|| Some(container_security_context())),
        ..specific
    }
}

/// An agent's container's security context: no privilege escalation, a
/// read-only root filesystem, no capability.
pub(crate) fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(strings(&["ALL"])),
            ..Default::default()
        }),
        ..Default::default()
    }
}
