//! Jobs through the virtual node, on two real clusters: a local Job in an
//! offloaded namespace, its pod bound to the virtual node, runs on the
//! provider as a Job of one (`backoffLimit: 0` for restartPolicy Never);
//! suspended and widened by the provider's admin while its pod waits on
//! cordoned workers, the remote Job is put back; the provider's kwok
//! completes Job-owned pods (its default pod-complete stage), the end
//! (Succeeded, exit code 0) comes back to the local pod, so the local
//! Job completes; deleting the local Job removes the remote
//! one.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::names::peering;
use liqo_e2e::fixture::pod::phase;
use liqo_e2e::fixture::{PROVIDER_ID, Pair, Stage, WAIT};
use liqo_e2e::wait_for;
use serde_json::json;

const LOCAL_POD_UID: &str = "liqo.io/local-pod-uid";
const NS: &str = "batch";
const TWIN: &str = "batch-consumer";

fn job() -> Job {
    serde_json::from_value(liqo_e2e::restricted(json!({
        "metadata": { "name": "report", "namespace": NS },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": { "labels": { "app": "report" } },
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": liqo_e2e::virtual_node_selector(),
                    "tolerations": liqo_e2e::virtual_node_tolerations(),
                    "containers": [{
                        "name": "report",
                        "image": "busybox",
                        "command": ["true"],
                        "resources": { "requests": { "cpu": "10m", "memory": "16Mi" } },
                    }],
                },
            },
        },
    })))
    .expect("job")
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_to_completion_on_the_provider() -> Result<()> {
    let pair = Pair::at(Stage::Offloaded(NS)).await?;
    let local = pair.consumer_client.clone();
    let prov = pair.provider_client.clone();
    let node_name = peering::virtual_node(&ClusterId::new(PROVIDER_ID)?);

    let jobs: Api<Job> = Api::namespaced(local.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(local.clone(), NS);
    let remote_jobs: Api<Job> = Api::namespaced(prov.clone(), TWIN);
    let remote_pods: Api<Pod> = Api::namespaced(prov.clone(), TWIN);
    let ours = ListParams::default().labels(LOCAL_POD_UID);
    // The provider's workers cordoned: the remote Job's pod waits
    // unscheduled (kwok would complete it at once), so that the Job can
    // be changed on the provider while it is still running.
    let provider_nodes: Api<Node> = Api::all(prov.clone());
    let workers: Vec<String> = provider_nodes
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .filter(|n| n.contains("worker"))
        .collect();
    assert!(!workers.is_empty(), "the provider has workers");
    let cordon = |unschedulable: bool| {
        let provider_nodes = provider_nodes.clone();
        let workers = workers.clone();
        async move {
            for w in &workers {
                provider_nodes
                    .patch(
                        w,
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "spec": { "unschedulable": unschedulable } })),
                    )
                    .await?;
            }
            anyhow::Ok(())
        }
    };
    cordon(true).await?;
    jobs.create(&PostParams::default(), &job()).await?;

    // The remote Job of one, for the local pod's UID.
    wait_for("the remote Job", WAIT, || async {
        Ok(!remote_jobs.list(&ours).await?.items.is_empty())
    })
    .await?;
    let local_pods = pods
        .list(&ListParams::default().labels("app=report"))
        .await?
        .items;
    assert_eq!(local_pods.len(), 1, "one local pod");
    let local_pod = &local_pods[0];
    assert_eq!(
        local_pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node_name.as_str())
    );
    let uid = local_pod.metadata.uid.clone().context("uid")?;
    let remote_job = remote_jobs
        .get(local_pod.metadata.name.as_deref().context("name")?)
        .await?;
    let labels_of = remote_job.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels_of.get(LOCAL_POD_UID), Some(&uid));
    let spec = remote_job.spec.clone().context("spec")?;
    assert_eq!(spec.backoff_limit, Some(0));
    assert_eq!(spec.completions, Some(1));

    // Suspended and widened by the provider's admin: put back (one pod,
    // not suspended), and the generation that leaves recorded.
    let remote_name = local_pod.metadata.name.clone().context("name")?;
    remote_jobs
        .patch(
            &remote_name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "suspend": true, "parallelism": 3 } })),
        )
        .await?;
    let mut seen = None;
    let waited = wait_for("the remote Job put back", WAIT, || async {
        let job = remote_jobs.get(&remote_name).await?;
        let spec = job.spec.clone().unwrap_or_default();
        let recorded = job
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("liqo.io/wrapper-generation"))
            .and_then(|g| g.parse::<i64>().ok());
        Ok(spec.suspend != Some(true)
            && spec.parallelism == Some(1)
            && recorded.is_some()
            && recorded == job.metadata.generation)
    })
    .await;
    if waited.is_err() {
        seen = Some(remote_jobs.get(&remote_name).await?);
    }
    waited.with_context(|| format!("{:?}", seen.map(|j| (j.spec, j.metadata.annotations))))?;
    cordon(false).await?;

    // Completed on the provider, and so on the consumer.
    wait_for("the local pod Succeeded", WAIT, || async {
        Ok(pods
            .get_opt(local_pod.metadata.name.as_deref().unwrap_or_default())
            .await?
            .is_some_and(|p| phase(&p) == Some("Succeeded")))
    })
    .await?;
    let done = pods
        .get(local_pod.metadata.name.as_deref().unwrap_or_default())
        .await?;
    let exit = done
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    assert_eq!(exit, Some(0), "the exit code comes back: {:?}", done.status);
    let remote = remote_pods.list(&ours).await?.items;
    assert_eq!(remote.len(), 1, "one remote pod");
    assert_eq!(phase(&remote[0]), Some("Succeeded"));
    wait_for("the local Job Complete", WAIT, || async {
        Ok(jobs
            .get("report")
            .await?
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "Complete" && c.status == "True")
            }))
    })
    .await?;
    // Finished, the remote Job is kept (the local pod still is) and not
    // run again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(remote_jobs.list(&ours).await?.items.len(), 1);
    assert_eq!(remote_pods.list(&ours).await?.items.len(), 1);

    // Deleting the local Job (and so its pod) removes the remote Job.
    jobs.delete(
        "report",
        &DeleteParams {
            propagation_policy: Some(kube::api::PropagationPolicy::Background),
            ..DeleteParams::default()
        },
    )
    .await?;
    wait_for("no remote Job nor pod, no local pod", WAIT, || async {
        Ok(remote_jobs.list(&ours).await?.items.is_empty()
            && remote_pods.list(&ours).await?.items.is_empty()
            && pods
                .list(&ListParams::default().labels("app=report"))
                .await?
                .items
                .is_empty())
    })
    .await?;
    Ok(())
}
