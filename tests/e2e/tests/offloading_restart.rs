//! Restart safety of the offloading at scale, on two real clusters (a
//! consumer whose host-process node runs the virtual kubelet, a provider
//! with two kwok nodes big enough for 500 pods and a grant that allows
//! them):
//!
//! - the virtual kubelet killed (SIGKILL) in the middle of a 500-pod
//!   scale-up and restarted by its node: every pod ends Running, one
//!   remote ReplicaSet and one remote pod per local pod, none orphaned or
//!   duplicated;
//! - the provider's API server paused for 60 s: the remote pods keep
//!   running (same UIDs), the virtual node goes NotReady and back to
//!   Ready, nothing is created twice.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::names::peering;
use liqo_e2e::fixture::pod::running;
use liqo_e2e::fixture::{PROVIDER_ID, Pair, Stage, WAIT, spec};
use liqo_e2e::wait_for;
use serde_json::json;

/// The label the virtual kubelet puts on remote ReplicaSets and pods.
const LOCAL_POD_UID: &str = "liqo.io/local-pod-uid";
const NS: &str = "fleet";
/// DefaultName: `<namespace>-<consumer cluster name>`.
const TWIN: &str = "fleet-consumer";
const SCALE: i32 = 500;
/// How long the scale-up may take; generous, the machine is shared.
const SCALE_WAIT: Duration = Duration::from_secs(600);

/// A consumer and a provider peered, the provider's nodes big enough for
/// [`SCALE`] pods and the grant (half of the free capacity by default)
/// with them, and [`NS`] offloaded. Returns the testbed, the consumer's
/// and the provider's clients and the virtual node's name.
async fn peered_and_offloaded()
-> Result<(liqo_testbed::Testbed, kube::Client, kube::Client, String)> {
    let mut provider = spec("provider", 2, 2);
    provider.node_pods = 1000;
    provider.node_cpu = "64".to_owned();
    provider.node_memory = "256Gi".to_owned();
    let pair = Pair::with_specs(spec("consumer", 1, 1), provider, Stage::Offloaded(NS)).await?;
    let Pair {
        testbed,
        consumer_client: local,
        provider_client: prov,
    } = pair;
    let node_name = peering::virtual_node(&ClusterId::new(PROVIDER_ID)?);
    let remote_namespaces: Api<Namespace> = Api::all(prov.clone());
    wait_for("the twin namespace", WAIT, || async {
        Ok(remote_namespaces.get_opt(TWIN).await?.is_some())
    })
    .await?;
    Ok((testbed, local, prov, node_name))
}

/// The node's Ready condition, when it has one.
fn node_ready(node: Option<&Node>) -> Option<bool> {
    node?
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status == "True")
}

fn deployment(replicas: i32) -> Deployment {
    serde_json::from_value(liqo_e2e::restricted(json!({
        "metadata": { "name": "fleet", "namespace": NS },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": "fleet" } },
            "template": {
                "metadata": { "labels": { "app": "fleet" } },
                "spec": {
                    "nodeSelector": liqo_e2e::virtual_node_selector(),
                    "tolerations": liqo_e2e::virtual_node_tolerations(),
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "app",
                        "image": "nginx",
                        "resources": { "requests": { "cpu": "1m", "memory": "1Mi" } },
                    }],
                },
            },
        },
    })))
    .expect("deployment")
}

/// What the provider holds for the offloaded pods, and checks against the
/// local pods: one ReplicaSet and one pod per local pod, by UID label,
/// nothing else.
struct Remote {
    rs: Api<ReplicaSet>,
    pods: Api<Pod>,
}

impl Remote {
    fn new(prov: &kube::Client) -> Self {
        Self {
            rs: Api::namespaced(prov.clone(), TWIN),
            pods: Api::namespaced(prov.clone(), TWIN),
        }
    }

    /// The UIDs of our ReplicaSets in the twin, by name.
    async fn replica_set_uids(&self) -> Result<BTreeMap<String, String>> {
        Ok(self
            .rs
            .list(&ListParams::default().labels(LOCAL_POD_UID))
            .await?
            .items
            .into_iter()
            .map(|r| {
                (
                    r.metadata.name.unwrap_or_default(),
                    r.metadata.uid.unwrap_or_default(),
                )
            })
            .collect())
    }

    /// Remote pods by their local pod's UID (all of them, to see twins).
    async fn pods_by_uid(&self) -> Result<BTreeMap<String, Vec<Pod>>> {
        let mut out: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
        for p in self
            .pods
            .list(&ListParams::default().labels(LOCAL_POD_UID))
            .await?
            .items
        {
            let uid = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LOCAL_POD_UID))
                .cloned()
                .unwrap_or_default();
            out.entry(uid).or_default().push(p);
        }
        Ok(out)
    }

    /// Whether every remote pod is controlled by the ReplicaSet of its
    /// local pod: the virtual kubelet makes a pod before its ReplicaSet,
    /// which adopts it.
    async fn all_adopted(&self) -> Result<bool> {
        let rs_by_uid: BTreeMap<String, String> = self
            .rs
            .list(&ListParams::default().labels(LOCAL_POD_UID))
            .await?
            .items
            .into_iter()
            .filter_map(|r| {
                let local = r.metadata.labels.as_ref()?.get(LOCAL_POD_UID)?.clone();
                Some((local, r.metadata.uid?))
            })
            .collect();
        Ok(self.pods_by_uid().await?.iter().all(|(local, pods)| {
            pods.iter().all(|p| {
                p.metadata.owner_references.iter().flatten().any(|o| {
                    o.controller == Some(true)
                        && o.kind == "ReplicaSet"
                        && rs_by_uid.get(local) == Some(&o.uid)
                })
            })
        }))
    }

    async fn rs_uids(&self) -> Result<Vec<String>> {
        Ok(self
            .rs
            .list(&ListParams::default().labels(LOCAL_POD_UID))
            .await?
            .items
            .into_iter()
            .filter_map(|r| r.metadata.labels?.get(LOCAL_POD_UID).cloned())
            .collect())
    }
}

/// Local pods of the Deployment (all, being deleted or not).
async fn local_pods(api: &Api<Pod>) -> Result<Vec<Pod>> {
    Ok(api
        .list(&ListParams::default().labels("app=fleet"))
        .await?
        .items)
}

/// Every local pod Running, and the provider holding exactly one
/// ReplicaSet and one Running pod per local pod.
async fn all_running_once(pods: &Api<Pod>, remote: &Remote, want: usize) -> Result<bool> {
    let local = local_pods(pods).await?;
    if local.len() != want || !local.iter().all(running) {
        return Ok(false);
    }
    let uids: BTreeSet<String> = local
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let mut rs = remote.rs_uids().await?;
    rs.sort();
    let remote_pods = remote.pods_by_uid().await?;
    Ok(rs.len() == want
        && rs.iter().cloned().collect::<BTreeSet<_>>() == uids
        && remote_pods.len() == want
        && remote_pods.keys().cloned().collect::<BTreeSet<_>>() == uids
        && remote_pods.values().all(|v| v.len() == 1 && running(&v[0])))
}

/// Asserts one ReplicaSet and one pod per local pod, by UID, with no
/// orphan (a UID no local pod has) and no duplicate.
async fn assert_one_each(pods: &Api<Pod>, remote: &Remote, want: usize) -> Result<()> {
    let local = local_pods(pods).await?;
    assert_eq!(local.len(), want, "local pods");
    let uids: BTreeSet<String> = local
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    assert_eq!(uids.len(), want);
    let rs = remote.rs_uids().await?;
    let rs_set: BTreeSet<String> = rs.iter().cloned().collect();
    assert_eq!(rs.len(), rs_set.len(), "a duplicated remote ReplicaSet");
    assert_eq!(rs_set, uids, "remote ReplicaSets against local pods");
    let remote_pods = remote.pods_by_uid().await?;
    let dup: Vec<_> = remote_pods.iter().filter(|(_, v)| v.len() != 1).collect();
    assert!(
        dup.is_empty(),
        "duplicated remote pods for {:?}",
        dup.iter().map(|(u, _)| u).collect::<Vec<_>>()
    );
    assert_eq!(
        remote_pods.keys().cloned().collect::<BTreeSet<_>>(),
        uids,
        "remote pods against local pods"
    );
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_in_the_middle_of_a_500_pod_scale_up() -> Result<()> {
    let (testbed, local, prov, node_name) = peered_and_offloaded().await?;
    let deployments: Api<Deployment> = Api::namespaced(local.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(local.clone(), NS);
    let remote = Remote::new(&prov);

    let start = Instant::now();
    deployments
        .create(&PostParams::default(), &deployment(SCALE))
        .await?;
    // Killed once a fifth of the ReplicaSets exist: well inside the
    // scale-up, with creations in flight.
    let fifth = usize::try_from(SCALE / 5)?;
    wait_for("a fifth of the remote ReplicaSets", SCALE_WAIT, || async {
        Ok(remote.rs_uids().await?.len() >= fifth)
    })
    .await?;
    let killed =
        liqo_e2e::kill_agent(testbed.cluster("consumer"), liqo_e2e::Agent::VirtualKubelet)?;
    let at_kill = remote.rs_uids().await?.len();
    eprintln!(
        "killed the virtual kubelet (pid {killed}) at {at_kill} remote ReplicaSets, {:?} in",
        start.elapsed()
    );
    assert!(
        at_kill < usize::try_from(SCALE)?,
        "the scale-up was over before the kill: {at_kill}"
    );
    liqo_e2e::agent_restarted(
        testbed.cluster("consumer"),
        liqo_e2e::Agent::VirtualKubelet,
        killed,
        WAIT,
    )
    .await?;

    let want = usize::try_from(SCALE)?;
    wait_for(
        "500 local pods Running, each with one Running remote pod",
        SCALE_WAIT,
        || all_running_once(&pods, &remote, want),
    )
    .await?;
    eprintln!(
        "{SCALE} pods Running through the provider in {:?}",
        start.elapsed()
    );
    // The restarted agent's later passes must not create anything again.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_one_each(&pods, &remote, want).await?;
    // Every pod is in the hands of its ReplicaSet (the provider's
    // controller adopts at its own pace).
    wait_for(
        "every remote pod adopted by its ReplicaSet",
        SCALE_WAIT,
        || remote.all_adopted(),
    )
    .await?;
    assert_one_each(&pods, &remote, want).await?;
    for p in local_pods(&pods).await? {
        let on = p.spec.as_ref().and_then(|s| s.node_name.clone());
        assert_eq!(on.as_deref(), Some(node_name.as_str()));
    }
    testbed.stop();
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_paused_for_a_minute() -> Result<()> {
    const PODS: i32 = 20;
    let (mut testbed, local, prov, node_name) = peered_and_offloaded().await?;
    let deployments: Api<Deployment> = Api::namespaced(local.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(local.clone(), NS);
    let nodes: Api<Node> = Api::all(local.clone());
    let remote = Remote::new(&prov);
    let want = usize::try_from(PODS)?;

    deployments
        .create(&PostParams::default(), &deployment(PODS))
        .await?;
    wait_for("the pods Running through the provider", SCALE_WAIT, || {
        all_running_once(&pods, &remote, want)
    })
    .await?;
    let uids_of = |by_uid: &BTreeMap<String, Vec<Pod>>| -> BTreeMap<String, String> {
        by_uid
            .iter()
            .map(|(local, v)| (local.clone(), v[0].metadata.uid.clone().unwrap_or_default()))
            .collect()
    };
    let before = uids_of(&remote.pods_by_uid().await?);
    let rs_before = remote.replica_set_uids().await?;

    let paused_at = Instant::now();
    testbed.cluster_mut("provider").pause_apiserver()?;
    eprintln!("provider's API server paused");
    let went_not_ready = wait_for("the virtual node to go NotReady", WAIT, || async {
        Ok(node_ready(nodes.get_opt(&node_name).await?.as_ref()) == Some(false))
    })
    .await;
    eprintln!("virtual node NotReady after {:?}", paused_at.elapsed());
    // Scale while the provider is away: nothing may be created for them
    // until it is back, and then once.
    deployments
        .patch(
            "fleet",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": PODS + 5 } })),
        )
        .await?;
    let left = Duration::from_secs(60).saturating_sub(paused_at.elapsed());
    tokio::time::sleep(left).await;
    testbed.cluster_mut("provider").resume_apiserver()?;
    eprintln!(
        "provider's API server resumed after {:?}",
        paused_at.elapsed()
    );
    went_not_ready?;

    wait_for("the virtual node Ready again", WAIT, || async {
        Ok(node_ready(nodes.get_opt(&node_name).await?.as_ref()) == Some(true))
    })
    .await?;
    let want = want + 5;
    wait_for("every pod Running through the provider", SCALE_WAIT, || {
        all_running_once(&pods, &remote, want)
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_one_each(&pods, &remote, want).await?;
    // The pods that ran before still run, the same remote pods.
    let after = uids_of(&remote.pods_by_uid().await?);
    for (local_uid, remote_uid) in &before {
        assert_eq!(
            after.get(local_uid),
            Some(remote_uid),
            "the remote pod of {local_uid} was replaced"
        );
    }
    let rs_after = remote.replica_set_uids().await?;
    for (name, uid) in &rs_before {
        assert_eq!(
            rs_after.get(name),
            Some(uid),
            "the ReplicaSet {name} was replaced"
        );
    }
    testbed.stop();
    Ok(())
}
