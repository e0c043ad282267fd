//! The remote pods' Events and status, back on the consumer once each.

use super::*;

/// Events of the remote pod come back onto the local pod, counts
/// included; settled copies and statuses are put back; a restarted
/// virtual kubelet duplicates nothing.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_events_and_status_come_back_and_a_restart_copies_nothing_twice() -> Result<()> {
    let shop = Shop::at(Stage::Offloaded(NS)).await?;
    let Shop { pods, events, .. } = &shop;
    let prov = shop.provider();
    let pp = PostParams::default();
    let consumer = shop.pair.consumer();
    let node_name = peering::virtual_node(&ClusterId::new(PROVIDER_ID)?);
    pods.create(&pp, &pod("remote-web", json!([]), json!([]))?)
        .await?;
    wait_for("remote-web Ready", WAIT, || async {
        Ok(liqo_e2e::fixture::pod::ready(
            &pods.get("remote-web").await?,
        ))
    })
    .await?;

    // Events of the remote pod come back onto the local pod: the
    // provider's scheduler's, and one the provider's admin writes as a
    // kubelet would, with its count as it grows; a restarted virtual
    // kubelet copies nothing twice.
    let remote_pods: Api<Pod> = Api::namespaced(prov.clone(), TWIN);
    let local_uid = pods.get("remote-web").await?.metadata.uid.context("uid")?;
    let remote_pod = remote_pods
        .list(&ListParams::default().labels(&format!("liqo.io/local-pod-uid={local_uid}")))
        .await?
        .items
        .into_iter()
        .next()
        .context("the remote pod of remote-web")?;
    let remote_events: Api<Event> = Api::namespaced(prov.clone(), TWIN);
    let now = k8s_openapi::jiff::Timestamp::now();
    remote_events
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": "remote-web.backoff", "namespace": TWIN },
                "involvedObject": {
                    "apiVersion": "v1", "kind": "Pod", "namespace": TWIN,
                    "name": remote_pod.metadata.name, "uid": remote_pod.metadata.uid,
                    "fieldPath": "spec.containers{app}",
                },
                "reason": "BackOff",
                "message": "Back-off restarting failed container app",
                "type": "Warning",
                "count": 1,
                "firstTimestamp": now.to_string(),
                "lastTimestamp": now.to_string(),
                "source": { "component": "kubelet", "host": "provider-node" },
            }))?,
        )
        .await?;
    let copies = |reason: &'static str| {
        let events = events.clone();
        async move {
            let all = events
                .list(
                    // Ours only: the local scheduler has its own
                    // Scheduled event on the pod.
                    &ListParams::default()
                        .fields("involvedObject.name=remote-web")
                        .labels(&format!(
                            "{}={}",
                            labels::MANAGED_BY,
                            labels::MANAGED_BY_VALUE
                        )),
                )
                .await?
                .items;
            Ok::<_, anyhow::Error>(
                all.into_iter()
                    .filter(|e| e.reason.as_deref() == Some(reason))
                    .collect::<Vec<_>>(),
            )
        }
    };
    wait_for("the remote pod's events on the local pod", WAIT, || async {
        let backoff = copies("BackOff").await?;
        Ok(copies("Scheduled").await?.len() == 1
            && backoff.len() == 1
            && backoff[0].count == Some(1))
    })
    .await?;
    let backoff = copies("BackOff").await?.remove(0);
    assert_eq!(backoff.type_.as_deref(), Some("Warning"));
    assert_eq!(
        backoff.message.as_deref(),
        Some("Back-off restarting failed container app")
    );
    assert_eq!(
        backoff.involved_object.uid.as_deref(),
        Some(local_uid.as_str())
    );
    assert_eq!(
        backoff.source.as_ref().and_then(|s| s.host.as_deref()),
        Some(node_name.as_str())
    );
    remote_events
        .patch(
            "remote-web.backoff",
            &PatchParams::default(),
            &Patch::Merge(json!({ "count": 3 })),
        )
        .await?;
    wait_for("the count to follow", WAIT, || async {
        let backoff = copies("BackOff").await?;
        Ok(backoff.len() == 1 && backoff[0].count == Some(3))
    })
    .await?;
    // Once its copy shows it, a remote Event is kept without what it says
    // (settled): a copy someone deletes is written again from a read of
    // the remote Event.
    let first_copy = copies("BackOff").await?.remove(0);
    events
        .delete(
            first_copy.metadata.name.as_deref().context("name")?,
            &DeleteParams::default(),
        )
        .await?;
    wait_for("the deleted copy to be written again", WAIT, || async {
        let backoff = copies("BackOff").await?;
        Ok(backoff.len() == 1
            && backoff[0].count == Some(3)
            && backoff[0].metadata.uid != first_copy.metadata.uid)
    })
    .await?;
    // So is a remote pod once the local pod shows its status: a local
    // status someone changes is put back from a read of the remote pod.
    let ready = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone())
    };
    assert_eq!(
        ready(&pods.get("remote-web").await?).as_deref(),
        Some("True")
    );
    let changed = pods
        .patch_status(
            "remote-web",
            &PatchParams::default(),
            &Patch::Strategic(json!({
                "status": { "conditions": [{ "type": "Ready", "status": "False" }] }
            })),
        )
        .await?;
    assert_eq!(ready(&changed).as_deref(), Some("False"));
    wait_for("the local status to be put back", WAIT, || async {
        Ok(ready(&pods.get("remote-web").await?).as_deref() == Some("True"))
    })
    .await?;

    // A copy that says what its remote Event says is not written again,
    // by the passes nor by a restart (the provider's scheduler writes an
    // events.k8s.io eventTime in microseconds, which a core/v1 copy keeps
    // in whole seconds).
    let scheduled = copies("Scheduled")
        .await?
        .remove(0)
        .metadata
        .resource_version;
    let killed = liqo_e2e::kill_agent(consumer, liqo_e2e::Agent::VirtualKubelet)?;
    liqo_e2e::agent_restarted(consumer, liqo_e2e::Agent::VirtualKubelet, killed, WAIT).await?;
    // A few passes of the restarted agent (it resyncs every 5 s).
    tokio::time::sleep(Duration::from_secs(12)).await;
    let backoff = copies("BackOff").await?;
    assert_eq!(
        backoff.len(),
        1,
        "no duplicate after a restart: {backoff:?}"
    );
    assert_eq!(backoff[0].count, Some(3));
    let after = copies("Scheduled").await?;
    assert_eq!(after.len(), 1);
    assert_eq!(
        after[0].metadata.resource_version, scheduled,
        "the Scheduled copy was written again though nothing changed: {after:?}"
    );
    Ok(())
}
