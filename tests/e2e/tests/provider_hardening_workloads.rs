//! What `consumer-1` may run and touch in its twin namespace on its
//! provider under the default terms (`restricted`, nothing else), proven
//! with its own credential straight against the provider's API server (see
//! `provider_hardening`): pods, pod templates, Services, EndpointSlices
//! and everything else the tenant may touch. Each refusal is paired with
//! the allowed form of the same request, and names the rule that made it.

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use liqo_api::authentication::Tenant;
use liqo_api::networking::Connection;
use serde_json::{Value, json};

use crate::provider_hardening::{
    PODS, PSA, RBAC, SECRETS, SERVICES, SLICES, T1, Tally, WORKLOADS, consumer_one_with_twin, from,
    pod, service,
};

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

fn slice(name: &str, address_type: &str, endpoints: Value) -> EndpointSlice {
    from(json!({
        "metadata": { "name": name, "labels": { "kubernetes.io/service-name": "web" } },
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": [{ "port": 80, "protocol": "TCP" }],
    }))
}

/// Pods at `restricted`: each escape, then the pod that is fine.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_runs_only_the_pods_its_restricted_terms_admit() -> Result<()> {
    let mut t = Tally::default();
    let (_pair, one) = consumer_one_with_twin(&mut t).await?;
    let pp = PostParams::default();

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
    t.refused_pods(&pods, escapes).await;
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
    t.at_least(19, 4);
    Ok(())
}

/// Pod templates: refused at once, not pod by pod.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_create_workloads_whose_pod_templates_its_terms_refuse() -> Result<()> {
    let mut t = Tally::default();
    let (_pair, one) = consumer_one_with_twin(&mut t).await?;
    let pp = PostParams::default();

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
    t.at_least(3, 4);
    Ok(())
}

/// Services: never external IPs; NodePort and LoadBalancer only where its
/// terms allow them (not for consumer-1).
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_services_get_no_external_ips_node_ports_or_load_balancers() -> Result<()> {
    let mut t = Tally::default();
    let (_pair, one) = consumer_one_with_twin(&mut t).await?;
    let pp = PostParams::default();

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
    t.at_least(4, 3);
    Ok(())
}

/// EndpointSlices: only its own pods, where the provider sees them (its
/// end of the tunnel says where).
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_endpoint_slices_hold_only_its_own_pods_addresses() -> Result<()> {
    let mut t = Tally::default();
    let (pair, one) = consumer_one_with_twin(&mut t).await?;
    let prov = pair.provider_client.clone();
    let pp = PostParams::default();

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
    t.at_least(6, 3);
    Ok(())
}

/// Everything else the tenant may touch: no tokens of the provider's, no
/// ServiceAccounts, Events or pods outside its twins, no looser terms.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_mint_tokens_forge_events_or_loosen_its_own_terms() -> Result<()> {
    let mut t = Tally::default();
    let (_pair, one) = consumer_one_with_twin(&mut t).await?;
    let pp = PostParams::default();

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
    t.at_least(6, 7);
    Ok(())
}
