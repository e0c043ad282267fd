//! What a peer granted storage (1Gi in 2 claims, of the class `standard`
//! only) can claim with its own credential straight against the
//! provider's API server, and what it cannot: a volume it was not given
//! (by name, by selector, by class, by a claim bound afterwards, through a
//! generic ephemeral volume, a volume of its own), or more than its grant
//! (bytes or claims).
//! Each refusal is paired with the allowed form of the same request (see
//! `provider_hardening`), and names the rule that made it.

use anyhow::Result;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, ResourceQuota};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use liqo_api::shares::SHARE_QUOTA;
use liqo_e2e::fixture::{PROVIDER_ID, Pair, Stage, WAIT};
use liqo_e2e::wait_for;
use serde_json::json;

use crate::provider_hardening::{PODS, RBAC, Tally, from, make_twin, pod};

const CLAIMS: &str = "ValidatingAdmissionPolicy 'liqo-peer-claims'";
const QUOTA: &str = "exceeded quota";
const TWIN: &str = "vault-consumer-1";

/// A claim of the peer's of `size`, changed by `change` on its JSON.
fn claim(
    name: &str,
    size: &str,
    change: impl FnOnce(&mut serde_json::Value),
) -> PersistentVolumeClaim {
    let mut v = json!({
        "metadata": { "name": name },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "standard",
            "resources": { "requests": { "storage": size } },
        },
    });
    change(&mut v);
    from(v)
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_claims_only_its_grant_in_the_classes_it_is_given() -> Result<()> {
    let mut t = Tally::default();
    let pair = Pair::at(Stage::Installed).await?;
    let prov = &pair.provider_client;
    provider_classes_and_root_volume(prov).await?;
    let one = peered_with_storage(&mut t, &pair).await?;
    claims_stay_within_the_grant_and_its_classes(&mut t, &one, prov).await?;
    no_volume_of_its_own_and_none_of_the_providers(&mut t, &one).await;
    pods_mount_its_claims_but_make_none(&mut t, &one).await;
    // Nothing of the peer's reached the provider's volume.
    let root = Api::<PersistentVolume>::all(prov.clone())
        .get("vault-root")
        .await?;
    assert!(
        root.spec.and_then(|s| s.claim_ref).is_none(),
        "the provider's volume was claimed"
    );
    t.at_least(10, 5);
    Ok(())
}

/// The provider's classes: `standard` (its default) for peers, `gold`
/// not; and a volume of its own, Available, that names the node's root,
/// of no class (as pre-provisioned volumes often are). A volume of a
/// class offered to peers would be theirs to claim: docs/storage.md.
async fn provider_classes_and_root_volume(prov: &kube::Client) -> Result<()> {
    let pp = PostParams::default();
    for (name, default) in [("standard", "true"), ("gold", "false")] {
        Api::<StorageClass>::all(prov.clone())
            .create(
                &pp,
                &from(json!({
                    "metadata": { "name": name, "annotations": {
                        "storageclass.kubernetes.io/is-default-class": default,
                    } },
                    "provisioner": "example.com/none",
                    "volumeBindingMode": "WaitForFirstConsumer",
                    "allowVolumeExpansion": true,
                })),
            )
            .await?;
    }
    Api::<PersistentVolume>::all(prov.clone())
        .create(
            &pp,
            &from(json!({
                "metadata": { "name": "vault-root" },
                "spec": {
                    "capacity": { "storage": "10Gi" }, "accessModes": ["ReadWriteOnce"],
                    "hostPath": { "path": "/" },
                },
            })),
        )
        .await?;
    Ok(())
}

/// The consumer peered under a grant of 1Gi in 2 claims of `standard`,
/// and its twin made, whose share holds the storage granted; the peer's
/// own credential on the provider.
async fn peered_with_storage(t: &mut Tally, pair: &Pair) -> Result<kube::Client> {
    let prov = &pair.provider_client;
    pair.on_provider(&[
        "sharing-policy",
        "set",
        "--storage=1Gi",
        "--claims=2",
        "--storage-classes=standard",
    ])
    .success();
    pair.on_consumer(&["peer", "--remote-kubeconfig", &pair.remote()])
        .success();
    liqo_e2e::virtual_node_ready(&pair.consumer_client, PROVIDER_ID, WAIT).await?;
    let one = liqo_e2e::peer_client(pair.consumer(), &pair.consumer_client, PROVIDER_ID).await?;
    make_twin(t, &one, prov, TWIN, "consumer-1", "baseline").await?;
    // Its twin's share holds its storage.
    let quotas: Api<ResourceQuota> = Api::namespaced(prov.clone(), TWIN);
    wait_for("the share to hold the storage granted", WAIT, || async {
        let hard = quotas
            .get(SHARE_QUOTA)
            .await?
            .status
            .and_then(|s| s.hard)
            .unwrap_or_default();
        Ok(
            hard.get("persistentvolumeclaims").map(|q| q.0.as_str()) == Some("2")
                && hard.get("requests.storage").is_some_and(|q| q.0 != "0"),
        )
    })
    .await?;
    Ok(one)
}

/// Claims of the classes it is given, within the bytes and the number of
/// its grant, each class counted on its own by its share; none that names
/// or selects a volume, is of another class or of none, or is bound to
/// the provider's volume afterwards.
async fn claims_stay_within_the_grant_and_its_classes(
    t: &mut Tally,
    one: &kube::Client,
    prov: &kube::Client,
) -> Result<()> {
    let pp = PostParams::default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(one.clone(), TWIN);
    t.allowed(
        "a claim of the class it is given",
        claims
            .create(&pp, &claim("ok-standard", "300Mi", |_| {}))
            .await,
    );
    t.refused(
        "a claim beyond the storage of its grant",
        QUOTA,
        claims.create(&pp, &claim("esc-big", "2Gi", |_| {})).await,
    );
    t.allowed(
        "a claim naming no class (the provider's default is filled in)",
        claims
            .create(
                &pp,
                &claim("ok-default", "300Mi", |c| {
                    c["spec"]
                        .as_object_mut()
                        .map(|s| s.remove("storageClassName"));
                }),
            )
            .await,
    );
    t.refused(
        "a claim naming the provider's volume",
        CLAIMS,
        claims
            .create(
                &pp,
                &claim("esc-name", "100Mi", |c| {
                    c["spec"]["volumeName"] = json!("vault-root");
                }),
            )
            .await,
    );
    t.refused(
        "a claim selecting volumes by label",
        CLAIMS,
        claims
            .create(
                &pp,
                &claim("esc-select", "100Mi", |c| {
                    c["spec"]["selector"] = json!({ "matchLabels": { "any": "x" } });
                }),
            )
            .await,
    );
    t.refused(
        "a claim of a class off its list",
        CLAIMS,
        claims
            .create(
                &pp,
                &claim("esc-gold", "100Mi", |c| {
                    c["spec"]["storageClassName"] = json!("gold");
                }),
            )
            .await,
    );
    t.refused(
        "a claim of no class at all (it would bind to any Available volume)",
        CLAIMS,
        claims
            .create(
                &pp,
                &claim("esc-none", "100Mi", |c| {
                    c["spec"]["storageClassName"] = json!("");
                }),
            )
            .await,
    );
    t.refused(
        "binding its own claim to the provider's volume afterwards",
        CLAIMS,
        claims
            .patch(
                "ok-standard",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "volumeName": "vault-root" } })),
            )
            .await,
    );
    t.refused(
        "a third claim, beyond the two of its grant",
        QUOTA,
        claims.create(&pp, &claim("esc-third", "1Mi", |_| {})).await,
    );
    // Its share counts each allowed class on its own.
    let quotas: Api<ResourceQuota> = Api::namespaced(prov.clone(), TWIN);
    wait_for(
        "the share to count the claims of standard",
        WAIT,
        || async {
            let used = quotas
                .get(SHARE_QUOTA)
                .await?
                .status
                .and_then(|s| s.used)
                .unwrap_or_default();
            Ok(used
                .get("standard.storageclass.storage.k8s.io/persistentvolumeclaims")
                .map(|q| q.0.as_str())
                == Some("2"))
        },
    )
    .await
}

/// It may neither make a volume nor read the provider's.
async fn no_volume_of_its_own_and_none_of_the_providers(t: &mut Tally, one: &kube::Client) {
    t.refused(
        "a volume of its own",
        RBAC,
        Api::<PersistentVolume>::all(one.clone())
            .create(
                &PostParams::default(),
                &from(json!({ "metadata": { "name": "esc-pv" }, "spec": {
                    "capacity": { "storage": "1Gi" }, "accessModes": ["ReadWriteOnce"],
                    "local": { "path": "/" }, "storageClassName": "standard",
                    "nodeAffinity": { "required": { "nodeSelectorTerms": [{ "matchExpressions": [
                        { "key": "kubernetes.io/hostname", "operator": "Exists" }] }] } },
                } })),
            )
            .await,
    );
    t.refused(
        "reading the provider's volumes",
        RBAC,
        Api::<PersistentVolume>::all(one.clone())
            .get("vault-root")
            .await,
    );
}

/// A pod may mount its own claim, but not have a claim made for it (a
/// generic ephemeral volume, whose claim the provider's controller makes).
async fn pods_mount_its_claims_but_make_none(t: &mut Tally, one: &kube::Client) {
    let pods: Api<Pod> = Api::namespaced(one.clone(), TWIN);
    t.allowed(
        "a pod mounting its own claim",
        pods.create(
            &PostParams::default(),
            &pod("ok-mount", |p| {
                p["spec"]["volumes"] =
                    json!([{ "name": "d", "persistentVolumeClaim": { "claimName": "ok-standard" } }]);
            }),
        )
        .await,
    );
    t.refused_pods(
        &pods,
        vec![(
            "a generic ephemeral volume (its claim made by the provider's controller)",
            PODS,
            pod("esc-ephemeral", |p| {
                p["spec"]["volumes"] = json!([{ "name": "e", "ephemeral": { "volumeClaimTemplate": { "spec": {
                    "accessModes": ["ReadWriteOnce"], "storageClassName": "standard",
                    "resources": { "requests": { "storage": "1Mi" } },
                } } } }]);
            }),
        )],
    )
    .await;
}
