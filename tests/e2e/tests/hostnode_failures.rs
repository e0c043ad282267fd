//! The host-process node fails where a kubelet fails: other images do not
//! pull, pods that do not tolerate its taint do not land on it, a missing
//! Secret stops a container, a grpc probe never passes; and it does what
//! it says. Run by [`super::hostnode`]'s test, on its cluster, with its
//! helpers.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::api::{Api, DeleteParams};
use liqo_e2e::fixture::pod::{phase, ready};
use liqo_e2e::wait_for;
use liqo_testbed::Cluster;
use serde_json::json;

use crate::hostnode::{
    AGENT_IMAGE, container, create, events, http_get, on_host_node, pid, pod_ip, wait_pod,
    waiting_reason,
};

/// The host node fails where a kubelet fails, and does what it says.
pub(crate) async fn fails_like_a_kubelet(cluster: &Cluster) -> Result<()> {
    const HONEST: &str = "honest";
    let client = cluster.client().await?;
    create(
        &Api::<Namespace>::all(client.clone()),
        json!({ "metadata": { "name": HONEST } }),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), HONEST);
    let agent = |name: &str, extra: serde_json::Value| {
        let mut container = json!({
            "name": "agent",
            "image": format!("{AGENT_IMAGE}:1"),
            "env": [
                { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                { "name": "GATE", "value": "/" },
            ],
        });
        for (key, value) in extra.as_object().into_iter().flatten() {
            container[key] = value.clone();
        }
        let mut spec = on_host_node();
        spec["terminationGracePeriodSeconds"] = json!(2);
        spec["containers"] = json!([container]);
        json!({ "metadata": { "name": name }, "spec": spec })
    };

    // An image that is not on the allow-list does not pull: ErrImagePull,
    // then ImagePullBackOff, Pending, never Ready, no process.
    let mut web_spec = on_host_node();
    web_spec["containers"] = json!([{ "name": "web", "image": "nginx:1.27" }]);
    create(
        &pods,
        json!({ "metadata": { "name": "web" }, "spec": web_spec }),
    )
    .await?;
    let web = wait_pod(&pods, "web", "nginx to back off pulling", |p| {
        waiting_reason(p).is_some_and(|(r, _)| r == "ImagePullBackOff")
    })
    .await?;
    let (_, message) = waiting_reason(&web).context("not waiting")?;
    assert!(
        message.contains("not on the host-process node's allow-list"),
        "{message}"
    );
    assert_eq!(phase(&web), Some("Pending"));
    assert!(!ready(&web));
    assert_eq!(container(&web).and_then(pid), None, "no process for nginx");
    let told = events(&client, HONEST, "web").await?;
    assert!(
        told.iter()
            .any(|e| e.starts_with("Failed: Failed to pull image \"nginx:1.27\"")),
        "no ErrImagePull event: {told:?}"
    );

    // A pod that does not tolerate the taint does not land on the host
    // node: pinned there, it stays Pending; free, it goes to a kwok node.
    let mut untolerated = on_host_node();
    untolerated
        .as_object_mut()
        .context("spec")?
        .remove("tolerations");
    untolerated["containers"] = json!([{ "name": "agent", "image": format!("{AGENT_IMAGE}:1") }]);
    create(
        &pods,
        json!({ "metadata": { "name": "untolerated" }, "spec": untolerated }),
    )
    .await?;
    create(
        &pods,
        json!({ "metadata": { "name": "anywhere" }, "spec": {
            "containers": [{ "name": "agent", "image": format!("{AGENT_IMAGE}:1") }],
        }}),
    )
    .await?;
    let unscheduled = wait_pod(&pods, "untolerated", "the scheduler to refuse it", |p| {
        (p.status.as_ref().and_then(|s| s.conditions.as_ref())).is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
        })
    })
    .await?;
    assert_eq!(unscheduled.spec.and_then(|s| s.node_name), None);
    let anywhere = wait_pod(&pods, "anywhere", "the free pod to be scheduled", |p| {
        p.spec.as_ref().is_some_and(|s| s.node_name.is_some())
    })
    .await?;
    let node = anywhere.spec.and_then(|s| s.node_name).context("no node")?;
    assert_eq!(
        node,
        format!("{}-worker-0", cluster.name()),
        "not on a kwok node"
    );

    // Exec probes run: `false` keeps the container unready (and says so),
    // whereas it runs; a grpc probe is refused loudly.
    let readiness = |probe: serde_json::Value| {
        json!({ "readinessProbe": {
            "exec": { "command": probe }, "periodSeconds": 1, "failureThreshold": 1,
        }})
    };
    create(&pods, agent("exec-false", readiness(json!(["false"])))).await?;
    create(
        &pods,
        agent(
            "grpc",
            json!({ "readinessProbe": { "grpc": { "port": 8080 }, "periodSeconds": 1 } }),
        ),
    )
    .await?;

    // Secret and ConfigMap volumes are files at their mount paths, for the
    // process only; updates show; the service-account volume is there too.
    let mount_root = PathBuf::from(format!("/run/liqo-hostnode-test-{}", std::process::id()));
    ensure!(!mount_root.exists(), "{} exists", mount_root.display());
    let at = |sub: &str| mount_root.join(sub).display().to_string();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), HONEST);
    create(
        &secrets,
        json!({ "metadata": { "name": "files" }, "stringData": { "word": "swordfish", "other": "x" } }),
    )
    .await?;
    create(
        &Api::<ConfigMap>::namespaced(client.clone(), HONEST),
        json!({ "metadata": { "name": "files" }, "data": { "greeting": "hello", "farewell": "bye" } }),
    )
    .await?;
    let token = "/var/run/secrets/kubernetes.io/serviceaccount";
    let check = format!(
        "test \"$(cat {})\" = hello && test -s {token}/token && test \"$(cat {token}/namespace)\" = {HONEST}",
        at("config/greeting")
    );
    let mut volumes = agent(
        "volumes",
        json!({
            "env": [
                { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                { "name": "GATE", "value": "/" },
                { "name": "SERVE_DIR", "value": at("") },
            ],
            "volumeMounts": [
                { "name": "secret", "mountPath": at("secret"), "readOnly": true },
                { "name": "config", "mountPath": at("config") },
            ],
            "readinessProbe": {
                "exec": { "command": ["sh", "-c", check] }, "periodSeconds": 1, "failureThreshold": 1,
            },
        }),
    );
    volumes["spec"]["volumes"] = json!([
        { "name": "secret", "secret": {
            "secretName": "files", "items": [{ "key": "word", "path": "dir/word", "mode": 0o600 }],
        }},
        { "name": "config", "configMap": { "name": "files" } },
    ]);
    create(&pods, volumes).await?;

    // A Secret that is missing stops the container, unless optional.
    let mut no_secret = agent("no-secret", json!({}));
    no_secret["spec"]["volumes"] = json!([{ "name": "s", "secret": { "secretName": "nope" } }]);
    create(&pods, no_secret).await?;
    // Init containers are refused, not skipped.
    let mut init = agent("init", json!({}));
    init["spec"]["initContainers"] =
        json!([{ "name": "init", "image": format!("{AGENT_IMAGE}:1") }]);
    create(&pods, init).await?;

    let volumes = wait_pod(&pods, "volumes", "the volumes pod to be Ready", ready).await?;
    let ip = pod_ip(&volumes).context("no pod IP")?.to_owned();
    // Ready by its exec probe, which does not wait for the server.
    wait_for("the volumes pod's server", Duration::from_secs(10), || {
        let ip = ip.clone();
        async move { Ok(std::net::TcpStream::connect((ip.as_str(), 8080)).is_ok()) }
    })
    .await?;
    assert_eq!(http_get(&ip, "/secret/dir/word")?, "swordfish");
    assert_eq!(http_get(&ip, "/config/farewell")?, "bye");
    assert!(
        http_get(&ip, "/secret/other").is_err(),
        "items choose the keys"
    );
    for sub in ["secret", "config"] {
        let seen = std::fs::read_dir(mount_root.join(sub))?.count();
        assert_eq!(seen, 0, "the host sees the mount on {sub}");
    }
    let updated = Instant::now();
    secrets
        .patch(
            "files",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({ "stringData": { "word": "marlin" } })),
        )
        .await?;
    wait_for(
        "the updated secret in the file",
        Duration::from_secs(10),
        || {
            let ip = ip.clone();
            async move { Ok(http_get(&ip, "/secret/dir/word").is_ok_and(|w| w == "marlin")) }
        },
    )
    .await?;
    eprintln!(
        "secret update seen in {:.1}s",
        updated.elapsed().as_secs_f64()
    );

    let no_secret = wait_pod(&pods, "no-secret", "the missing secret to stop it", |p| {
        waiting_reason(p).is_some_and(|(r, _)| r == "CreateContainerConfigError")
    })
    .await?;
    let (_, message) = waiting_reason(&no_secret).context("not waiting")?;
    assert!(message.contains("nope"), "{message}");
    let init = wait_pod(&pods, "init", "init containers to be refused", |p| {
        waiting_reason(p).is_some_and(|(r, _)| r == "CreateContainerConfigError")
    })
    .await?;
    let (_, message) = waiting_reason(&init).context("not waiting")?;
    assert!(message.contains("init containers"), "{message}");

    // By now the unready ones have had many probes.
    for name in ["exec-false", "grpc"] {
        let pod = pods.get(name).await?;
        assert!(
            container(&pod).and_then(pid).is_some(),
            "{name} does not run"
        );
        assert!(!ready(&pod), "{name} is Ready");
    }
    let told = events(&client, HONEST, "exec-false").await?;
    assert!(
        told.iter().any(|e| e.starts_with("Unhealthy: Readiness probe failed: command [\"false\"] exited")),
        "no probe failure event: {told:?}"
    );
    let grpc = pods.get("grpc").await?;
    let ready = (grpc.status.as_ref().and_then(|s| s.conditions.as_ref()))
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .context("no Ready condition")?;
    let message = ready.message.as_deref().unwrap_or_default();
    assert!(
        message.contains("grpc probes are not supported on the host-process node"),
        "{message}"
    );

    // Gone with its pods: the namespace, and the mount points made for them.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.delete(HONEST, &DeleteParams::default()).await?;
    wait_for(
        "the honest namespace to be gone",
        Duration::from_secs(60),
        || {
            let namespaces = namespaces.clone();
            async move { Ok(namespaces.get_opt(HONEST).await?.is_none()) }
        },
    )
    .await?;
    wait_for(
        "the mount points to be removed",
        Duration::from_secs(10),
        || {
            let gone = !mount_root.exists();
            async move { Ok(gone) }
        },
    )
    .await?;
    Ok(())
}
