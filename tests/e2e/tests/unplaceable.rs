//! A virtual node that says no to what the provider cannot place
//! (docs/offloading.md, "A pod no node can hold"), on kwok nodes of two
//! sizes (4 and 6 CPUs): a pod within the grant but larger than the
//! provider's largest free node is never bound to the virtual node, with
//! the reason on the pod; one bound to it by hand is refused by the
//! virtual kubelet before anything is sent; one that fits runs; and as
//! the provider's nodes fill, the bound follows. A pod within the bound that no node can
//! hold all the same (one node has the CPU, another the memory) waits on
//! the provider, its `Unschedulable` reason comes back, and after the
//! virtual kubelet's `--unschedulable-timeout` it is failed here with that
//! reason and removed there.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::core::ForeignCluster;
use liqo_api::names::labels;
use liqo_api::names::peering::virtual_node;
use liqo_api::sharing::Amounts;
use liqo_e2e::fixture::pod::{on_virtual_node, phase, running, scheduled_reason};
use liqo_e2e::fixture::{PROVIDER_ID, Pair, Stage, WAIT};
use liqo_e2e::{Agent, wait_for};

const NS: &str = "shop";

/// A pod on the virtual node by hand, asking `cpu` and 64Mi.
fn pod(name: &str, cpu: &str) -> Result<Pod> {
    pod_asking(name, cpu, "64Mi")
}

fn pod_asking(name: &str, cpu: &str, memory: &str) -> Result<Pod> {
    on_virtual_node(NS, name, cpu, memory)
}

/// Waits until the consumer's virtual kubelet knows that the provider's
/// largest free node has `cpu` millicores (it says so in the provider's
/// ForeignCluster, from the provider's record of the consumer).
async fn largest_cpu_is(pair: &Pair, cpu: u64) -> Result<()> {
    let peers: Api<ForeignCluster> = Api::all(pair.consumer_client.clone());
    wait_for(
        &format!("the largest free node to have {cpu}m"),
        WAIT,
        || async {
            let largest = peers
                .get(PROVIDER_ID)
                .await?
                .status
                .and_then(|s| s.largest_free_node);
            Ok(largest
                .map(|r| Amounts::from_resources(&r))
                .transpose()?
                .is_some_and(|a| a.cpu_millis == cpu))
        },
    )
    .await
}

/// Waits for `name` to be failed with `reason`, and returns its message.
async fn failed(pods: &Api<Pod>, name: &str, reason: &str) -> Result<String> {
    wait_for(&format!("{name} failed"), WAIT, || async {
        Ok(phase(&pods.get(name).await?) == Some("Failed"))
    })
    .await?;
    let status = pods.get(name).await?.status.context("status")?;
    assert_eq!(status.reason.as_deref(), Some(reason), "{status:?}");
    Ok(status.message.unwrap_or_default())
}

/// Waits for `name` to be refused by the virtual kubelet (Pending, with the
/// reason: a failed pod would be replaced at once), and returns why.
async fn refused(pods: &Api<Pod>, name: &str) -> Result<String> {
    wait_for(&format!("{name} refused"), WAIT, || async {
        let p = pods.get(name).await?;
        Ok(p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("OffloadingRefused"))
    })
    .await?;
    let status = pods.get(name).await?.status.context("status")?;
    assert_eq!(status.phase.as_deref(), Some("Pending"), "{status:?}");
    Ok(status.message.unwrap_or_default())
}

/// A consumer peered with a provider that offers all it has, with one
/// kwok node of 4 CPUs and 16Gi and `extra` (name, CPUs, memory), and
/// namespace `shop` offloaded.
async fn peered_with(extra: (&str, &str, &str)) -> Result<Pair> {
    let pair = Pair::with_nodes(1, 1, Stage::Installed).await?;
    pair.provider()
        .add_kwok_node(extra.0, extra.1, extra.2, 110)
        .await?;
    pair.on_provider(&[
        "sharing-policy",
        "set",
        "--cpu=100%",
        "--memory=100%",
        "--pods=100%",
    ])
    .success();
    pair.peer_with_kubeconfigs();
    pair.offload(NS).await?;
    Ok(pair)
}

/// Waits until the virtual node's label says the provider's largest
/// free node has `cpu` millicores.
async fn labelled_cpu_is(pair: &Pair, cpu: u64) -> Result<()> {
    let nodes: Api<Node> = Api::all(pair.consumer_client.clone());
    let name = virtual_node(&ClusterId::new(PROVIDER_ID)?);
    let want = cpu.to_string();
    wait_for(
        &format!("the virtual node labelled with {cpu}m"),
        WAIT,
        || async {
            let node = nodes.get(&name).await?;
            Ok(node.labels().get(labels::LARGEST_FREE_CPU) == Some(&want))
        },
    )
    .await
}

/// Waits until `name` waits unbound, the scheduler's reason naming node
/// affinity and the virtual kubelet's Event naming the sizes; returns
/// that Event's message.
async fn waits_for_room(pods: &Api<Pod>, events: &Api<Event>, name: &str) -> Result<String> {
    wait_for(&format!("{name} unschedulable"), WAIT, || async {
        Ok(
            scheduled_reason(&pods.get(name).await?).is_some_and(|(reason, message)| {
                reason == "Unschedulable" && message.contains("affinity")
            }),
        )
    })
    .await?;
    let said = || async {
        let listed = events
            .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
            .await?
            .items;
        Ok::<_, anyhow::Error>(
            listed
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("NoRoomOnProvider"))
                .and_then(|e| e.message),
        )
    };
    wait_for(
        &format!("{name}'s NoRoomOnProvider Event"),
        WAIT,
        || async { Ok(said().await?.is_some()) },
    )
    .await?;
    let pod = pods.get(name).await?;
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        None,
        "{name} was bound"
    );
    Ok(said().await?.unwrap_or_default())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_no_provider_node_can_hold_is_not_bound_and_one_that_fits_runs() -> Result<()> {
    // Two nodes open to peers: the provider's kwok node of 4 CPUs and
    // one of 6 (its host-process node is tainted for the testbed's
    // agents, closed to peers).
    let pair = peered_with(("provider-big", "6", "16Gi")).await?;
    largest_cpu_is(&pair, 6000).await?;
    labelled_cpu_is(&pair, 6000).await?;

    // Within the grant (18 CPUs, the host-process node's too), above the
    // 6 of the largest node: never bound, with the reason on the pod.
    let pods: Api<Pod> = Api::namespaced(pair.consumer_client.clone(), NS);
    let events: Api<Event> = Api::namespaced(pair.consumer_client.clone(), NS);
    let pp = PostParams::default();
    pods.create(&pp, &pod("fits", "5")?).await?;
    pods.create(&pp, &pod("too-big", "7")?).await?;
    let why = waits_for_room(&pods, &events, "too-big").await?;
    assert!(
        why.contains("no node of cluster provider-1 has room for it")
            && why.contains("cpu 7 ")
            && why.contains("cpu 6 "),
        "{why}"
    );
    wait_for("fits Running", WAIT, || async {
        Ok(running(&pods.get("fits").await?))
    })
    .await?;
    let remote: Api<Pod> = Api::namespaced(pair.provider_client.clone(), "shop-consumer");
    let remote_pods = remote.list(&ListParams::default()).await?.items;
    assert_eq!(remote_pods.len(), 1, "only fits is sent: {remote_pods:?}");

    // Bound by hand, past the scheduler: the virtual kubelet refuses it
    // before anything is sent.
    let mut by_hand = pod("by-hand", "7")?;
    if let Some(spec) = by_hand.spec.as_mut() {
        spec.node_name = Some(virtual_node(&ClusterId::new(PROVIDER_ID)?));
    }
    pods.create(&pp, &by_hand).await?;
    let why = refused(&pods, "by-hand").await?;
    assert!(why.contains("cpu 7 ") && why.contains("cpu 6 "), "{why}");
    let listed = events
        .list(&ListParams::default().fields("involvedObject.name=by-hand"))
        .await?
        .items;
    assert!(
        listed
            .iter()
            .any(|e| e.reason.as_deref() == Some("OffloadingRefused")),
        "{listed:?}"
    );

    // The big node now has 1 CPU free, the other 4: the bound and the
    // label follow.
    largest_cpu_is(&pair, 4000).await?;
    labelled_cpu_is(&pair, 4000).await?;
    pods.create(&pp, &pod("now-too-big", "5")?).await?;
    pods.create(&pp, &pod("still-fits", "4")?).await?;
    let why = waits_for_room(&pods, &events, "now-too-big").await?;
    assert!(why.contains("cpu 5 ") && why.contains("cpu 4 "), "{why}");
    wait_for("still-fits Running", WAIT, || async {
        Ok(running(&pods.get("still-fits").await?))
    })
    .await?;
    // Still waiting (the bound only shrank), never sent.
    assert_eq!(
        pods.get("too-big").await?.spec.and_then(|s| s.node_name),
        None
    );
    let sent = remote.list(&ListParams::default()).await?.items.len();
    assert_eq!(sent, 2, "fits and still-fits only");
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_the_provider_cannot_schedule_is_failed_here_after_the_timeout() -> Result<()> {
    // One node with the CPU (6, 1Gi), the other with the memory (4, 16Gi).
    let pair = peered_with(("provider-cpu", "6", "1Gi")).await?;
    let agent = Agent::VirtualKubelet;
    let before = liqo_e2e::agents(pair.consumer(), agent)
        .first()
        .map(|p| p.pid)
        .context("no virtual kubelet")?;
    liqo_e2e::set_agent_args(
        &pair.consumer_client,
        PROVIDER_ID,
        |a| a,
        &["--unschedulable-timeout=15".to_owned()],
    )
    .await?;
    liqo_e2e::agent_restarted(pair.consumer(), agent, before, WAIT).await?;
    largest_cpu_is(&pair, 6000).await?;
    let pods: Api<Pod> = Api::namespaced(pair.consumer_client.clone(), NS);
    let pp = PostParams::default();
    // Both within the bound (6 CPUs, 16Gi): one fits a node, the other
    // none.
    pods.create(&pp, &pod_asking("fits", "3", "2Gi")?).await?;
    pods.create(&pp, &pod_asking("stuck", "5", "8Gi")?).await?;
    wait_for("fits Running", WAIT, || async {
        Ok(running(&pods.get("fits").await?))
    })
    .await?;
    // The provider's reason comes back while it waits there...
    wait_for("stuck's provider reason", WAIT, || async {
        Ok(scheduled_reason(&pods.get("stuck").await?)
            .is_some_and(|(reason, _)| reason == "Unschedulable"))
    })
    .await?;
    let (_, waiting) = scheduled_reason(&pods.get("stuck").await?).context("reason")?;
    assert!(waiting.contains("Insufficient"), "{waiting}");
    // ...and after the timeout it is failed here with it, and removed
    // there.
    let why = failed(&pods, "stuck", "ProviderUnschedulable").await?;
    assert!(
        why.contains("cluster provider-1 could not place it for 15s")
            && why.contains("Insufficient"),
        "{why}"
    );
    let remote: Api<Pod> = Api::namespaced(pair.provider_client.clone(), "shop-consumer");
    wait_for("stuck gone from the provider", WAIT, || async {
        let left = remote.list(&ListParams::default()).await?.items;
        Ok(left.len() == 1)
    })
    .await?;
    assert!(running(&pods.get("fits").await?), "fits was touched");
    let events = Api::<Event>::namespaced(pair.consumer_client.clone(), NS)
        .list(&ListParams::default().fields("involvedObject.name=stuck"))
        .await?
        .items;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("ProviderUnschedulable")),
        "{events:?}"
    );
    Ok(())
}
