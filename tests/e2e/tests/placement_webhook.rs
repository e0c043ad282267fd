//! Placement on a consumer without MutatingAdmissionPolicy (off by
//! default in 1.34, so most clusters): `liqoctl install` makes the
//! placement webhook instead (its certificate in a Secret, a Service in
//! front of every virtual kubelet, a MutatingWebhookConfiguration), and
//! the virtual kubelets serve it. The unmodified scheduler then binds a
//! plain pod of a `Remote` namespace to the virtual node its selector
//! matches, where it runs on the provider; a `LocalAndRemote` pod whose
//! selector matches no provider tolerates the virtual nodes but is bound
//! to a local node; a pod of a namespace that is not offloaded is never
//! touched. Installing again keeps the certificate. An agent that cannot
//! load the certificate is not ready until it can. (The testbed's pod
//! IPs are loopback addresses, which endpoints refuse: the agent serves
//! the webhook at this machine's own address, and the Service's endpoints
//! are written to say so, as `kubelet_api.rs` moves the kubelet API.)

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Pod, Secret, Service};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::names::{self, peering};
use liqo_e2e::fixture::{One, Pair, Stage, WAIT, spec};
use liqo_e2e::{liqoctl, wait_for};
use liqo_testbed::ClusterSpec;
use serde_json::json;

fn pod(name: &str) -> Pod {
    serde_json::from_value(liqo_e2e::restricted(json!({
        "metadata": { "name": name },
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{ "name": "c", "image": "busybox" }],
        },
    })))
    .expect("pod")
}

/// Creates a pod, retrying while the virtual kubelets have not seen the
/// namespace's offloading yet (they refuse its pods until then).
async fn create(pods: &Api<Pod>, pod: &Pod) -> Result<Pod> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match pods.create(&PostParams::default(), pod).await {
            Err(kube::Error::Api(s))
                if s.message.contains("not known yet") && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return Ok(other?),
        }
    }
}

fn tolerates_virtual_nodes(p: &Pod) -> bool {
    p.spec
        .iter()
        .flat_map(|s| s.tolerations.iter().flatten())
        .any(|t| t.key.as_deref() == Some(names::VIRTUAL_NODE_TAINT))
}

async fn bound_to(pods: &Api<Pod>, name: &str) -> Result<String> {
    wait_for(&format!("pod {name} to be bound"), WAIT, || async {
        Ok(pods
            .get(name)
            .await?
            .spec
            .and_then(|s| s.node_name)
            .is_some())
    })
    .await?;
    pods.get(name)
        .await?
        .spec
        .and_then(|s| s.node_name)
        .context("bound")
}

async fn placement_ca(client: &kube::Client) -> Result<Option<String>> {
    let secret = Api::<Secret>::namespaced(client.clone(), names::NAMESPACE)
        .get_opt("liqo-placement-tls")
        .await?;
    Ok(secret
        .and_then(|s| s.data)
        .and_then(|d| d.get("ca.crt").cloned())
        .map(|b| String::from_utf8_lossy(&b.0).into_owned()))
}

/// A consumer whose API server does not serve MutatingAdmissionPolicy.
fn consumer_without_policies() -> ClusterSpec {
    let mut consumer = spec("consumer", 1, 1);
    consumer.without_mutating_admission_policy = true;
    consumer
}

/// The consumer without MutatingAdmissionPolicy peered with a provider;
/// the name of its virtual node.
async fn peered() -> Result<(Pair, String)> {
    let pair = Pair::with_specs(
        consumer_without_policies(),
        spec("provider", 2, 1),
        Stage::Peered,
    )
    .await?;
    Ok((pair, peering::virtual_node(&ClusterId::new("provider-1")?)))
}

/// `liqoctl install` on a cluster without MutatingAdmissionPolicy makes
/// the placement webhook, its certificate in a Secret, and keeps that
/// certificate when run again; a dry run prints a webhook whose CA was
/// made for that print until one is installed.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_makes_the_placement_webhook_and_keeps_its_certificate() -> Result<()> {
    let consumer = One::start(consumer_without_policies()).await?;
    let (cluster, local) = (consumer.cluster(), consumer.client.clone());
    // Nothing installed yet: a dry run prints a webhook whose CA was made
    // for that print (its key is never printed), and says so.
    let throwaway = "made for this print only";
    let dry = liqoctl(Some(cluster.kubeconfig_path()), &["install", "--dry-run"]).success();
    assert!(dry.stdout.contains("caBundle"), "{}", dry.stdout);
    assert!(dry.stderr.contains(throwaway), "{}", dry.stderr);
    let out = liqo_e2e::install(cluster, "consumer-1", "10.201.0.0/16", &[]).success();
    assert!(
        out.stdout.contains("with a webhook instead")
            || out.stderr.contains("with a webhook instead"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    let hooks = Api::<MutatingWebhookConfiguration>::all(local.clone())
        .get("liqo-placement")
        .await?;
    assert_eq!(hooks.webhooks.as_ref().map(Vec::len), Some(2));
    let ca = placement_ca(&local)
        .await?
        .context("no placement certificate")?;
    assert!(ca.contains("BEGIN CERTIFICATE"));
    // Installed: a dry run prints the CA the Secret holds, and no note.
    let dry = liqoctl(Some(cluster.kubeconfig_path()), &["install", "--dry-run"]).success();
    assert!(!dry.stderr.contains(throwaway), "{}", dry.stderr);
    // Installing again keeps the certificate the webhook trusts.
    liqo_e2e::install(cluster, "consumer-1", "10.201.0.0/16", &[]).success();
    assert_eq!(placement_ca(&local).await?, Some(ca));
    Ok(())
}

/// The testbed's pod IPs are loopback addresses, which EndpointSlices
/// refuse (docs/testbed.md): the agent of provider-1 on the consumer
/// (`local`) serves the webhook at this machine's own address instead
/// (local delivery, nothing leaves the host), and the Service's endpoints
/// say so, as a cluster's endpoint controller would say the pod's.
async fn serve_the_webhook_at_the_hosts_address(local: &kube::Client) -> Result<()> {
    let host_ip = liqo_e2e::host_address()?;
    let port = std::net::TcpListener::bind((host_ip.as_str(), 0))?
        .local_addr()?
        .port();
    liqo_e2e::set_agent_args(
        local,
        "provider-1",
        |a| {
            if a.starts_with("--placement-addr=") {
                format!("--placement-addr={host_ip}:{port}")
            } else {
                a
            }
        },
        &[],
    )
    .await?;
    let services: Api<Service> = Api::namespaced(local.clone(), names::NAMESPACE);
    let patch = json!([
        { "op": "remove", "path": "/spec/selector" },
        { "op": "replace", "path": "/spec/ports/0/targetPort", "value": port },
    ]);
    services
        .patch(
            "liqo-placement",
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(patch)?),
        )
        .await?;
    Api::<Endpoints>::namespaced(local.clone(), names::NAMESPACE)
        .patch(
            "liqo-placement",
            &PatchParams::apply("placement-test").force(),
            &Patch::Apply(json!({
                "apiVersion": "v1",
                "kind": "Endpoints",
                "metadata": { "name": "liqo-placement" },
                "subsets": [{
                    "addresses": [{ "ip": host_ip }],
                    "ports": [{ "name": "webhook", "port": port }],
                }],
            })),
        )
        .await?;
    wait_for(
        "the agent to listen at the host's address",
        WAIT,
        || async { Ok(std::net::TcpStream::connect((host_ip.as_str(), port)).is_ok()) },
    )
    .await
}

/// The unmodified scheduler, with the virtual kubelets' webhook, binds a
/// plain pod of a `Remote` namespace to the virtual node its selector
/// matches, where it runs on the provider; a `LocalAndRemote` pod whose
/// selector matches no provider tolerates the virtual nodes but is bound
/// to a local node; a pod of a namespace that is not offloaded is never
/// touched.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_places_offloaded_pods_and_leaves_the_others_alone() -> Result<()> {
    let (pair, virtual_node) = peered().await?;
    let (consumer, local) = (pair.consumer(), pair.consumer_client.clone());
    serve_the_webhook_at_the_hosts_address(&local).await?;

    let pp = PostParams::default();
    for ns in ["shop", "both", "private"] {
        Api::<Namespace>::all(local.clone())
            .create(
                &pp,
                &serde_json::from_value(json!({ "metadata": { "name": ns } }))?,
            )
            .await?;
    }
    pair.on_consumer(&[
        "offload",
        "namespace",
        "shop",
        "--pod-offloading-strategy=Remote",
        "--selector=liqo.io/remote-cluster-id=provider-1",
        "--wait",
        "--timeout=60",
    ])
    .success();
    pair.on_consumer(&[
        "offload",
        "namespace",
        "both",
        "--pod-offloading-strategy=LocalAndRemote",
        "--selector=liqo.io/remote-cluster-id=nobody",
    ])
    .success();

    // Remote: the toleration, the node selector and the selector's
    // affinity; bound to the virtual node and Running on the provider.
    let shop: Api<Pod> = Api::namespaced(local.clone(), "shop");
    let created = create(&shop, &pod("web")).await?;
    assert!(tolerates_virtual_nodes(&created), "{created:?}");
    let spec = serde_json::to_value(&created.spec)?;
    assert_eq!(spec["nodeSelector"][names::labels::VIRTUAL_NODE], "true");
    let affinity = spec["affinity"].to_string();
    assert!(affinity.contains("provider-1"), "{affinity}");
    assert_eq!(bound_to(&shop, "web").await?, virtual_node);
    let waited = wait_for("the offloaded pod to run", WAIT, || async {
        let p = shop.get("web").await?;
        Ok(p.status.and_then(|s| s.phase).as_deref() == Some("Running"))
    })
    .await;
    if waited.is_err() {
        eprintln!("--- consumer agents ---\n{}", consumer.pod_logs());
    }
    waited?;

    // LocalAndRemote with a selector that matches no provider: it
    // tolerates the virtual nodes, but only a local node is allowed.
    let both: Api<Pod> = Api::namespaced(local.clone(), "both");
    let created = create(&both, &pod("job")).await?;
    assert!(tolerates_virtual_nodes(&created), "{created:?}");
    assert!(
        serde_json::to_string(&created.spec)?.contains("DoesNotExist"),
        "{created:?}"
    );
    assert_ne!(bound_to(&both, "job").await?, virtual_node);

    // Not offloaded: never touched.
    let private: Api<Pod> = Api::namespaced(local.clone(), "private");
    let created = private.create(&pp, &pod("db")).await?;
    assert!(!tolerates_virtual_nodes(&created), "{created:?}");
    assert_ne!(bound_to(&private, "db").await?, virtual_node);
    Ok(())
}

/// A virtual kubelet is ready only once its webhook can answer: started
/// while the certificate cannot be loaded, it runs unready (so no
/// endpoint of the Service, and no admission sent to it), and is ready
/// once it can.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_kubelet_is_ready_only_once_its_webhook_can_answer() -> Result<()> {
    let (pair, _) = peered().await?;
    let local = pair.consumer_client.clone();
    let secrets: Api<Secret> = Api::namespaced(local.clone(), names::NAMESPACE);
    let good = secrets
        .get("liqo-placement-tls")
        .await?
        .data
        .and_then(|d| d.get("tls.crt").cloned())
        .context("tls.crt")?;
    let set_certificate = |data: serde_json::Value| {
        let secrets = secrets.clone();
        async move {
            secrets
                .patch(
                    "liqo-placement-tls",
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "data": { "tls.crt": data } })),
                )
                .await
        }
    };
    set_certificate(serde_json::to_value(ByteString(
        b"not a certificate".to_vec(),
    ))?)
    .await?;
    let old_agent = agent_pod(&local)
        .await?
        .context("no virtual kubelet pod")?
        .metadata
        .name;
    Api::<Deployment>::namespaced(local.clone(), names::NAMESPACE)
        .patch(
            &peering::virtual_kubelet(&ClusterId::new("provider-1")?),
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "template": { "metadata": {
                "annotations": { "test.liqo.io/restarted": "broken-certificate" },
            } } } })),
        )
        .await?;
    // Recreated: for a moment there is none.
    wait_for("the agent to run again", WAIT, || async {
        Ok(agent_pod(&local).await?.is_some_and(|p| {
            p.metadata.name != old_agent
                && p.status.and_then(|s| s.phase).as_deref() == Some("Running")
        }))
    })
    .await?;
    // Time enough for everything else readiness waits for (the node
    // registered, the peers listed: about a second) and for a few reads
    // of the Secret.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let unready = agent_pod(&local).await?.context("no virtual kubelet pod")?;
    assert_eq!(ready(&unready), Some(false), "{:?}", unready.status);
    set_certificate(serde_json::to_value(good)?).await?;
    wait_for("the agent to be ready", WAIT, || async {
        Ok(agent_pod(&local)
            .await?
            .is_some_and(|p| ready(&p) == Some(true)))
    })
    .await?;
    Ok(())
}

/// The consumer's only virtual kubelet pod (the newest while two exist).
async fn agent_pod(client: &kube::Client) -> Result<Option<Pod>> {
    let pods = Api::<Pod>::namespaced(client.clone(), names::NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/name=liqo-virtual-kubelet"))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .max_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0)))
}

/// A pod's Ready condition, when it has one.
fn ready(pod: &Pod) -> Option<bool> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status == "True")
}
