//! ConfigMaps and Secrets copied into the twin, and what is left alone.

use super::*;

/// ConfigMaps and Secrets: copied with our labels, updated, put back,
/// removed when opted out or deleted; what is not ours is left alone.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_maps_and_secrets_follow_their_local_objects_and_nothing_else() -> Result<()> {
    let shop = Shop::at(Stage::Peered).await?;
    let Shop {
        pair,
        cms,
        secrets,
        remote_cms,
        remote_secrets,
        ..
    } = &shop;
    Api::<Namespace>::all(shop.local())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": NS } }))?,
        )
        .await?;

    // Objects that exist before the offloading.
    let pp = PostParams::default();
    cms.create(
        &pp,
        &config_map("app-config", json!({ "k": "v1" }), json!({}))?,
    )
    .await?;
    cms.create(
        &pp,
        &config_map(
            "private",
            json!({ "k": "v" }),
            json!({ names::SKIP_REFLECTION_ANNOTATION: "true" }),
        )?,
    )
    .await?;
    secrets
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": "app-secret", "namespace": NS },
                "type": "Opaque",
                "data": { "password": "aHVudGVyMg==" },
            }))?,
        )
        .await?;
    // A legacy token Secret of the namespace's default account.
    secrets
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {
                    "name": "default-token",
                    "namespace": NS,
                    "annotations": { "kubernetes.io/service-account.name": "default" },
                },
                "type": "kubernetes.io/service-account-token",
            }))?,
        )
        .await?;

    pair.on_consumer(&["offload", "namespace", NS, "--wait", "--timeout=60"])
        .success();
    let remote_ns: Api<Namespace> = Api::all(shop.provider());
    wait_for("the twin namespace", WAIT, || async {
        Ok(remote_ns.get_opt(TWIN).await?.is_some())
    })
    .await?;
    // Nothing is made in a twin before its share (liqo-twin-share).
    let quotas: Api<ResourceQuota> = Api::namespaced(shop.provider(), TWIN);
    wait_for("the twin's share", WAIT, || async {
        Ok(quotas.get_opt(SHARE_QUOTA).await?.is_some())
    })
    .await?;
    // The provider's admin makes an object in the twin under a name the
    // consumer then uses too.
    remote_cms
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": "theirs", "namespace": TWIN },
                "data": { "k": "admin" },
            }))?,
        )
        .await?;
    cms.create(
        &pp,
        &config_map("theirs", json!({ "k": "ours" }), json!({}))?,
    )
    .await?;

    wait_for("app-config and app-secret in the twin", WAIT, || async {
        Ok(remote_cms.get_opt("app-config").await?.is_some()
            && remote_secrets.get_opt("app-secret").await?.is_some())
    })
    .await?;
    let copy = remote_cms.get("app-config").await?;
    assert!(is_ours(&copy.metadata));
    assert_eq!(label(&copy.metadata, labels::ORIGIN_NAMESPACE), Some(NS));
    assert_eq!(label(&copy.metadata, "app"), Some("web"));
    assert_eq!(
        copy.data,
        Some(BTreeMap::from([("k".to_owned(), "v1".to_owned())]))
    );
    let secret = remote_secrets.get("app-secret").await?;
    assert_eq!(
        secret.data.as_ref().and_then(|d| d.get("password")),
        Some(&ByteString(b"hunter2".to_vec()))
    );
    // Give the reflector a few passes before checking what it must not do.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(remote_cms.get_opt("private").await?.is_none(), "opted out");
    assert!(
        remote_secrets.get_opt("default-token").await?.is_none(),
        "service account tokens stay home"
    );
    let root_ca = remote_cms.get("kube-root-ca.crt").await?;
    assert!(!is_ours(&root_ca.metadata), "the provider's own");
    assert_eq!(
        value(&remote_cms.get("theirs").await?, "k"),
        Some("admin"),
        "the admin's object is not taken over"
    );

    // Local updates propagate.
    cms.patch(
        "app-config",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "k": "v2" } })),
    )
    .await?;
    let data_is = |api: Api<ConfigMap>, want: &'static str| async move {
        Ok::<_, anyhow::Error>(
            api.get_opt("app-config")
                .await?
                .and_then(|c| c.data)
                .and_then(|d| d.get("k").cloned())
                .as_deref()
                == Some(want),
        )
    };
    wait_for("the update on the provider", WAIT, || {
        data_is(remote_cms.clone(), "v2")
    })
    .await?;

    // The provider's admin changes one copy and deletes another: both
    // are put back.
    remote_cms
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "k": "tampered" } })),
        )
        .await?;
    remote_secrets
        .delete("app-secret", &DeleteParams::default())
        .await?;
    wait_for("the copies put back", WAIT, || async {
        Ok(data_is(remote_cms.clone(), "v2").await?
            && remote_secrets.get_opt("app-secret").await?.is_some())
    })
    .await?;

    // Opting out afterwards removes the copy; deleting locally too.
    cms.patch(
        "app-config",
        &PatchParams::default(),
        &Patch::Merge(
            json!({ "metadata": { "annotations": { names::SKIP_REFLECTION_ANNOTATION: "true" } } }),
        ),
    )
    .await?;
    secrets
        .delete("app-secret", &DeleteParams::default())
        .await?;
    wait_for("the opted-out and deleted copies gone", WAIT, || async {
        Ok(remote_cms.get_opt("app-config").await?.is_none()
            && remote_secrets.get_opt("app-secret").await?.is_none())
    })
    .await?;
    assert_eq!(
        value(&remote_cms.get("theirs").await?, "k"),
        Some("admin"),
        "the admin's object is still theirs"
    );
    Ok(())
}
