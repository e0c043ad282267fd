//! Pods that need a missing ConfigMap wait for it, as on a kubelet.

use super::*;

/// Pods that reference a missing ConfigMap wait as on a kubelet, an
/// optional reference holds nothing back, and they start once it exists.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_that_need_a_missing_config_map_wait_until_it_exists() -> Result<()> {
    let shop = Shop::at(Stage::Offloaded(NS)).await?;
    let Shop {
        pods,
        cms,
        events,
        remote_cms,
        remote_rs,
        ..
    } = &shop;
    let pp = PostParams::default();

    // Pods and missing ConfigMaps.
    pods.create(
        &pp,
        &pod(
            "env-waits",
            json!([{ "configMapRef": { "name": "late" } }]),
            json!([]),
        )?,
    )
    .await?;
    pods.create(
        &pp,
        &pod(
            "volume-waits",
            json!([]),
            json!([{ "name": "conf", "configMap": { "name": "late-vol" } }]),
        )?,
    )
    .await?;
    pods.create(
        &pp,
        &pod(
            "optional-runs",
            json!([{ "configMapRef": { "name": "never", "optional": true } }]),
            json!([]),
        )?,
    )
    .await?;
    wait_for(
        "the waiting reasons, and the optional pod Running",
        WAIT,
        || async {
            let env = pods.get("env-waits").await?;
            let vol = pods.get("volume-waits").await?;
            let opt = pods.get("optional-runs").await?;
            Ok(
                waiting_reason(&env).as_deref() == Some("CreateContainerConfigError")
                    && waiting_reason(&vol).as_deref() == Some("ContainerCreating")
                    && running(&opt),
            )
        },
    )
    .await?;
    let env = pods.get("env-waits").await?;
    let message = env
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c[0].state.clone())
        .and_then(|s| s.waiting)
        .and_then(|w| w.message);
    assert_eq!(message.as_deref(), Some("configmap \"late\" not found"));
    let failed_mount: Vec<Event> = events
        .list(&ListParams::default().fields("involvedObject.name=volume-waits"))
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedMount"))
        .collect();
    assert_eq!(failed_mount.len(), 1, "{failed_mount:?}");
    assert!(
        failed_mount[0]
            .message
            .as_deref()
            .is_some_and(|m| m.contains("configmap \"late-vol\" not found")),
        "{:?}",
        failed_mount[0].message
    );
    for waiting in ["env-waits", "volume-waits"] {
        assert!(
            remote_rs.get_opt(waiting).await?.is_none(),
            "{waiting} is not created on the provider"
        );
    }

    // The ConfigMaps appear: the pods start.
    cms.create(&pp, &config_map("late", json!({ "A": "1" }), json!({}))?)
        .await?;
    cms.create(
        &pp,
        &config_map("late-vol", json!({ "f": "x" }), json!({}))?,
    )
    .await?;
    wait_for("the waiting pods Running", WAIT, || async {
        Ok(running(&pods.get("env-waits").await?) && running(&pods.get("volume-waits").await?))
    })
    .await?;
    // And what they read exists on the provider.
    assert!(remote_cms.get_opt("late").await?.is_some());
    assert!(remote_cms.get_opt("late-vol").await?.is_some());
    Ok(())
}
