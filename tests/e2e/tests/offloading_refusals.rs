//! A workload its providers' terms refuse is refused on the consumer the
//! Kubernetes way, not in a storm of Failed pods: an offloaded namespace
//! carries its providers' Pod Security level, so a pod below it is refused
//! at creation (`FailedCreate` on its ReplicaSet, whose controller backs
//! off), `offload namespace` names the workloads that would be refused,
//! and `liqoctl info` says the namespace is not ready, how many pods and
//! why. Under the default terms (`baseline`), an ordinary image that runs
//! as root runs on the provider.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, PostParams};
use liqo_api::core::ForeignCluster;
use liqo_e2e::fixture::pod::running;
use liqo_e2e::fixture::{PROVIDER_ID, Pair, Stage, WAIT};
use liqo_e2e::wait_for;
use serde_json::{Value, json};

const NS: &str = "shop";
const ENFORCE: &str = "pod-security.kubernetes.io/enforce";

/// A Deployment of `replicas` pods of an image that runs as root, as
/// `kubectl create deployment web --image=nginx` makes it.
fn root_deployment(name: &str, replicas: i32) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{ "name": "nginx", "image": "nginx" }] },
            },
        },
    }))?)
}

/// The pods of `app` in the namespace.
async fn pods_of(pods: &Api<Pod>, app: &str) -> Result<Vec<Pod>> {
    Ok(pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?
        .items)
}

async fn labels_of(namespaces: &Api<Namespace>) -> Result<BTreeMap<String, String>> {
    Ok(namespaces
        .get(NS)
        .await?
        .metadata
        .labels
        .unwrap_or_default())
}

/// The level the namespace enforces, if any.
async fn enforced(namespaces: &Api<Namespace>) -> Result<Option<String>> {
    Ok(labels_of(namespaces).await?.get(ENFORCE).cloned())
}

/// `offload namespace` of [`NS`], Remote, with `more` flags.
fn offload(pair: &Pair, more: &[&str]) -> liqo_e2e::Run {
    let mut args = vec![
        "offload",
        "namespace",
        NS,
        "--pod-offloading-strategy=Remote",
    ];
    args.extend(more);
    pair.on_consumer(&args).success()
}

/// The provider's level as the consumer's virtual kubelet last read it.
async fn level_read(pair: &Pair, level: &str) -> Result<()> {
    let peers: Api<ForeignCluster> = Api::all(pair.consumer_client.clone());
    wait_for(
        &format!("the provider's level {level} to be read"),
        WAIT,
        || async {
            let fc = peers.get(PROVIDER_ID).await?;
            Ok(fc
                .status
                .and_then(|s| s.admission)
                .is_some_and(|a| a.pod_security.as_str() == level))
        },
    )
    .await
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_the_terms_refuse_is_refused_at_creation_and_said_by_info() -> Result<()> {
    let pair = Pair::at(Stage::Peered).await?;
    let client = &pair.consumer_client;
    level_read(&pair, "baseline").await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({ "metadata": { "name": NS, "labels": { "team": "a" } } }),
            )?,
        )
        .await?;
    let out = offload(&pair, &["--wait", "--timeout=60"]);
    assert!(
        out.stdout.contains("pod security: baseline (enforced here"),
        "{}",
        out.stdout
    );
    assert_eq!(enforced(&namespaces).await?.as_deref(), Some("baseline"));

    // The default terms: an image that runs as root runs there.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    deployments
        .create(&PostParams::default(), &root_deployment("web", 5)?)
        .await?;
    wait_for("the 5 pods of web to run on the provider", WAIT, || async {
        let all = pods_of(&pods, "web").await?;
        Ok(all.len() == 5 && all.iter().all(running))
    })
    .await?;

    // The provider moves every peer to restricted: offloading again tells
    // which workloads it would refuse, and holds the namespace to it.
    pair.on_provider(&["sharing-policy", "set", "--pod-security=restricted"])
        .success();
    level_read(&pair, "restricted").await?;
    let out = offload(&pair, &[]);
    assert!(
        out.stderr.contains("warning: shop: deployment/web: cluster provider-1 would refuse its pods: violates PodSecurity \"restricted:latest\""),
        "{}",
        out.stderr
    );
    assert_eq!(enforced(&namespaces).await?.as_deref(), Some("restricted"));

    // Twenty pods the provider would refuse: none is made, the ReplicaSet
    // says why, and the running ones are untouched.
    deployments
        .create(&PostParams::default(), &root_deployment("refused", 20)?)
        .await?;
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), NS);
    wait_for("the ReplicaSet to say FailedCreate", WAIT, || async {
        let list = sets
            .list(&ListParams::default().labels("app=refused"))
            .await?;
        Ok(list.items.iter().any(|rs| {
            rs.status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| {
                    c.reason.as_deref() == Some("FailedCreate")
                        && c.message
                            .as_deref()
                            .is_some_and(|m| m.contains("violates PodSecurity"))
                })
        }))
    })
    .await?;
    // A while for a storm to show, if there were one.
    tokio::time::sleep(std::time::Duration::from_secs(15)).await;
    let all = pods.list(&ListParams::default()).await?.items;
    eprintln!(
        "pods in {NS} 15 s after the refused Deployment: {}",
        all.len()
    );
    assert_eq!(pods_of(&pods, "refused").await?.len(), 0);
    assert_eq!(all.len(), 5, "only web's pods");
    assert!(pods_of(&pods, "web").await?.iter().all(running));

    // info: not ready, how many and why.
    let info = pair.on_consumer(&["info", "-o", "json"]).success();
    let info: Value = serde_json::from_str(&info.stdout)?;
    let shop = info["offloadedNamespaces"]
        .as_array()
        .and_then(|all| all.iter().find(|o| o["namespace"] == NS))
        .context("shop in info")?;
    assert_eq!(shop["refusing"]["pods"], 20, "{shop}");
    assert!(
        shop["refusing"]["why"]
            .as_str()
            .is_some_and(|w| w.contains("violates PodSecurity")),
        "{shop}"
    );
    assert_eq!(shop["podSecurity"], "restricted (enforced)", "{shop}");
    let table = pair.on_consumer(&["info"]).success();
    assert!(
        table.stdout.contains("Not ready: 20 pods refused"),
        "{}",
        table.stdout
    );

    // The allowed form: the same Deployment made to pass restricted runs.
    let fine: Deployment = serde_json::from_value(liqo_e2e::restricted(serde_json::to_value(
        root_deployment("fine", 2)?,
    )?))?;
    deployments.create(&PostParams::default(), &fine).await?;
    wait_for(
        "the restricted pods to run on the provider",
        WAIT,
        || async {
            let all = pods_of(&pods, "fine").await?;
            Ok(all.len() == 2 && all.iter().all(running))
        },
    )
    .await?;

    // Its one provider leaves (unpeered with the namespace still
    // offloaded): no provider's level holds it any more.
    pair.on_consumer(&["unpeer", "--remote-kubeconfig", &pair.remote(), "--force"])
        .success();
    assert_eq!(enforced(&namespaces).await?, None);
    // Unoffloaded: the namespace's own labels come back.
    pair.on_consumer(&["unoffload", "namespace", NS]).success();
    let labels = labels_of(&namespaces).await?;
    assert_eq!(labels.get(ENFORCE), None, "{labels:?}");
    assert_eq!(labels.get("team").map(String::as_str), Some("a"));
    let annotations = namespaces
        .get(NS)
        .await?
        .metadata
        .annotations
        .unwrap_or_default();
    assert!(
        !annotations.contains_key(liqo_api::home_level::BEFORE),
        "{annotations:?}"
    );
    Ok(())
}
