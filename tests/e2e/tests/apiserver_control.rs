//! A test can take a cluster's kube-apiserver away and bring it back:
//! paused it hangs requests, resumed it answers them; stopped it refuses
//! connections, started again it serves the same data on the same URL to
//! the clients made before; neither counts as a crash; and a paused one
//! does not hold up the cluster's stop.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use liqo_e2e::process_running;
use liqo_testbed::{ApiServerState, Cluster, ClusterSpec, Testbed};
use serde_json::json;

/// How long a request to a paused API server is given before it counts as
/// hanging.
const HANG: Duration = Duration::from_secs(3);

fn apiserver_pid(cluster: &Cluster) -> Result<u32> {
    cluster
        .processes()
        .iter()
        .find(|p| p.name == "kube-apiserver")
        .map(|p| p.pid)
        .context("the cluster has a kube-apiserver")
}

/// Whether an error is, somewhere in its chain, a refused connection.
fn connection_refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        next = e.source();
    }
    false
}

async fn data(configmaps: &Api<ConfigMap>) -> Result<Option<BTreeMap<String, String>>> {
    Ok(configmaps.get("kept").await?.data)
}

#[liqo_e2e::test]
async fn the_apiserver_pauses_resumes_stops_and_starts_again_on_the_same_url() -> Result<()> {
    let mut testbed = Testbed::start(vec![ClusterSpec {
        nodes: 1,
        ..ClusterSpec::new("ctl", 1)
    }])
    .await?;
    let cluster = &mut testbed.clusters_mut()[0];
    let server = cluster.server().to_owned();
    let addr = server.trim_start_matches("https://").to_owned();
    let client = cluster.client().await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "kept" },
                "data": { "made": "before the restart" },
            }))?,
        )
        .await?;
    let want = data(&configmaps).await?;
    assert_eq!(cluster.apiserver_state(), ApiServerState::Running);

    // Paused: it looks dead, requests hang.
    let pid = apiserver_pid(cluster)?;
    cluster.pause_apiserver()?;
    assert_eq!(cluster.apiserver_state(), ApiServerState::Paused);
    let asked = Instant::now();
    let hung = tokio::time::timeout(HANG, configmaps.get("kept")).await;
    assert!(
        hung.is_err(),
        "a paused API server answered after {:?}: {hung:?}",
        asked.elapsed()
    );
    cluster
        .ensure_running()
        .context("a paused API server is no crash")?;

    // Resumed: the same client is answered.
    cluster.resume_apiserver()?;
    let resumed = tokio::time::timeout(Duration::from_secs(10), data(&configmaps))
        .await
        .context("a resumed API server answers")??;
    assert_eq!(resumed, want);
    assert_eq!(apiserver_pid(cluster)?, pid, "resuming keeps the process");

    // Stopped: the process is gone and its port refuses connections.
    cluster.stop_apiserver().await?;
    assert_eq!(cluster.apiserver_state(), ApiServerState::Stopped);
    assert!(!process_running(pid), "the stopped API server still runs");
    match configmaps.get("kept").await {
        Err(e) => assert!(connection_refused(&e), "not refused: {e:?}"),
        Ok(cm) => bail!("a stopped API server answered: {cm:?}"),
    }
    match std::net::TcpStream::connect(&addr) {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}"),
        Ok(_) => bail!("{addr} accepts connections with its API server stopped"),
    }
    cluster
        .ensure_running()
        .context("a stopped API server is no crash")?;
    assert!(
        matches!(
            cluster.pause_apiserver(),
            Err(liqo_testbed::Error::ApiServerState { .. })
        ),
        "a stopped API server cannot be paused"
    );

    // Started again: same URL, same certificates, same data, same client.
    cluster.start_apiserver().await?;
    assert_eq!(cluster.apiserver_state(), ApiServerState::Running);
    assert_eq!(cluster.server(), server);
    assert_ne!(apiserver_pid(cluster)?, pid, "a new process");
    assert_eq!(
        data(&configmaps).await?,
        want,
        "the client made before works"
    );
    let fresh = liqo_testbed::client_from_kubeconfig(cluster.kubeconfig_path()).await?;
    assert_eq!(
        data(&Api::namespaced(fresh, "default")).await?,
        want,
        "the kubeconfig works"
    );

    cluster.restart_apiserver().await?;
    assert_eq!(data(&configmaps).await?, want, "after a restart too");
    cluster.ensure_running()?;

    // A paused API server would sit out the 5 s grace of each stop and be
    // killed; resumed first, it exits at once.
    cluster.pause_apiserver()?;
    let pids: Vec<u32> = cluster.processes().iter().map(|p| p.pid).collect();
    let stopping = Instant::now();
    testbed.stop();
    let took = stopping.elapsed();
    for pid in pids {
        assert!(!process_running(pid), "process {pid} outlived the testbed");
    }
    assert!(
        took < Duration::from_secs(5),
        "stopping a cluster with a paused API server took {took:?}"
    );
    Ok(())
}
