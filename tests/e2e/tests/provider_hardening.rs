//! What a peer can run on its provider, proven with the consumer's own
//! credential straight against the provider's API server (as a consumer
//! that bypasses its virtual kubelet would), never through its agent.
//!
//! Each attempt the provider must refuse is paired with the allowed form
//! of the same request, which it admits, so that nothing here passes by
//! refusing everything; each refusal names the rule that made it (Pod
//! Security admission, one of the `liqo-peer-*` admission policies, or
//! RBAC). Two consumers peer with one provider: `consumer-1` under the
//! default terms (`restricted`, nothing else), `consumer-2` under terms its
//! provider opted into for it alone (baseline, NodePort Services, a
//! priority class, a toleration, then privileged), and each is held to
//! its own. The consumer's virtual kubelet reads its terms: a pod they
//! refuse is refused on the consumer with the reason, before it is sent.
//! Twin namespaces of an earlier version are brought under the rules by
//! `liqoctl install`, which reports the running pods they would refuse.

use std::fmt::Debug;

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Namespace, Pod, ResourceQuota, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use liqo_api::authentication::Tenant;
use liqo_api::names::{labels, peering};
use liqo_api::networking::Connection;
use liqo_api::shares::{DEMAND_ANNOTATION, SHARE_QUOTA};
use liqo_e2e::fixture::WAIT;
use liqo_e2e::{liqoctl, wait_for};
use liqo_testbed::{ClusterSpec, Testbed};
use serde_json::{Value, json};

/// The rules a refusal names.
const PSA: &str = "violates PodSecurity";
const PODS: &str = "ValidatingAdmissionPolicy 'liqo-peer-pods'";
const WORKLOADS: &str = "ValidatingAdmissionPolicy 'liqo-peer-workloads'";
const SERVICES: &str = "ValidatingAdmissionPolicy 'liqo-peer-services'";
const SLICES: &str = "ValidatingAdmissionPolicy 'liqo-peer-endpointslices'";
const NS_SECURITY: &str = "ValidatingAdmissionPolicy 'liqo-peer-pod-security'";
const NAMESPACES: &str = "ValidatingAdmissionPolicy 'liqo-peer-namespaces'";
const ROLEBINDINGS: &str = "ValidatingAdmissionPolicy 'liqo-peer-rolebindings'";
const SECRETS: &str = "ValidatingAdmissionPolicy 'liqo-peer-secrets'";
const RBAC: &str = "cannot";
const ESCALATION: &str = "attempting to grant RBAC permissions not currently held";

/// The attempts made, refused and allowed.
#[derive(Default)]
struct Tally {
    refused: usize,
    allowed: usize,
}

impl Tally {
    /// `r` was refused with 403 (or 422) and a message naming `rule`.
    fn refused<T: Debug>(&mut self, what: &str, rule: &str, r: Result<T, kube::Error>) {
        match &r {
            Err(kube::Error::Api(s))
                if (s.code == 403 || s.code == 422) && s.message.contains(rule) =>
            {
                self.refused += 1;
            }
            _ => panic!("{what}: wanted a refusal naming {rule:?}, got {r:?}"),
        }
    }

    /// `r`, the allowed form, was admitted.
    fn allowed<T: Debug>(&mut self, what: &str, r: Result<T, kube::Error>) -> T {
        match r {
            Ok(t) => {
                self.allowed += 1;
                t
            }
            Err(e) => panic!("{what}: the allowed form was refused: {e}"),
        }
    }
}

fn from<T: k8s_openapi::serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

/// A pod of the peer that its default terms admit (restricted, requests
/// stated for its share's quota), changed by `change` on its JSON.
fn pod(name: &str, change: impl FnOnce(&mut Value)) -> Pod {
    let mut v = liqo_e2e::restricted(json!({
        "metadata": { "name": name },
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "c",
                "image": "nginx",
                "resources": { "requests": { "cpu": "1m", "memory": "1Mi" } },
            }],
        },
    }));
    change(&mut v);
    from(v)
}

/// The same pod spec, for templates.
fn pod_spec(change: impl FnOnce(&mut Value)) -> Value {
    let v = serde_json::to_value(pod("t", change)).expect("json");
    v["spec"].clone()
}

fn replica_set(name: &str, change: impl FnOnce(&mut Value)) -> ReplicaSet {
    from(json!({
        "metadata": { "name": name },
        "spec": {
            "replicas": 0,
            "selector": { "matchLabels": { "app": name } },
            "template": { "metadata": { "labels": { "app": name } }, "spec": pod_spec(change) },
        },
    }))
}

fn job(name: &str, change: impl FnOnce(&mut Value)) -> Job {
    let mut spec = pod_spec(change);
    spec["restartPolicy"] = json!("Never");
    from(json!({
        "metadata": { "name": name },
        "spec": { "suspend": true, "template": { "spec": spec } },
    }))
}

fn service(name: &str, spec: Value) -> Service {
    let mut spec = spec;
    spec["ports"] = json!([{ "port": 80 }]);
    from(json!({ "metadata": { "name": name }, "spec": spec }))
}

fn slice(name: &str, address_type: &str, endpoints: Value) -> EndpointSlice {
    from(json!({
        "metadata": { "name": name, "labels": { "kubernetes.io/service-name": "web" } },
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": [{ "port": 80, "protocol": "TCP" }],
    }))
}

/// A namespace of tenant `tenant` with the Pod Security labels `levels`
/// (enforce, audit, warn) and any `extra` labels.
fn twin(name: &str, tenant: &str, levels: [&str; 3], extra: Value) -> Namespace {
    let mut l = json!({
        labels::TENANT: tenant,
        labels::ORIGIN_NAMESPACE: "probe",
        "pod-security.kubernetes.io/enforce": levels[0],
        "pod-security.kubernetes.io/audit": levels[1],
        "pod-security.kubernetes.io/warn": levels[2],
    });
    if let (Some(l), Some(extra)) = (l.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            if v.is_null() {
                l.remove(k);
            } else {
                l.insert(k.clone(), v.clone());
            }
        }
    }
    from(json!({ "metadata": { "name": name, "labels": l } }))
}

fn own_binding(tenant: &str) -> RoleBinding {
    from(json!({
        "metadata": { "name": peering::TWIN_ROLE_BINDING },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("liqo-tenant-{tenant}") },
        "subjects": [{ "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": format!("liqo.io:peer:{tenant}") }],
    }))
}

/// Makes twin `ns` of `tenant` as the peer does, binds its role there,
/// and waits for its share (the provider's gateway makes it).
async fn make_twin(
    tally: &mut Tally,
    peer: &kube::Client,
    prov: &kube::Client,
    ns: &str,
    tenant: &str,
    level: &str,
) -> Result<()> {
    let pp = PostParams::default();
    tally.allowed(
        &format!("create twin {ns} at level {level}"),
        Api::<Namespace>::all(peer.clone())
            .create(&pp, &twin(ns, tenant, [level; 3], json!({})))
            .await,
    );
    tally.allowed(
        &format!("bind its own role in {ns}"),
        Api::<RoleBinding>::namespaced(peer.clone(), ns)
            .create(&pp, &own_binding(tenant))
            .await,
    );
    let quotas: Api<ResourceQuota> = Api::namespaced(prov.clone(), ns);
    wait_for(&format!("the share of {ns}"), WAIT, || async {
        Ok(quotas.get_opt(SHARE_QUOTA).await?.is_some())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_runs_on_its_provider_only_what_the_provider_allowed() -> Result<()> {
    let mut specs = Vec::new();
    for (name, index, nodes) in [("consumer", 1, 1), ("lab", 3, 1), ("provider", 2, 2)] {
        let mut spec = ClusterSpec::new(name, index);
        spec.nodes = nodes;
        spec.agent_bin_dir = Some(liqo_e2e::bin_dir());
        specs.push(spec);
    }
    let testbed = Testbed::start(specs).await?;
    let consumer = testbed.cluster("consumer");
    let lab = testbed.cluster("lab");
    let provider = testbed.cluster("provider");
    for (cluster, id, cidr) in [
        (consumer, "consumer-1", "10.201.0.0/16"),
        (lab, "consumer-2", "10.203.0.0/16"),
        (provider, "provider-1", "10.202.0.0/16"),
    ] {
        liqo_e2e::install(cluster, id, cidr, &[]).success();
    }
    let on_provider = |args: &[&str]| liqoctl(Some(provider.kubeconfig_path()), args);
    // consumer-2's own terms, before it peers: baseline, two node ports,
    // a priority class and a taint of the provider's.
    on_provider(&[
        "sharing-policy",
        "set",
        "--peer=consumer-2",
        "--pod-security=baseline",
        "--node-ports=2",
        "--priority-classes=peer-low",
        "--tolerations=dedicated",
    ])
    .success();
    let remote = provider.kubeconfig_path().to_str().context("path")?;
    for cluster in [consumer, lab] {
        let out = liqoctl(
            Some(cluster.kubeconfig_path()),
            &["peer", "--remote-kubeconfig", remote, "--timeout=120"],
        );
        if out.code != 0 {
            eprintln!("--- agents ---\n{}", cluster.pod_logs());
            eprintln!("--- provider agents ---\n{}", provider.pod_logs());
        }
        out.success();
    }
    let prov = provider.client().await?;
    let one = liqo_e2e::peer_client(consumer, &consumer.client().await?, "provider-1").await?;
    let two = liqo_e2e::peer_client(lab, &lab.client().await?, "provider-1").await?;
    let pp = PostParams::default();
    let mut t = Tally::default();

    // Each peering's terms in `liqoctl info`, on both sides.
    let compact = |text: &str| text.split_whitespace().collect::<String>();
    let info = compact(&on_provider(&["info", "-o", "json"]).success().stdout);
    assert!(
        info.contains("\"podSecurity\":\"baseline\"")
            && info.contains("\"podSecurity\":\"restricted\""),
        "{info}"
    );
    wait_for("the consumer's info to show its terms", WAIT, || async {
        let out = liqoctl(Some(consumer.kubeconfig_path()), &["info", "-o", "json"]);
        Ok(compact(&out.stdout).contains("\"podSecurity\":\"restricted\""))
    })
    .await?;

    // ---- Namespaces: the Pod Security labels of its level, fixed.
    let namespaces: Api<Namespace> = Api::all(one.clone());
    t.refused(
        "create its namespace labelled privileged",
        NS_SECURITY,
        namespaces
            .create(
                &pp,
                &twin("esc-privileged", "consumer-1", ["privileged"; 3], json!({})),
            )
            .await,
    );
    t.refused(
        "create its namespace with no Pod Security labels",
        NS_SECURITY,
        namespaces
            .create(
                &pp,
                &twin(
                    "esc-unlabelled",
                    "consumer-1",
                    ["restricted"; 3],
                    json!({
                        "pod-security.kubernetes.io/enforce": null,
                        "pod-security.kubernetes.io/audit": null,
                        "pod-security.kubernetes.io/warn": null,
                    }),
                ),
            )
            .await,
    );
    t.refused(
        "create its namespace warning at privileged",
        NS_SECURITY,
        namespaces
            .create(
                &pp,
                &twin(
                    "esc-warn",
                    "consumer-1",
                    ["restricted", "restricted", "privileged"],
                    json!({}),
                ),
            )
            .await,
    );
    t.refused(
        "pin an old Pod Security version",
        NS_SECURITY,
        namespaces
            .create(
                &pp,
                &twin(
                    "esc-version",
                    "consumer-1",
                    ["restricted"; 3],
                    json!({ "pod-security.kubernetes.io/enforce-version": "v1.22" }),
                ),
            )
            .await,
    );
    t.allowed(
        "pin the latest version",
        namespaces
            .create(
                &pp,
                &twin(
                    "ok-latest",
                    "consumer-1",
                    ["restricted"; 3],
                    json!({ "pod-security.kubernetes.io/enforce-version": "latest" }),
                ),
            )
            .await,
    );
    t.refused(
        "create a namespace for another tenant",
        NAMESPACES,
        namespaces
            .create(
                &pp,
                &twin("esc-other", "consumer-2", ["baseline"; 3], json!({})),
            )
            .await,
    );
    const T1: &str = "probe-consumer-1";
    make_twin(&mut t, &one, &prov, T1, "consumer-1", "restricted").await?;
    t.refused(
        "relabel its twin privileged",
        NS_SECURITY,
        namespaces
            .patch(
                T1,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "pod-security.kubernetes.io/enforce": "privileged" } } })),
            )
            .await,
    );
    t.refused(
        "remove its twin's enforce label",
        NS_SECURITY,
        namespaces
            .patch(
                T1,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "pod-security.kubernetes.io/enforce": null } } })),
            )
            .await,
    );
    t.allowed(
        "annotate its twin",
        namespaces
            .patch(
                T1,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "annotations": { "probe": "yes" } } })),
            )
            .await,
    );

    // ---- RBAC: nothing beyond its own role in its own namespaces.
    let cluster_admin: RoleBinding = from(json!({
        "metadata": { "name": "escalate" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "liqo.io:peer:consumer-1" }],
    }));
    // RBAC's escalation check refuses it before admission sees it.
    t.refused(
        "bind cluster-admin in its twin",
        ESCALATION,
        Api::<RoleBinding>::namespaced(one.clone(), T1)
            .create(&pp, &cluster_admin)
            .await,
    );
    t.refused(
        "bind its role to someone else in its twin",
        ROLEBINDINGS,
        Api::<RoleBinding>::namespaced(one.clone(), T1)
            .create(
                &pp,
                &from(json!({
                    "metadata": { "name": "lend" },
                    "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "liqo-tenant-consumer-1" },
                    "subjects": [{ "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "mallory" }],
                })),
            )
            .await,
    );
    let crb: ClusterRoleBinding = from(json!({
        "metadata": { "name": "escalate" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "liqo.io:peer:consumer-1" }],
    }));
    t.refused(
        "bind cluster-admin cluster-wide",
        RBAC,
        Api::<ClusterRoleBinding>::all(one.clone())
            .create(&pp, &crb)
            .await,
    );

    // ---- Pods at `restricted`: each escape, then the pod that is fine.
    let pods: Api<Pod> = Api::namespaced(one.clone(), T1);
    let escapes: Vec<(&str, &str, Pod)> = vec![
        (
            "privileged",
            PSA,
            pod("esc-privileged", |p| {
                p["spec"]["containers"][0]["securityContext"]["privileged"] = json!(true);
                p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] =
                    json!(true);
            }),
        ),
        (
            "the node's / through hostPath",
            PSA,
            pod("esc-hostpath", |p| {
                p["spec"]["volumes"] = json!([{ "name": "root", "hostPath": { "path": "/" } }]);
                p["spec"]["containers"][0]["volumeMounts"] =
                    json!([{ "name": "root", "mountPath": "/host" }]);
            }),
        ),
        (
            "hostNetwork",
            PSA,
            pod("esc-hostnetwork", |p| {
                p["spec"]["hostNetwork"] = json!(true)
            }),
        ),
        (
            "hostPID",
            PSA,
            pod("esc-hostpid", |p| p["spec"]["hostPID"] = json!(true)),
        ),
        (
            "hostIPC",
            PSA,
            pod("esc-hostipc", |p| p["spec"]["hostIPC"] = json!(true)),
        ),
        (
            "hostPort 80",
            PSA,
            pod("esc-hostport", |p| {
                p["spec"]["containers"][0]["ports"] =
                    json!([{ "containerPort": 80, "hostPort": 80 }]);
            }),
        ),
        (
            "SYS_ADMIN",
            PSA,
            pod("esc-sysadmin", |p| {
                p["spec"]["containers"][0]["securityContext"]["capabilities"] =
                    json!({ "drop": ["ALL"], "add": ["SYS_ADMIN"] });
                p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] =
                    json!(true);
            }),
        ),
        (
            "NET_ADMIN",
            PSA,
            pod("esc-netadmin", |p| {
                p["spec"]["containers"][0]["securityContext"]["capabilities"] =
                    json!({ "drop": ["ALL"], "add": ["NET_ADMIN"] });
            }),
        ),
        (
            "root",
            PSA,
            pod("esc-root", |p| {
                p["spec"]["securityContext"]["runAsNonRoot"] = json!(false);
                p["spec"]["securityContext"]["runAsUser"] = json!(0);
            }),
        ),
        (
            "privilege escalation",
            PSA,
            pod("esc-escalation", |p| {
                p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] =
                    json!(true);
            }),
        ),
        (
            "seccomp Unconfined",
            PSA,
            pod("esc-seccomp", |p| {
                p["spec"]["securityContext"]["seccompProfile"] = json!({ "type": "Unconfined" });
            }),
        ),
        (
            "a provider node by spec.nodeName",
            PODS,
            pod("esc-nodename", |p| {
                p["spec"]["nodeName"] = json!("provider-kwok-0");
            }),
        ),
        (
            "priority system-cluster-critical",
            PODS,
            pod("esc-priority", |p| {
                p["spec"]["priorityClassName"] = json!("system-cluster-critical");
            }),
        ),
        (
            "tolerating every taint",
            PODS,
            pod("esc-tolerate-all", |p| {
                p["spec"]["tolerations"] = json!([{ "operator": "Exists" }]);
            }),
        ),
        (
            "tolerating the control plane",
            PODS,
            pod("esc-control-plane", |p| {
                p["spec"]["tolerations"] = json!([{ "key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule" }]);
            }),
        ),
        (
            "tolerating a taint another peer may",
            PODS,
            pod("esc-dedicated", |p| {
                p["spec"]["tolerations"] = json!([{ "key": "dedicated", "operator": "Exists" }]);
            }),
        ),
    ];
    for (what, rule, p) in escapes {
        t.refused(
            &format!("a pod with {what}"),
            rule,
            pods.create(&pp, &p).await,
        );
    }
    t.allowed(
        "a restricted pod that tolerates an unreachable node for a while",
        pods.create(
            &pp,
            &pod("ok-pod", |p| {
                p["spec"]["tolerations"] = json!([{
                    "key": "node.kubernetes.io/unreachable", "operator": "Exists",
                    "effect": "NoExecute", "tolerationSeconds": 30,
                }]);
            }),
        )
        .await,
    );
    // Read and written again while the pod's status moves under it: a
    // conflict is tried again, a few times.
    let mut added = Err(kube::Error::LinesCodecMaxLineLengthExceeded);
    for _ in 0..5 {
        let mut tolerating = pods.get("ok-pod").await?;
        if let Some(spec) = tolerating.spec.as_mut() {
            spec.tolerations.get_or_insert_default().push(from(json!({
                "key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
            })));
        }
        added = pods.replace("ok-pod", &pp, &tolerating).await;
        if !matches!(&added, Err(kube::Error::Api(s)) if s.code == 409) {
            break;
        }
    }
    t.refused("add a toleration to a pod it has", PODS, added);
    t.allowed(
        "label a pod it has",
        pods.patch(
            "ok-pod",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "probe": "yes" } } })),
        )
        .await,
    );
    t.refused(
        "write its pod's status",
        RBAC,
        pods.patch_status(
            "ok-pod",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "phase": "Succeeded" } })),
        )
        .await,
    );
    t.refused(
        "add an ephemeral container",
        RBAC,
        pods.patch_subresource(
            "ephemeralcontainers",
            "ok-pod",
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "spec": { "ephemeralContainers": [{ "name": "x", "image": "busybox" }] } }),
            ),
        )
        .await,
    );

    // ---- Pod templates: refused at once, not pod by pod.
    let rs: Api<ReplicaSet> = Api::namespaced(one.clone(), T1);
    t.refused(
        "a ReplicaSet whose pods pick a node",
        WORKLOADS,
        rs.create(
            &pp,
            &replica_set("esc-rs-node", |p| {
                p["spec"]["nodeName"] = json!("provider-kwok-0")
            }),
        )
        .await,
    );
    t.refused(
        "a ReplicaSet whose pods preempt the provider's",
        WORKLOADS,
        rs.create(
            &pp,
            &replica_set("esc-rs-priority", |p| {
                p["spec"]["priorityClassName"] = json!("system-node-critical");
            }),
        )
        .await,
    );
    t.allowed(
        "a ReplicaSet of fine pods",
        rs.create(&pp, &replica_set("ok-rs", |_| ())).await,
    );
    let jobs: Api<Job> = Api::namespaced(one.clone(), T1);
    t.refused(
        "a Job whose pods tolerate every taint",
        WORKLOADS,
        jobs.create(
            &pp,
            &job("esc-job", |p| {
                p["spec"]["tolerations"] = json!([{ "operator": "Exists" }])
            }),
        )
        .await,
    );
    t.allowed(
        "a Job of fine pods",
        jobs.create(&pp, &job("ok-job", |_| ())).await,
    );

    // ---- Services: never external IPs; NodePort and LoadBalancer only
    // where its terms allow them (not for consumer-1).
    let services: Api<Service> = Api::namespaced(one.clone(), T1);
    t.refused(
        "a Service taking over 8.8.8.8 (CVE-2020-8554)",
        SERVICES,
        services
            .create(
                &pp,
                &service("esc-external", json!({ "externalIPs": ["8.8.8.8"] })),
            )
            .await,
    );
    t.refused(
        "a NodePort Service",
        SERVICES,
        services
            .create(&pp, &service("esc-nodeport", json!({ "type": "NodePort" })))
            .await,
    );
    t.refused(
        "a LoadBalancer Service",
        SERVICES,
        services
            .create(&pp, &service("esc-lb", json!({ "type": "LoadBalancer" })))
            .await,
    );
    t.allowed(
        "a ClusterIP Service",
        services.create(&pp, &service("web", json!({}))).await,
    );
    t.refused(
        "give its Service external IPs later",
        SERVICES,
        services
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "externalIPs": ["10.202.0.1"] } })),
            )
            .await,
    );

    // ---- EndpointSlices: only its own pods, where the provider sees
    // them (its end of the tunnel says where).
    let conn: Api<Connection> = Api::namespaced(prov.clone(), "liqo-tenant-consumer-1");
    let seen = conn
        .get("consumer-1")
        .await?
        .status
        .and_then(|s| s.peer_seen_as)
        .context("the provider's gateway says where it sees consumer-1's pods")?;
    assert_eq!(
        seen, "10.201.0.0/16",
        "disjoint CIDRs: seen at their own addresses"
    );
    let slices: Api<EndpointSlice> = Api::namespaced(one.clone(), T1);
    let at = |ip: &str| json!([{ "addresses": [ip] }]);
    for (what, s) in [
        (
            "a provider's pod",
            slice("esc-provider-pod", "IPv4", at("10.202.0.9")),
        ),
        (
            "an address on the Internet",
            slice("esc-internet", "IPv4", at("8.8.8.8")),
        ),
        (
            "a host on the provider's network",
            slice("esc-lan", "IPv4", at("192.168.1.10")),
        ),
        (
            "its pod and a provider's",
            slice(
                "esc-mixed",
                "IPv4",
                json!([{ "addresses": ["10.201.0.7"] }, { "addresses": ["10.202.0.9"] }]),
            ),
        ),
        (
            "a name",
            slice("esc-fqdn", "FQDN", at("kubernetes.default.svc")),
        ),
        (
            "a pod of kube-system (CVE-2021-25740)",
            slice(
                "esc-target",
                "IPv4",
                json!([{ "addresses": ["10.201.0.8"], "targetRef": { "kind": "Pod", "namespace": "kube-system", "name": "coredns" } }]),
            ),
        ),
    ] {
        t.refused(
            &format!("an EndpointSlice to {what}"),
            SLICES,
            slices.create(&pp, &s).await,
        );
    }
    t.allowed(
        "an EndpointSlice to its own pod",
        slices
            .create(&pp, &slice("ok-slice", "IPv4", at("10.201.0.7")))
            .await,
    );

    // ---- Everything else the tenant may touch.
    let secrets: Api<Secret> = Api::namespaced(one.clone(), T1);
    let token_secret: Secret = from(json!({
        "metadata": { "name": "esc-token", "annotations": { "kubernetes.io/service-account.name": "default" } },
        "type": "kubernetes.io/service-account-token",
    }));
    t.refused(
        "a Secret the provider fills with a token of its own",
        SECRETS,
        secrets.create(&pp, &token_secret).await,
    );
    t.allowed(
        "an Opaque Secret",
        secrets
            .create(
                &pp,
                &from(json!({ "metadata": { "name": "ok-secret" }, "stringData": { "k": "v" } })),
            )
            .await,
    );
    t.refused(
        "a ServiceAccount",
        RBAC,
        Api::<ServiceAccount>::namespaced(one.clone(), T1)
            .create(&pp, &from(json!({ "metadata": { "name": "esc" } })))
            .await,
    );
    t.allowed(
        "a ConfigMap",
        Api::<ConfigMap>::namespaced(one.clone(), T1)
            .create(&pp, &from(json!({ "metadata": { "name": "ok-cm" } })))
            .await,
    );
    let events: Api<Event> = Api::namespaced(one.clone(), T1);
    t.refused(
        "write an Event",
        RBAC,
        events
            .create(
                &pp,
                &from(json!({
                    "metadata": { "name": "esc-event" },
                    "involvedObject": { "kind": "Pod", "name": "ok-pod", "namespace": T1 },
                    "reason": "Forged", "message": "x",
                })),
            )
            .await,
    );
    t.allowed("read the Events", events.list(&ListParams::default()).await);
    let tenant_ns = "liqo-tenant-consumer-1";
    t.refused(
        "run a pod in its tenant namespace",
        RBAC,
        Api::<Pod>::namespaced(one.clone(), tenant_ns)
            .create(&pp, &pod("esc-tenant-ns", |_| ()))
            .await,
    );
    t.allowed(
        "read its end of the tunnel",
        Api::<Connection>::namespaced(one.clone(), tenant_ns)
            .list(&ListParams::default())
            .await,
    );
    let tenants: Api<Tenant> = Api::all(one.clone());
    t.refused(
        "loosen its own terms",
        RBAC,
        tenants
            .patch(
                "consumer-1",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "admission": { "podSecurity": "privileged" } } })),
            )
            .await,
    );
    let own = t.allowed("read its own terms", tenants.get("consumer-1").await);
    assert_eq!(own.spec.admission.pod_security.as_str(), "restricted");
    t.refused(
        "read another tenant's terms",
        RBAC,
        tenants.get("consumer-2").await,
    );

    // ---- consumer-2, on the same provider, under the terms it was given.
    const T2: &str = "probe-consumer-2";
    make_twin(&mut t, &two, &prov, T2, "consumer-2", "baseline").await?;
    t.refused(
        "consumer-2 making a privileged namespace",
        NS_SECURITY,
        Api::<Namespace>::all(two.clone())
            .create(
                &pp,
                &twin("esc-two", "consumer-2", ["privileged"; 3], json!({})),
            )
            .await,
    );
    Api::<PriorityClass>::all(prov.clone())
        .create(
            &pp,
            &from(json!({ "metadata": { "name": "peer-low" }, "value": 10 })),
        )
        .await?;
    let pods_two: Api<Pod> = Api::namespaced(two.clone(), T2);
    let baseline_pod = |name: &str| {
        from::<Pod>(json!({
            "metadata": { "name": name },
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "containers": [{ "name": "c", "image": "nginx",
                    "resources": { "requests": { "cpu": "1m", "memory": "1Mi" } } }],
            },
        }))
    };
    t.refused(
        "a baseline pod of consumer-1",
        PSA,
        pods.create(&pp, &baseline_pod("esc-baseline")).await,
    );
    t.allowed(
        "a baseline pod of consumer-2",
        pods_two.create(&pp, &baseline_pod("ok-baseline")).await,
    );
    t.refused(
        "a privileged pod of consumer-2",
        PSA,
        pods_two
            .create(
                &pp,
                &pod("esc-privileged", |p| {
                    p["spec"]["containers"][0]["securityContext"]["privileged"] = json!(true);
                    p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] =
                        json!(true);
                }),
            )
            .await,
    );
    let allowed_extras = |name: &str| {
        pod(name, |p| {
            p["spec"]["priorityClassName"] = json!("peer-low");
            p["spec"]["tolerations"] = json!([{ "key": "dedicated", "operator": "Exists" }]);
        })
    };
    t.allowed(
        "consumer-2's allowed priority class and toleration",
        pods_two.create(&pp, &allowed_extras("ok-extras")).await,
    );
    t.refused(
        "consumer-1 with consumer-2's priority class and toleration",
        PODS,
        pods.create(&pp, &allowed_extras("esc-extras")).await,
    );
    let services_two: Api<Service> = Api::namespaced(two.clone(), T2);
    // Counted by its share's quota: two node ports per namespace. The
    // quota counts a Service when it is admitted only once its status
    // holds the limit; one admitted before waits for the quota
    // controller's full resync (minutes).
    let quotas: Api<ResourceQuota> = Api::namespaced(prov.clone(), T2);
    wait_for("the share of T2 to limit node ports", WAIT, || async {
        let q = quotas.get(SHARE_QUOTA).await?;
        Ok(q.status
            .and_then(|s| s.hard)
            .is_some_and(|h| h.contains_key("services.nodeports")))
    })
    .await?;
    t.allowed(
        "a NodePort Service of consumer-2",
        services_two
            .create(&pp, &service("np-1", json!({ "type": "NodePort" })))
            .await,
    );
    wait_for("the share of T2 to count node ports", WAIT, || async {
        let q = quotas.get(SHARE_QUOTA).await?;
        Ok(q.status
            .and_then(|s| s.used)
            .and_then(|u| u.get("services.nodeports").cloned())
            .is_some_and(|n| n.0 == "1"))
    })
    .await?;
    t.allowed(
        "a second NodePort Service of consumer-2",
        services_two
            .create(&pp, &service("np-2", json!({ "type": "NodePort" })))
            .await,
    );
    t.refused(
        "a third NodePort Service of consumer-2, beyond its node ports",
        "exceeded quota",
        services_two
            .create(&pp, &service("np-3", json!({ "type": "NodePort" })))
            .await,
    );
    t.refused(
        "a LoadBalancer Service of consumer-2",
        SERVICES,
        services_two
            .create(&pp, &service("lb", json!({ "type": "LoadBalancer" })))
            .await,
    );

    // The provider grants consumer-2 privileged, and it applies at once
    // to its existing twin; consumer-1 stays restricted.
    let set = on_provider(&[
        "sharing-policy",
        "set",
        "--peer=consumer-2",
        "--pod-security=privileged",
    ])
    .success();
    assert!(set.stdout.contains("tenant/consumer-2"), "{}", set.stdout);
    let privileged = |name: &str| {
        pod(name, |p| {
            p["spec"]["containers"][0]["securityContext"]["privileged"] = json!(true);
            p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = json!(true);
        })
    };
    t.allowed(
        "a privileged pod of consumer-2, once granted",
        pods_two.create(&pp, &privileged("ok-privileged")).await,
    );
    t.refused(
        "a privileged pod of consumer-1, still",
        PSA,
        pods.create(&pp, &privileged("esc-privileged-2")).await,
    );
    let t2: Namespace = Api::<Namespace>::all(prov.clone()).get(T2).await?;
    assert_eq!(
        t2.metadata.labels.unwrap_or_default()["pod-security.kubernetes.io/enforce"],
        "privileged"
    );

    // Nodes set aside for peers, and a runtime class, for consumer-2.
    Api::<k8s_openapi::api::node::v1::RuntimeClass>::all(prov.clone())
        .create(
            &pp,
            &from(json!({ "metadata": { "name": "sandboxed" }, "handler": "runsc" })),
        )
        .await?;
    on_provider(&[
        "sharing-policy",
        "set",
        "--peer=consumer-2",
        "--node-selector=pool=peers",
        "--runtime-class=sandboxed",
    ])
    .success();
    t.refused(
        "a pod of consumer-2 anywhere",
        PODS,
        pods_two.create(&pp, &pod("esc-anywhere", |_| ())).await,
    );
    t.allowed(
        "a pod of consumer-2 on the peers' nodes, sandboxed",
        pods_two
            .create(
                &pp,
                &pod("ok-sandboxed", |p| {
                    p["spec"]["nodeSelector"] = json!({ "pool": "peers" });
                    p["spec"]["runtimeClassName"] = json!("sandboxed");
                }),
            )
            .await,
    );

    eprintln!(
        "{} attempts refused, {} allowed forms admitted",
        t.refused, t.allowed
    );
    assert!(t.refused >= 40, "only {} refused attempts", t.refused);
    assert!(t.allowed >= 20, "only {} allowed forms", t.allowed);

    // ---- The consumer's virtual kubelet sends only what its terms admit.
    virtual_kubelet_refuses_before_sending(consumer).await?;

    // ---- A twin of an earlier version: brought under the rules by
    // install, its running pods reported, not killed.
    upgrade_brings_twins_under_the_rules(provider, &prov).await?;
    Ok(())
}

async fn virtual_kubelet_refuses_before_sending(consumer: &liqo_testbed::Cluster) -> Result<()> {
    let local = consumer.client().await?;
    let pp = PostParams::default();
    Api::<Namespace>::all(local.clone())
        .create(&pp, &from(json!({ "metadata": { "name": "web" } })))
        .await?;
    liqoctl(
        Some(consumer.kubeconfig_path()),
        &[
            "offload",
            "namespace",
            "web",
            "--pod-offloading-strategy=Remote",
            "--wait",
            "--timeout=90",
        ],
    )
    .success();
    let pods: Api<Pod> = Api::namespaced(local.clone(), "web");
    let on_virtual = |mut p: Pod| {
        let spec = p.spec.as_mut().expect("spec");
        spec.node_selector =
            Some(serde_json::from_value(liqo_e2e::virtual_node_selector()).expect("map"));
        spec.tolerations =
            Some(serde_json::from_value(liqo_e2e::virtual_node_tolerations()).expect("list"));
        p
    };
    pods.create(&pp, &on_virtual(pod("fine", |_| ()))).await?;
    let mut root = on_virtual(pod("as-root", |p| {
        p["spec"]["securityContext"] = json!({ "runAsUser": 0 });
    }));
    root.metadata.name = Some("as-root".to_owned());
    pods.create(&pp, &root).await?;
    let phase = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.clone());
    wait_for("the fine pod to run on the provider", WAIT, || async {
        Ok(phase(&pods.get("fine").await?).as_deref() == Some("Running"))
    })
    .await?;
    wait_for(
        "the pod as root to be refused on the consumer",
        WAIT,
        || async {
            let p = pods.get("as-root").await?;
            let status = p.status.unwrap_or_default();
            Ok(status.phase.as_deref() == Some("Failed")
                && status.reason.as_deref() == Some("OffloadingRefused")
                && status
                    .message
                    .as_deref()
                    .is_some_and(|m| m.contains("restricted") && m.contains("runAsUser")))
        },
    )
    .await?;
    Ok(())
}

async fn upgrade_brings_twins_under_the_rules(
    provider: &liqo_testbed::Cluster,
    prov: &kube::Client,
) -> Result<()> {
    let pp = PostParams::default();
    // As a version without Pod Security labels left it: a twin of
    // consumer-1 with no labels, and a pod there the rules now refuse.
    const OLD: &str = "old-twin";
    Api::<Namespace>::all(prov.clone())
        .create(
            &pp,
            &from(json!({ "metadata": {
                "name": OLD,
                "labels": { labels::TENANT: "consumer-1" },
                // What its consumer says it needs there, for its share.
                "annotations": { DEMAND_ANNOTATION: r#"{"cpu":"1m","memory":"1Mi","pods":"1"}"# },
            } })),
        )
        .await?;
    let quotas: Api<ResourceQuota> = Api::namespaced(prov.clone(), OLD);
    wait_for("the old twin's share to hold a pod", WAIT, || async {
        Ok(quotas.get_opt(SHARE_QUOTA).await?.is_some_and(|q| {
            q.status
                .and_then(|s| s.hard)
                .and_then(|h| h.get("pods").cloned())
                .is_some_and(|p| p.0 != "0")
        }))
    })
    .await?;
    Api::<Pod>::namespaced(prov.clone(), OLD)
        .create(
            &pp,
            &pod("old-root", |p| {
                p["spec"]["securityContext"] = json!({ "runAsUser": 0 });
            }),
        )
        .await?;
    let out = liqo_e2e::install(provider, "provider-1", "10.202.0.0/16", &[]).success();
    assert!(
        out.stderr.contains("old-twin/old-root") && out.stderr.contains("keeps running"),
        "install reports the pod the rules would refuse: {}",
        out.stderr
    );
    let ns = Api::<Namespace>::all(prov.clone()).get(OLD).await?;
    assert_eq!(
        ns.metadata.labels.unwrap_or_default()["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    let kept = Api::<Pod>::namespaced(prov.clone(), OLD)
        .get("old-root")
        .await?;
    assert!(
        kept.metadata.deletion_timestamp.is_none(),
        "the pod was not disturbed"
    );
    Ok(())
}
