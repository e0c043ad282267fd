//! `liqoctl peer` and `unpeer` between two real clusters: a provider it
//! cannot peer with is refused before anything is written; the consumer's
//! identity is confined to its tenant on the provider (proven with real
//! requests made with its own certificate), the grant is enforced by a
//! ResourceQuota, the virtual node is Ready with the grant as capacity,
//! and unpeer leaves both clusters as they were, as do a tenancy the
//! provider ends alone, a forced unpeer and a peering both ways. Each test
//! starts from its own pair of clusters, [`install`]ed.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Node, ResourceQuota, Secret};
use kube::api::{Api, ListParams};
use liqo_api::names::{self, peering};
use liqo_api::{ClusterId, core::ForeignCluster};
use liqo_e2e::fixture::{Holdings, Pair, Stage};
use liqo_e2e::{snapshot, wait_for};

/// Installs liqo-rs on both clusters of `pair` (IDs `consumer-1` and
/// `provider-1`, with a cluster label): what each holds then, consumer
/// first.
async fn install(pair: &Pair) -> Result<Holdings> {
    let (consumer, provider) = (pair.consumer(), pair.provider());
    for (cluster, id, cidr) in [
        (consumer, "consumer-1", "10.201.0.0/16"),
        (provider, "provider-1", "10.202.0.0/16"),
    ] {
        liqo_e2e::install(cluster, id, cidr, &["--cluster-labels=region=eu-west"]).success();
    }
    pair.holdings().await
}

/// The NamespaceOffloading of the consumer's `default` namespace.
fn offloading_object() -> Result<liqo_api::offloading::NamespaceOffloading> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "liqo.io/v1alpha1", "kind": "NamespaceOffloading",
        "metadata": { "name": names::NAMESPACE_OFFLOADING },
        "spec": {},
    }))?)
}

/// Waits up to `within` for the namespace's offloading to be gone.
async fn offloading_gone(
    offloadings: &Api<liqo_api::offloading::NamespaceOffloading>,
    within: Duration,
) -> Result<()> {
    wait_for("the offloading to be gone", within, || async {
        Ok(offloadings
            .get_opt(names::NAMESPACE_OFFLOADING)
            .await?
            .is_none())
    })
    .await
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_refuses_what_it_cannot_peer_with_before_writing_anything() -> Result<()> {
    let pair = Pair::at(Stage::Started).await?;
    let (consumer, provider) = (pair.consumer(), pair.provider());
    // A provider without liqo-rs is refused first, saying so.
    let out = pair
        .on_consumer(&[
            "peer",
            "--remote-kubeconfig",
            provider.kubeconfig_path().to_str().context("path")?,
        ])
        .user_error(7);
    assert!(
        out.error_line().contains("not installed on cluster"),
        "{}",
        out.stderr
    );
    let before = install(&pair).await?;
    let (consumer_client, provider_client) =
        (pair.consumer_client.clone(), pair.provider_client.clone());

    // Refused before anything is written: itself, a request above the offer.
    let own = consumer.kubeconfig_path().to_str().context("path")?;
    pair.on_consumer(&["peer", "--remote-kubeconfig", own])
        .user_error(6);
    let remote = provider.kubeconfig_path().to_str().context("path")?;
    let out = pair
        .on_consumer(&[
            "peer",
            "--remote-kubeconfig",
            remote,
            "--cpu=1000",
            "--require-request",
        ])
        .user_error(6);
    assert!(out.error_line().contains("cannot grant"), "{}", out.stderr);
    // A provider running a version this liqoctl cannot speak to.
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(provider_client.clone(), names::NAMESPACE);
    let version_patch = |v: &str| {
        kube::api::Patch::Merge(serde_json::json!({ "data": { names::IDENTITY_VERSION_KEY: v } }))
    };
    maps.patch(
        names::IDENTITY_CONFIGMAP,
        &Default::default(),
        &version_patch("9.9.0"),
    )
    .await?;
    let out = pair
        .on_consumer(&["peer", "--remote-kubeconfig", remote])
        .user_error(6);
    assert!(
        out.error_line().contains("runs liqo-rs 9.9.0"),
        "{}",
        out.stderr
    );
    maps.patch(
        names::IDENTITY_CONFIGMAP,
        &Default::default(),
        &version_patch(liqo_api::VERSION),
    )
    .await?;
    assert_eq!(
        snapshot(&provider_client).await?,
        before.1,
        "a refused peer wrote on the provider"
    );
    assert_eq!(
        snapshot(&consumer_client).await?,
        before.0,
        "a refused peer wrote on the consumer"
    );

    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_confines_the_consumer_to_its_grant_and_unpeer_leaves_both_clusters_as_they_were()
-> Result<()> {
    let pair = Pair::at(Stage::Started).await?;
    let (consumer, provider) = (pair.consumer(), pair.provider());
    let before = install(&pair).await?;
    let (consumer_client, provider_client) =
        (pair.consumer_client.clone(), pair.provider_client.clone());
    let remote = provider.kubeconfig_path().to_str().context("path")?;

    let start = std::time::Instant::now();
    let out = pair.on_consumer(&[
        "peer",
        "--remote-kubeconfig",
        remote,
        "--cpu=2",
        "--memory=1Gi",
        "--pods=10",
        "-o",
        "json",
        "--timeout=90",
    ]);
    if out.code != 0 {
        eprintln!("--- agent logs ---\n{}", consumer.pod_logs());
    }
    let out = out.success();
    eprintln!("peer took {:?}", start.elapsed());
    let report: serde_json::Value = serde_json::from_str(&out.stdout)?;
    assert_eq!(report["grant"]["cpu"], "2");
    assert_eq!(report["grant"]["pods"], "10");

    // The virtual node stands for the provider with the grant.
    let provider_id = ClusterId::new("provider-1")?;
    let node: Node = Api::<Node>::all(consumer_client.clone())
        .get(&peering::virtual_node(&provider_id))
        .await?;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get(names::labels::VIRTUAL_NODE).map(String::as_str),
        Some("true")
    );
    assert_eq!(labels.get("region").map(String::as_str), Some("eu-west"));
    let capacity = node.status.and_then(|s| s.capacity).unwrap_or_default();
    assert_eq!(capacity.get("pods").map(|q| q.0.as_str()), Some("10"));

    // The grant is enforced on the provider by a ResourceQuota.
    let tenant_ns = peering::tenant_namespace(&ClusterId::new("consumer-1")?);
    let quota = Api::<ResourceQuota>::namespaced(provider_client.clone(), &tenant_ns)
        .get("liqo-grant")
        .await?;
    let hard = quota.spec.and_then(|s| s.hard).unwrap_or_default();
    assert_eq!(hard.get("pods").map(|q| q.0.as_str()), Some("10"));
    let fc = Api::<ForeignCluster>::all(consumer_client.clone())
        .get("provider-1")
        .await?;
    assert!(fc.status.and_then(|s| s.certificate_expiry).is_some());
    // The provider records the tenant, its request and grant, with status.
    let tenant = Api::<liqo_api::authentication::Tenant>::all(provider_client.clone())
        .get("consumer-1")
        .await?;
    assert_eq!(
        tenant.spec.grant.pods.as_ref().map(|q| q.0.as_str()),
        Some("10")
    );
    assert!(tenant.spec.request.is_some());
    let granted = tenant.status.map(|s| s.conditions).unwrap_or_default();
    assert!(
        granted
            .iter()
            .any(|c| c.type_ == "Granted" && c.status == "True"),
        "{granted:?}"
    );

    // Peering again changes nothing and succeeds.
    pair.on_consumer(&[
        "peer",
        "--remote-kubeconfig",
        remote,
        "--cpu=2",
        "--memory=1Gi",
        "--pods=10",
    ])
    .success();

    // The identity's key stays on the consumer: the provider holds no Secret with it.
    let secret = Api::<Secret>::namespaced(consumer_client.clone(), names::NAMESPACE)
        .get(&peering::identity_secret(&provider_id))
        .await?;
    assert!(secret.data.is_some_and(|d| d.contains_key("kubeconfig")));

    // The consumer's own certificate, used as it is: confined to its tenant.
    let peer = liqo_e2e::peer_client(consumer, &consumer_client, provider_id.as_str()).await?;
    let allowed = liqo_e2e::least_privilege_probe(&peer, &tenant_ns).await?;
    assert!(allowed >= 3, "the identity could not do its own work");

    // Unpeer refuses while a namespace is offloaded to the provider.
    let offloadings: Api<liqo_api::offloading::NamespaceOffloading> =
        Api::namespaced(consumer_client.clone(), "default");
    let offloading = offloading_object()?;
    offloadings.create(&Default::default(), &offloading).await?;
    let out = pair
        .on_consumer(&["unpeer", "--remote-kubeconfig", remote])
        .user_error(6);
    assert!(out.error_line().contains("offloaded"), "{}", out.stderr);
    offloadings
        .delete(names::NAMESPACE_OFFLOADING, &Default::default())
        .await?;
    // The virtual kubelet made the twin namespace on the provider, and
    // its finalizer keeps the offloading until the twin is deleted.
    offloading_gone(&offloadings, Duration::from_secs(60)).await?;

    let start = std::time::Instant::now();
    pair.on_consumer(&["unpeer", "--remote-kubeconfig", remote])
        .success();
    eprintln!("unpeer took {:?}", start.elapsed());
    // The provider's gateway saw the tenant namespace go with its share,
    // and did not take that for a failure.
    let logs = provider.pod_logs();
    assert!(
        !logs.lines().any(
            |l| l.contains("cannot keep the tenants' shares") && l.contains("being terminated")
        ),
        "{logs}"
    );
    pair.assert_as_before(&before, "unpeer", &[]).await?;
    // The certificate cannot be revoked, but it no longer authorizes anything.
    for (what, result) in [
        (
            "read the provider's identity",
            Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
                peer.clone(),
                names::NAMESPACE,
            )
            .get(names::IDENTITY_CONFIGMAP)
            .await
            .map(|_| ()),
        ),
        (
            "list pods in its old namespace",
            Api::<k8s_openapi::api::core::v1::Pod>::namespaced(peer.clone(), &tenant_ns)
                .list(&ListParams::default())
                .await
                .map(|_| ()),
        ),
    ] {
        assert!(
            matches!(result, Err(kube::Error::Api(ref s)) if s.code == 403),
            "after unpeer it may still {what}: {result:?}"
        );
    }
    wait_for("no virtual node", Duration::from_secs(5), || {
        let nodes: Api<Node> = Api::all(consumer_client.clone());
        async move {
            Ok(nodes
                .list(&ListParams::default().labels(names::labels::VIRTUAL_NODE))
                .await?
                .items
                .is_empty())
        }
    })
    .await?;
    Ok(())
}

/// Renewal: `peer --renew` issues a new certificate (here with the
/// shortest lifetime a signer takes), the Secret is updated in place, the
/// agent reloads it and its node stays Ready throughout.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_renew_issues_a_new_certificate_that_the_agent_reloads() -> Result<()> {
    let pair = Pair::at(Stage::Peered).await?;
    let consumer = pair.consumer();
    let consumer_client = pair.consumer_client.clone();
    let remote = pair.remote();
    let remote = remote.as_str();
    let provider_id = ClusterId::new("provider-1")?;
    let old = liqo_e2e::identity_kubeconfig(&consumer_client, provider_id.as_str()).await?;
    pair.on_consumer(&[
        "peer",
        "--remote-kubeconfig",
        remote,
        "--renew",
        "--certificate-lifetime=600",
    ])
    .success();
    let new = liqo_e2e::identity_kubeconfig(&consumer_client, provider_id.as_str()).await?;
    assert_ne!(old, new, "the identity was not renewed");
    let lifetime = certificate_lifetime(&new)?;
    assert!(
        (570..=600).contains(&lifetime),
        "asked 600 s, {lifetime} s left"
    );
    wait_for(
        "the agent to reload its kubeconfig",
        Duration::from_secs(15),
        || async {
            Ok(consumer
                .pod_logs()
                .contains("reloaded the provider kubeconfig"))
        },
    )
    .await?;
    for _ in 0..6 {
        let node = Api::<Node>::all(consumer_client.clone())
            .get(&peering::virtual_node(&provider_id))
            .await?;
        let ready = node.status.and_then(|s| s.conditions).unwrap_or_default();
        assert!(
            ready
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True"),
            "NotReady after renewal: {ready:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenancy_ended_by_the_provider_or_a_forced_unpeer_leaves_both_clusters_as_they_were()
-> Result<()> {
    let pair = Pair::at(Stage::Started).await?;
    let provider = pair.provider();
    let before = install(&pair).await?;
    let (consumer_client, provider_client) =
        (pair.consumer_client.clone(), pair.provider_client.clone());
    let remote = provider.kubeconfig_path().to_str().context("path")?;

    let provider_id = ClusterId::new("provider-1")?;
    let offloadings: Api<liqo_api::offloading::NamespaceOffloading> =
        Api::namespaced(consumer_client.clone(), "default");
    let offloading = offloading_object()?;

    // The provider's administrator ends the tenancy alone: the consumer's
    // node turns NotReady, and the consumer cleans its side alone.
    pair.on_consumer(&["peer", "--remote-kubeconfig", remote])
        .success();
    let out = pair.on_provider(&["uninstall", "--yes"]).user_error(6);
    assert!(
        out.error_line().contains("consume its resources"),
        "{}",
        out.stderr
    );
    pair.on_provider(&["unpeer", "--tenant", "nope"])
        .user_error(7);
    pair.on_provider(&["unpeer", "--tenant", "consumer-1", "--yes"])
        .success();
    let nodes: Api<Node> = Api::all(consumer_client.clone());
    let node_name = peering::virtual_node(&provider_id);
    wait_for(
        "the virtual node to turn NotReady (ProviderForbidden)",
        Duration::from_secs(40),
        || {
            let nodes = nodes.clone();
            let node_name = node_name.clone();
            async move {
                let node = nodes.get(&node_name).await?;
                let ready = node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == "Ready");
                Ok(ready.is_some_and(|c| {
                    c.status == "False" && c.reason.as_deref() == Some("ProviderForbidden")
                }))
            }
        },
    )
    .await?;
    pair.on_consumer(&["unpeer", "--force", "--cluster-id", "provider-1"])
        .success();
    pair.assert_as_before(&before, "a provider-side end", &[])
        .await?;

    // `unpeer --force` while a namespace is offloaded: the peering goes,
    // and the agent's finalizer does not keep the offloading forever.
    pair.on_consumer(&["peer", "--remote-kubeconfig", remote])
        .success();
    offloadings.create(&Default::default(), &offloading).await?;
    let finalizer = peering::twin_finalizer(&provider_id);
    wait_for(
        "the agent's finalizer on the offloading",
        Duration::from_secs(30),
        || async {
            Ok(offloadings
                .get_opt(names::NAMESPACE_OFFLOADING)
                .await?
                .is_some_and(|o| {
                    o.metadata
                        .finalizers
                        .unwrap_or_default()
                        .contains(&finalizer)
                }))
        },
    )
    .await?;
    pair.on_consumer(&["unpeer", "--remote-kubeconfig", remote, "--force"])
        .success();
    offloadings
        .delete(names::NAMESPACE_OFFLOADING, &Default::default())
        .await?;
    offloading_gone(&offloadings, Duration::from_secs(10)).await?;
    // The twin namespaces are deleted by `unpeer`, not awaited (their pods
    // may take their grace period): wait for the namespace controller, or
    // the snapshot may list a RoleBinding of one still being emptied.
    let twins: Api<Namespace> = Api::all(provider_client.clone());
    let tenant_label = format!("{}=consumer-1", names::labels::TENANT);
    wait_for(
        "the twin namespaces to be gone from the provider",
        Duration::from_secs(60),
        || async {
            Ok(twins
                .list(&ListParams::default().labels(&tenant_label))
                .await?
                .items
                .is_empty())
        },
    )
    .await?;
    pair.assert_as_before(&before, "a forced unpeer", &[])
        .await?;
    drop(pair);
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_both_ways_gives_each_cluster_a_virtual_node_and_unpeer_undoes_it() -> Result<()> {
    let pair = Pair::at(Stage::Started).await?;
    let (consumer, provider) = (pair.consumer(), pair.provider());
    let before = install(&pair).await?;
    let (consumer_client, provider_client) =
        (pair.consumer_client.clone(), pair.provider_client.clone());
    let remote = provider.kubeconfig_path().to_str().context("path")?;

    // Both ways at once: each cluster gets a virtual node for the other.
    let own = consumer.kubeconfig_path().to_str().context("path")?;
    pair.on_consumer(&[
        "peer",
        "--remote-kubeconfig",
        remote,
        "--bidirectional",
        "--pods=5",
    ])
    .success();
    for (client, peer) in [
        (&consumer_client, "provider-1"),
        (&provider_client, "consumer-1"),
    ] {
        let node = Api::<Node>::all(client.clone())
            .get(&peering::virtual_node(&ClusterId::new(peer)?))
            .await?;
        let capacity = node.status.and_then(|s| s.capacity).unwrap_or_default();
        assert_eq!(
            capacity.get("pods").map(|q| q.0.as_str()),
            Some("5"),
            "{peer}"
        );
    }
    pair.on_consumer(&["unpeer", "--remote-kubeconfig", remote])
        .success();
    pair.on_provider(&["unpeer", "--remote-kubeconfig", own])
        .success();
    pair.assert_as_before(&before, "both ways", &[]).await?;
    Ok(())
}

/// Seconds from now to the notAfter of the kubeconfig's certificate (the
/// signer backdates notBefore, so that says nothing of the asked lifetime).
fn certificate_lifetime(kubeconfig: &[u8]) -> Result<i64> {
    use base64::Engine as _;
    let config = kube::config::Kubeconfig::from_yaml(std::str::from_utf8(kubeconfig)?)?;
    let data = config.auth_infos[0]
        .auth_info
        .as_ref()
        .and_then(|a| a.client_certificate_data.clone())
        .context("no certificate")?;
    let pem = base64::engine::general_purpose::STANDARD.decode(data)?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem)?;
    let cert = pem.parse_x509()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    Ok(cert.validity().not_after.timestamp() - i64::try_from(now)?)
}
