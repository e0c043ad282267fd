//! The cluster's DNS, as kubeadm deploys it: CoreDNS (built from its Go
//! module, `tests/toolchain/coredns`) as the Deployment `coredns` in
//! `kube-system`, behind the Service `kube-dns` at the tenth address of
//! the service CIDR, which the real node's kubelet gives pods as their
//! nameserver. Its Corefile is kubeadm's but for `forward`: the testbed's
//! pods have no upstream resolver (their traffic stays on the machine),
//! so a name outside the cluster's zones is refused rather than sent out.
//!
//! The cluster serves the Multi-Cluster Services API's CRDs (those
//! `sigs.k8s.io/mcs-api` v0.5.0 ships, made here as a platform that has
//! them makes them: not liqoctl's), and CoreDNS serves `clusterset.local`
//! from its ServiceImports (the `kubernetes` plugin's `multicluster`
//! option), as an administrator sets it up for an MCS implementation.

use std::net::{IpAddr, Ipv4Addr};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use serde_json::{Value, json};

use crate::Error;
use crate::cluster::ClusterSpec;
use crate::create_or_keep;

/// The image the node holds CoreDNS in (kubeadm's name for it).
pub(crate) const COREDNS_IMAGE: &str = "registry.k8s.io/coredns/coredns:v1.14.0";
/// The cluster's DNS domain, the kubelets' `clusterDomain`.
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// The Multi-Cluster Services API's domain.
pub const CLUSTERSET_DOMAIN: &str = "clusterset.local";
/// The MCS API's CRDs, as the module ships them.
const MCS_CRDS: [&str; 2] = [
    include_str!("../../../cli/src/manifests/mcs/serviceexports.yaml"),
    include_str!("../../../cli/src/manifests/mcs/serviceimports.yaml"),
];
/// What errors call these objects.
const OBJECTS: &str = "the cluster DNS's";
/// The namespace, Deployment, and Service of the cluster's DNS.
pub const NAMESPACE: &str = "kube-system";
pub const DEPLOYMENT: &str = "coredns";
pub const SERVICE: &str = "kube-dns";

/// The `kube-dns` Service's address: the tenth of the service CIDR, as
/// kubeadm chooses it.
pub(crate) fn service_ip(spec: &ClusterSpec) -> Result<Ipv4Addr, Error> {
    let net: ipnet::Ipv4Net = spec.service_cidr.parse().map_err(|_| {
        Error::Spec(format!(
            "service CIDR {:?} is not an IPv4 CIDR",
            spec.service_cidr
        ))
    })?;
    net.hosts().nth(9).ok_or_else(|| {
        Error::Spec(format!(
            "service CIDR {:?} is too small for kube-dns",
            spec.service_cidr
        ))
    })
}

/// The Corefile: kubeadm's, without an upstream, with the clusterset's
/// zone served from ServiceImports, and answers kept 5 s rather than 30:
/// a name asked for just before its import is made is not refused for
/// half a minute.
pub fn corefile() -> String {
    format!(
        ".:53 {{\n\
         \x20   errors\n\
         \x20   health {{\n\
         \x20      lameduck 5s\n\
         \x20   }}\n\
         \x20   ready\n\
         \x20   kubernetes {CLUSTER_DOMAIN} {CLUSTERSET_DOMAIN} in-addr.arpa ip6.arpa {{\n\
         \x20      pods insecure\n\
         \x20      multicluster {CLUSTERSET_DOMAIN}\n\
         \x20      fallthrough in-addr.arpa ip6.arpa\n\
         \x20      ttl 5\n\
         \x20   }}\n\
         \x20   prometheus :9153\n\
         \x20   cache 30\n\
         \x20   loop\n\
         \x20   reload\n\
         \x20   loadbalance\n\
         }}\n"
    )
}

/// Creates CoreDNS's objects, its pod on the real node `node` (a kwok
/// node would say it runs and serve nothing); returns without waiting for
/// it to be Ready (tests that resolve names wait for an answer).
pub(crate) async fn deploy(client: &kube::Client, ip: Ipv4Addr, node: &str) -> Result<(), Error> {
    for crd in MCS_CRDS {
        let crd: Value = serde_yaml::from_str(crd)
            .map_err(|e| Error::Spec(format!("the MCS API's CRDs: {e}")))?;
        create_or_keep::<CustomResourceDefinition>(Api::all(client.clone()), crd, OBJECTS).await?;
    }
    let labels = json!({"k8s-app": "kube-dns"});
    create_or_keep::<ServiceAccount>(
        Api::namespaced(client.clone(), NAMESPACE),
        json!({"metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE}}),
        OBJECTS,
    )
    .await?;
    create_or_keep::<ClusterRole>(
        Api::all(client.clone()),
        json!({
            "metadata": {"name": "system:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                 "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                 "verbs": ["list", "watch"]},
                {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["serviceimports"],
                 "verbs": ["list", "watch"]},
            ],
        }),
        OBJECTS,
    )
    .await?;
    create_or_keep::<ClusterRoleBinding>(
        Api::all(client.clone()),
        json!({
            "metadata": {"name": "system:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
            "subjects": [{"kind": "ServiceAccount", "name": DEPLOYMENT, "namespace": NAMESPACE}],
        }), OBJECTS)
    .await?;
    create_or_keep::<ConfigMap>(
        Api::namespaced(client.clone(), NAMESPACE),
        json!({
            "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE},
            "data": {"Corefile": corefile()},
        }),
        OBJECTS,
    )
    .await?;
    create_or_keep::<Deployment>(
        Api::namespaced(client.clone(), NAMESPACE),
        deployment(&labels, node),
        OBJECTS,
    )
    .await?;
    create_or_keep::<Service>(
        Api::namespaced(client.clone(), NAMESPACE),
        json!({
            "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": {
                "k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
            "spec": {
                "selector": labels,
                "clusterIP": IpAddr::V4(ip).to_string(),
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                    {"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153},
                ],
            },
        }),
        OBJECTS,
    )
    .await
}

/// kubeadm's CoreDNS Deployment, with one replica (the testbed's
/// clusters have one real node), on `node`.
fn deployment(labels: &Value, node: &str) -> Value {
    json!({
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": DEPLOYMENT,
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "priorityClassName": "system-cluster-critical",
                    "dnsPolicy": "Default",
                    "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
                    "containers": [{
                        "name": "coredns",
                        "image": COREDNS_IMAGE,
                        "imagePullPolicy": "Never",
                        "args": ["-conf", "/etc/coredns/Corefile"],
                        "resources": {
                            "requests": {"cpu": "100m", "memory": "70Mi"},
                            "limits": {"memory": "170Mi"},
                        },
                        "ports": [
                            {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                            {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                            {"name": "metrics", "containerPort": 9153, "protocol": "TCP"},
                        ],
                        "volumeMounts": [{"name": "config-volume", "mountPath": "/etc/coredns", "readOnly": true}],
                        "livenessProbe": {
                            "httpGet": {"path": "/health", "port": 8080, "scheme": "HTTP"},
                            "initialDelaySeconds": 60, "timeoutSeconds": 5,
                            "successThreshold": 1, "failureThreshold": 5,
                        },
                        "readinessProbe": {
                            "httpGet": {"path": "/ready", "port": 8181, "scheme": "HTTP"},
                            "periodSeconds": 2,
                        },
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                            "readOnlyRootFilesystem": true,
                        },
                    }],
                    "volumes": [{"name": "config-volume", "configMap": {
                        "name": DEPLOYMENT,
                        "items": [{"key": "Corefile", "path": "Corefile"}],
                    }}],
                },
            },
        },
    })
}
