//! JSON the pod stores keep deflated while it waits: whole pending pods
//! (until their wrapper is made) and remote pods' statuses (until the
//! local pod shows them). A scale-up of thousands of pods holds thousands
//! of these at once: the peak of the agent's memory.
//!
//! Each kind of text is deflated with a preset dictionary ([`Dictionary`]):
//! a typical pending pod, or a typical running status, serialised as the
//! stores serialise theirs. Most of a pod is the API server's defaults
//! and the field names, the same in every pod, and a pod on its own is
//! too short for deflate to learn them; with the dictionary it refers to
//! them from its first byte. The dictionaries are made when first used
//! and never change while the agent runs, and nothing deflated outlives
//! the agent, so a new version may change them freely.

use std::sync::{LazyLock, Mutex};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde_json::json;

/// What a text is deflated against.
#[derive(Debug, Clone, Copy)]
pub enum Dictionary {
    /// A pod as the API has it before it runs.
    PendingPod,
    /// A pod's status as a local pod shows it
    /// ([`crate::forge::pod::local_status`]).
    Status,
}

impl Dictionary {
    fn bytes(self) -> &'static [u8] {
        match self {
            Self::PendingPod => &PENDING_POD,
            Self::Status => &STATUS,
        }
    }
}

/// The deflate and inflate states, one of each for the process, reset for
/// each use: a state allocates about 300 KiB (its window and hash
/// tables). One per thread held four of them.
static DEFLATE: LazyLock<Mutex<flate2::Compress>> =
    LazyLock::new(|| Mutex::new(flate2::Compress::new(flate2::Compression::default(), false)));
static INFLATE: LazyLock<Mutex<flate2::Decompress>> =
    LazyLock::new(|| Mutex::new(flate2::Decompress::new(false)));

/// `bytes` deflated against `dictionary` (raw deflate, no header).
pub fn deflate(bytes: &[u8], dictionary: Dictionary) -> Option<Box<[u8]>> {
    let mut state = DEFLATE.lock().ok()?;
    state.reset();
    state.set_dictionary(dictionary.bytes()).ok()?;
    let mut out = Vec::with_capacity(bytes.len() / 4 + 64);
    loop {
        let read = usize::try_from(state.total_in()).ok()?;
        let done = state
            .compress_vec(&bytes[read..], &mut out, flate2::FlushCompress::Finish)
            .ok()?;
        if done == flate2::Status::StreamEnd {
            return Some(out.into_boxed_slice());
        }
        out.reserve(out.capacity());
    }
}

/// What [`deflate`] made against `dictionary`, inflated; `None` when it is
/// not that.
pub fn inflate(bytes: &[u8], dictionary: Dictionary) -> Option<Vec<u8>> {
    let mut state = INFLATE.lock().ok()?;
    state.reset(false);
    state.set_dictionary(dictionary.bytes()).ok()?;
    let mut out = Vec::with_capacity(bytes.len() * 6);
    loop {
        let read = usize::try_from(state.total_in()).ok()?;
        let before = (state.total_in(), state.total_out());
        let done = state
            .decompress_vec(&bytes[read..], &mut out, flate2::FlushDecompress::Finish)
            .ok()?;
        if done == flate2::Status::StreamEnd {
            return Some(out);
        }
        if out.len() < out.capacity() && before == (state.total_in(), state.total_out()) {
            // No progress with room to spare: the input is cut short.
            return None;
        }
        out.reserve(out.capacity().max(64));
    }
}

/// A Deployment's pod as the API server has it once scheduled, before it
/// runs: its defaults and field names, in the order the stores serialise
/// them.
static PENDING_POD: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let condition = json!({"type": "PodScheduled", "status": "True",
                           "lastTransitionTime": "2026-01-01T00:00:00Z"});
    let toleration = |key: &str| json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300});
    serialised::<Pod>(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "app-5d8f7c6b9d-abcde", "generateName": "app-5d8f7c6b9d-",
            "namespace": "default", "uid": "00000000-0000-0000-0000-000000000000",
            "resourceVersion": "1000", "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "app", "app.kubernetes.io/name": "app", "pod-template-hash": "5d8f7c6b9d"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": "app-5d8f7c6b9d", "uid": "00000000-0000-0000-0000-000000000000",
                                 "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {
            "containers": [{
                "name": "app", "image": "registry.example/app:latest",
                "imagePullPolicy": "IfNotPresent",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "env": [{"name": "NAME", "value": "value"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
                "resources": {"limits": {"cpu": "100m", "memory": "128Mi"},
                              "requests": {"cpu": "100m", "memory": "128Mi"}},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "volumeMounts": [{"name": "kube-api-access-abcde", "readOnly": true,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
            }],
            "dnsPolicy": "ClusterFirst", "enableServiceLinks": true,
            "nodeName": "liqo-provider", "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0, "restartPolicy": "Always", "schedulerName": "default-scheduler",
            "securityContext": {}, "serviceAccount": "default", "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
            "tolerations": [toleration("node.kubernetes.io/not-ready"),
                            toleration("node.kubernetes.io/unreachable")],
            "volumes": [{"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ]}}],
        },
        "status": {"phase": "Pending", "conditions": [condition], "qosClass": "Guaranteed"},
    }))
});

/// A running pod's status as a local pod shows it.
static STATUS: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let condition = |t: &str| {
        json!({"type": t, "status": "True", "lastProbeTime": null,
               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };
    serialised::<PodStatus>(json!({
        "phase": "Running",
        "conditions": [condition("PodReadyToStartContainers"), condition("Initialized"),
                       condition("Ready"), condition("ContainersReady"), condition("PodScheduled")],
        "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}],
        "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}],
        "startTime": "2026-01-01T00:00:00Z",
        "containerStatuses": [{
            "name": "app", "ready": true, "started": true, "restartCount": 0,
            "image": "registry.example/app:latest",
            "imageID": "registry.example/app@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "containerID": "containerd://0000000000000000000000000000000000000000000000000000000000000000",
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
            "lastState": {},
        }],
    }))
});

/// `value` as a `T` serialises it: the field order the stores' texts have.
fn serialised<T: serde::Serialize + serde::de::DeserializeOwned>(
    value: serde_json::Value,
) -> Vec<u8> {
    serde_json::from_value::<T>(value)
        .and_then(|typed| serde_json::to_vec(&typed))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_deflate_and_inflate_back_whole() {
        // Small, large (past the first guess of the output's size, many
        // times over), empty, and incompressible.
        let mut noise = Vec::new();
        let mut x: u32 = 7;
        for _ in 0..50_000 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            noise.push((x >> 16) as u8);
        }
        let cases: Vec<Vec<u8>> = vec![
            br#"{"phase":"Running"}"#.to_vec(),
            "x".repeat(200_000).into_bytes(),
            Vec::new(),
            noise,
            PENDING_POD.clone(),
        ];
        for dictionary in [Dictionary::PendingPod, Dictionary::Status] {
            for bytes in &cases {
                let packed = deflate(bytes, dictionary).expect("deflated");
                assert_eq!(inflate(&packed, dictionary).as_ref(), Some(bytes));
                // Twice in a row on the same state.
                assert_eq!(
                    inflate(&deflate(bytes, dictionary).expect("deflated"), dictionary).as_ref(),
                    Some(bytes)
                );
                // Cut short: nothing, and no endless loop.
                if packed.len() > 4 {
                    assert_eq!(inflate(&packed[..packed.len() / 2], dictionary), None);
                }
            }
        }
    }

    /// Asserts that `value`'s text deflates at least a third smaller
    /// against `dictionary` than without one; says both sizes.
    fn at_least_a_third_smaller(what: &str, value: &impl serde::Serialize, dictionary: Dictionary) {
        let text = serde_json::to_vec(value).expect("serialised");
        let with = deflate(&text, dictionary).expect("deflated").len();
        let without = plain(&text);
        eprintln!(
            "{what}: {} bytes, deflated {without}, with the dictionary {with}",
            text.len()
        );
        assert!(
            with * 3 <= without * 2,
            "{what}: {with} bytes with the dictionary, {without} without"
        );
    }

    /// `bytes` deflated as before the dictionaries, for comparison.
    fn plain(bytes: &[u8]) -> usize {
        let mut state = flate2::Compress::new(flate2::Compression::default(), false);
        let mut out = Vec::with_capacity(bytes.len() + 64);
        state
            .compress_vec(bytes, &mut out, flate2::FlushCompress::Finish)
            .expect("deflated");
        out.len()
    }

    #[test]
    fn a_dictionary_shrinks_pods_it_was_not_made_from() {
        // Another workload's pod: its names, image, UIDs, requests and
        // environment are not the dictionary's, nor are its labels or
        // volumes in part.
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "checkout-7c9f8d5b4-qz2xw", "generateName": "checkout-7c9f8d5b4-",
                "namespace": "shop", "uid": "3f2b8c1e-9d4a-4e6b-8f0c-7a1d2e3f4b5c",
                "resourceVersion": "4821337", "creationTimestamp": "2026-11-25T10:41:07Z",
                "labels": {"app.kubernetes.io/name": "checkout", "tier": "backend", "pod-template-hash": "7c9f8d5b4"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "checkout-7c9f8d5b4",
                                     "uid": "9a8b7c6d-5e4f-4a3b-2c1d-0e9f8a7b6c5d", "controller": true,
                                     "blockOwnerDeletion": true}],
            },
            "spec": {
                "containers": [{
                    "name": "checkout", "image": "ghcr.io/acme/checkout:2.14.1",
                    "imagePullPolicy": "Always",
                    "args": ["--listen=:9000", "--db=postgres://db.shop:5432/orders"],
                    "env": [{"name": "LOG_LEVEL", "value": "debug"}],
                    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/checkout"},
                        {"name": "kube-api-access-9mfd2", "readOnly": true,
                         "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                }],
                "dnsPolicy": "ClusterFirst", "enableServiceLinks": true, "nodeName": "liqo-rome",
                "preemptionPolicy": "PreemptLowerPriority", "priority": 0, "restartPolicy": "Always",
                "schedulerName": "default-scheduler", "securityContext": {},
                "serviceAccount": "checkout", "serviceAccountName": "checkout",
                "terminationGracePeriodSeconds": 45,
                "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                 "effect": "NoExecute", "tolerationSeconds": 300}],
                "volumes": [
                    {"name": "config", "configMap": {"name": "checkout", "defaultMode": 420}},
                    {"name": "kube-api-access-9mfd2", "projected": {"defaultMode": 420, "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                    ]}}],
            },
            "status": {"phase": "Pending", "qosClass": "Burstable", "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-25T10:41:07Z"}]},
        }))
        .expect("a pod");
        at_least_a_third_smaller("a pending pod", &pod, Dictionary::PendingPod);

        let conditions = [
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled",
        ]
        .map(|t| {
            json!({"type": t, "status": "True", "lastProbeTime": null,
                   "lastTransitionTime": "2026-11-25T10:41:12Z"})
        });
        let status: PodStatus = serde_json::from_value(json!({
            "phase": "Running", "podIP": "10.71.3.17", "podIPs": [{"ip": "10.71.3.17"}],
            "hostIP": "192.168.4.21", "hostIPs": [{"ip": "192.168.4.21"}],
            "startTime": "2026-11-25T10:41:09Z",
            "conditions": conditions,
            "containerStatuses": [{
                "name": "checkout", "ready": true, "started": true, "restartCount": 2,
                "image": "ghcr.io/acme/checkout:2.14.1",
                "imageID": "ghcr.io/acme/checkout@sha256:4e1f0c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f",
                "containerID": "containerd://b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4",
                "state": {"running": {"startedAt": "2026-11-25T10:41:11Z"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                    "startedAt": "2026-11-25T10:41:09Z", "finishedAt": "2026-11-25T10:41:10Z"}},
            }],
        }))
        .expect("a status");
        at_least_a_third_smaller("a running status", &status, Dictionary::Status);
    }

    #[test]
    fn the_dictionaries_are_what_the_stores_serialise() {
        // A dictionary that failed to parse would be empty, and every
        // text would deflate as if it had none.
        let pod: Pod = serde_json::from_slice(&PENDING_POD).expect("a pod");
        assert_eq!(pod.metadata.name.as_deref(), Some("app-5d8f7c6b9d-abcde"));
        assert!(
            pod.spec
                .is_some_and(|s| s.volumes.is_some_and(|v| v.len() == 1))
        );
        let status: PodStatus = serde_json::from_slice(&STATUS).expect("a status");
        assert_eq!(status.container_statuses.map(|c| c.len()), Some(1));
        assert_eq!(status.conditions.map(|c| c.len()), Some(5));
    }
}
