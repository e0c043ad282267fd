//! Namespace offloading end to end, on two real clusters (a consumer with
//! the host-process node that runs the virtual kubelet, a provider with
//! kwok nodes): `liqoctl offload namespace` gets its twin namespace on
//! the provider and a ready status entry; a Deployment's pods bound to the
//! virtual node run on the provider as ReplicaSets of one, Running on kwok
//! nodes, and the local pods show the remote pods' status and IPs; the
//! virtual kubelet killed mid-way duplicates nothing; scaling down removes
//! the remote ReplicaSets and the local pods; a remote ReplicaSet changed
//! on the provider is put back; `liqoctl unoffload`
//! removes the twin namespace.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::names::{self, labels, peering};
use liqo_api::offloading::NamespaceOffloading;
use liqo_e2e::fixture::pod::{ip, running};
use liqo_e2e::fixture::{PROVIDER_ID, Pair, Stage, WAIT};
use liqo_e2e::wait_for;
use serde_json::json;

/// The label the virtual kubelet puts on remote ReplicaSets and pods.
const LOCAL_POD_UID: &str = "liqo.io/local-pod-uid";
const NS: &str = "shop";
/// DefaultName: `<namespace>-<consumer cluster name>`.
const TWIN: &str = "shop-consumer";

fn deployment(replicas: i32) -> Deployment {
    serde_json::from_value(liqo_e2e::restricted(json!({
        "metadata": { "name": "web", "namespace": NS },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": {
                    // Placed by hand, so that the test does not depend on
                    // the placement policy.
                    "nodeSelector": liqo_e2e::virtual_node_selector(),
                    "tolerations": liqo_e2e::virtual_node_tolerations(),
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "web",
                        "image": "nginx",
                        "env": [{ "name": "GREETING", "value": "hello" }],
                        "resources": { "requests": { "cpu": "10m", "memory": "16Mi" } },
                    }],
                },
            },
        },
    })))
    .expect("deployment")
}

/// Local pods of the Deployment that are not being deleted.
async fn local_pods(api: &Api<Pod>) -> Result<Vec<Pod>> {
    Ok(api
        .list(&ListParams::default().labels("app=web"))
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// What the steps look at: `NS` and its offloading on the consumer, and
/// its twin on the provider.
struct Shop {
    offloadings: Api<NamespaceOffloading>,
    deployments: Api<Deployment>,
    pods: Api<Pod>,
    remote_namespaces: Api<Namespace>,
    remote_rs: Api<ReplicaSet>,
    remote_pods: Api<Pod>,
    /// The remote ReplicaSets and pods the virtual kubelet made.
    ours: ListParams,
}

impl Shop {
    fn of(pair: &Pair) -> Self {
        let (local, prov) = (&pair.consumer_client, &pair.provider_client);
        Self {
            offloadings: Api::namespaced(local.clone(), NS),
            deployments: Api::namespaced(local.clone(), NS),
            pods: Api::namespaced(local.clone(), NS),
            remote_namespaces: Api::all(prov.clone()),
            remote_rs: Api::namespaced(prov.clone(), TWIN),
            remote_pods: Api::namespaced(prov.clone(), TWIN),
            ours: ListParams::default().labels(LOCAL_POD_UID),
        }
    }
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn offloaded_pods_run_on_the_provider() -> Result<()> {
    let pair = Pair::at(Stage::Peered).await?;
    let shop = Shop::of(&pair);
    offload_makes_a_twin_namespace_and_a_ready_entry(&pair, &shop).await?;
    pods_run_on_the_provider_though_the_agent_is_killed_midway(&pair, &shop).await?;
    each_pod_is_one_replica_set_of_one_on_a_provider_node(&pair, &shop).await?;
    a_remote_replica_set_changed_on_the_provider_is_put_back(&shop).await?;
    scaling_down_removes_remote_replica_sets_and_local_pods(&shop).await?;
    unoffload_removes_the_twin_namespace(&pair, &shop).await?;
    Ok(())
}

/// The offloading: a twin namespace, labelled with its tenant and its
/// origin, and a ready status entry.
async fn offload_makes_a_twin_namespace_and_a_ready_entry(pair: &Pair, shop: &Shop) -> Result<()> {
    let provider_id = ClusterId::new(PROVIDER_ID)?;
    let start = Instant::now();
    let namespaces: Api<Namespace> = Api::all(pair.consumer_client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": NS } }))?,
        )
        .await?;
    pair.on_consumer(&["offload", "namespace", NS, "--wait", "--timeout=60"])
        .success();
    wait_for("the twin namespace and a ready entry", WAIT, || async {
        let off = shop.offloadings.get(names::NAMESPACE_OFFLOADING).await?;
        let ready = off.status.as_ref().is_some_and(|s| {
            s.clusters
                .iter()
                .any(|c| c.cluster_id == provider_id && c.ready && c.remote_namespace == TWIN)
        });
        Ok(ready && shop.remote_namespaces.get_opt(TWIN).await?.is_some())
    })
    .await?;
    eprintln!("twin namespace ready in {:?}", start.elapsed());
    let twin = shop.remote_namespaces.get(TWIN).await?;
    let twin_labels = twin.metadata.labels.unwrap_or_default();
    assert_eq!(
        twin_labels.get(labels::TENANT).map(String::as_str),
        Some("consumer-1")
    );
    assert_eq!(
        twin_labels
            .get(labels::ORIGIN_NAMESPACE)
            .map(String::as_str),
        Some(NS)
    );
    Ok(())
}

/// Three pods, bound to the virtual node, run on the provider, the local
/// pods showing the remote pods' status and IPs, though the virtual
/// kubelet is killed as soon as the first remote ReplicaSet exists.
async fn pods_run_on_the_provider_though_the_agent_is_killed_midway(
    pair: &Pair,
    shop: &Shop,
) -> Result<()> {
    let consumer = pair.consumer();
    let start = Instant::now();
    shop.deployments
        .create(&PostParams::default(), &deployment(3))
        .await?;
    wait_for("a first remote ReplicaSet", WAIT, || async {
        Ok(!shop.remote_rs.list(&shop.ours).await?.items.is_empty())
    })
    .await?;
    let killed = liqo_e2e::kill_agent(consumer, liqo_e2e::Agent::VirtualKubelet)?;
    eprintln!("killed the virtual kubelet (pid {killed})");

    wait_for(
        "3 local pods Running with the remote pods' IPs",
        Duration::from_secs(120),
        || async {
            let local_pods = local_pods(&shop.pods).await?;
            let remote: BTreeMap<String, Pod> = shop
                .remote_pods
                .list(&shop.ours)
                .await?
                .items
                .into_iter()
                .filter_map(|p| Some((p.metadata.labels.clone()?.get(LOCAL_POD_UID)?.clone(), p)))
                .collect();
            Ok(local_pods.len() == 3
                && local_pods.iter().all(|p| {
                    let uid = p.metadata.uid.clone().unwrap_or_default();
                    running(p)
                        && ip(p).is_some()
                        && remote
                            .get(&uid)
                            .is_some_and(|r| running(r) && ip(r) == ip(p))
                }))
        },
    )
    .await?;
    eprintln!(
        "3 pods Running through the provider in {:?}",
        start.elapsed()
    );
    liqo_e2e::agent_restarted(consumer, liqo_e2e::Agent::VirtualKubelet, killed, WAIT).await
}

/// Nothing twice, after the restarted agent's first passes: each local
/// pod bound to the virtual node is one remote ReplicaSet of one, whose
/// one pod (made by the virtual kubelet, then adopted by its ReplicaSet)
/// runs on a kwok node of the provider, without a service account token
/// and with the pod's environment.
async fn each_pod_is_one_replica_set_of_one_on_a_provider_node(
    pair: &Pair,
    shop: &Shop,
) -> Result<()> {
    let node_name = peering::virtual_node(&ClusterId::new(PROVIDER_ID)?);
    // The restarted agent's first passes must not create anything again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let local_pods = local_pods(&shop.pods).await?;
    for p in &local_pods {
        let spec = p.spec.as_ref().context("spec")?;
        assert_eq!(spec.node_name.as_deref(), Some(node_name.as_str()));
    }
    let rs = shop.remote_rs.list(&shop.ours).await?.items;
    assert_eq!(rs.len(), 3, "one ReplicaSet per pod: {:?}", names_of(&rs));
    for r in &rs {
        assert_eq!(r.spec.as_ref().and_then(|s| s.replicas), Some(1));
    }
    let remote = shop.remote_pods.list(&shop.ours).await?.items;
    assert_eq!(
        remote.len(),
        3,
        "one remote pod per pod: {:?}",
        names_of(&remote)
    );
    // Each made by the virtual kubelet, then adopted by its ReplicaSet.
    wait_for(
        "the remote pods adopted by their ReplicaSets",
        WAIT,
        || async {
            let rs_uids: Vec<String> = shop
                .remote_rs
                .list(&shop.ours)
                .await?
                .items
                .into_iter()
                .filter_map(|r| r.metadata.uid)
                .collect();
            let pods = shop.remote_pods.list(&shop.ours).await?.items;
            Ok(pods.len() == 3
                && pods.iter().all(|p| {
                    p.metadata.owner_references.iter().flatten().any(|o| {
                        o.controller == Some(true)
                            && o.kind == "ReplicaSet"
                            && rs_uids.contains(&o.uid)
                    })
                }))
        },
    )
    .await?;
    let remote = shop.remote_pods.list(&shop.ours).await?.items;
    assert_eq!(remote.len(), 3, "still one remote pod per pod");
    let kwok_nodes: Vec<String> = Api::<Node>::all(pair.provider_client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    for r in &remote {
        let spec = r.spec.as_ref().context("spec")?;
        let on = spec.node_name.clone().unwrap_or_default();
        assert!(kwok_nodes.contains(&on), "remote pod on {on}");
        assert_eq!(spec.automount_service_account_token, Some(false));
        let env = spec.containers[0].env.clone().unwrap_or_default();
        assert!(env.iter().any(|e| e.name == "GREETING"), "{env:?}");
    }
    Ok(())
}

/// A remote ReplicaSet changed on the provider by someone else (scaled to
/// nothing, its template edited) is put back: one pod again, the template
/// as the local pod says, the generation it left recorded.
async fn a_remote_replica_set_changed_on_the_provider_is_put_back(shop: &Shop) -> Result<()> {
    let remote_rs = &shop.remote_rs;
    let rs = remote_rs.list(&shop.ours).await?.items;
    let first = rs.first().context("no remote ReplicaSet")?;
    let tampered = first.metadata.name.clone().context("nameless")?;
    let uid = first
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LOCAL_POD_UID))
        .cloned()
        .context("no uid label")?;
    remote_rs
        .patch(
            &tampered,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": {
                "replicas": 0,
                "template": { "metadata": { "annotations": { "tampered": "yes" } } },
            } })),
        )
        .await?;
    wait_for("the tampered ReplicaSet put back", WAIT, || async {
        let now = remote_rs.get(&tampered).await?;
        let spec = now.spec.clone().unwrap_or_default();
        let annotations = spec
            .template
            .and_then(|t| t.metadata)
            .and_then(|m| m.annotations)
            .unwrap_or_default();
        let recorded = now
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("liqo.io/wrapper-generation"))
            .cloned();
        Ok(spec.replicas == Some(1)
            && !annotations.contains_key("tampered")
            && recorded == now.metadata.generation.map(|g| g.to_string()))
    })
    .await?;
    wait_for("its pod running again", WAIT, || async {
        let running = shop
            .remote_pods
            .list(&ListParams::default().labels(&format!("{LOCAL_POD_UID}={uid}")))
            .await?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        Ok(running == 1)
    })
    .await
}

/// Scaled to 1: two remote ReplicaSets go, the local pods are removed.
async fn scaling_down_removes_remote_replica_sets_and_local_pods(shop: &Shop) -> Result<()> {
    let start = Instant::now();
    shop.deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 1 } })),
        )
        .await?;
    wait_for("one remote ReplicaSet and one local pod", WAIT, || async {
        let rs = shop.remote_rs.list(&shop.ours).await?.items;
        let all_local = shop
            .pods
            .list(&ListParams::default().labels("app=web"))
            .await?
            .items;
        Ok(rs.len() == 1 && all_local.len() == 1)
    })
    .await?;
    let remote = shop.remote_pods.list(&shop.ours).await?.items;
    assert_eq!(remote.len(), 1, "{:?}", names_of(&remote));
    eprintln!("scaled down in {:?}", start.elapsed());
    Ok(())
}

/// Unoffload: the twin namespace goes, and the offloading with it.
async fn unoffload_removes_the_twin_namespace(pair: &Pair, shop: &Shop) -> Result<()> {
    let start = Instant::now();
    shop.deployments
        .delete("web", &DeleteParams::default())
        .await?;
    wait_for("no local pods", WAIT, || async {
        Ok(shop
            .pods
            .list(&ListParams::default().labels("app=web"))
            .await?
            .items
            .is_empty())
    })
    .await?;
    pair.on_consumer(&["unoffload", "namespace", NS, "--timeout=60"])
        .success();
    wait_for("the twin namespace to be gone", WAIT, || async {
        Ok(shop.remote_namespaces.get_opt(TWIN).await?.is_none()
            && shop
                .offloadings
                .get_opt(names::NAMESPACE_OFFLOADING)
                .await?
                .is_none())
    })
    .await?;
    eprintln!("twin namespace gone in {:?}", start.elapsed());
    Ok(())
}

fn names_of<K: kube::Resource>(objs: &[K]) -> Vec<String> {
    objs.iter()
        .map(|o| o.meta().name.clone().unwrap_or_default())
        .collect()
}
