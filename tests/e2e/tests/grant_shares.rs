//! The grant across twin namespaces, enforced by the provider's own API
//! server: the provider's gateway splits each tenant's grant into one
//! ResourceQuota `liqo-share` per namespace the tenant may run pods in
//! (its tenant namespace and its twins), as the consumer's virtual
//! kubelet states each twin's demand, and the hards never add up to more
//! than the grant. Proven with the consumer's own credential creating
//! pods straight in its twins (as a consumer that bypasses its virtual
//! kubelet would): what it gets across all its namespaces stays within
//! the grant. A twin without a share yet (the gateway stopped) admits no
//! pod (the admission policy `liqo-twin-share`).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::names::{self, labels, peering};
use liqo_api::shares::{DEMAND_ANNOTATION, SHARE_QUOTA};
use liqo_e2e::fixture::WAIT;
use liqo_e2e::fixture::{CONSUMER_ID, Pair, Stage};
use liqo_e2e::wait_for;
use serde_json::json;

/// The grant: pods are what this test counts.
const GRANT_PODS: u64 = 6;

fn deployment(ns: &str, replicas: i32) -> Result<Deployment> {
    Ok(serde_json::from_value(liqo_e2e::restricted(json!({
        "metadata": { "name": "web", "namespace": ns },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": {
                    "nodeSelector": liqo_e2e::virtual_node_selector(),
                    "tolerations": liqo_e2e::virtual_node_tolerations(),
                    "terminationGracePeriodSeconds": 0,
                    // No requests: the quota would refuse such a pod, so
                    // the virtual kubelet states zero.
                    "containers": [{ "name": "web", "image": "nginx" }],
                },
            },
        },
    })))?)
}

/// A pod as a consumer bypassing its virtual kubelet would make it.
fn direct_pod(name: &str) -> Result<Pod> {
    Ok(serde_json::from_value(liqo_e2e::restricted(json!({
        "metadata": { "name": name },
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "c",
                "image": "nginx",
                "resources": { "requests": { "cpu": "1m", "memory": "1Mi" } },
            }],
        },
    })))?)
}

/// Every share on the provider: namespace → (hard pods, used pods).
async fn shares(prov: &kube::Client) -> Result<BTreeMap<String, (u64, Option<u64>)>> {
    let quotas = Api::<ResourceQuota>::all(prov.clone())
        .list(&ListParams::default().fields(&format!("metadata.name={SHARE_QUOTA}")))
        .await?;
    Ok(quotas
        .items
        .into_iter()
        .map(|q| {
            let ns = q.metadata.namespace.clone().unwrap_or_default();
            let hard = q
                .spec
                .as_ref()
                .and_then(|s| s.hard.as_ref())
                .and_then(|h| h.get("pods"))
                .and_then(|p| p.0.parse().ok())
                .unwrap_or(0);
            let used = q
                .status
                .as_ref()
                .and_then(|s| s.used.as_ref())
                .and_then(|u| u.get("pods"))
                .and_then(|p| p.0.parse().ok());
            (ns, (hard, used))
        })
        .collect())
}

/// Pods that count against the grant in `namespaces` (not ended).
async fn pods_held(prov: &kube::Client, namespaces: &[&str]) -> Result<usize> {
    let mut n = 0;
    for ns in namespaces {
        n += Api::<Pod>::namespaced(prov.clone(), ns)
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                !matches!(phase, Some("Succeeded" | "Failed"))
            })
            .count();
    }
    Ok(n)
}

/// The shares, checked to add up to at most the grant.
async fn checked_shares(prov: &kube::Client) -> Result<BTreeMap<String, (u64, Option<u64>)>> {
    let s = shares(prov).await?;
    let sum: u64 = s.values().map(|(h, _)| h).sum();
    assert!(sum <= GRANT_PODS, "the shares add up to {sum} pods: {s:?}");
    Ok(s)
}

/// The pair, peered with a grant of [`GRANT_PODS`] pods, its virtual node
/// Ready.
async fn granted() -> Result<Pair> {
    let pair = Pair::at(Stage::Installed).await?;
    let remote = pair.remote();
    pair.on_consumer(&[
        "peer",
        "--remote-kubeconfig",
        &remote,
        "--cpu=2",
        "--memory=2Gi",
        &format!("--pods={GRANT_PODS}"),
        "--timeout=90",
    ])
    .success();
    liqo_e2e::virtual_node_ready(&pair.consumer_client, "provider-1", WAIT).await?;
    Ok(pair)
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grant_bounds_every_twin_together() -> Result<()> {
    let pair = granted().await?;
    let (consumer, provider) = (pair.consumer(), pair.provider());
    let local = consumer.client().await?;
    let prov = provider.client().await?;
    let tenant_ns = peering::tenant_namespace(&ClusterId::new(CONSUMER_ID)?);

    // No twin yet: the tenant namespace holds the whole grant.
    wait_for("the tenant namespace's share", WAIT, || async {
        Ok(checked_shares(&prov).await?.get(&tenant_ns).map(|s| s.0) == Some(GRANT_PODS))
    })
    .await?;

    // Two offloaded namespaces: nothing is needed yet, so the twins get
    // equal parts and the tenant namespace what it uses (nothing).
    let pp = PostParams::default();
    for ns in ["a", "b"] {
        Api::<Namespace>::all(local.clone())
            .create(
                &pp,
                &serde_json::from_value(json!({ "metadata": { "name": ns } }))?,
            )
            .await?;
    }
    pair.on_consumer(&["offload", "namespace", "a", "b", "--wait", "--timeout=60"])
        .success();
    let (twin_a, twin_b) = ("a-consumer", "b-consumer");
    wait_for("equal shares for the twins", WAIT, || async {
        let s = checked_shares(&prov).await?;
        Ok(s.get(&tenant_ns).map(|s| s.0) == Some(0)
            && s.get(twin_a).map(|s| s.0) == Some(GRANT_PODS / 2)
            && s.get(twin_b).map(|s| s.0) == Some(GRANT_PODS / 2))
    })
    .await?;

    // Four pods offloaded from a: its twin states the demand and gets the
    // grant (b needs nothing); the pods run on the provider although
    // they request nothing.
    Api::<Deployment>::namespaced(local.clone(), "a")
        .create(&pp, &deployment("a", 4)?)
        .await?;
    let local_a: Api<Pod> = Api::namespaced(local.clone(), "a");
    let waited = wait_for("4 offloaded pods Running", WAIT, || async {
        let pods = local_a
            .list(&ListParams::default().labels("app=web"))
            .await?;
        let running = pods
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        checked_shares(&prov).await?;
        Ok(running == 4)
    })
    .await;
    if waited.is_err() {
        eprintln!("--- consumer agents ---\n{}", consumer.pod_logs());
        eprintln!("--- provider agents ---\n{}", provider.pod_logs());
    }
    waited?;
    // The consumer states the demand a moment after its pods change
    // (reflection/demand.rs), not before they run.
    let counts_4 = |demand: &str| {
        serde_json::from_str::<serde_json::Value>(demand).is_ok_and(|d| d["pods"] == "4")
    };
    let stated = wait_for("the twin's demand to count its 4 pods", WAIT, || async {
        Ok(counts_4(&demand_of(&prov, twin_a).await?))
    })
    .await;
    if stated.is_err() {
        let last = demand_of(&prov, twin_a).await?;
        stated.with_context(|| format!("the demand stated last: {last:?}"))?;
    }
    wait_for(
        "a's share to cover its pods and b's to give way",
        WAIT,
        || async {
            let s = checked_shares(&prov).await?;
            Ok(s.get(twin_a).map(|s| s.0) == Some(GRANT_PODS)
                && s.get(twin_b).map(|s| s.0) == Some(0))
        },
    )
    .await?;

    // The consumer's own credential, straight into its namespaces: across
    // all of them it gets no more than the grant leaves (2 pods), however
    // the gateway moves the shares between attempts.
    let peer = liqo_e2e::peer_client(consumer, &local, "provider-1").await?;
    let mut admitted = 0;
    let mut refusals = Vec::new();
    for attempt in 0..9 {
        let ns = [twin_b, twin_a, tenant_ns.as_str()][attempt % 3];
        match Api::<Pod>::namespaced(peer.clone(), ns)
            .create(&pp, &direct_pod(&format!("extra-{attempt}"))?)
            .await
        {
            Ok(_) => admitted += 1,
            Err(kube::Error::Api(s)) if s.code == 403 => refusals.push(s.message),
            Err(e) => return Err(e.into()),
        }
        // Time for the gateway to move the shares after each change.
        tokio::time::sleep(Duration::from_millis(700)).await;
        checked_shares(&prov).await?;
    }
    let held = pods_held(&prov, &[twin_a, twin_b, &tenant_ns]).await?;
    assert!(
        held as u64 <= GRANT_PODS,
        "{held} pods held on the provider for a grant of {GRANT_PODS}"
    );
    assert!(
        admitted <= 2,
        "{admitted} pods admitted beyond the 4 offloaded"
    );
    assert!(
        refusals.iter().any(|m| m.contains("exceeded quota")),
        "{refusals:?}"
    );

    // Unoffloading a: its twin and its share go, and b (with what the
    // consumer made there by hand) may have the rest.
    for attempt in 0..9 {
        let _ = Api::<Pod>::namespaced(
            peer.clone(),
            [twin_b, twin_a, tenant_ns.as_str()][attempt % 3],
        )
        .delete(&format!("extra-{attempt}"), &DeleteParams::default())
        .await;
    }
    pair.on_consumer(&["unoffload", "namespace", "a", "--timeout=60"])
        .success();
    wait_for("b's share to grow once a is gone", WAIT, || async {
        let s = checked_shares(&prov).await?;
        Ok(!s.contains_key(twin_a) && s.get(twin_b).map(|s| s.0) == Some(GRANT_PODS))
    })
    .await?;

    // The tenant namespace held in deletion (an object of someone else's
    // with a finalizer; unpeering goes through the same state briefly):
    // its share goes with its content, the gateway's rewrite is refused
    // (NamespaceTerminating), and that is not a failure to keep shares.
    let held: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(prov.clone(), &tenant_ns);
    held.create(
        &pp,
        &serde_json::from_value(json!({
            "metadata": { "name": "held", "finalizers": ["liqo-e2e.io/hold"] },
        }))?,
    )
    .await?;
    Api::<Namespace>::all(prov.clone())
        .delete(&tenant_ns, &DeleteParams::default())
        .await?;
    wait_for(
        "the gateway to meet the tenant namespace being deleted",
        WAIT,
        || async {
            Ok(provider
                .pod_logs()
                .lines()
                .any(|l| l.contains("namespace being deleted") && l.contains(&tenant_ns)))
        },
    )
    .await?;
    let logs = provider.pod_logs();
    assert!(
        !logs.lines().any(
            |l| l.contains("cannot keep the tenants' shares") && l.contains("being terminated")
        ),
        "{logs}"
    );
    held.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(&json!({ "metadata": { "finalizers": null } })),
    )
    .await?;
    Ok(())
}

/// Without the provider's gateway, a new twin namespace has no share,
/// and its API server admits no pod there, not even the provider's own;
/// the gateway, back, gives it one.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_gateway_a_new_twin_has_no_share_and_admits_no_pod() -> Result<()> {
    let pair = granted().await?;
    let prov = pair.provider_client.clone();
    let peer = liqo_e2e::peer_client(pair.consumer(), &pair.consumer_client, "provider-1").await?;
    let pp = PostParams::default();
    let gateway: Api<Deployment> = Api::namespaced(prov.clone(), names::NAMESPACE);
    let scale = |n: i32| json!({ "spec": { "replicas": n } });
    gateway
        .patch(
            names::GATEWAY,
            &PatchParams::default(),
            &Patch::Merge(&scale(0)),
        )
        .await?;
    wait_for("the provider's gateway to stop", WAIT, || async {
        let pods = Api::<Pod>::namespaced(prov.clone(), names::NAMESPACE)
            .list(&ListParams::default().labels("app.kubernetes.io/name=liqo-gateway"))
            .await?;
        Ok(pods.items.is_empty())
    })
    .await?;
    let twin_c = "c-consumer";
    Api::<Namespace>::all(peer.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": twin_c, "labels": {
                    labels::TENANT: CONSUMER_ID,
                    "pod-security.kubernetes.io/enforce": "baseline",
                    "pod-security.kubernetes.io/audit": "baseline",
                    "pod-security.kubernetes.io/warn": "baseline",
                } },
            }))?,
        )
        .await?;
    let refused = Api::<Pod>::namespaced(prov.clone(), twin_c)
        .create(&pp, &direct_pod("first")?)
        .await;
    assert!(
        // The API server answers 422 for a binding whose parameter is
        // missing.
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422
            && s.message.contains("liqo-twin-share")
            && s.message.contains("no params found")),
        "a pod in a twin without a share, even the provider's own: {refused:?}"
    );
    gateway
        .patch(
            names::GATEWAY,
            &PatchParams::default(),
            &Patch::Merge(&scale(1)),
        )
        .await?;
    wait_for("the new twin's share", WAIT, || async {
        Ok(checked_shares(&prov).await?.contains_key(twin_c))
    })
    .await?;
    Api::<Namespace>::all(peer.clone())
        .delete(twin_c, &DeleteParams::default())
        .await?;

    Ok(())
}

/// The demand the consumer states on twin `twin` (empty when none).
async fn demand_of(prov: &kube::Client, twin: &str) -> Result<String> {
    let twin = Api::<Namespace>::all(prov.clone()).get(twin).await?;
    Ok(twin
        .metadata
        .annotations
        .and_then(|mut a| a.remove(DEMAND_ANNOTATION))
        .unwrap_or_default())
}
