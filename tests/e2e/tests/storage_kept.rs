//! A claim kept on the provider that grows, and ending a peering while
//! claims hold data there
//! (docs/storage.md, "Nothing lost by surprise"): `unpeer` refuses on the
//! consumer's side and on the provider's (`--tenant`), naming the claims;
//! the provider's administrator keeps them with `--keep-remote-data`, and
//! the twin namespace holding them stays while the rest of the tenancy
//! goes; the consumer keeps its side too, and a later peering and offload
//! of the same namespace find the claim again. On the testbed's kwok nodes: what is checked is where the claims
//! are kept, not their bytes (`real_node_storage_offloaded` does that).

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::names::{labels, peering};
use liqo_e2e::fixture::{CONSUMER_ID, PROVIDER_ID, Pair, Stage, WAIT};
use liqo_e2e::wait_for;
use serde_json::json;

const NS: &str = "vault";

/// A pod that mounts the claim `data`.
fn user_of_data(name: &str) -> Result<Pod> {
    Ok(serde_json::from_value(liqo_e2e::restricted(json!({
        "metadata": { "name": name },
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{ "name": "c", "image": "nginx",
                             "volumeMounts": [{ "name": "d", "mountPath": "/d" }] }],
            "volumes": [{ "name": "d", "persistentVolumeClaim": { "claimName": "data" } }],
        },
    })))?)
}

/// Peers the consumer with the provider (`remote`, its kubeconfig) and
/// offloads `NS`, which exists, its pods to the provider only.
async fn peer_and_offload(pair: &Pair, remote: &str) -> Result<()> {
    pair.on_consumer(&["peer", "--remote-kubeconfig", remote])
        .success();
    liqo_e2e::virtual_node_ready(&pair.consumer_client, PROVIDER_ID, WAIT).await?;
    pair.on_consumer(&[
        "offload",
        "namespace",
        NS,
        "--pod-offloading-strategy=Remote",
        "--wait",
    ])
    .success();
    Ok(())
}

/// The consumer's volumes of claims kept on the provider.
async fn kept_volumes(home: &kube::Client) -> Result<Vec<PersistentVolume>> {
    Ok(Api::<PersistentVolume>::all(home.clone())
        .list(&ListParams::default().labels(&format!("{}={PROVIDER_ID}", labels::PEER_CLUSTER_ID)))
        .await?
        .items)
}

/// The provider's claims of twin namespaces.
async fn twins_claims(prov: &kube::Client) -> Result<Vec<PersistentVolumeClaim>> {
    Ok(Api::<PersistentVolumeClaim>::all(prov.clone())
        .list(&ListParams::default().labels(labels::ORIGIN_NAMESPACE))
        .await?
        .items)
}

/// The consumer's twin namespaces on the provider.
async fn twins(prov: &kube::Client) -> Result<Vec<Namespace>> {
    Ok(Api::<Namespace>::all(prov.clone())
        .list(&ListParams::default().labels(&format!("{}={CONSUMER_ID}", labels::TENANT)))
        .await?
        .items)
}

/// The pair, the provider granting 1Gi in 4 claims of its class
/// `standard`, peered, `NS` offloaded, and in it the claim `data`, which
/// names no class, used by the pod `user`: the claim kept on the provider.
async fn a_kept_claim() -> Result<Pair> {
    let pair = Pair::at(Stage::Installed).await?;
    let (home, prov) = (&pair.consumer_client, &pair.provider_client);
    let pp = PostParams::default();
    Api::<StorageClass>::all(prov.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": "standard" },
                "provisioner": "example.com/none",
                "volumeBindingMode": "WaitForFirstConsumer",
                "allowVolumeExpansion": true,
            }))?,
        )
        .await?;
    pair.on_provider(&[
        "sharing-policy",
        "set",
        "--storage=1Gi",
        "--claims=4",
        "--storage-classes=standard",
    ])
    .success();
    Api::<Namespace>::all(home.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({ "metadata": { "name": NS } }))?,
        )
        .await?;
    peer_and_offload(&pair, &pair.remote()).await?;

    // A claim that names no class, and a pod that uses it: the claim goes
    // to the provider with the pod.
    Api::<PersistentVolumeClaim>::namespaced(home.clone(), NS)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": "data" },
                "spec": { "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": "100Mi" } } },
            }))?,
        )
        .await?;
    Api::<Pod>::namespaced(home.clone(), NS)
        .create(&pp, &user_of_data("user")?)
        .await?;
    wait_for("the claim kept on the provider", WAIT, || async {
        Ok(kept_volumes(home).await?.len() == 1 && twins_claims(prov).await?.len() == 1)
    })
    .await?;
    Ok(pair)
}

/// The twin's demand counts a kept claim, so that its share holds it; and
/// the claim grows where the provider's class lets it: the provider's
/// claim (bound here by hand to a volume, as its provisioner would) is
/// asked for more, and the size the provider gives comes back.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_claim_counts_in_its_twins_demand_and_grows_as_the_provider_lets_it() -> Result<()> {
    let pair = a_kept_claim().await?;
    let (home, prov) = (&pair.consumer_client, &pair.provider_client);
    let pp = PostParams::default();
    wait_for("the twin's demand to count the claim", WAIT, || async {
        let twins = twins(prov).await?;
        let demand = twins
            .first()
            .and_then(|t| t.metadata.annotations.as_ref())
            .and_then(|a| a.get(liqo_api::shares::DEMAND_ANNOTATION))
            .cloned()
            .unwrap_or_default();
        let demand = liqo_api::shares::demand_of(Some(&std::collections::BTreeMap::from([(
            liqo_api::shares::DEMAND_ANNOTATION.to_owned(),
            demand,
        )])));
        Ok(demand.storage_bytes == 100 << 20 && demand.claims == 1)
    })
    .await?;
    let twin = twins(prov)
        .await?
        .first()
        .and_then(|n| n.metadata.name.clone())
        .context("the twin")?;
    let remote_claims: Api<PersistentVolumeClaim> = Api::namespaced(prov.clone(), &twin);
    let remote_uid = remote_claims
        .get("data")
        .await?
        .metadata
        .uid
        .context("uid")?;
    Api::<PersistentVolume>::all(prov.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": "vault-data" },
                "spec": {
                    "capacity": { "storage": "100Mi" }, "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "standard", "hostPath": { "path": "/tmp/vault-data" },
                    "claimRef": { "namespace": twin, "name": "data", "uid": remote_uid },
                },
            }))?,
        )
        .await?;
    wait_for("the provider's claim bound", WAIT, || async {
        Ok(remote_claims
            .get("data")
            .await?
            .status
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Bound"))
    })
    .await?;
    let claims_here: Api<PersistentVolumeClaim> = Api::namespaced(home.clone(), NS);
    claims_here
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "spec": { "resources": { "requests": { "storage": "200Mi" } } } }),
            ),
        )
        .await?;
    let size = |c: &PersistentVolumeClaim| {
        c.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .and_then(|q| liqo_api::sharing::parse_bytes(&q.0))
    };
    wait_for("the provider's claim asked for more", WAIT, || async {
        Ok(size(&remote_claims.get("data").await?) == Some(200 << 20))
    })
    .await?;
    remote_claims
        .patch_status(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "capacity": { "storage": "200Mi" } } })),
        )
        .await?;
    wait_for("the size given here too", WAIT, || async {
        let given = claims_here
            .get("data")
            .await?
            .status
            .and_then(|s| s.capacity)
            .and_then(|c| c.get("storage").cloned())
            .and_then(|q| liqo_api::sharing::parse_bytes(&q.0));
        let volume = kept_volumes(home).await?;
        let volume_size = volume
            .first()
            .and_then(|v| v.spec.as_ref()?.capacity.as_ref()?.get("storage").cloned())
            .and_then(|q| liqo_api::sharing::parse_bytes(&q.0));
        Ok(given == Some(200 << 20) && volume_size == Some(200 << 20))
    })
    .await?;
    Ok(())
}

/// `unpeer` refuses on the consumer's side and on the provider's
/// (`--tenant`) while a kept claim holds data, naming it; the provider's
/// administrator keeps it with `--keep-remote-data`, and the twin holding
/// it stays while the rest of the tenancy goes; the consumer keeps its
/// side too, and a later peering and offload find the claim again.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpeer_refuses_while_claims_hold_data_and_keeps_them_when_told() -> Result<()> {
    let pair = a_kept_claim().await?;
    let (home, prov) = (&pair.consumer_client, &pair.provider_client);
    let remote = pair.remote();
    let pods: Api<Pod> = Api::namespaced(home.clone(), NS);
    pods.delete("user", &DeleteParams::default()).await?;
    pair.on_consumer(&["unoffload", "namespace", NS, "--keep-remote-data"])
        .success();

    // Refused on both sides while the claim holds data, naming it.
    let refused = pair
        .on_consumer(&["unpeer", "--remote-kubeconfig", &remote])
        .user_error(6);
    let line = refused.error_line();
    ensure!(
        line.contains("vault/data") && line.contains("--keep-remote-data"),
        "{line}"
    );
    let refused = pair
        .on_provider(&["unpeer", "--tenant", CONSUMER_ID, "--yes"])
        .user_error(6);
    let line = refused.error_line();
    ensure!(
        line.contains("/data") && line.contains("--delete-remote-data"),
        "{line}"
    );
    ensure!(
        kept_volumes(home).await?.len() == 1,
        "a refusal changed something"
    );

    // Kept by the provider's administrator: the twin holding the claim
    // stays, the rest of the tenancy goes.
    pair.on_provider(&[
        "unpeer",
        "--tenant",
        CONSUMER_ID,
        "--keep-remote-data",
        "--yes",
    ])
    .success();
    let tenancy = peering::tenant_namespace(&ClusterId::new(CONSUMER_ID)?);
    wait_for("the tenancy gone, its kept claim left", WAIT, || async {
        let left = Api::<Namespace>::all(prov.clone())
            .get_opt(&tenancy)
            .await?;
        Ok(left.is_none() && twins_claims(prov).await?.len() == 1)
    })
    .await?;
    let twins = twins(prov).await?;
    ensure!(
        twins.len() == 1 && twins[0].metadata.deletion_timestamp.is_none(),
        "the twin holding the claim is gone"
    );
    let kept_uid = twins_claims(prov)
        .await?
        .first()
        .and_then(|c| c.metadata.uid.clone())
        .context("the kept claim")?;

    // The consumer keeps its side too; a later peering and offload of the
    // same namespace find the claim again, and its pod goes back to it.
    pair.on_consumer(&[
        "unpeer",
        "--remote-kubeconfig",
        &remote,
        "--keep-remote-data",
    ])
    .success();
    ensure!(
        kept_volumes(home).await?.len() == 1,
        "the volume here is gone"
    );
    peer_and_offload(&pair, &remote).await?;
    pods.create(&PostParams::default(), &user_of_data("again")?)
        .await?;
    let node = peering::virtual_node(&ClusterId::new(PROVIDER_ID)?);
    wait_for(
        "the pod back on the provider, with its claim",
        WAIT,
        || async {
            let bound = pods
                .get_opt("again")
                .await?
                .and_then(|p| p.spec?.node_name)
                .is_some_and(|n| n == node);
            let remote_pods = Api::<Pod>::all(prov.clone())
                .list(&ListParams::default().labels("liqo.io/local-pod-uid"))
                .await?
                .items;
            Ok(bound && !remote_pods.is_empty())
        },
    )
    .await?;
    let claims = twins_claims(prov).await?;
    ensure!(
        claims.len() == 1 && claims[0].metadata.uid.as_deref() == Some(kept_uid.as_str()),
        "the kept claim was not found again: {} claims",
        claims.len()
    );
    Ok(())
}
