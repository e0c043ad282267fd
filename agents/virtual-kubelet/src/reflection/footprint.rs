//! What the reflection's stores hold in memory for a given number of
//! offloaded pods, measured in this process: every store the agent keeps
//! per pod is filled with objects shaped as the API serves them (a
//! Deployment's running pods, their remote ReplicaSets, pods and token
//! Secrets, and their Events on both sides), and the heap they hold is
//! counted by the agent's allocator. Beside it, as a reference, the same
//! objects held as a plain kube-runtime reflector holds them (k8s-openapi
//! values, managedFields dropped).
//!
//! Run by `tests/bench/stores.sh` (ignored in the test suite: it fills
//! stores of 10,000 pods and reads a process-wide counter, so it runs
//! alone).

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector;
use kube::runtime::watcher;
use serde_json::{Value, json};
use tikv_jemalloc_ctl::thread;

/// What the agent's allocator (jemalloc, in tests too) has handed out to
/// this thread, less what it took back: each allocation at its size
/// class, what the agent pays for it.
fn held_now() -> isize {
    let allocated = thread::allocatedp::read().expect("jemalloc's thread.allocatedp");
    let deallocated = thread::deallocatedp::read().expect("jemalloc's thread.deallocatedp");
    allocated.get() as isize - deallocated.get() as isize
}

/// What `fill` holds once done, in jemalloc's size classes (what it makes
/// on the way and drops is not counted), and the value that holds it.
/// `fill` runs on this thread, whose counters are read.
fn measure<T>(fill: impl FnOnce() -> T) -> (isize, T) {
    let before = held_now();
    let kept = fill();
    (held_now() - before, kept)
}

/// An object read from its JSON text, as the agent reads the API's
/// responses (strings exactly as long as they are).
fn parse<T: serde::de::DeserializeOwned>(value: Value) -> serde_json::Result<T> {
    serde_json::from_str(&value.to_string())
}

const NAMESPACE: &str = "shop";
const TWIN: &str = "shop-7f3a9c";

fn uid(kind: u32, i: usize) -> String {
    format!("{kind:08x}-4b1e-4c2a-9d7f-{i:012x}")
}

/// The i-th pod's name, as a Deployment's ReplicaSet names its pods.
fn pod_name(i: usize) -> String {
    format!("web-6d4cf56db6-{}", suffix(i))
}

/// Five characters of the alphabet the API server's name generator
/// uses, different for every i below 27^5.
fn suffix(i: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = i;
    (0..5)
        .map(|_| {
            let c = ALPHABET[n % ALPHABET.len()] as char;
            n /= ALPHABET.len();
            c
        })
        .collect()
}

fn running_status(ip: &str) -> Value {
    let condition = |t: &str| {
        json!({"type": t, "status": "True", "lastProbeTime": null,
               "lastTransitionTime": "2026-11-25T10:00:03Z"})
    };
    json!({
        "phase": "Running",
        "conditions": [condition("PodReadyToStartContainers"), condition("Initialized"),
                       condition("Ready"), condition("ContainersReady"), condition("PodScheduled")],
        "hostIP": "10.200.0.7", "hostIPs": [{"ip": "10.200.0.7"}],
        "podIP": ip, "podIPs": [{"ip": ip}],
        "startTime": "2026-11-25T10:00:01Z",
        "qosClass": "Burstable",
        "containerStatuses": [{
            "name": "web", "ready": true, "started": true, "restartCount": 0,
            "image": "registry.example.com/shop/web:1.4.2",
            "imageID": "registry.example.com/shop/web@sha256:9b2a6c0e2d4f8a1b3c5d7e9f0a2b4c6d8e0f1a3b5c7d9e1f3a5b7c9d1e3f5a7b",
            "containerID": "containerd://5f1c9e0b7a3d2c4e6f8a0b1c3d5e7f9a1b3c5d7e9f0a2b4c6d8e0f1a3b5c7d9e",
            "state": {"running": {"startedAt": "2026-11-25T10:00:02Z"}},
        }],
    })
}

fn pod_spec(node: &str, i: usize) -> Value {
    json!({
        "nodeName": node,
        "serviceAccountName": "default", "serviceAccount": "default",
        "schedulerName": "default-scheduler", "dnsPolicy": "ClusterFirst",
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
        "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0, "securityContext": {},
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"},
        ],
        "containers": [{
            "name": "web", "image": "registry.example.com/shop/web:1.4.2",
            "imagePullPolicy": "IfNotPresent",
            "ports": [{"containerPort": 8080, "protocol": "TCP"}],
            "env": [{"name": "REPLICA", "value": format!("{i}")}],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
            "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": true,
                              "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
        }],
        "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]}}],
    })
}

/// The i-th local pod as it waits for its remote pod (a scale-up holds
/// thousands of these at once).
fn pending_pod(i: usize) -> Pod {
    let mut pod = local_pod(i);
    pod.status = parse(json!({
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True",
                        "lastTransitionTime": "2026-11-25T10:00:00Z"}],
        "qosClass": "Burstable",
    }))
    .expect("a pending status");
    pod
}

fn local_pod(i: usize) -> Pod {
    parse(json!({
        "metadata": {
            "name": pod_name(i), "generateName": "web-6d4cf56db6-", "namespace": NAMESPACE,
            "uid": uid(1, i), "resourceVersion": format!("{}", 100_000 + i),
            "creationTimestamp": "2026-11-25T10:00:00Z",
            "labels": {"app": "web", "pod-template-hash": "6d4cf56db6"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-6d4cf56db6",
                                 "uid": uid(9, 0), "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": pod_spec("liqo-provider", i),
        "status": running_status(&format!("10.71.{}.{}", i / 250, i % 250 + 2)),
    }))
    .expect("a local pod")
}

fn remote_pod(i: usize) -> Pod {
    let name = format!("{}-{}", pod_name(i), suffix(i + 7));
    parse(json!({
        "metadata": {
            "name": name, "generateName": format!("{}-", pod_name(i)), "namespace": TWIN,
            "uid": uid(2, i), "resourceVersion": format!("{}", 200_000 + i),
            "creationTimestamp": "2026-11-25T10:00:00Z",
            "labels": {"app": "web", "pod-template-hash": "6d4cf56db6",
                       "liqo.io/local-pod-uid": uid(1, i), "liqo.io/managed-by": "liqo-rs"},
            "annotations": {"liqo.io/local-pod": pod_name(i)},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": pod_name(i),
                                 "uid": uid(3, i), "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": pod_spec("worker-3", i),
        "status": running_status(&format!("10.70.{}.{}", i / 250, i % 250 + 2)),
    }))
    .expect("a remote pod")
}

fn remote_replica_set(i: usize) -> PartialObjectMeta<ReplicaSet> {
    parse(json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {
            "name": pod_name(i), "namespace": TWIN, "uid": uid(3, i),
            "resourceVersion": format!("{}", 300_000 + i), "generation": 1,
            "creationTimestamp": "2026-11-25T10:00:00Z",
            "labels": {"liqo.io/local-pod-uid": uid(1, i), "liqo.io/managed-by": "liqo-rs"},
            "annotations": {"liqo.io/local-pod": pod_name(i), "liqo.io/wrapper-generation": "1"},
        },
    }))
    .expect("a remote replica set")
}

fn token_secret(i: usize) -> Secret {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let token = format!("eyJhbGciOiJSUzI1NiIsImtpZCI6Ik{}", "x".repeat(900));
    let ca = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        "M".repeat(1100)
    );
    parse(json!({
        "metadata": {
            "name": format!("{}-token", pod_name(i)), "namespace": TWIN, "uid": uid(4, i),
            "resourceVersion": format!("{}", 400_000 + i),
            "creationTimestamp": "2026-11-25T10:00:00Z",
            "labels": {"liqo.io/local-pod-uid": uid(1, i), "liqo.io/managed-by": "liqo-rs"},
            "annotations": {"liqo.io/token-expires": "2026-11-25T11:00:00Z"},
        },
        "type": "Opaque",
        "data": {"token": b64(&token), "ca.crt": b64(&ca), "namespace": b64(NAMESPACE)},
    }))
    .expect("a token secret")
}

/// The j-th Event about a pod (the scheduler's, then the kubelet's).
fn event(namespace: &str, pod: &str, i: usize, j: usize, local: bool) -> Event {
    let (reason, message, component) = match j % 3 {
        0 => (
            "Scheduled",
            format!("Successfully assigned {namespace}/{pod} to worker-3"),
            "default-scheduler",
        ),
        1 => (
            "Pulled",
            "Container image \"registry.example.com/shop/web:1.4.2\" already present on machine"
                .to_owned(),
            "kubelet",
        ),
        _ => ("Started", "Started container web".to_owned(), "kubelet"),
    };
    let name = format!("{pod}.{:016x}", i * 8 + j);
    let labels = if local {
        json!({"liqo.io/managed-by": "liqo-rs"})
    } else {
        json!(null)
    };
    parse(json!({
        "metadata": {"name": name, "namespace": namespace, "uid": uid(5 + local as u32, i * 8 + j),
                     "resourceVersion": format!("{}", 500_000 + i * 8 + j),
                     "creationTimestamp": "2026-11-25T10:00:01Z", "labels": labels},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": namespace,
                           "uid": uid(2, i), "resourceVersion": format!("{}", 200_000 + i)},
        "reason": reason, "message": message, "type": "Normal",
        "source": {"component": component, "host": "worker-3"},
        "firstTimestamp": "2026-11-25T10:00:01Z", "lastTimestamp": "2026-11-25T10:00:01Z",
        "count": 1, "reportingComponent": component, "reportingInstance": "worker-3",
    }))
    .expect("an event")
}

/// Events per pod on each side (a pod of a Deployment gets about three:
/// scheduled, pulled, started; the count seen at 10,000 pods was 1.4 to
/// 2.4 per pod, Events living an hour).
const EVENTS_PER_POD: usize = 2;

/// The same objects as a plain kube-runtime reflector holds them.
fn reference<K>(objects: impl Iterator<Item = K>) -> reflector::Store<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default + Send + Sync,
{
    let mut writer = reflector::store::Writer::default();
    let store = writer.as_reader();
    writer.apply_watcher_event(&watcher::Event::Init);
    for mut obj in objects {
        obj.meta_mut().managed_fields = None;
        writer.apply_watcher_event(&watcher::Event::InitApply(obj));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    store
}

#[test]
#[ignore = "a measurement: run alone by tests/bench/stores.sh"]
fn footprint() {
    let pods: usize = std::env::var("FOOTPRINT_PODS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let mut rows = Vec::new();
    let mut total = (0, 0);
    let mut row = |what: &str, count: usize, ours: isize, reference: isize| {
        total = (total.0 + ours, total.1 + reference);
        rows.push(line(what, Some(count), ours, reference));
    };
    let events = pods * EVENTS_PER_POD;
    let local_events = || {
        (0..events).map(|k| {
            event(
                NAMESPACE,
                &pod_name(k / EVENTS_PER_POD),
                k / EVENTS_PER_POD,
                k % EVENTS_PER_POD,
                true,
            )
        })
    };
    let remote_events = || {
        (0..events).map(|k| {
            let i = k / EVENTS_PER_POD;
            event(
                TWIN,
                &format!("{}-{}", pod_name(i), suffix(i + 7)),
                i,
                k % EVENTS_PER_POD,
                false,
            )
        })
    };

    let (ours, _local) = measure(|| super::pod::footprint::local_pods((0..pods).map(local_pod)));
    let (refr, _r) = measure(|| reference((0..pods).map(local_pod)));
    row("local pods", pods, ours, refr);
    let (ours, _remote) =
        measure(|| super::pod::footprint::remote_pods_settled((0..pods).map(remote_pod)));
    let (refr_pods, _r) = measure(|| reference((0..pods).map(remote_pod)));
    row("remote pods", pods, ours, refr_pods);
    let (unsettled_pods, _remote) =
        measure(|| super::pod::footprint::remote_pods((0..pods).map(remote_pod)));
    let (ours, _rs) =
        measure(|| super::pod::footprint::wrappers((0..pods).map(remote_replica_set)));
    let (refr, _r) = measure(|| {
        reference((0..pods).map(|i| {
            let meta = remote_replica_set(i);
            ReplicaSet {
                metadata: meta.metadata,
                ..ReplicaSet::default()
            }
        }))
    });
    row("remote replica sets", pods, ours, refr);
    let (ours, _tokens) = measure(|| super::token::footprint::secrets((0..pods).map(token_secret)));
    let (refr, _r) = measure(|| reference((0..pods).map(token_secret)));
    row("remote token secrets", pods, ours, refr);
    let (ours, _re) = measure(|| super::event::footprint::settled(remote_events()));
    let (refr_events, _r) = measure(|| reference(remote_events()));
    row("remote events", events, ours, refr_events);
    let (unsettled, _re) = measure(|| super::event::footprint::remote(remote_events()));
    let (ours, _le) = measure(|| super::event::footprint::local(local_events()));
    let (refr, _r) = measure(|| reference(local_events()));
    row("local event copies", events, ours, refr);

    println!("stores of {pods} offloaded pods ({EVENTS_PER_POD} Events per pod on each side)");
    println!(
        "{:<22} {:>7} {:>8} {:>8} {:>11}",
        "store", "objects", "MiB", "B/object", "kube-rt MiB"
    );
    for r in &rows {
        println!("{r}");
    }
    println!("{}", line("total", None, total.0, total.1));
    // The local pods again, all pending, as a scale-up holds them (not in
    // the total: the same pods in another state).
    let (ours, _pending) =
        measure(|| super::pod::footprint::local_pods((0..pods).map(pending_pod)));
    let (refr, _r) = measure(|| reference((0..pods).map(pending_pod)));
    println!("{}", line("(local pods, pending)", Some(pods), ours, refr));
    // The remote pods and Events again, as read (each is settled once
    // the local pod or the Event's copy shows it).
    println!(
        "{}",
        line("(remote pods, new)", Some(pods), unsettled_pods, refr_pods)
    );
    println!(
        "{}",
        line("(remote events, new)", Some(events), unsettled, refr_events)
    );
    assert!(total.0 > 0, "the stores hold something");
}

/// One line of the table: `count` objects held in `ours` bytes (and per
/// object), against `reference` bytes.
fn line(what: &str, count: Option<usize>, ours: isize, reference: isize) -> String {
    let mib = |b: isize| b as f64 / (1024.0 * 1024.0);
    let (count, each) = match count {
        Some(n) => (n.to_string(), (ours / n.max(1) as isize).to_string()),
        None => (String::new(), String::new()),
    };
    format!(
        "{what:<22} {count:>7} {:>8.1} {each:>8} {:>11.1}",
        mib(ours),
        mib(reference)
    )
}
