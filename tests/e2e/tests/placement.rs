//! `liqoctl offload namespace` and placement: the unmodified scheduler binds
//! the pods of a namespace offloaded with Remote to the virtual node (the
//! MutatingAdmissionPolicies give them the toleration and the node
//! selector), and pods of other namespaces never tolerate a virtual node.
//! Also the command's checks (exit 2 and 7), `-o yaml`, `info`, and
//! `unoffload` removing what offload added. Only binding (`spec.nodeName`)
//! is checked: running the pods is the virtual kubelet's.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, PostParams};
use liqo_api::ClusterId;
use liqo_api::names::{self, labels, peering};
use liqo_api::offloading::NamespaceOffloading;
use liqo_e2e::fixture::{One, Pair, Stage, spec};
use liqo_e2e::liqoctl;
use serde_json::json;

fn pod(name: &str) -> Pod {
    serde_json::from_value(liqo_e2e::restricted(json!({
        "metadata": { "name": name },
        "spec": { "containers": [{ "name": "c", "image": "busybox" }] },
    })))
    .expect("pod")
}

async fn bound_to(pods: &Api<Pod>, name: &str) -> Result<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let node = pods.get(name).await?.spec.and_then(|s| s.node_name);
        if let Some(node) = node {
            return Ok(node);
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "pod {name} is not bound"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A pod with a required node affinity of its own: one term, `key op
/// values`.
fn pod_requiring(name: &str, key: &str, op: &str, values: &[&str]) -> Pod {
    serde_json::from_value(liqo_e2e::restricted(json!({
        "metadata": { "name": name },
        "spec": {
            "containers": [{ "name": "c", "image": "busybox" }],
            "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{ "matchExpressions": [
                    { "key": key, "operator": op, "values": values },
                ] }],
            } } },
        },
    })))
    .expect("pod")
}

/// Creates a pod, retrying while the placement policy has not seen the
/// namespace's offloading yet (it reads parameters from a cache, and
/// refuses pods of offloaded namespaces until then).
/// Creates `pod`, retried while the placement policy's parameter is not
/// seen yet (`liqoctl offload` writes the offloading just before the
/// namespace's labels); returns it as stored.
pub(crate) async fn create(pods: &Api<Pod>, pod: &Pod) -> Result<Pod> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match pods.create(&PostParams::default(), pod).await {
            Err(kube::Error::Api(s))
                if s.message.contains("no params found")
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return Ok(other?),
        }
    }
}

fn affinity_of(p: &Pod) -> String {
    serde_json::to_string(&p.spec.as_ref().map(|s| &s.affinity)).expect("serializes")
}

fn tolerates_virtual_nodes(p: &Pod) -> bool {
    p.spec
        .iter()
        .flat_map(|s| s.tolerations.iter().flatten())
        .any(|t| t.key.as_deref() == Some(names::VIRTUAL_NODE_TAINT))
}

/// Makes each of `names` on the cluster of `client`.
async fn namespaces(client: &kube::Client, names: &[&str]) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in names {
        let object: Namespace = serde_json::from_value(json!({ "metadata": { "name": ns } }))?;
        namespaces.create(&PostParams::default(), &object).await?;
    }
    Ok(())
}

/// The labels of namespace `name`.
async fn labels_of(client: &kube::Client, name: &str) -> Result<BTreeMap<String, String>> {
    let namespace = Api::<Namespace>::all(client.clone()).get(name).await?;
    Ok(namespace.metadata.labels.unwrap_or_default())
}

/// `liqoctl` on the consumer, which must succeed; the agents' logs are
/// printed when it does not.
fn on_consumer_or_logs(pair: &Pair, args: &[&str]) {
    let out = pair.on_consumer(args);
    if out.code != 0 {
        eprintln!("--- agent logs ---\n{}", pair.consumer().pod_logs());
    }
    out.success();
}

/// A consumer of two nodes, with the namespaces `names`, peered with a
/// provider of one, granted 20 pods; the name of its virtual node.
async fn peered_with(names: &[&str]) -> Result<(Pair, String)> {
    let pair = Pair::with_nodes(2, 1, Stage::Installed).await?;
    namespaces(&pair.consumer_client, names).await?;
    let remote = pair.remote();
    on_consumer_or_logs(
        &pair,
        &[
            "peer",
            "--remote-kubeconfig",
            &remote,
            "--pods=20",
            "--timeout=90",
        ],
    );
    let virtual_node = peering::virtual_node(&ClusterId::new("provider-1")?);
    Ok((pair, virtual_node))
}

/// `liqoctl offload namespace` checks its flags before the cluster (exit
/// 2) and refuses a namespace that is not there (exit 7), and `-o yaml`
/// prints what it would apply: none of them writes anything.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offload_refused_or_only_printed_writes_nothing() -> Result<()> {
    let consumer = One::start(spec("consumer", 1, 1)).await?;
    liqo_e2e::install(consumer.cluster(), "consumer-1", "10.201.0.0/16", &[]).success();
    let kubeconfig = consumer.cluster().kubeconfig_path();
    let client = consumer.client.clone();
    namespaces(&client, &["remote"]).await?;

    liqoctl(
        Some(kubeconfig),
        &[
            "offload",
            "namespace",
            "remote",
            "--namespace-mapping-strategy",
            "SelectedName",
        ],
    )
    .user_error(2);
    liqoctl(
        Some(kubeconfig),
        &["offload", "namespace", "remote", "--selector", "a in b"],
    )
    .user_error(2);
    liqoctl(
        Some(kubeconfig),
        &["offload", "namespace", "remote", "missing"],
    )
    .user_error(7);
    assert!(
        Api::<NamespaceOffloading>::namespaced(client.clone(), "remote")
            .get_opt(names::NAMESPACE_OFFLOADING)
            .await?
            .is_none(),
        "a refused offload wrote"
    );
    // -o yaml prints and applies nothing.
    let printed = liqoctl(
        Some(kubeconfig),
        &[
            "offload",
            "namespace",
            "remote",
            "--pod-offloading-strategy",
            "Remote",
            "-o",
            "yaml",
        ],
    )
    .success();
    for want in [
        "kind: NamespaceOffloading",
        "namespace: remote",
        "podOffloadingStrategy: Remote",
    ] {
        assert!(printed.stdout.contains(want), "{}", printed.stdout);
    }
    assert!(
        Api::<NamespaceOffloading>::namespaced(client.clone(), "remote")
            .get_opt(names::NAMESPACE_OFFLOADING)
            .await?
            .is_none(),
        "-o yaml applied"
    );
    liqoctl(Some(kubeconfig), &["unoffload", "namespace", "missing"]).user_error(7);
    Ok(())
}

/// The pods of a namespace offloaded with Remote are bound to the virtual
/// node every time, those of a LocalAndRemote one whose selector matches
/// no provider tolerate it but stay local, and those of any other
/// namespace never tolerate it; unoffloaded, a namespace's new pods stay
/// local.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn offloaded_pods_land_on_the_virtual_node_and_others_never() -> Result<()> {
    let (pair, virtual_node) = peered_with(&["remote", "mixed", "plain"]).await?;
    let client = pair.consumer_client.clone();
    on_consumer_or_logs(
        &pair,
        &[
            "offload",
            "namespace",
            "remote",
            "--pod-offloading-strategy",
            "Remote",
            "--selector",
            "liqo.io/remote-cluster-id=provider-1",
            "--wait",
            "--timeout=60",
        ],
    );
    pair.on_consumer(&[
        "offload",
        "namespace",
        "mixed",
        "--selector",
        "liqo.io/remote-cluster-id=nope",
    ])
    .success();
    // --wait returned once the provider's agent reported the twin ready.
    let status = Api::<NamespaceOffloading>::namespaced(client.clone(), "remote")
        .get(names::NAMESPACE_OFFLOADING)
        .await?
        .status
        .unwrap_or_default();
    assert!(
        status
            .clusters
            .iter()
            .any(|c| c.cluster_id.as_str() == "provider-1"
                && c.ready
                && c.remote_namespace == "remote-consumer"),
        "{status:?}"
    );
    let twin = Api::<Namespace>::all(pair.provider_client.clone())
        .get("remote-consumer")
        .await?;
    let twin_labels = twin.metadata.labels.unwrap_or_default();
    assert_eq!(
        twin_labels.get(labels::TENANT).map(String::as_str),
        Some("consumer-1")
    );
    let labelled = labels_of(&client, "remote").await?;
    assert_eq!(
        labelled.get(labels::OFFLOADING).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        labelled
            .get(labels::POD_OFFLOADING_STRATEGY)
            .map(String::as_str),
        Some("Remote")
    );
    let info = pair.on_consumer(&["info", "-o", "json"]).success();
    let info: serde_json::Value = serde_json::from_str(&info.stdout)?;
    let offloaded = info["offloadedNamespaces"].to_string();
    assert!(
        offloaded.contains("\"remote\"") && offloaded.contains("\"mixed\""),
        "{offloaded}"
    );

    // Remote: on the virtual node, every time.
    let remote_pods: Api<Pod> = Api::namespaced(client.clone(), "remote");
    for i in 0..3 {
        let name = format!("r{i}");
        create(&remote_pods, &pod(&name)).await?;
        assert_eq!(bound_to(&remote_pods, &name).await?, virtual_node);
    }
    let remote_pod = remote_pods.get("r0").await?;
    let affinity = affinity_of(&remote_pod);
    assert!(affinity.contains("provider-1"), "{affinity}");
    // LocalAndRemote: tolerates the virtual node, may land anywhere.
    let mixed_pods: Api<Pod> = Api::namespaced(client.clone(), "mixed");
    let mixed = create(&mixed_pods, &pod("m")).await?;
    assert!(tolerates_virtual_nodes(&mixed), "{:?}", mixed.spec);
    // Its selector matches no virtual node: local nodes remain allowed.
    let affinity = affinity_of(&mixed);
    assert!(
        affinity.contains("DoesNotExist") && affinity.contains("nope"),
        "{affinity}"
    );
    assert_ne!(bound_to(&mixed_pods, "m").await?, virtual_node);
    // Elsewhere: never tolerates, never on the virtual node.
    let plain_pods: Api<Pod> = Api::namespaced(client.clone(), "plain");
    for i in 0..3 {
        let name = format!("p{i}");
        let created = create(&plain_pods, &pod(&name)).await?;
        assert!(!tolerates_virtual_nodes(&created), "{:?}", created.spec);
        assert_ne!(bound_to(&plain_pods, &name).await?, virtual_node);
    }

    // Unoffload removes the offloading and the labels; new pods stay local.
    on_consumer_or_logs(
        &pair,
        &["unoffload", "namespace", "remote", "mixed", "--timeout=60"],
    );
    let labelled = labels_of(&client, "remote").await?;
    assert!(!labelled.contains_key(labels::OFFLOADING), "{labelled:?}");
    assert!(!labelled.contains_key(labels::POD_OFFLOADING_STRATEGY));
    let late = create(&remote_pods, &pod("late")).await?;
    assert!(!tolerates_virtual_nodes(&late));
    assert_ne!(bound_to(&remote_pods, "late").await?, virtual_node);
    Ok(())
}

/// A namespace's selector and a pod's own required affinity both hold: a
/// set-based selector that excludes the only provider leaves the pod
/// unbound rather than on an unselected provider, negations the provider
/// satisfies put it on the virtual node, and a pod's own affinity is
/// ANDed with the selector's.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_lands_only_where_its_namespaces_selector_and_its_own_affinity_allow() -> Result<()> {
    let (pair, virtual_node) = peered_with(&["remote", "picky", "negated"]).await?;
    let client = pair.consumer_client.clone();
    for (ns, selector, wait) in [
        ("remote", "liqo.io/remote-cluster-id=provider-1", true),
        (
            "picky",
            "liqo.io/remote-cluster-id notin (provider-1,other)",
            false,
        ),
        ("negated", "liqo.io/remote-cluster-id!=nope,!zone", false),
    ] {
        let mut args = vec![
            "offload",
            "namespace",
            ns,
            "--pod-offloading-strategy",
            "Remote",
            "--selector",
            selector,
        ];
        if wait {
            args.extend(["--wait", "--timeout=60"]);
        }
        on_consumer_or_logs(&pair, &args);
    }

    // A set-based selector that excludes the only provider: the pod gets
    // the affinity and stays unbound rather than land on an unselected
    // provider.
    let picky_pods: Api<Pod> = Api::namespaced(client.clone(), "picky");
    let picky = create(&picky_pods, &pod("x")).await?;
    let affinity = affinity_of(&picky);
    assert!(
        affinity.contains("NotIn") && affinity.contains("provider-1"),
        "{affinity}"
    );
    // Negations that the provider satisfies: its virtual node.
    let negated_pods: Api<Pod> = Api::namespaced(client.clone(), "negated");
    create(&negated_pods, &pod("n")).await?;
    assert_eq!(bound_to(&negated_pods, "n").await?, virtual_node);
    // A pod's own required affinity is ANDed with the selector's: one it
    // shares with the virtual node still lands there, one that excludes
    // the provider leaves no node.
    let remote_pods: Api<Pod> = Api::namespaced(client.clone(), "remote");
    let own = pod_requiring("own", labels::PEER_CLUSTER_NAME, "Exists", &[]);
    let own = create(&remote_pods, &own).await?;
    let affinity = affinity_of(&own);
    assert!(
        affinity.contains(labels::PEER_CLUSTER_NAME) && affinity.contains("provider-1"),
        "{affinity}"
    );
    // Each of the provider's terms asks for room on one of its nodes, or
    // for a virtual node that does not say it (an older agent).
    let terms: Vec<String> = own
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref()?.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| {
            r.node_selector_terms
                .iter()
                .map(|t| serde_json::to_string(t).unwrap_or_default())
                .collect()
        })
        .unwrap_or_default();
    let room = format!(
        r#""key":"{}","operator":"Exists""#,
        labels::LARGEST_FREE_CPU
    );
    let unsaid = format!(
        r#""key":"{}","operator":"DoesNotExist""#,
        labels::LARGEST_FREE_CPU
    );
    assert_eq!(
        (
            terms.iter().filter(|t| t.contains(&room)).count(),
            terms.iter().filter(|t| t.contains(&unsaid)).count()
        ),
        (1, 1),
        "{terms:?}"
    );
    assert_eq!(bound_to(&remote_pods, "own").await?, virtual_node);
    let contrary = pod_requiring(
        "contrary",
        labels::PEER_CLUSTER_ID,
        "NotIn",
        &["provider-1"],
    );
    create(&remote_pods, &contrary).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (pods, name) in [(&picky_pods, "x"), (&remote_pods, "contrary")] {
        let unbound = pods.get(name).await?;
        assert_eq!(
            unbound.spec.and_then(|s| s.node_name),
            None,
            "{name} was bound"
        );
    }
    Ok(())
}
