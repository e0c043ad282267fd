//! The placement policy keeps a pod off a virtual node whose provider's
//! Pod Security level it does not meet: in a namespace offloaded
//! `LocalAndRemote`, such a pod runs at home, or stays unbound with the
//! scheduler's reason where it may go nowhere else, rather than being
//! bound to the virtual node and refused there. The levels a pod meets
//! are computed by the API server in CEL (the policy) and by
//! `liqo_api::pod_security` in Rust (the webhook and the virtual kubelet):
//! both are compared on pods of every kind of check.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, PostParams};
use liqo_api::names::{labels, peering};
use liqo_e2e::fixture::{PROVIDER_ID, Pair, Stage, WAIT};
use liqo_e2e::wait_for;
use serde_json::{Value, json};

use crate::placement::create;

const NS: &str = "mixed";

/// A pod of the namespace, from `spec` (a container `c` added).
fn pod(name: &str, mut spec: Value, annotations: Value) -> Result<Pod> {
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{ "name": "c", "image": "busybox" }]);
    }
    spec["terminationGracePeriodSeconds"] = json!(0);
    Ok(serde_json::from_value(json!({
        "metadata": { "name": name, "annotations": annotations },
        "spec": spec,
    }))?)
}

/// `pod`, made to pass restricted.
fn restricted(name: &str) -> Result<Pod> {
    Ok(serde_json::from_value(liqo_e2e::restricted(
        serde_json::to_value(pod(name, json!({}), json!({}))?)?,
    ))?)
}

/// The levels the placement policy wrote into the pod's affinity.
fn levels_written(p: &Pod) -> Option<Vec<String>> {
    let terms = &p
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .find(|r| r.key == labels::POD_SECURITY)
        .and_then(|r| r.values.clone())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_below_its_providers_level_is_kept_off_the_virtual_node() -> Result<()> {
    let pair = Pair::at(Stage::Peered).await?;
    let client = &pair.consumer_client;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": NS } }))?,
        )
        .await?;
    pair.on_consumer(&["offload", "namespace", NS, "--wait", "--timeout=60"])
        .success();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);

    // The API server's CEL and the Rust checks agree on every kind of check.
    let host_path = json!([{ "name": "h", "hostPath": { "path": "/" } }]);
    let nfs = json!([{ "name": "n", "nfs": { "server": "192.0.2.1", "path": "/" } }]);
    let cases: Vec<(&str, Pod)> = vec![
        ("bare", pod("bare", json!({}), json!({}))?),
        ("restricted", restricted("hardened")?),
        (
            "host network",
            pod("hostnet", json!({ "hostNetwork": true }), json!({}))?,
        ),
        (
            "host PID",
            pod("hostpid", json!({ "hostPID": true }), json!({}))?,
        ),
        (
            "host path",
            pod("hostpath", json!({ "volumes": host_path }), json!({}))?,
        ),
        ("NFS", pod("nfs", json!({ "volumes": nfs }), json!({}))?),
        (
            "privileged",
            pod(
                "privileged",
                json!({ "containers": [{ "name": "c", "image": "busybox",
            "securityContext": { "privileged": true } }] }),
                json!({}),
            )?,
        ),
        (
            "NET_RAW",
            pod(
                "netraw",
                json!({ "containers": [{ "name": "c", "image": "busybox",
            "securityContext": { "capabilities": { "add": ["NET_RAW"] } } }] }),
                json!({}),
            )?,
        ),
        (
            "CHOWN",
            pod(
                "chown",
                json!({ "containers": [{ "name": "c", "image": "busybox",
            "securityContext": { "capabilities": { "add": ["CHOWN"] } } }] }),
                json!({}),
            )?,
        ),
        (
            "host port",
            pod(
                "hostport",
                json!({ "containers": [{ "name": "c", "image": "busybox",
            "ports": [{ "containerPort": 80, "hostPort": 8080 }] }] }),
                json!({}),
            )?,
        ),
        (
            "seccomp unconfined",
            pod(
                "unconfined",
                json!({ "securityContext": {
            "seccompProfile": { "type": "Unconfined" } } }),
                json!({}),
            )?,
        ),
        (
            "AppArmor unconfined",
            pod(
                "apparmor",
                json!({}),
                json!({
            "container.apparmor.security.beta.kubernetes.io/c": "unconfined" }),
            )?,
        ),
        (
            "an SELinux user",
            pod(
                "selinux",
                json!({ "securityContext": {
            "seLinuxOptions": { "user": "system_u" } } }),
                json!({}),
            )?,
        ),
        (
            "an unsafe sysctl",
            pod(
                "sysctl",
                json!({ "securityContext": {
            "sysctls": [{ "name": "kernel.msgmax", "value": "1" }] } }),
                json!({}),
            )?,
        ),
        (
            "a probe of another host",
            pod(
                "probe",
                json!({ "containers": [{ "name": "c", "image": "busybox",
            "livenessProbe": { "tcpSocket": { "port": 80, "host": "192.0.2.1" } } }] }),
                json!({}),
            )?,
        ),
        ("restricted but root", {
            let mut p = restricted("root")?;
            if let Some(sc) = p.spec.as_mut().and_then(|s| s.security_context.as_mut()) {
                sc.run_as_user = Some(0);
                sc.run_as_non_root = None;
            }
            p
        }),
    ];
    for (what, p) in &cases {
        let stored = create(&pods, p).await.with_context(|| what.to_string())?;
        let rust: Vec<String> = liqo_api::capacity::levels_met(&stored)
            .into_iter()
            .map(|l| l.as_str().to_owned())
            .collect();
        assert_eq!(levels_written(&stored), Some(rust), "{what}");
    }

    // The provider holds this cluster to restricted; its virtual node says so.
    pair.on_provider(&["sharing-policy", "set", "--pod-security=restricted"])
        .success();
    let nodes: Api<Node> = Api::all(client.clone());
    let vnode = peering::virtual_node(&liqo_api::ClusterId::new(PROVIDER_ID)?);
    wait_for("the virtual node to say restricted", WAIT, || async {
        let n = nodes.get(&vnode).await?;
        Ok(n.metadata
            .labels
            .unwrap_or_default()
            .get(labels::POD_SECURITY)
            .map(String::as_str)
            == Some("restricted"))
    })
    .await?;
    let on_virtual = |mut p: Pod| {
        if let Some(spec) = p.spec.as_mut() {
            spec.node_selector =
                Some([(labels::VIRTUAL_NODE.to_owned(), "true".to_owned())].into());
        }
        p
    };
    // Meets it: bound to the virtual node. Does not: at home, or, when it
    // may go nowhere else, unbound with the scheduler's reason.
    create(&pods, &on_virtual(restricted("fits")?)).await?;
    create(&pods, &pod("at-home", json!({}), json!({}))?).await?;
    create(&pods, &on_virtual(pod("nowhere", json!({}), json!({}))?)).await?;
    let node_of = |name: &'static str| {
        let pods = pods.clone();
        async move { Ok::<_, anyhow::Error>(pods.get(name).await?.spec.and_then(|s| s.node_name)) }
    };
    wait_for("fits and at-home to be bound", WAIT, || async {
        Ok(node_of("fits").await?.is_some() && node_of("at-home").await?.is_some())
    })
    .await?;
    assert_eq!(node_of("fits").await?.as_deref(), Some(vnode.as_str()));
    assert_ne!(node_of("at-home").await?.as_deref(), Some(vnode.as_str()));
    wait_for("nowhere to be unschedulable", WAIT, || async {
        let p = pods.get("nowhere").await?;
        Ok(p.status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .any(|c| {
                c.type_ == "PodScheduled"
                    && c.reason.as_deref() == Some("Unschedulable")
                    && c.message.as_deref().is_some_and(|m| m.contains("affinity"))
            }))
    })
    .await?;
    assert_eq!(node_of("nowhere").await?, None);
    Ok(())
}
