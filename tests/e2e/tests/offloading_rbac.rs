//! The virtual kubelet's rights on the consumer, asked of the real
//! authorizer (SubjectAccessReviews for its ServiceAccount): it may read
//! what it reflects (ConfigMaps, Secrets, Services, EndpointSlices; its
//! Event copies; service account tokens) in offloaded namespaces only,
//! through one RoleBinding per namespace. `liqoctl offload` makes it (an
//! offloading applied by hand, as GitOps would, has none, and the agent
//! says so in the offloading's status), `liqoctl peer` makes it for the
//! namespaces offloaded before, and it goes with `unpeer` and with the
//! offloading (`unoffload`).

use anyhow::{Context, Result};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, PostParams};
use liqo_api::ClusterId;
use liqo_api::names::{self, peering};
use liqo_api::offloading::NamespaceOffloading;
use liqo_e2e::fixture::{Pair, Stage, WAIT};
use liqo_e2e::wait_for;
use serde_json::json;

/// Offloaded.
const SHOP: &str = "shop";
/// Never offloaded.
const PRIVATE: &str = "private";

/// What the agent needs in an offloaded namespace: (verb, group, resource).
const REFLECTION: [(&str, &str, &str); 7] = [
    ("list", "", "secrets"),
    ("watch", "", "configmaps"),
    ("list", "", "services"),
    ("watch", "discovery.k8s.io", "endpointslices"),
    ("list", "", "events"),
    ("patch", "", "events"),
    ("create", "", "serviceaccounts/token"),
];

/// May the virtual kubelet of provider-1 do `verb` on `resource` in
/// `namespace` (every namespace for `None`)?
async fn agent_may(
    client: &kube::Client,
    (verb, group, resource): (&str, &str, &str),
    namespace: Option<&str>,
) -> Result<bool> {
    let account = peering::virtual_kubelet(&ClusterId::new("provider-1")?);
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {
            "user": format!("system:serviceaccount:{}:{account}", names::NAMESPACE),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{}", names::NAMESPACE)],
            "resourceAttributes": {
                "verb": verb, "group": group, "resource": resource,
                "subresource": subresource, "namespace": namespace,
            },
        },
    }))?;
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// The reflection rights the agent has in `namespace`, as a list of
/// booleans in the order of [`REFLECTION`].
async fn rights_in(client: &kube::Client, namespace: Option<&str>) -> Result<Vec<bool>> {
    let mut out = Vec::new();
    for right in REFLECTION {
        out.push(agent_may(client, right, namespace).await?);
    }
    Ok(out)
}

/// This provider's entry in the offloading's status: (ready, reason,
/// message).
async fn entry(
    offloadings: &Api<NamespaceOffloading>,
) -> Result<Option<(bool, Option<String>, Option<String>)>> {
    let off = offloadings.get_opt(names::NAMESPACE_OFFLOADING).await?;
    Ok(off.and_then(|o| o.status).and_then(|s| {
        s.clusters
            .into_iter()
            .find(|c| c.cluster_id.as_str() == "provider-1")
            .map(|c| (c.ready, c.reason, c.message))
    }))
}

#[liqo_e2e::test]
async fn the_agent_reads_offloaded_namespaces_only() -> Result<()> {
    let pair = Pair::at(Stage::Peered).await?;
    let provider = pair.provider();
    let local = pair.consumer_client.clone();
    let prov = pair.provider_client.clone();
    let pp = PostParams::default();
    for ns in [SHOP, PRIVATE] {
        Api::<Namespace>::all(local.clone())
            .create(
                &pp,
                &serde_json::from_value(json!({ "metadata": { "name": ns } }))?,
            )
            .await?;
        Api::<Secret>::namespaced(local.clone(), ns)
            .create(
                &pp,
                &serde_json::from_value(json!({
                    "metadata": { "name": "db", "namespace": ns },
                    "stringData": { "password": "hunter2" },
                }))?,
            )
            .await?;
    }
    let none = vec![false; REFLECTION.len()];
    let all = vec![true; REFLECTION.len()];
    // Peered, nothing offloaded: no read anywhere.
    assert_eq!(rights_in(&local, None).await?, none, "cluster-wide");
    assert_eq!(rights_in(&local, Some(SHOP)).await?, none, "in {SHOP}");

    // An offloading applied by hand, as GitOps would from `-o yaml`: the
    // agent has no rights there, and says so instead of offloading.
    let yaml = pair
        .on_consumer(&["offload", "namespace", SHOP, "-o", "json"])
        .success();
    let declared: NamespaceOffloading = serde_json::from_str(&yaml.stdout)?;
    let offloadings: Api<NamespaceOffloading> = Api::namespaced(local.clone(), SHOP);
    offloadings.create(&pp, &declared).await?;
    let waited = wait_for("the agent to report that it is not bound", WAIT, || async {
        Ok(entry(&offloadings)
            .await?
            .is_some_and(|(ready, reason, _)| !ready && reason.as_deref() == Some("AgentNotBound")))
    })
    .await;
    let seen = entry(&offloadings).await?;
    waited.with_context(|| format!("{seen:?}"))?;
    let message = seen.and_then(|(_, _, m)| m).unwrap_or_default();
    assert!(
        message.contains("liqoctl offload namespace shop"),
        "{message}"
    );
    let twins: Api<Namespace> = Api::all(prov.clone());
    assert!(
        twins.get_opt("shop-consumer").await?.is_none(),
        "a twin made for a namespace the agent may not read"
    );

    // `liqoctl offload` binds it: the twin comes, the Secret is reflected.
    pair.on_consumer(&["offload", "namespace", SHOP, "--wait", "--timeout=60"])
        .success();
    let remote_secrets: Api<Secret> = Api::namespaced(prov.clone(), "shop-consumer");
    wait_for("the Secret in the twin", WAIT, || async {
        Ok(remote_secrets.get_opt("db").await?.is_some())
    })
    .await?;
    assert_eq!(rights_in(&local, Some(SHOP)).await?, all, "in {SHOP}");
    assert_eq!(
        rights_in(&local, Some(PRIVATE)).await?,
        none,
        "in {PRIVATE}"
    );
    assert_eq!(rights_in(&local, None).await?, none, "cluster-wide");
    let bindings: Api<RoleBinding> = Api::namespaced(local.clone(), SHOP);
    let vk = peering::virtual_kubelet(&ClusterId::new("provider-1")?);
    let binding = bindings.get(&vk).await?;
    let offloading_uid = offloadings
        .get(names::NAMESPACE_OFFLOADING)
        .await?
        .metadata
        .uid;
    let owner = binding
        .metadata
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .next()
        .context("the binding has no owner")?;
    assert_eq!(
        (owner.kind.as_str(), Some(owner.uid)),
        ("NamespaceOffloading", offloading_uid.clone())
    );

    // Unpeered (forced: shop is offloaded), the binding goes with the
    // agent; peered again, it is made for the namespace offloaded before.
    let remote = provider
        .kubeconfig_path()
        .to_str()
        .context("the provider's kubeconfig path is not UTF-8")?;
    pair.on_consumer(&["unpeer", "--remote-kubeconfig", remote, "--force"])
        .success();
    assert!(bindings.get_opt(&vk).await?.is_none(), "left by unpeer");
    assert_eq!(rights_in(&local, Some(SHOP)).await?, none, "after unpeer");
    // The forced unpeer does not wait for the twin, which the provider's
    // namespace controller is still emptying.
    wait_for("the old twin to be gone", WAIT, || async {
        Ok(twins.get_opt("shop-consumer").await?.is_none())
    })
    .await?;
    pair.on_consumer(&["peer", "--remote-kubeconfig", remote])
        .success();
    let binding = bindings.get(&vk).await?;
    assert_eq!(
        binding
            .metadata
            .owner_references
            .unwrap_or_default()
            .first()
            .map(|o| o.uid.clone()),
        offloading_uid,
        "made by peer for the offloading"
    );
    assert_eq!(rights_in(&local, Some(SHOP)).await?, all, "after peer");
    wait_for("the twin and the Secret again", WAIT, || async {
        Ok(remote_secrets.get_opt("db").await?.is_some())
    })
    .await?;

    // Unoffloaded: the binding goes with the offloading (the garbage
    // collector, once the agent has removed its finalizer).
    pair.on_consumer(&["unoffload", "namespace", SHOP, "--timeout=60"])
        .success();
    wait_for("the binding to go with the offloading", WAIT, || async {
        Ok(bindings.get_opt(&vk).await?.is_none())
    })
    .await?;
    assert_eq!(
        rights_in(&local, Some(SHOP)).await?,
        none,
        "after unoffload"
    );
    Ok(())
}
