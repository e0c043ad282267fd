//! Storage on a real node, as on k3s and kind: a claim that names no
//! class gets the default StorageClass `local-path`, whose provisioner
//! (local-path-provisioner) makes the volume a folder of the node, in the
//! cluster's own storage folder; what one pod wrote there the next pod
//! reads; deleting the claim removes the folder (reclaim `Delete`).
//! Needs root, containerd, runc, CNI plugins.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, LogParams, PostParams};
use liqo_e2e::fixture::WAIT;
use liqo_e2e::fixture::pod::{phase, running};
use liqo_e2e::fixture::{One, real_node_spec};
use liqo_e2e::wait_for;
use liqo_testbed::{TOOLBOX_IMAGE, storage};
use serde_json::json;

const CLAIM: &str = "data";
const FILE: &str = "/data/file";

/// A pod of the toolbox image, as a user other than root (the volume's
/// folder is open to all), that runs `script` with the claim at `/data`
/// and `$CONTENT` set.
fn pod(name: &str, script: &str, content: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            // `sleep` as the first process ignores SIGTERM.
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": TOOLBOX_IMAGE,
                "command": ["sh", "-c", script],
                "env": [{"name": "CONTENT", "value": content}],
                "securityContext": {"runAsUser": 1000, "runAsNonRoot": true,
                                    "allowPrivilegeEscalation": false},
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}],
        },
    }))?)
}

async fn deleted(pods: &Api<Pod>, name: &str) -> Result<()> {
    pods.delete(name, &DeleteParams::default()).await?;
    wait_for(&format!("pod {name} to be gone"), WAIT, || async move {
        Ok(pods.get_opt(name).await?.is_none())
    })
    .await
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_with_no_class_gets_a_local_path_volume_that_outlives_its_pods() -> Result<()> {
    let one = One::start(real_node_spec("storage", 1)).await?;
    let (cluster, client) = (one.cluster(), one.client.clone());
    let folder = cluster
        .storage_dir()
        .context("a real-node cluster has a storage folder")?;

    let class = Api::<StorageClass>::all(client.clone())
        .get(storage::STORAGE_CLASS)
        .await?;
    let default = class
        .metadata
        .annotations
        .unwrap_or_default()
        .get("storageclass.kubernetes.io/is-default-class")
        .cloned();
    ensure!(
        default.as_deref() == Some("true"),
        "{} is not the default class",
        storage::STORAGE_CLASS
    );

    // A claim as a chart writes it: no class.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let claim = claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": CLAIM},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "64Mi"}},
                },
            }))?,
        )
        .await?;
    let class_name = claim.spec.and_then(|s| s.storage_class_name);
    ensure!(
        class_name.as_deref() == Some(storage::STORAGE_CLASS),
        "the claim got the class {class_name:?}"
    );

    // The first pod writes; its claim is bound once it is scheduled.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let content = format!("written by the first pod at {nanos}\n");
    let write = format!("printf '%s' \"$CONTENT\" > {FILE} && exec sleep 3600");
    pods.create(&PostParams::default(), &pod("writer", &write, &content)?)
        .await?;
    wait_for("the writer to be Running", WAIT, || async {
        Ok(pods.get_opt("writer").await?.is_some_and(|p| running(&p)))
    })
    .await?;
    let claim = claims.get(CLAIM).await?;
    let status = claim.status.and_then(|s| s.phase);
    ensure!(
        status.as_deref() == Some("Bound"),
        "the claim is {status:?}"
    );
    let volume = claim
        .spec
        .and_then(|s| s.volume_name)
        .context("a bound claim names its volume")?;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let path = volumes
        .get(&volume)
        .await?
        .spec
        .and_then(|s| s.host_path)
        .map(|h| PathBuf::from(h.path))
        .context("a local-path volume is a hostPath")?;
    ensure!(
        path.parent() == Some(folder.as_path()),
        "{} is not in {}",
        path.display(),
        folder.display()
    );
    let on_node = path.join(Path::new(FILE).strip_prefix("/data")?);
    wait_for("the file on the node", WAIT, || {
        let on_node = on_node.clone();
        let content = content.clone();
        async move { Ok(std::fs::read_to_string(&on_node).is_ok_and(|c| c == content)) }
    })
    .await?;
    deleted(&pods, "writer").await?;

    // The next pod reads the same bytes.
    pods.create(
        &PostParams::default(),
        &pod("reader", &format!("cat {FILE}"), "")?,
    )
    .await?;
    wait_for("the reader to finish", WAIT, || async {
        let pod = pods.get_opt("reader").await?;
        let phase = pod.as_ref().and_then(phase).map(str::to_owned);
        ensure!(phase.as_deref() != Some("Failed"), "the reader failed");
        Ok(phase.as_deref() == Some("Succeeded"))
    })
    .await?;
    let read = pods.logs("reader", &LogParams::default()).await?;
    ensure!(read == content, "the reader read {read:?}, not {content:?}");
    deleted(&pods, "reader").await?;

    // Reclaim Delete: the volume goes, and its folder with it.
    claims.delete(CLAIM, &DeleteParams::default()).await?;
    wait_for("the volume to be deleted", WAIT, || async {
        Ok(volumes.get_opt(&volume).await?.is_none())
    })
    .await?;
    ensure!(!path.exists(), "{} is left", path.display());
    let left: Vec<_> = std::fs::read_dir(&folder)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    ensure!(left.is_empty(), "{} holds {left:?}", folder.display());
    Ok(())
}
