//! A grant given as shares of the provider's free capacity follows it
//! while the peering lasts (docs/peering.md, "A grant that follows the
//! load"), on two real clusters: kwok nodes added to the provider grow the
//! virtual node; the provider's own pods shrink it, while the offloaded
//! pods that run stay and a new one waits, Pending, with the scheduler's
//! reason; an absolute offer does not move while a share beside it does;
//! and a grant survives the restart of the gateway, the provider's API
//! server and the virtual kubelet, with nothing changed twice. Each change
//! is an Event on both sides and the `Granted` condition `liqoctl info`
//! shows.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::authentication::Tenant;
use liqo_api::following;
use liqo_api::names::peering;
use liqo_api::sharing::{parse_bytes, parse_cpu_millis};
use liqo_e2e::fixture::pod::{on_virtual_node, running, scheduled_reason};
use liqo_e2e::fixture::{CONSUMER_ID, PROVIDER_ID, Pair, Stage, WAIT};
use liqo_e2e::{Agent, wait_for};
use serde_json::json;

/// The promise is 15 s from the provider's change to the virtual node's
/// capacity on an idle machine (the figures are in docs/benchmarks.md);
/// a machine running four of these tests at once gets twice that.
const FOLLOWS_WITHIN: Duration = Duration::from_secs(30);

/// The virtual node's capacity: CPU in millicores, memory in bytes, pods.
async fn capacity(pair: &Pair) -> Result<(u64, u64, u64)> {
    let node = Api::<Node>::all(pair.consumer_client.clone())
        .get(&peering::virtual_node(&ClusterId::new(PROVIDER_ID)?))
        .await?;
    let capacity = node.status.and_then(|s| s.capacity).unwrap_or_default();
    let get = |k: &str, parse: fn(&str) -> Option<u64>| {
        capacity.get(k).and_then(|q| parse(&q.0)).unwrap_or(0)
    };
    Ok((
        get("cpu", parse_cpu_millis),
        get("memory", parse_bytes),
        get("pods", parse_bytes),
    ))
}

/// Waits until the virtual node's capacity is `want` of what it was;
/// how long that took.
async fn capacity_becomes(
    pair: &Pair,
    what: &str,
    want: impl Fn((u64, u64, u64)) -> bool,
) -> Result<Duration> {
    let started = Instant::now();
    wait_for(what, FOLLOWS_WITHIN, || async {
        Ok(want(capacity(pair).await?))
    })
    .await?;
    Ok(started.elapsed())
}

/// The consumer's Tenant on the provider.
async fn tenant(pair: &Pair) -> Result<Tenant> {
    Ok(Api::<Tenant>::all(pair.provider_client.clone())
        .get(CONSUMER_ID)
        .await?)
}

/// Waits until the tenant's grant may change again: the policy's least
/// interval (the default, 10 s) since it was last set.
async fn past_the_interval(pair: &Pair) -> Result<()> {
    let granted = tenant(pair)
        .await?
        .status
        .and_then(|s| following::granted(&s.conditions).cloned())
        .context("no Granted condition on the tenant")?;
    let since = k8s_openapi::jiff::Timestamp::now().duration_since(granted.last_transition_time.0);
    let left =
        Duration::from_secs(11).saturating_sub(Duration::try_from(since).unwrap_or_default());
    tokio::time::sleep(left).await;
    Ok(())
}

/// The GrantChanged Events: on the provider, in the tenant namespace; on
/// the consumer, of the virtual node.
async fn grant_events(pair: &Pair) -> Result<(Vec<Event>, Vec<Event>)> {
    let changed = |e: &Event| e.reason.as_deref() == Some(following::GRANT_CHANGED);
    let tenant_ns = peering::tenant_namespace(&ClusterId::new(CONSUMER_ID)?);
    let provider = Api::<Event>::namespaced(pair.provider_client.clone(), &tenant_ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(changed)
        .collect();
    let node = peering::virtual_node(&ClusterId::new(PROVIDER_ID)?);
    let consumer = Api::<Event>::namespaced(pair.consumer_client.clone(), "default")
        .list(&ListParams::default().fields(&format!("involvedObject.name={node}")))
        .await?
        .items
        .into_iter()
        .filter(changed)
        .collect();
    Ok((provider, consumer))
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_virtual_node_grows_when_the_provider_gains_nodes() -> Result<()> {
    // The default policy: half of each free resource.
    let pair = Pair::at(Stage::Peered).await?;
    let before = capacity(&pair).await?;
    past_the_interval(&pair).await?;
    assert_eq!(
        grant_events(&pair).await?,
        (vec![], vec![]),
        "no change yet"
    );

    // 16 CPUs, 64Gi and 220 pods more: half of them more granted.
    for name in ["provider-extra-0", "provider-extra-1"] {
        pair.provider()
            .add_kwok_node(name, "8", "32Gi", 110)
            .await?;
    }
    let took = capacity_becomes(&pair, "the virtual node to grow", |now| {
        now.0 >= before.0 + 8000 && now.1 >= before.1 + (32 << 30) && now.2 >= before.2 + 110
    })
    .await?;
    eprintln!(
        "grant change reached the virtual node after {took:?}: {before:?} → {:?}",
        capacity(&pair).await?
    );

    // Said on both sides, once each, and in the record's condition.
    let (provider_events, consumer_events) = grant_events(&pair).await?;
    assert_eq!(provider_events.len(), 1, "{provider_events:?}");
    assert_eq!(consumer_events.len(), 1, "{consumer_events:?}");
    let message = provider_events[0].message.clone().unwrap_or_default();
    assert!(message.contains("the free capacity is now"), "{message}");
    // The grant and its condition are two writes of the provider's
    // gateway, read by the virtual kubelet every 5 s: the condition may
    // come one read after the capacity.
    let mut info = serde_json::Value::Null;
    for _ in 0..30 {
        let out = pair
            .on_consumer(&["info", "peer", PROVIDER_ID, "-o", "json"])
            .success();
        let read: serde_json::Value = serde_json::from_str(&out.stdout)?;
        info = read[0].clone();
        if granted(&info).is_some_and(|c| c["reason"] == following::FOLLOWED) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let info = &info;
    let granted = granted(info).with_context(|| format!("no Granted condition in {info}"))?;
    assert_eq!(granted["reason"], following::FOLLOWED, "{info}");
    assert!(
        granted["lastTransitionTime"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{info}"
    );
    let table = pair.on_provider(&["info", "peer", CONSUMER_ID]).success();
    assert!(
        table.stdout.contains(following::FOLLOWED),
        "{}",
        table.stdout
    );
    Ok(())
}

/// A pod of `shop` requesting `cpu`, on the virtual node by hand.
fn offloaded_pod(name: &str, cpu: &str) -> Result<Pod> {
    on_virtual_node("shop", name, cpu, "64Mi")
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_providers_own_pods_shrink_the_virtual_node_and_evict_nothing() -> Result<()> {
    let pair = Pair::at(Stage::Offloaded("shop")).await?;
    let pods: Api<Pod> = Api::namespaced(pair.consumer_client.clone(), "shop");
    let pp = PostParams::default();
    for name in ["runs-0", "runs-1"] {
        pods.create(&pp, &offloaded_pod(name, "500m")?).await?;
    }
    wait_for("the offloaded pods Running", WAIT, || async {
        Ok(running(&pods.get("runs-0").await?) && running(&pods.get("runs-1").await?))
    })
    .await?;
    let uids = |list: Vec<Pod>| -> Vec<String> {
        let mut uids: Vec<String> = list.into_iter().filter_map(|p| p.metadata.uid).collect();
        uids.sort();
        uids
    };
    let remote_pods: Api<Pod> = Api::namespaced(pair.provider_client.clone(), "shop-consumer");
    let remote_before = uids(remote_pods.list(&ListParams::default()).await?.items);
    assert_eq!(remote_before.len(), 2);
    let before = capacity(&pair).await?;
    past_the_interval(&pair).await?;

    // The provider's own Deployment takes 6 of its 8 kwok CPUs.
    let hog: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "hog", "namespace": "default" },
        "spec": {
            "replicas": 6,
            "selector": { "matchLabels": { "app": "hog" } },
            "template": {
                "metadata": { "labels": { "app": "hog" } },
                "spec": {
                    "nodeSelector": { "type": "kwok" },
                    "containers": [{
                        "name": "hog", "image": "busy",
                        "resources": { "requests": { "cpu": "1" } },
                    }],
                },
            },
        },
    }))?;
    Api::<Deployment>::namespaced(pair.provider_client.clone(), "default")
        .create(&pp, &hog)
        .await?;
    let took = capacity_becomes(&pair, "the virtual node to shrink", |now| {
        now.0 + 2000 <= before.0
    })
    .await?;
    let after = capacity(&pair).await?;
    eprintln!("grant shrink reached the virtual node after {took:?}: {before:?} → {after:?}");
    // Never below what the tenant's pods request (1 CPU).
    assert!(after.0 >= 1000, "{after:?}");

    // The pods that ran run on, the same remote pods.
    for name in ["runs-0", "runs-1"] {
        assert!(running(&pods.get(name).await?), "{name} no longer runs");
    }
    assert_eq!(
        uids(remote_pods.list(&ListParams::default()).await?.items),
        remote_before
    );
    // A new one that the old grant had room for waits, with the reason:
    // the virtual node's CPU (the grant), or no provider node with room
    // for it (the largest free node), which the virtual kubelet says.
    let asked = format!("{}m", before.0 - 1000);
    pods.create(&pp, &offloaded_pod("waits", &asked)?).await?;
    let events: Api<Event> = Api::namespaced(pair.consumer_client.clone(), "shop");
    wait_for("the new pod Pending for lack of CPU", WAIT, || async {
        let pod = pods.get("waits").await?;
        let Some((reason, message)) = scheduled_reason(&pod) else {
            return Ok(false);
        };
        let no_room = || async {
            let said = events
                .list(&ListParams::default().fields("involvedObject.name=waits"))
                .await?
                .items;
            Ok::<_, anyhow::Error>(said.iter().any(|e| {
                e.reason.as_deref() == Some("NoRoomOnProvider")
                    && e.message.as_deref().is_some_and(|m| m.contains("cpu"))
            }))
        };
        Ok(reason == "Unschedulable"
            && (message.contains("Insufficient cpu")
                || (message.contains("affinity") && no_room().await?)))
    })
    .await?;
    assert_eq!(
        pods.get("waits").await?.spec.and_then(|s| s.node_name),
        None,
        "bound though it does not fit"
    );
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absolute_offer_never_moves_while_a_share_beside_it_does() -> Result<()> {
    let pair = Pair::at(Stage::Installed).await?;
    pair.on_provider(&[
        "sharing-policy",
        "set",
        "--cpu=2",
        "--memory=4Gi",
        "--pods=50%",
    ])
    .success();
    pair.peer_with_kubeconfigs();
    let before = capacity(&pair).await?;
    assert_eq!((before.0, before.1), (2000, 4 << 30), "{before:?}");
    past_the_interval(&pair).await?;
    for name in ["provider-extra-0", "provider-extra-1"] {
        pair.provider()
            .add_kwok_node(name, "8", "32Gi", 110)
            .await?;
    }
    // The share moves: the follower is at work.
    capacity_becomes(&pair, "the pods to grow", |now| now.2 >= before.2 + 110).await?;
    // A few rounds more: the absolute amounts stayed.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let after = capacity(&pair).await?;
    assert_eq!((after.0, after.1), (2000, 4 << 30), "{after:?}");
    let grant = liqo_api::sharing::Amounts::from_resources(&tenant(&pair).await?.spec.grant)?;
    assert_eq!((grant.cpu_millis, grant.memory_bytes), (2000, 4 << 30));
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_survives_restarts_and_changes_once() -> Result<()> {
    let mut pair = Pair::at(Stage::Peered).await?;
    let before = capacity(&pair).await?;
    past_the_interval(&pair).await?;
    pair.provider()
        .add_kwok_node("provider-extra-0", "8", "32Gi", 110)
        .await?;
    capacity_becomes(&pair, "the virtual node to grow", |now| {
        now.0 >= before.0 + 4000
    })
    .await?;
    let grown = capacity(&pair).await?;
    let grant = tenant(&pair).await?.spec.grant;

    // The provider's gateway killed, its API server restarted, the
    // consumer's virtual kubelet killed: none of them changes anything.
    let gateway = liqo_e2e::kill_agent(pair.provider(), Agent::Gateway)?;
    pair.testbed
        .cluster_mut("provider")
        .restart_apiserver()
        .await?;
    let vk = liqo_e2e::kill_agent(pair.consumer(), Agent::VirtualKubelet)?;
    liqo_e2e::agent_restarted(pair.provider(), Agent::Gateway, gateway, WAIT).await?;
    liqo_e2e::agent_restarted(pair.consumer(), Agent::VirtualKubelet, vk, WAIT).await?;
    liqo_e2e::virtual_node_ready(&pair.consumer_client, PROVIDER_ID, WAIT).await?;
    // Several rounds of both agents (the gateway looks at once on start,
    // the virtual kubelet reads the record every 5 s).
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(tenant(&pair).await?.spec.grant, grant, "the grant moved");
    assert_eq!(capacity(&pair).await?, grown, "the virtual node moved");
    let (provider_events, consumer_events) = grant_events(&pair).await?;
    assert_eq!(
        (provider_events.len(), consumer_events.len()),
        (1, 1),
        "one change, told once on each side: {provider_events:?} {consumer_events:?}"
    );

    // And the restarted agents follow the next change.
    past_the_interval(&pair).await?;
    pair.provider()
        .add_kwok_node("provider-extra-1", "8", "32Gi", 110)
        .await?;
    capacity_becomes(&pair, "the virtual node to grow again", |now| {
        now.0 >= grown.0 + 4000
    })
    .await?;
    let (provider_events, consumer_events) = grant_events(&pair).await?;
    assert_eq!((provider_events.len(), consumer_events.len()), (2, 2));
    Ok(())
}

/// The Granted condition in `info` (one record of `info peer -o json`).
fn granted(info: &serde_json::Value) -> Option<&serde_json::Value> {
    info["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == following::GRANTED)
}
