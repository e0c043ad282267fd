//! The tethered mode (docs/tethering.md) on real clusters: the consumer
//! of the pair plays the laptop, the provider the company's cluster, its
//! anchor. Tethered, a Deployment of the laptop runs where the anchor's
//! scheduler puts it, one created afterwards too, a bare pod stays where it
//! ran, and the anchor's own pods land on the laptop's nodes, which the
//! laptop's scheduler no longer uses; untethered, the laptop's Deployment
//! runs at home again and nothing of the tether is left. A laptop that
//! provides for another peer is refused, and so are a second tether and
//! an untether of a cluster that is not tethered; a tether that fails
//! half-way leaves nothing behind. With a token of the
//! anchor's, the laptop makes its side alone and the anchor peers back
//! with a token of the laptop's; `untether` then needs no kubeconfig.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::names::{self, peering};
use liqo_e2e::fixture::pod::running;
use liqo_e2e::fixture::{self, CONSUMER_ID, PROVIDER_ID, Pair, Stage, WAIT, spec};
use liqo_e2e::refusal::{Refusal, TEST_POLICIES, allow, refuse};
use liqo_e2e::{liqoctl, wait_for};
use serde_json::json;

/// A Deployment of `replicas` pods that ask nothing of placement: where
/// they run is the schedulers' choice.
fn deployment(namespace: &str, name: &str, replicas: i32) -> Result<Deployment> {
    Ok(serde_json::from_value(liqo_e2e::restricted(json!({
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "app", "image": "nginx",
                        "resources": { "requests": { "cpu": "10m", "memory": "16Mi" } },
                    }],
                },
            },
        },
    })))?)
}

async fn create_namespace(client: &kube::Client, name: &str) -> Result<()> {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": name } }))?,
        )
        .await?;
    Ok(())
}

/// The names of a cluster's kwok nodes: its own nodes that run pods.
async fn kwok_nodes(client: &kube::Client) -> Result<BTreeSet<String>> {
    Ok(Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels("type=kwok"))
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect())
}

/// The running pods of `app` in `namespace`, by the node they are on.
async fn nodes_of(client: &kube::Client, namespace: &str, app: &str) -> Result<Vec<String>> {
    Ok(Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?
        .items
        .iter()
        .filter(|p| running(p) && p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect())
}

/// Waits until `want` pods of `app` run, every one on a node of `on`.
async fn all_on(
    client: &kube::Client,
    namespace: &str,
    app: &str,
    want: usize,
    on: &BTreeSet<String>,
    what: &str,
) -> Result<()> {
    wait_for(what, WAIT, || async {
        let nodes = nodes_of(client, namespace, app).await?;
        Ok(nodes.len() == want && nodes.iter().all(|n| on.contains(n)))
    })
    .await
}

/// The mode `liqoctl info -o json` shows.
fn mode(pair: &Pair, on_consumer: bool) -> Result<String> {
    let args = ["info", "-o", "json"];
    let out = if on_consumer {
        pair.on_consumer(&args)
    } else {
        pair.on_provider(&args)
    }
    .success();
    let info: serde_json::Value = serde_json::from_str(&out.stdout)?;
    info["mode"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("no mode in {info}"))
}

/// Each node's taints, by key.
async fn taints(client: &kube::Client) -> Result<BTreeMap<String, BTreeSet<String>>> {
    Ok(Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|n| {
            let keys = n
                .spec
                .and_then(|s| s.taints)
                .into_iter()
                .flatten()
                .map(|t| t.key)
                .collect();
            (n.metadata.name.unwrap_or_default(), keys)
        })
        .collect())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tethered_cluster_is_scheduled_by_its_anchor_until_untethered() -> Result<()> {
    let pair = Pair::at(Stage::Installed).await?;
    let (laptop, company) = (&pair.consumer_client, &pair.provider_client);
    let laptop_nodes = kwok_nodes(laptop).await?;
    let company_nodes = kwok_nodes(company).await?;
    let on_company = BTreeSet::from([peering::virtual_node(&ClusterId::new(PROVIDER_ID)?)]);
    let pp = PostParams::default();

    // The laptop's work before the tether: a Deployment and a bare pod.
    create_namespace(laptop, "shop").await?;
    let deployments: Api<Deployment> = Api::namespaced(laptop.clone(), "shop");
    deployments
        .create(&pp, &deployment("shop", "web", 3)?)
        .await?;
    let bare: Pod = serde_json::from_value(liqo_e2e::restricted(json!({
        "metadata": { "name": "bare", "namespace": "shop", "labels": { "app": "bare" } },
        "spec": { "containers": [{ "name": "app", "image": "nginx" }] },
    })))?;
    Api::<Pod>::namespaced(laptop.clone(), "shop")
        .create(&pp, &bare)
        .await?;
    all_on(laptop, "shop", "web", 3, &laptop_nodes, "web at home").await?;
    all_on(laptop, "shop", "bare", 1, &laptop_nodes, "bare at home").await?;
    create_namespace(company, "hq").await?;
    let before = pair.holdings().await?;
    let taints_before = taints(laptop).await?;
    assert_eq!(mode(&pair, true)?, "autonomous");

    // Tether.
    let started = Instant::now();
    let out = pair
        .on_consumer(&["tether", "--remote-kubeconfig", &pair.remote(), "--yes"])
        .success();
    eprintln!("tether took {:?}: {}", started.elapsed(), out.stdout);
    assert!(out.stdout.contains("is tethered to"), "{}", out.stdout);
    assert_eq!(mode(&pair, true)?, format!("tethered to {PROVIDER_ID}"));
    assert_eq!(mode(&pair, false)?, format!("anchor of {CONSUMER_ID}"));
    // Each of its own nodes has the taint, and keeps its others.
    let tethered = taints(laptop).await?;
    for (node, before) in &taints_before {
        let mut want = before.clone();
        want.insert(names::TETHERED_TAINT.to_owned());
        assert_eq!(tethered.get(node), Some(&want), "the taints of {node}");
    }

    // The Deployment restarted through the anchor, whose scheduler put
    // its pods on the anchor's nodes; a new one goes the same way; the
    // bare pod was left where it ran.
    all_on(
        laptop,
        "shop",
        "web",
        3,
        &on_company,
        "web through the anchor",
    )
    .await?;
    all_on(
        company,
        "shop-consumer",
        "web",
        3,
        &company_nodes,
        "web on the anchor's nodes",
    )
    .await?;
    deployments
        .create(&pp, &deployment("shop", "late", 2)?)
        .await?;
    all_on(
        laptop,
        "shop",
        "late",
        2,
        &on_company,
        "late through the anchor",
    )
    .await?;
    all_on(
        laptop,
        "shop",
        "bare",
        1,
        &laptop_nodes,
        "bare still at home",
    )
    .await?;

    // The anchor's own pods land on the laptop's nodes.
    pair.on_provider(&[
        "offload",
        "namespace",
        "hq",
        "--pod-offloading-strategy",
        "Remote",
        "--wait",
    ])
    .success();
    Api::<Deployment>::namespaced(company.clone(), "hq")
        .create(&pp, &deployment("hq", "desk", 2)?)
        .await?;
    all_on(
        laptop,
        "hq-provider",
        "desk",
        2,
        &laptop_nodes,
        "desk on the laptop",
    )
    .await?;

    // Tethered twice: refused, nothing changed.
    let again = pair
        .on_consumer(&["tether", "--remote-kubeconfig", &pair.remote(), "--yes"])
        .user_error(6);
    assert!(
        again
            .error_line()
            .contains("already tethered to provider-1"),
        "{}",
        again.error_line()
    );

    // Made with the anchor's kubeconfig, it is untethered with it.
    let without = pair.on_consumer(&["untether", "--yes"]).user_error(2);
    assert!(
        without.error_line().contains("--remote-kubeconfig"),
        "{}",
        without.error_line()
    );

    // Untether: the laptop's workloads come home.
    let started = Instant::now();
    pair.on_consumer(&["untether", "--remote-kubeconfig", &pair.remote(), "--yes"])
        .success();
    eprintln!("untether took {:?}", started.elapsed());
    assert_eq!(mode(&pair, true)?, "autonomous");
    assert_eq!(mode(&pair, false)?, "autonomous");
    all_on(laptop, "shop", "web", 3, &laptop_nodes, "web at home again").await?;
    all_on(laptop, "shop", "late", 2, &laptop_nodes, "late at home").await?;
    all_on(laptop, "shop", "bare", 1, &laptop_nodes, "bare never moved").await?;
    let mut taints_after = taints(laptop).await?;
    taints_after.retain(|node, _| taints_before.contains_key(node));
    assert_eq!(taints_after, taints_before, "the laptop's nodes' taints");
    let not_tethered = pair
        .on_consumer(&["untether", "--remote-kubeconfig", &pair.remote(), "--yes"])
        .user_error(6);
    assert!(
        not_tethered.error_line().contains("is not tethered"),
        "{}",
        not_tethered.error_line()
    );

    // Nothing of the tether is left: what differs is what the test made
    // meanwhile (the late Deployment, the anchor's offloading of hq and
    // its Deployment).
    pair.on_provider(&["unoffload", "namespace", "hq"])
        .success();
    pair.assert_as_before(&before, "untether", &["deployments/", "rolebindings/hq/"])
        .await?;
    Ok(())
}

/// A tether that fails half-way removes what it made, newest first, and
/// leaves both clusters as they were: failing in its hand-over (the
/// laptop's API server refuses the offloading of one namespace, after an
/// earlier one was made), and in its restart (it refuses deleting the
/// pods to restart, after the taints and the marks were made). The same
/// command finishes it once the cause is gone.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tether_failing_half_way_leaves_both_clusters_as_they_were() -> Result<()> {
    let pair = Pair::at(Stage::Installed).await?;
    let laptop = &pair.consumer_client;
    let laptop_nodes = kwok_nodes(laptop).await?;
    // Offloaded after `default`, which the hand-over offloads first; a
    // pod of it runs at home, for the restart.
    create_namespace(laptop, "shop").await?;
    Api::<Deployment>::namespaced(laptop.clone(), "shop")
        .create(&PostParams::default(), &deployment("shop", "web", 1)?)
        .await?;
    all_on(laptop, "shop", "web", 1, &laptop_nodes, "web at home").await?;
    let before = pair.holdings().await?;
    let taints_before = taints(laptop).await?;
    let tether = ["tether", "--remote-kubeconfig", &pair.remote(), "--yes"];

    let in_shop = |resource, operation| Refusal {
        group: if resource == "pods" { "" } else { names::GROUP },
        version: "*",
        resource,
        operation,
        refuse: "request.namespace == 'shop'".to_owned(),
        reason: Some("Forbidden"),
    };
    for (phase, refusal) in [
        (
            "Offloading the namespaces",
            in_shop("namespaceoffloadings", "CREATE"),
        ),
        ("Restarting the workloads' pods", in_shop("pods", "DELETE")),
    ] {
        refuse(laptop, &refusal).await?;
        let failed = pair.on_consumer(&tether);
        allow(laptop).await?;
        let failed = failed.user_error(6);
        assert!(
            failed.stderr.contains(&format!("✘ {phase}")),
            "{phase} did not fail:\n{}",
            failed.stderr
        );
        assert!(
            failed.stderr.contains("✔ Rolling back what this run made"),
            "{phase}: no complete rollback:\n{}",
            failed.stderr
        );
        assert_eq!(mode(&pair, true)?, "autonomous", "after {phase}");
        assert_eq!(mode(&pair, false)?, "autonomous", "after {phase}");
        assert_eq!(taints(laptop).await?, taints_before, "after {phase}");
        all_on(laptop, "shop", "web", 1, &laptop_nodes, "web still at home").await?;
        pair.assert_as_before(
            &before,
            &format!("a tether failed at {phase}"),
            &[TEST_POLICIES],
        )
        .await?;
    }

    // Nothing refused: the same command tethers, and untether ends it.
    pair.on_consumer(&tether).success();
    assert_eq!(mode(&pair, true)?, format!("tethered to {PROVIDER_ID}"));
    pair.on_consumer(&["untether", "--remote-kubeconfig", &pair.remote(), "--yes"])
        .success();
    assert_eq!(mode(&pair, false)?, "autonomous");
    all_on(laptop, "shop", "web", 1, &laptop_nodes, "web at home again").await?;
    pair.assert_as_before(&before, "tether and untether", &[TEST_POLICIES])
        .await?;
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_provides_for_another_peer_is_not_tethered() -> Result<()> {
    let specs = vec![
        spec("laptop", 1, 1),
        spec("company", 2, 1),
        spec("other", 3, 1),
    ];
    let testbed = fixture::start(specs).await?;
    let [laptop, company, other] = [0, 1, 2].map(|i| &testbed.clusters()[i]);
    for (cluster, id, cidr) in [
        (laptop, "laptop-1", "10.201.0.0/16"),
        (company, "company-1", "10.202.0.0/16"),
        (other, "other-1", "10.203.0.0/16"),
    ] {
        liqo_e2e::install(cluster, id, cidr, &[]).success();
    }
    let path = |c: &liqo_testbed::Cluster| c.kubeconfig_path().display().to_string();
    // Another cluster consumes the laptop's resources.
    liqoctl(
        Some(other.kubeconfig_path()),
        &["peer", "--remote-kubeconfig", &path(laptop), "--no-network"],
    )
    .success();
    let laptop_client = laptop.client().await?;
    let company_client = company.client().await?;
    let before = (
        liqo_e2e::snapshot(&laptop_client).await?,
        liqo_e2e::snapshot(&company_client).await?,
    );

    let refused = liqoctl(
        Some(laptop.kubeconfig_path()),
        &["tether", "--remote-kubeconfig", &path(company), "--yes"],
    )
    .user_error(6);
    let line = refused.error_line();
    assert!(line.contains("provides for other-1"), "{line}");
    assert!(line.contains("unpeer"), "{line}");
    // The same kubeconfig twice is a usage error.
    let same = liqoctl(
        Some(laptop.kubeconfig_path()),
        &["tether", "--remote-kubeconfig", &path(laptop), "--yes"],
    )
    .user_error(2);
    assert!(
        same.error_line().contains("itself"),
        "{}",
        same.error_line()
    );
    let after = (
        liqo_e2e::snapshot(&laptop_client).await?,
        liqo_e2e::snapshot(&company_client).await?,
    );
    assert_eq!(before, after, "a refused tether changed something");

    // Once the other peering ends, the same command goes through.
    liqoctl(
        Some(other.kubeconfig_path()),
        &["unpeer", "--remote-kubeconfig", &path(laptop)],
    )
    .success();
    liqoctl(
        Some(laptop.kubeconfig_path()),
        &[
            "tether",
            "--remote-kubeconfig",
            &path(company),
            "--yes",
            "--no-network",
        ],
    )
    .success();
    Ok(())
}

/// The running pods of `app` in every namespace, by the node they are on.
async fn nodes_of_app(client: &kube::Client, app: &str) -> Result<Vec<String>> {
    Ok(Api::<Pod>::all(client.clone())
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?
        .items
        .iter()
        .filter(|p| running(p) && p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect())
}

/// `liqoctl generate peering-token --for FOR` on `cluster`, saved in `dir`.
fn token_for(
    cluster: &liqo_testbed::Cluster,
    for_id: &str,
    dir: &tempfile::TempDir,
) -> Result<String> {
    let out = liqoctl(
        Some(cluster.kubeconfig_path()),
        &["generate", "peering-token", "--for", for_id],
    )
    .success();
    let path = dir.path().join(format!("{for_id}.token"));
    std::fs::write(&path, out.stdout.trim())?;
    Ok(path.to_str().context("path")?.to_owned())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_tethers_with_a_token_and_its_anchor_peers_back_with_one() -> Result<()> {
    let pair = Pair::at(Stage::Installed).await?;
    let (laptop, company) = (&pair.consumer_client, &pair.provider_client);
    let laptop_nodes = kwok_nodes(laptop).await?;
    let company_nodes = kwok_nodes(company).await?;
    let on_company = BTreeSet::from([peering::virtual_node(&ClusterId::new(PROVIDER_ID)?)]);
    let pp = PostParams::default();
    let dir = tempfile::tempdir()?;
    create_namespace(laptop, "shop").await?;
    Api::<Deployment>::namespaced(laptop.clone(), "shop")
        .create(&pp, &deployment("shop", "web", 2)?)
        .await?;
    all_on(laptop, "shop", "web", 2, &laptop_nodes, "web at home").await?;
    create_namespace(company, "hq").await?;
    let before = pair.holdings().await?;

    // With the company's token: the laptop's side of the tether.
    let company_token = token_for(pair.provider(), CONSUMER_ID, &dir)?;
    let out = pair
        .on_consumer(&["tether", "--token-file", &company_token, "--yes"])
        .success();
    assert!(out.stdout.contains("is tethered to"), "{}", out.stdout);
    let said = format!("{}{}", out.stdout, out.stderr);
    assert!(
        said.contains(&format!(
            "liqoctl generate peering-token --for {PROVIDER_ID}"
        )),
        "how the anchor peers back is not said: {said}"
    );
    assert!(!said.contains("bootstrap"), "{said}");
    assert_eq!(mode(&pair, true)?, format!("tethered to {PROVIDER_ID}"));
    all_on(
        laptop,
        "shop",
        "web",
        2,
        &on_company,
        "web through the anchor",
    )
    .await?;
    wait_for("web on the anchor's nodes", WAIT, || async {
        let nodes = nodes_of_app(company, "web").await?;
        Ok(nodes.len() == 2 && nodes.iter().all(|n| company_nodes.contains(n)))
    })
    .await?;
    // Tethered twice, even with the kubeconfig: refused.
    let again = pair
        .on_consumer(&["tether", "--token-file", &company_token, "--yes"])
        .user_error(6);
    assert!(
        again
            .error_line()
            .contains("already tethered to provider-1"),
        "{}",
        again.error_line()
    );

    // The company peers back with the laptop's token: its pods land on
    // the laptop's nodes.
    let laptop_token = token_for(pair.consumer(), PROVIDER_ID, &dir)?;
    pair.on_provider(&["peer", "--token-file", &laptop_token, "--yes"])
        .success();
    pair.on_provider(&[
        "offload",
        "namespace",
        "hq",
        "--pod-offloading-strategy",
        "Remote",
        "--wait",
    ])
    .success();
    Api::<Deployment>::namespaced(company.clone(), "hq")
        .create(&pp, &deployment("hq", "desk", 2)?)
        .await?;
    wait_for("desk on the laptop's nodes", WAIT, || async {
        let nodes = nodes_of_app(laptop, "desk").await?;
        Ok(nodes.len() == 2 && nodes.iter().all(|n| laptop_nodes.contains(n)))
    })
    .await?;

    // Untethered without the company's kubeconfig: the laptop's work
    // comes home; the company's peering with the laptop is said, and
    // kept.
    let out = pair.on_consumer(&["untether", "--yes"]).success();
    let said = format!("{}{}", out.stdout, out.stderr);
    assert!(said.contains("still peers with this cluster"), "{said}");
    assert_eq!(mode(&pair, true)?, "autonomous");
    all_on(laptop, "shop", "web", 2, &laptop_nodes, "web at home again").await?;
    let not_tethered = pair.on_consumer(&["untether", "--yes"]).user_error(6);
    assert!(
        not_tethered.error_line().contains("is not tethered"),
        "{}",
        not_tethered.error_line()
    );

    // The company ends its own peering; with the unused tokens revoked,
    // nothing of either is left.
    pair.on_provider(&["unoffload", "namespace", "hq"])
        .success();
    pair.on_provider(&["unpeer", "--cluster-id", CONSUMER_ID, "--yes"])
        .success();
    // The laptop's garbage collector removes what the company's tenant
    // record owned there.
    let tenancy = peering::tenant_namespace(&ClusterId::new(PROVIDER_ID)?);
    wait_for(
        "the company's tenancy gone from the laptop",
        WAIT,
        || async {
            let left = Api::<Namespace>::all(laptop.clone())
                .get_opt(&tenancy)
                .await?;
            let roles = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(laptop.clone())
                .list(
                    &ListParams::default()
                        .labels(&format!("{}={PROVIDER_ID}", names::labels::PEER_CLUSTER_ID)),
                )
                .await?
                .items;
            let accounts = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
                laptop.clone(),
                names::NAMESPACE,
            )
            .list(
                &ListParams::default()
                    .labels(&format!("{}={PROVIDER_ID}", names::labels::PEER_CLUSTER_ID)),
            )
            .await?
            .items;
            Ok(left.is_none() && roles.is_empty() && accounts.is_empty())
        },
    )
    .await?;
    // And the company's garbage collector removes what the laptop's tenant
    // record owned there (it learns the record's kind within 30 s of the
    // install, so a quick test may get there first).
    let laptop_tenancy = peering::tenant_namespace(&ClusterId::new(CONSUMER_ID)?);
    wait_for(
        "the laptop's tenancy gone from the company",
        WAIT,
        || async {
            let left = Api::<Namespace>::all(company.clone())
                .get_opt(&laptop_tenancy)
                .await?;
            let roles = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(company.clone())
                .list(
                    &ListParams::default()
                        .labels(&format!("{}={CONSUMER_ID}", names::labels::PEER_CLUSTER_ID)),
                )
                .await?
                .items;
            Ok(left.is_none() && roles.is_empty())
        },
    )
    .await?;
    for on_consumer in [true, false] {
        let args = ["revoke", "peering-token", "--all", "--yes"];
        if on_consumer {
            pair.on_consumer(&args)
        } else {
            pair.on_provider(&args)
        }
        .success();
    }
    pair.assert_as_before(&before, "untether", &["deployments/", "rolebindings/hq/"])
        .await?;
    Ok(())
}
