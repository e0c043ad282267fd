//! Claims of an offloaded namespace kept on the provider's real storage
//! (docs/storage.md), on two real-node clusters with identical pod CIDRs:
//! a StatefulSet of 3 with claims runs on the provider, its data outlives
//! its pods and a scale down and up; a claim grows only where the
//! provider's class lets it; a claim over the grant or of a class
//! the provider does not allow is said on the claim; a claim bound to a
//! local volume keeps its pod home; unoffload refuses while claims hold
//! data, keeps them when told and finds them again; unpeer with
//! `--delete-remote-data` leaves no claim, volume nor folder on the
//! provider. Needs root, containerd, runc, CNI plugins.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use liqo_e2e::fixture::pod::running;
use liqo_e2e::fixture::{Pair, Stage, real_node_spec};
use liqo_e2e::{Run, liqoctl, run, wait_for};
use liqo_testbed::{Cluster, ClusterSpec, TOOLBOX_IMAGE, Toolchain};
use serde_json::json;

const NS: &str = "db";
const LOCAL_NS: &str = "mixed";
const WAIT: std::time::Duration = std::time::Duration::from_secs(180);

fn spec(name: &str, index: u8) -> ClusterSpec {
    let mut spec = real_node_spec(name, index);
    spec.pod_cidr = "10.200.0.0/16".to_owned();
    spec
}

fn kubectl(cluster: &Cluster, args: &[&str]) -> Result<Run> {
    let mut cmd = std::process::Command::new(Toolchain::locate()?.binary("kubectl"));
    cmd.arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args(args);
    Ok(run(&mut cmd))
}

fn ctl(cluster: &Cluster, args: &[&str]) -> Run {
    liqoctl(Some(cluster.kubeconfig_path()), args)
}

/// The toolbox as the provider's `baseline`/`restricted` levels admit it.
fn secure() -> serde_json::Value {
    json!({ "allowPrivilegeEscalation": false, "capabilities": { "drop": ["ALL"] } })
}

/// A StatefulSet of `replicas` whose pods write an ID into their claim
/// once, and print it.
fn stateful_set(replicas: u32) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": { "name": "db", "namespace": NS },
        "spec": {
            "serviceName": "db", "replicas": replicas,
            "selector": { "matchLabels": { "app": "db" } },
            "template": {
                "metadata": { "labels": { "app": "db" } },
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "securityContext": { "runAsNonRoot": true, "runAsUser": 65534, "seccompProfile": { "type": "RuntimeDefault" } },
                    "containers": [{
                        "name": "db", "image": TOOLBOX_IMAGE,
                        "command": ["sh", "-c", "test -f /data/id || echo \"$POD_NAME $RANDOM$RANDOM\" > /data/id; cat /data/id; exec sleep 100000"],
                        "env": [{ "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } }],
                        "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
                        "securityContext": secure(),
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": { "name": "data" },
                "spec": { "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": "64Mi" } } },
            }],
        },
    })
}

/// The ID pod `name` printed: what its claim holds.
async fn id_of(pods: &Api<Pod>, name: &str) -> Result<String> {
    let printed = || async {
        let log = pods.logs(name, &LogParams::default()).await;
        Ok::<_, anyhow::Error>(log.unwrap_or_default().trim().to_owned())
    };
    wait_for(&format!("{name} to print its ID"), WAIT, || async {
        Ok(!printed().await?.is_empty())
    })
    .await?;
    printed().await
}

async fn ready(pods: &Api<Pod>, names: &[&str]) -> Result<()> {
    for name in names {
        wait_for(&format!("{name} to run"), WAIT, || async {
            Ok(pods.get_opt(name).await?.is_some_and(|p| running(&p)))
        })
        .await?;
    }
    Ok(())
}

async fn gone(pods: &Api<Pod>, name: &str) -> Result<()> {
    wait_for(&format!("{name} to be gone"), WAIT, || async {
        Ok(pods.get_opt(name).await?.is_none())
    })
    .await
}

/// The claims kept for `ns` on the provider: those labelled ours.
async fn kept(foreign: &kube::Client) -> Result<Vec<PersistentVolumeClaim>> {
    Ok(Api::<PersistentVolumeClaim>::all(foreign.clone())
        .list(&ListParams::default().labels("liqo.io/origin-namespace"))
        .await?
        .items)
}

/// The reasons and messages of the Warning Events of `claim`.
async fn warnings(home: &kube::Client, ns: &str, claim: &str) -> Result<Vec<String>> {
    Ok(Api::<Event>::namespaced(home.clone(), ns)
        .list(&ListParams::default().fields(&format!("involvedObject.name={claim}")))
        .await?
        .items
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect())
}

/// What the steps act on: the clusters, the clients of home (`hc`) and
/// foreign (`fc`), and the pods and claims of `NS` at home.
struct Db<'a> {
    home: &'a Cluster,
    foreign: &'a Cluster,
    hc: kube::Client,
    fc: kube::Client,
    pods: Api<Pod>,
    claims: Api<PersistentVolumeClaim>,
}

impl<'a> Db<'a> {
    fn of(pair: &'a Pair) -> Self {
        let hc = pair.consumer_client.clone();
        Self {
            home: pair.consumer(),
            foreign: pair.provider(),
            fc: pair.provider_client.clone(),
            pods: Api::namespaced(hc.clone(), NS),
            claims: Api::namespaced(hc.clone(), NS),
            hc,
        }
    }

    /// `kubectl scale` of the StatefulSet at home, which must succeed.
    fn scale(&self, replicas: u32) -> Result<()> {
        let replicas = format!("--replicas={replicas}");
        kubectl(
            self.home,
            &["-n", NS, "scale", "statefulset", "db", &replicas],
        )?
        .success();
        Ok(())
    }

    /// Scales the StatefulSet to none and waits for its pods to go.
    async fn scale_to_none(&self) -> Result<()> {
        self.scale(0)?;
        for i in 0..3 {
            gone(&self.pods, &format!("db-{i}")).await?;
        }
        Ok(())
    }
}

/// The IDs db-0 and db-2 wrote into their claims.
struct Ids {
    db0: String,
    db2: String,
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateful_set_keeps_its_data_on_the_providers_storage() -> Result<()> {
    let pair = Pair::with_specs(spec("home", 1), spec("foreign", 2), Stage::Started).await?;
    let db = Db::of(&pair);
    home_peers_with_a_grant_of_storage(&db)?;
    a_stateful_set_runs_on_the_provider_with_its_claims_there(&db).await?;
    let ids = its_data_outlives_its_pods_and_a_scale_down_and_up(&db).await?;
    a_claim_grows_only_where_the_providers_class_lets_it(&db).await?;
    a_claim_over_the_grant_or_of_a_class_not_allowed_says_so(&db).await?;
    a_claim_bound_to_a_local_volume_keeps_its_pod_home(&db).await?;
    unoffload_refuses_while_claims_hold_data_and_keeps_them_when_told(&db, &ids).await?;
    unpeer_told_to_delete_the_data_leaves_none_on_the_provider(&db).await
}

/// liqo-rs installed on both, foreign granting 1Gi in 5 claims of its
/// `local-path`, and home peered with it.
fn home_peers_with_a_grant_of_storage(db: &Db) -> Result<()> {
    for (cluster, id) in [(db.home, "home-1"), (db.foreign, "foreign-1")] {
        let id = format!("--cluster-id={id}");
        let cidr = format!("--pod-cidr={}", cluster.spec().pod_cidr);
        ctl(cluster, &["install", &id, &cidr, "--timeout=90"]).success();
    }
    ctl(
        db.foreign,
        &[
            "sharing-policy",
            "set",
            "--storage=1Gi",
            "--claims=5",
            "--storage-classes=local-path",
        ],
    )
    .success();
    let remote = remote(db)?;
    let peered = ctl(
        db.home,
        &["peer", "--remote-kubeconfig", remote, "--timeout=120"],
    )
    .success();
    ensure!(
        peered.stdout.contains("storage 1Gi in 5 claims"),
        "{}",
        peered.stdout
    );
    Ok(())
}

/// The provider's kubeconfig, as `--remote-kubeconfig` takes it.
fn remote<'a>(db: &Db<'a>) -> Result<&'a str> {
    db.foreign.kubeconfig_path().to_str().context("path")
}

/// Offloads `NS` with `Remote`, waiting for its twin.
fn offload_remote(db: &Db) {
    ctl(
        db.home,
        &[
            "offload",
            "namespace",
            NS,
            "--pod-offloading-strategy=Remote",
            "--wait",
        ],
    )
    .success();
}

/// A StatefulSet of 3 in a namespace whose pods run on the provider: its
/// claims name no class, get `liqo`, and are kept there in the provider's
/// `local-path`.
async fn a_stateful_set_runs_on_the_provider_with_its_claims_there(db: &Db<'_>) -> Result<()> {
    kubectl(db.home, &["create", "namespace", NS])?.success();
    offload_remote(db);
    let started = Instant::now();
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(db.hc.clone(), NS);
    sets.create(
        &PostParams::default(),
        &serde_json::from_value(stateful_set(3))?,
    )
    .await?;
    ready(&db.pods, &["db-0", "db-1", "db-2"]).await?;
    eprintln!(
        "figure: a StatefulSet of 3 with claims, offloaded, all Running in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    for i in 0..3 {
        let claim = db.claims.get(&format!("data-db-{i}")).await?;
        let spec = claim.spec.context("spec")?;
        ensure!(
            spec.storage_class_name.as_deref() == Some("liqo"),
            "{spec:?}"
        );
        let volume = Api::<PersistentVolume>::all(db.hc.clone())
            .get(spec.volume_name.as_deref().context("bound")?)
            .await?;
        let affinity = serde_json::to_string(&volume.spec.and_then(|s| s.node_affinity))?;
        ensure!(affinity.contains("liqo-foreign-1"), "{affinity}");
    }
    let there = kept(&db.fc).await?;
    ensure!(there.len() == 3, "{} claims on the provider", there.len());
    for c in &there {
        let spec = c.spec.as_ref().context("spec")?;
        ensure!(
            spec.storage_class_name.as_deref() == Some("local-path"),
            "{spec:?}"
        );
    }
    Ok(())
}

/// Its data outlives its pods: deleted, db-0 comes back with its ID;
/// scaled down and up, db-2 gets its same claim back. The IDs they hold.
async fn its_data_outlives_its_pods_and_a_scale_down_and_up(db: &Db<'_>) -> Result<Ids> {
    let pods = &db.pods;
    let first = id_of(pods, "db-0").await?;
    pods.delete("db-0", &DeleteParams::default()).await?;
    wait_for("db-0 to come back", WAIT, || async {
        Ok(pods
            .get_opt("db-0")
            .await?
            .is_some_and(|p| running(&p) && p.metadata.deletion_timestamp.is_none()))
    })
    .await?;
    ensure!(id_of(pods, "db-0").await? == first, "db-0 lost its data");
    let before = id_of(pods, "db-2").await?;
    db.scale(1)?;
    gone(pods, "db-2").await?;
    db.scale(3)?;
    ready(pods, &["db-2"]).await?;
    ensure!(id_of(pods, "db-2").await? == before, "db-2 lost its data");
    ensure!(kept(&db.fc).await?.len() == 3, "claims were made again");
    Ok(Ids {
        db0: first,
        db2: before,
    })
}

/// Grown here, the claim grows there where the provider's class lets it:
/// local-path does not, and the provider's reason is said here.
async fn a_claim_grows_only_where_the_providers_class_lets_it(db: &Db<'_>) -> Result<()> {
    db.claims
        .patch(
            "data-db-0",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({ "spec": { "resources": { "requests": { "storage": "128Mi" } } } }),
            ),
        )
        .await?;
    wait_for("the resize's refusal said", WAIT, || async {
        Ok(warnings(&db.hc, NS, "data-db-0")
            .await?
            .iter()
            .any(|w| w.starts_with("VolumeResizeFailed") && w.contains("resize")))
    })
    .await
}

/// Over the grant, and a class the provider does not allow: said on the
/// claim, which stays Pending, as does its pod.
async fn a_claim_over_the_grant_or_of_a_class_not_allowed_says_so(db: &Db<'_>) -> Result<()> {
    let (pods, claims) = (&db.pods, &db.claims);
    for (name, size, class) in [("big", "2Gi", None), ("gold", "10Mi", Some("gold"))] {
        let mut claim = json!({
            "metadata": { "name": name },
            "spec": { "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": size } } },
        });
        if let Some(class) = class {
            claim["metadata"]["annotations"] = json!({ "liqo.io/remote-storage-class": class });
        }
        claims
            .create(&PostParams::default(), &serde_json::from_value(claim)?)
            .await?;
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": format!("use-{name}") },
                "spec": {
                    "securityContext": { "runAsNonRoot": true, "runAsUser": 65534, "seccompProfile": { "type": "RuntimeDefault" } },
                    "containers": [{ "name": "c", "image": TOOLBOX_IMAGE, "command": ["sleep", "1000"],
                                     "securityContext": secure(),
                                     "volumeMounts": [{ "name": "d", "mountPath": "/d" }] }],
                    "volumes": [{ "name": "d", "persistentVolumeClaim": { "claimName": name } }],
                },
            }))?,
        )
        .await?;
    }
    for (claim, said) in [
        ("big", "exceeded quota"),
        ("gold", "does not allow the storage class gold"),
    ] {
        wait_for(&format!("the refusal of {claim} said"), WAIT, || async {
            Ok(warnings(&db.hc, NS, claim)
                .await?
                .iter()
                .any(|w| w.starts_with("ProvisioningFailed") && w.contains(said)))
        })
        .await?;
        let phase = claims.get(claim).await?.status.and_then(|s| s.phase);
        ensure!(phase.as_deref() == Some("Pending"), "{claim} is {phase:?}");
    }
    for name in ["use-big", "use-gold"] {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    for name in ["big", "gold"] {
        claims.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}

/// A claim bound to a local volume keeps its pod home, in a namespace
/// whose pods may run on either side.
async fn a_claim_bound_to_a_local_volume_keeps_its_pod_home(db: &Db<'_>) -> Result<()> {
    kubectl(db.home, &["create", "namespace", LOCAL_NS])?.success();
    let local_claims: Api<PersistentVolumeClaim> = Api::namespaced(db.hc.clone(), LOCAL_NS);
    local_claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "local" },
                "spec": { "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": "16Mi" } } },
            }))?,
        )
        .await?;
    let local_pods: Api<Pod> = Api::namespaced(db.hc.clone(), LOCAL_NS);
    let user = |name: &str| -> Result<Pod> {
        Ok(serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{ "name": "c", "image": TOOLBOX_IMAGE, "command": ["sleep", "1000"],
                                 "volumeMounts": [{ "name": "d", "mountPath": "/d" }] }],
                "volumes": [{ "name": "d", "persistentVolumeClaim": { "claimName": "local" } }],
            },
        }))?)
    };
    local_pods
        .create(&PostParams::default(), &user("first")?)
        .await?;
    ready(&local_pods, &["first"]).await?;
    local_pods.delete("first", &DeleteParams::default()).await?;
    gone(&local_pods, "first").await?;
    ctl(
        db.home,
        &[
            "offload",
            "namespace",
            LOCAL_NS,
            "--pod-offloading-strategy=LocalAndRemote",
            "--wait",
        ],
    )
    .success();
    local_pods
        .create(&PostParams::default(), &user("second")?)
        .await?;
    ready(&local_pods, &["second"]).await?;
    let node = local_pods
        .get("second")
        .await?
        .spec
        .and_then(|s| s.node_name)
        .unwrap_or_default();
    ensure!(
        Some(node.as_str()) == db.home.real_node_name(),
        "the pod with a local claim went to {node}"
    );
    Ok(())
}

/// Unoffload refuses while claims hold data, in one line naming them and
/// both ways on; keeps them when told, and finds them again: the pods
/// back on the provider hold the `ids` they wrote.
async fn unoffload_refuses_while_claims_hold_data_and_keeps_them_when_told(
    db: &Db<'_>,
    ids: &Ids,
) -> Result<()> {
    db.scale_to_none().await?;
    let refused = ctl(db.home, &["unoffload", "namespace", NS]).user_error(6);
    let line = refused.error_line();
    for part in [
        "3 claims",
        "db/data-db-0",
        "--keep-remote-data",
        "--delete-remote-data",
    ] {
        ensure!(line.contains(part), "{part:?} not in: {line}");
    }
    ctl(
        db.home,
        &["unoffload", "namespace", NS, "--keep-remote-data"],
    )
    .success();
    wait_for("the twin to hold only its claims", WAIT, || async {
        let left = Api::<Pod>::all(db.fc.clone())
            .list(&ListParams::default().labels("liqo.io/local-pod-uid"))
            .await?
            .items;
        Ok(left.is_empty())
    })
    .await?;
    ensure!(kept(&db.fc).await?.len() == 3, "the kept claims are gone");
    offload_remote(db);
    db.scale(3)?;
    ready(&db.pods, &["db-0", "db-1", "db-2"]).await?;
    ensure!(
        id_of(&db.pods, "db-0").await? == ids.db0,
        "db-0 lost its data"
    );
    ensure!(
        id_of(&db.pods, "db-2").await? == ids.db2,
        "db-2 lost its data"
    );
    Ok(())
}

/// Unpeer deletes the data only when told: then no claim, volume nor
/// folder of it is left on the provider, and no volume of ours at home
/// once its claim goes.
async fn unpeer_told_to_delete_the_data_leaves_none_on_the_provider(db: &Db<'_>) -> Result<()> {
    db.scale_to_none().await?;
    ctl(
        db.home,
        &["unoffload", "namespace", NS, LOCAL_NS, "--keep-remote-data"],
    )
    .success();
    let remote = remote(db)?;
    let refused = ctl(db.home, &["unpeer", "--remote-kubeconfig", remote]).user_error(6);
    ensure!(
        refused.error_line().contains("--delete-remote-data"),
        "{}",
        refused.error_line()
    );
    ctl(
        db.home,
        &[
            "unpeer",
            "--remote-kubeconfig",
            remote,
            "--delete-remote-data",
            "--timeout=120",
        ],
    )
    .success();
    wait_for(
        "no claim, volume nor folder left on the provider",
        WAIT,
        || async {
            let claims = kept(&db.fc).await?;
            let volumes = Api::<PersistentVolume>::all(db.fc.clone())
                .list(&ListParams::default())
                .await?
                .items;
            let folder = db.foreign.storage_dir().context("a storage folder")?;
            let files = std::fs::read_dir(&folder)?.count();
            Ok(claims.is_empty() && volumes.is_empty() && files == 0)
        },
    )
    .await?;
    let ours = || async {
        Ok::<_, anyhow::Error>(
            Api::<PersistentVolume>::all(db.hc.clone())
                .list(&ListParams::default().labels("liqo.io/remote-cluster-id"))
                .await?
                .items,
        )
    };
    // Deleted here too: Kubernetes keeps each until its claim goes.
    ensure!(
        ours()
            .await?
            .iter()
            .all(|v| v.metadata.deletion_timestamp.is_some()),
        "volumes of ours left at home"
    );
    db.claims
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    wait_for("no volume of ours left at home", WAIT, || async {
        Ok(ours().await?.is_empty())
    })
    .await
}
