//! The provider's sharing policy, set with `liqoctl sharing-policy` on two
//! real clusters: bad values are refused before anything is written, a
//! consumer's own policy takes precedence over `default`, `peer` grants
//! what it offers (virtual node and ResourceQuota), `info` shows the
//! peering on both sides, a provider that accepts no new peers refuses a
//! consumer without a tenant, and a floor and a ceiling bound the offer.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, ResourceQuota};
use kube::api::{Api, ListParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::authentication::Tenant;
use liqo_api::names::peering;
use liqo_api::sharing::SharingPolicy;
use liqo_e2e::fixture::{Pair, Stage};

fn json(stdout: &str) -> Result<serde_json::Value> {
    serde_json::from_str(stdout).with_context(|| format!("not JSON:\n{stdout}"))
}

/// Without liqo-rs there is no policy to set; bad values exit 2 with
/// one line, and nothing is written; a policy liqoctl did not make is
/// left alone.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_is_refused_without_liqo_rs_with_bad_values_or_over_anothers() -> Result<()> {
    let pair = Pair::at(Stage::Started).await?;
    let provider = pair.provider();
    let on_provider = |args: &[&str]| pair.on_provider(args);

    let out = on_provider(&["sharing-policy", "show"]).user_error(7);
    assert!(
        out.error_line().contains("liqoctl install"),
        "{}",
        out.stderr
    );

    liqo_e2e::install(provider, "provider-1", "10.202.0.0/16", &[]).success();
    let policies: Api<SharingPolicy> = Api::all(provider.client().await?);

    for bad in [
        &["--cpu", "lots"][..],
        &["--memory", "150%"],
        &["--pods", "1.5"],
        &["--cost-cpu-hour", "-1"],
        &["--currency", "€"],
        &["--peer", "Bad_ID"],
        &["--accept-new-peers", "maybe"],
    ] {
        let mut args = vec!["sharing-policy", "set", "--cpu=1"];
        args.extend_from_slice(bad);
        on_provider(&args).user_error(2);
    }
    assert!(
        policies
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );
    let shown = json(
        &on_provider(&["sharing-policy", "show", "-o", "json"])
            .success()
            .stdout,
    )?;
    assert_eq!(shown["source"], "builtIn", "{shown}");
    assert_eq!(shown["policy"]["cpu"], "50%", "{shown}");

    // A policy liqoctl did not make is left alone.
    policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "apiVersion": "liqo.io/v1alpha1", "kind": "SharingPolicy",
                "metadata": { "name": "other-1" },
                "spec": { "cpu": "1" },
            }))?,
        )
        .await?;
    on_provider(&["sharing-policy", "set", "--peer=other-1", "--cpu=2"]).user_error(6);
    on_provider(&["sharing-policy", "delete", "--peer=other-1"]).user_error(6);
    on_provider(&["sharing-policy", "delete", "--peer=nobody-1"]).user_error(7);
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_shape_the_grant_and_info_shows_the_peering() -> Result<()> {
    let pair = Pair::at(Stage::Started).await?;
    let (consumer, provider) = (pair.consumer(), pair.provider());
    let on_consumer = |args: &[&str]| pair.on_consumer(args);
    let on_provider = |args: &[&str]| pair.on_provider(args);

    for (cluster, id, cidr) in [
        (consumer, "consumer-1", "10.201.0.0/16"),
        (provider, "provider-1", "10.202.0.0/16"),
    ] {
        liqo_e2e::install(cluster, id, cidr, &[]).success();
    }
    let consumer_client = consumer.client().await?;
    let provider_client = provider.client().await?;

    // A default policy, and the consumer's own on top of it.
    on_provider(&[
        "sharing-policy",
        "set",
        "--cpu=1",
        "--memory=1Gi",
        "--pods=5",
        "--cost-cpu-hour=0.02",
        "--cost-memory-gib-hour=0.005",
        "--currency=EUR",
    ])
    .success();
    let out = on_provider(&[
        "sharing-policy",
        "set",
        "--peer=consumer-1",
        "--cpu=2",
        "--memory=2Gi",
        "--pods=7",
        "--cost-cpu-hour=0.05",
        "--currency=USD",
    ])
    .success();
    assert!(out.stdout.contains("created"), "{}", out.stdout);
    // Setting the same again changes nothing.
    let again = on_provider(&["sharing-policy", "set", "--peer=consumer-1", "--pods=7"]).success();
    assert!(again.stdout.contains("unchanged"), "{}", again.stdout);
    let shown = json(
        &on_provider(&["sharing-policy", "show", "--peer=consumer-1", "-o", "json"])
            .success()
            .stdout,
    )?;
    assert_eq!(shown["source"], "peer", "{shown}");
    assert_eq!(shown["object"], "consumer-1", "{shown}");
    assert_eq!(shown["offer"]["pods"], "7", "{shown}");
    // What is not given comes from the default policy it started from.
    assert_eq!(shown["policy"]["cost"]["memoryGibHour"], "0.005", "{shown}");
    assert_eq!(shown["policy"]["cost"]["currency"], "USD", "{shown}");
    assert_eq!(shown["peerPolicies"][0], "consumer-1", "{shown}");
    let table = on_provider(&["sharing-policy", "show"]).success();
    eprintln!("{}", table.stdout);
    for want in [
        "SharingPolicy/default",
        "Offered now",
        "0.02 EUR per CPU-hour",
    ] {
        assert!(table.stdout.contains(want), "{want}:\n{}", table.stdout);
    }

    // Peering without a request gets the consumer's own offer.
    let remote = provider.kubeconfig_path().to_str().context("path")?;
    let out = on_consumer(&[
        "peer",
        "--remote-kubeconfig",
        remote,
        "-o",
        "json",
        "--timeout=90",
    ]);
    if out.code != 0 {
        eprintln!("--- agent logs ---\n{}", consumer.pod_logs());
    }
    let report = json(&out.success().stdout)?;
    assert_eq!(report["grant"]["cpu"], "2", "{report}");
    assert_eq!(report["grant"]["pods"], "7", "{report}");
    let provider_id = ClusterId::new("provider-1")?;
    let node = Api::<Node>::all(consumer_client.clone())
        .get(&peering::virtual_node(&provider_id))
        .await?;
    let capacity = node.status.and_then(|s| s.capacity).unwrap_or_default();
    assert_eq!(capacity.get("cpu").map(|q| q.0.as_str()), Some("2"));
    assert_eq!(capacity.get("pods").map(|q| q.0.as_str()), Some("7"));
    let tenant_ns = peering::tenant_namespace(&ClusterId::new("consumer-1")?);
    let quota = Api::<ResourceQuota>::namespaced(provider_client.clone(), &tenant_ns)
        .get("liqo-grant")
        .await?;
    let hard = quota.spec.and_then(|s| s.hard).unwrap_or_default();
    assert_eq!(hard.get("pods").map(|q| q.0.as_str()), Some("7"));
    assert_eq!(hard.get("requests.cpu").map(|q| q.0.as_str()), Some("2"));

    // info on the consumer: the outgoing peering, as a table (the cost,
    // the cluster ID and the tenant namespace with -o wide) and as JSON.
    let table = on_consumer(&["info"]).success();
    eprintln!("{}", table.stdout);
    for want in ["provider", "outgoing", "Ready", "pods 7"] {
        assert!(table.stdout.contains(want), "{want}:\n{}", table.stdout);
    }
    assert!(
        !table.stdout.contains("USD"),
        "the cost is a column of -o wide:\n{}",
        table.stdout
    );
    let wide = on_consumer(&["info", "-o", "wide"]).success();
    for want in [
        "provider-1",
        "outgoing",
        "Ready",
        "pods 7",
        "0.05 USD per CPU-hour",
        &tenant_ns,
    ] {
        assert!(wide.stdout.contains(want), "{want}:\n{}", wide.stdout);
    }
    let info = json(&on_consumer(&["info", "-o", "json"]).success().stdout)?;
    let p = &info["peerings"][0];
    assert_eq!(p["clusterId"], "provider-1", "{info}");
    assert_eq!(p["name"], provider.name(), "{info}");
    assert_eq!(p["direction"], "outgoing", "{info}");
    assert_eq!(p["ready"]["status"], "True", "{info}");
    assert_eq!(p["grant"]["pods"], "7", "{info}");
    assert_eq!(p["cost"]["cpuHour"], "0.05", "{info}");
    assert_eq!(p["tenantNamespace"], tenant_ns.as_str(), "{info}");
    assert!(p["certificateExpiry"].is_string(), "{info}");
    assert!(info["identity"]["clusterId"] == "consumer-1", "{info}");

    // info peer: one peering in detail, by ID or by name; unknown names exit 7.
    let detail = on_consumer(&["info", "peer", "provider-1"]).success();
    eprintln!("{}", detail.stdout);
    for want in [
        "Certificate expiry",
        "cpu 2, memory 2048Mi, pods 7",
        "Granted=",
    ] {
        assert!(detail.stdout.contains(want), "{want}:\n{}", detail.stdout);
    }
    let by_name = json(
        &on_consumer(&["info", "peer", provider.name(), "-o", "json"])
            .success()
            .stdout,
    )?;
    assert_eq!(by_name[0]["clusterId"], "provider-1", "{by_name}");
    let out = on_consumer(&["info", "peer", "nope"]).user_error(7);
    assert!(out.error_line().contains("provider-1"), "{}", out.stderr);

    // info on the provider: the incoming tenant (its cluster ID and tenant
    // namespace with -o wide).
    let table = on_provider(&["info", "-o", "wide"]).success();
    eprintln!("{}", table.stdout);
    for want in ["consumer-1", "incoming", &tenant_ns] {
        assert!(table.stdout.contains(want), "{want}:\n{}", table.stdout);
    }
    let info = json(&on_provider(&["info", "-o", "json"]).success().stdout)?;
    let p = &info["peerings"][0];
    assert_eq!(p["clusterId"], "consumer-1", "{info}");
    assert_eq!(p["direction"], "incoming", "{info}");
    assert_eq!(p["grant"]["pods"], "7", "{info}");
    assert_eq!(p["user"], "liqo.io:peer:consumer-1", "{info}");
    on_provider(&["info", "peer", "consumer-1"]).success();

    // The consumer's own policy goes; default accepts no new peers. Once
    // unpeered, the consumer has no tenant and is refused.
    on_provider(&["sharing-policy", "delete", "--peer=consumer-1"]).success();
    on_provider(&["sharing-policy", "delete", "--peer=consumer-1"]).user_error(7);
    on_provider(&["sharing-policy", "set", "--accept-new-peers=false"]).success();
    let shown = json(
        &on_provider(&["sharing-policy", "show", "--peer=consumer-1", "-o", "json"])
            .success()
            .stdout,
    )?;
    assert_eq!(shown["source"], "default", "{shown}");
    assert_eq!(shown["policy"]["acceptNewPeers"], false, "{shown}");
    assert_eq!(shown["policy"]["pods"], "5", "{shown}");

    on_consumer(&["unpeer", "--remote-kubeconfig", remote, "--timeout=60"]).success();
    let info = json(&on_consumer(&["info", "-o", "json"]).success().stdout)?;
    assert_eq!(info["peerings"], serde_json::json!([]), "{info}");
    on_consumer(&["info", "peer", "provider-1"]).user_error(7);

    let out = on_consumer(&["peer", "--remote-kubeconfig", remote]).user_error(6);
    assert!(
        out.error_line().contains("accepts no new peers"),
        "{}",
        out.stderr
    );
    assert!(
        Api::<Tenant>::all(provider_client.clone())
            .get_opt("consumer-1")
            .await?
            .is_none(),
        "a refused peer made a tenant"
    );
    drop(pair);
    Ok(())
}

/// A floor and a ceiling bound what a share of the free capacity offers:
/// one above the other is refused with one line and nothing written; a
/// ceiling lowers a share, a floor raises it, and `peer` grants the bounded
/// offer (the virtual node's capacity).
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_and_a_ceiling_bound_the_offer_and_the_grant() -> Result<()> {
    let pair = Pair::at(Stage::Installed).await?;
    let policies: Api<SharingPolicy> = Api::all(pair.provider_client.clone());

    let out = pair
        .on_provider(&[
            "sharing-policy",
            "set",
            "--floor=cpu=9,memory=1Gi",
            "--ceiling=cpu=8",
        ])
        .user_error(2);
    assert!(
        out.error_line()
            .contains("the floor of cpu (9) is above its ceiling (8)"),
        "{}",
        out.stderr
    );
    assert!(
        policies
            .list(&ListParams::default())
            .await?
            .items
            .is_empty(),
        "a refused policy was written"
    );

    // The same flags, the right way round: a share of the CPU lowered to
    // its ceiling, and pods raised to their floor.
    pair.on_provider(&[
        "sharing-policy",
        "set",
        "--cpu=50%",
        "--pods=1",
        "--floor=pods=9",
        "--ceiling=cpu=100m",
    ])
    .success();
    let shown = json(
        &pair
            .on_provider(&["sharing-policy", "show", "-o", "json"])
            .success()
            .stdout,
    )?;
    assert_eq!(shown["offer"]["cpu"], "100m", "{shown}");
    assert_eq!(shown["offer"]["pods"], "9", "{shown}");
    let table = pair.on_provider(&["sharing-policy", "show"]).success();
    assert!(
        table.stdout.contains("floor pods=9, ceiling cpu=100m"),
        "{}",
        table.stdout
    );

    pair.peer_with_kubeconfigs();
    let node = Api::<Node>::all(pair.consumer_client.clone())
        .get(&peering::virtual_node(&ClusterId::new("provider-1")?))
        .await?;
    let capacity = node
        .status
        .and_then(|s| s.capacity)
        .context("the virtual node has no capacity")?;
    assert_eq!(capacity.get("cpu").map(|q| q.0.as_str()), Some("100m"));
    assert_eq!(capacity.get("pods").map(|q| q.0.as_str()), Some("9"));
    Ok(())
}
