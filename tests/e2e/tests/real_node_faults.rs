//! A real node through its API server's faults: after each of pause and
//! resume, stop and start, and restart, the node's kubelet reaches its API
//! server again (through the testbed's relay, as a node of a real cluster
//! reaches its control plane), renews its lease, starts a new pod and
//! lets a deleted one go, as a real cluster does. Needs root, containerd,
//! runc, CNI plugins.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, PostParams};
use liqo_e2e::fixture::WAIT;
use liqo_e2e::fixture::pod::running;
use liqo_e2e::fixture::{One, real_node_spec};
use liqo_e2e::wait_for;
use liqo_testbed::{Cluster, TOOLBOX_IMAGE};
use serde_json::json;

/// Longer than the kubelet's request timeouts and its connections' health
/// checks, so that it gives up its connections and makes new ones.
const PAUSE: Duration = Duration::from_secs(40);

fn sleeper(name: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": TOOLBOX_IMAGE,
                "command": ["sleep", "3600"],
                "securityContext": {"runAsUser": 1000, "runAsNonRoot": true,
                                    "allowPrivilegeEscalation": false},
            }],
        },
    }))?)
}

async fn renew_time(cluster: &Cluster) -> Result<Option<MicroTime>> {
    let leases: Api<Lease> = Api::namespaced(cluster.client().await?, "kube-node-lease");
    let node = cluster.real_node_name().context("a real node")?;
    Ok(leases
        .get_opt(node)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.renew_time))
}

/// The node works again after `fault`: its lease is renewed after the
/// fault ended, `new` starts, and `old` is deleted and gone.
async fn node_works_again(cluster: &Cluster, fault: &str, old: &str, new: &str) -> Result<()> {
    let before = renew_time(cluster).await?.context("the node's lease")?;
    wait_for(
        &format!("the node's lease to be renewed after {fault}"),
        WAIT,
        || async { Ok(renew_time(cluster).await?.is_some_and(|t| t != before)) },
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(cluster.client().await?, "default");
    pods.create(&PostParams::default(), &sleeper(new)?).await?;
    wait_for(&format!("pod {new} to run after {fault}"), WAIT, || async {
        Ok(pods.get_opt(new).await?.is_some_and(|p| running(&p)))
    })
    .await?;
    pods.delete(old, &DeleteParams::default()).await?;
    wait_for(
        &format!("pod {old} to be gone after {fault}"),
        WAIT,
        || async { Ok(pods.get_opt(old).await?.is_none()) },
    )
    .await
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_node_reaches_its_api_server_again_after_a_pause_a_stop_and_a_restart() -> Result<()>
{
    let mut faults = One::start(real_node_spec("faults", 1)).await?;
    {
        let cluster = faults.cluster();
        let pods: Api<Pod> = Api::namespaced(faults.client.clone(), "default");
        pods.create(&PostParams::default(), &sleeper("first")?)
            .await?;
        wait_for("the first pod to run", WAIT, || async {
            Ok(pods.get_opt("first").await?.is_some_and(|p| running(&p)))
        })
        .await?;
        // The kubelet makes its lease some seconds after the node.
        wait_for("the node's lease", WAIT, || async {
            Ok(renew_time(cluster).await?.is_some())
        })
        .await?;
    }

    let cluster = faults.cluster_mut();
    cluster.pause_apiserver()?;
    tokio::time::sleep(PAUSE).await;
    cluster.resume_apiserver()?;
    node_works_again(cluster, "a pause", "first", "second").await?;

    cluster.stop_apiserver().await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    cluster.start_apiserver().await?;
    node_works_again(cluster, "a stop and a start", "second", "third").await?;

    cluster.restart_apiserver().await?;
    node_works_again(cluster, "a restart", "third", "fourth").await
}
