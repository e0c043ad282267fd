//! The gateway follows the API the level-triggered way: it is ready exactly
//! while the identity and the peers are known and current, stops being
//! ready when the API goes away or the identity is deleted, and is ready
//! again, without being restarted, once they come back.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use liqo_api::names;
use liqo_e2e::fixture::{One, spec};
use liqo_e2e::{liqoctl, wait_for};
use liqo_testbed::{Cluster, HOST_PROCESS_LABEL, HOST_PROCESS_TAINT};

/// The gateway's own answer to `/readyz`, asked directly on its pod IP so
/// that it does not lag behind the kubelet's probe period.
async fn readyz(http: &reqwest::Client, url: &str) -> Option<u16> {
    let answer = http.get(url).timeout(Duration::from_secs(2)).send().await;
    answer.ok().map(|r| r.status().as_u16())
}

async fn wait_readyz(http: &reqwest::Client, url: &str, want: u16, why: &str) -> Result<()> {
    wait_for(why, Duration::from_secs(60), || async move {
        Ok(readyz(http, url).await == Some(want))
    })
    .await
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_converges_across_api_restarts_and_identity_deletion() -> Result<()> {
    let mut gw = One::start(spec("gw", 1, 1)).await?;
    let kubeconfig = gw.cluster().kubeconfig_path().to_owned();
    let client = gw.client.clone();
    let selector = format!("--node-selector={HOST_PROCESS_LABEL}=true");
    let toleration = format!("--toleration={HOST_PROCESS_TAINT}=true:NoSchedule");
    let install = [
        "install",
        "--cluster-id=gw-1",
        "--pod-cidr=10.201.0.0/16",
        &selector,
        &toleration,
        "--timeout=60",
    ];
    liqoctl(Some(&kubeconfig), &install).success();

    let pods: Api<Pod> = Api::namespaced(client.clone(), names::NAMESPACE);
    let listed = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=liqo-gateway"))
        .await?;
    let [pod] = &listed.items[..] else {
        anyhow::bail!("expected one gateway pod, got {}", listed.items.len());
    };
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("a running pod has an IP");
    let url = format!("http://{ip}:{}/readyz", names::HEALTH_PORT);
    let http = reqwest::Client::builder().no_proxy().build()?;
    assert_eq!(
        readyz(&http, &url).await,
        Some(200),
        "not ready after install"
    );
    let pids = gateway_pids(gw.cluster());
    assert_eq!(pids.len(), 1, "{pids:?}");

    // The API server goes away: what the gateway knows is no longer current.
    gw.cluster_mut().stop_apiserver().await?;
    wait_readyz(
        &http,
        &url,
        503,
        "the gateway to be not ready while the API is down",
    )
    .await?;
    // It comes back at the same address: ready again, by itself.
    gw.cluster_mut().start_apiserver().await?;
    wait_readyz(
        &http,
        &url,
        200,
        "the gateway to be ready after the API restart",
    )
    .await?;
    // Twice, to show the first recovery left nothing behind.
    gw.cluster_mut().restart_apiserver().await?;
    wait_readyz(
        &http,
        &url,
        200,
        "the gateway to be ready after a second restart",
    )
    .await?;

    // The identity is deleted: no identity, not ready.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), names::NAMESPACE);
    maps.delete(names::IDENTITY_CONFIGMAP, &DeleteParams::default())
        .await?;
    wait_readyz(
        &http,
        &url,
        503,
        "the gateway to notice the identity is gone",
    )
    .await?;
    // The kubelet sees it too: the pod is no longer Ready.
    wait_for(
        "the gateway pod to be not Ready",
        Duration::from_secs(30),
        || {
            let pods = pods.clone();
            let name = pod_name.clone();
            async move { Ok(!pod_ready(&pods.get(&name).await?)) }
        },
    )
    .await?;
    // Deleted while the API is down, recreated once it is back.
    gw.cluster_mut().restart_apiserver().await?;
    liqoctl(Some(&kubeconfig), &install).success();
    wait_readyz(
        &http,
        &url,
        200,
        "the gateway to read the recreated identity",
    )
    .await?;

    // It converged: the same process throughout, never restarted.
    assert_eq!(
        gateway_pids(gw.cluster()),
        pids,
        "the gateway was restarted"
    );
    let pod = pods.get(&pod_name).await?;
    let restarts = pod
        .status
        .and_then(|s| s.container_statuses)
        .map(|cs| cs.iter().map(|c| c.restart_count).sum::<i32>());
    assert_eq!(restarts, Some(0));
    gw.stop();
    Ok(())
}

fn gateway_pids(cluster: &Cluster) -> Vec<u32> {
    liqo_testbed::agent_processes(cluster.dir())
        .iter()
        .filter(|p| p.name.contains("gateway"))
        .map(|p| p.pid)
        .collect()
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
