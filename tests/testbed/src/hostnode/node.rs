//! The host node's own objects: its Node, the status that keeps it Ready,
//! and its Lease in `kube-node-lease`.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::{HOST_PROCESS_LABEL, HOST_PROCESS_TAINT, LEASE_SECONDS};

const CAPACITY: [(&str, &str); 3] = [("cpu", "8"), ("memory", "16Gi"), ("pods", "110")];

/// The Node object, as registered: not annotated for kwok, labelled
/// [`HOST_PROCESS_LABEL`] so that agents can be pinned to it, and tainted
/// [`HOST_PROCESS_TAINT`] so that nothing else lands on it.
pub(super) fn object(name: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": arch(),
                HOST_PROCESS_LABEL: "true",
            },
        },
        "spec": {
            "taints": [{ "key": HOST_PROCESS_TAINT, "value": "true", "effect": "NoSchedule" }],
        },
    }))
    .expect("invariant: the literal above is a Node")
}

/// The node's status: Ready since `since`, as of `now`.
pub(super) fn status(
    name: &str,
    address: std::net::Ipv4Addr,
    since: &Timestamp,
    now: &Timestamp,
) -> Value {
    let capacity: serde_json::Map<String, Value> = CAPACITY
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": Time(*now),
            "lastTransitionTime": Time(*since),
        })
    };
    json!({
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [
            condition("Ready", "True", "KubeletReady", "the liqo-testbed host-process node is ready"),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "no memory pressure"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "no PID pressure"),
        ],
        "addresses": [
            { "type": "InternalIP", "address": address.to_string() },
            { "type": "Hostname", "address": name },
        ],
        "nodeInfo": {
            "architecture": arch(),
            "operatingSystem": "linux",
            "kernelVersion": read_trimmed("/proc/sys/kernel/osrelease"),
            "osImage": os_image(),
            "bootID": read_trimmed("/proc/sys/kernel/random/boot_id"),
            "machineID": read_trimmed("/etc/machine-id"),
            "systemUUID": "",
            "containerRuntimeVersion": concat!("hostprocess://", env!("CARGO_PKG_VERSION")),
            "kubeletVersion": concat!("liqo-testbed-", env!("CARGO_PKG_VERSION")),
            "kubeProxyVersion": "",
        },
    })
}

/// The node's Lease, renewed `now`, owned by the node so that it goes with it.
pub(super) fn lease(name: &str, node_uid: &str, now: &Timestamp) -> Lease {
    serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": "kube-node-lease",
            "ownerReferences": [{ "apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid }],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": MicroTime(*now),
        },
    }))
    .expect("invariant: the literal above is a Lease")
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn os_image() -> String {
    let release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_else(|| "Linux".to_owned())
}
