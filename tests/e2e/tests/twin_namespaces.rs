//! What a consumer's identity may do with namespaces on its provider, proven
//! with real requests made with its own certificate: create, change and
//! delete its own twin namespaces (labelled `liqo.io/tenant=<its id>`) and
//! bind its ClusterRole to itself there, and nothing else — no namespace
//! without the label or with another tenant's, no taking over an existing
//! namespace (an EnforceSameName clash), no binding of other roles or
//! subjects. After unpeer, nothing at all.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::names::{self, labels, peering};
use liqo_e2e::fixture::{Pair, Stage};
use liqo_e2e::liqoctl;
use serde_json::json;

const CONSUMER: &str = "consumer-1";
const USER: &str = "liqo.io:peer:consumer-1";

/// A namespace as a peer asks for it: with its tenant label (if any), and
/// the Pod Security labels of the level its provider gives it.
fn namespace(name: &str, tenant: Option<&str>) -> Namespace {
    let labels = tenant.map(|t| {
        json!({
            labels::TENANT: t,
            labels::ORIGIN_NAMESPACE: "shop",
            "pod-security.kubernetes.io/enforce": "baseline",
            "pod-security.kubernetes.io/audit": "baseline",
            "pod-security.kubernetes.io/warn": "baseline",
        })
    });
    serde_json::from_value(json!({ "metadata": { "name": name, "labels": labels } }))
        .expect("namespace")
}

fn binding(role: &str, user: &str) -> RoleBinding {
    serde_json::from_value(json!({
        "metadata": { "name": names::peering::TWIN_ROLE_BINDING },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role },
        "subjects": [{ "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user }],
    }))
    .expect("rolebinding")
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({ "metadata": { "name": name } })).expect("configmap")
}

/// Refused with `code` (403 for admission and RBAC, 409 AlreadyExists).
fn refused<T: std::fmt::Debug>(code: u16, what: &str, r: Result<T, kube::Error>) {
    assert!(
        matches!(&r, Err(kube::Error::Api(s)) if s.code == code),
        "the peer identity may {what} (wanted {code}): {r:?}"
    );
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_manages_its_twin_namespaces_and_nothing_else() -> Result<()> {
    let pair = Pair::with_nodes(1, 1, Stage::Installed).await?;
    let (consumer, provider) = (pair.consumer(), pair.provider());
    let remote = provider.kubeconfig_path().to_str().context("path")?;
    let out = liqoctl(
        Some(consumer.kubeconfig_path()),
        &["peer", "--remote-kubeconfig", remote, "--timeout=90"],
    );
    if out.code != 0 {
        eprintln!("--- agent logs ---\n{}", consumer.pod_logs());
    }
    out.success();

    let consumer_client = consumer.client().await?;
    let provider_client = provider.client().await?;
    let peer = liqo_e2e::peer_client(consumer, &consumer_client, "provider-1").await?;
    let namespaces: Api<Namespace> = Api::all(peer.clone());
    let pp = PostParams::default();

    // Its own twin namespace, labelled for itself: allowed.
    namespaces
        .create(&pp, &namespace("shop-consumer", Some(CONSUMER)))
        .await?;
    namespaces.get("shop-consumer").await?;
    // Without the label, or with another tenant's: refused.
    refused(
        403,
        "create an unlabelled namespace",
        namespaces.create(&pp, &namespace("unlabelled", None)).await,
    );
    refused(
        403,
        "create a namespace for another tenant",
        namespaces
            .create(&pp, &namespace("others", Some("someone-else")))
            .await,
    );
    // Reads are not confined by admission: no listing at all.
    refused(
        403,
        "list namespaces",
        namespaces.list(&ListParams::default()).await,
    );

    // EnforceSameName clashing with the provider's own namespaces: the
    // create fails, and taking one over by labelling it is refused.
    Api::<Namespace>::all(provider_client.clone())
        .create(&pp, &namespace("shop", None))
        .await?;
    // (`default` is a reserved name besides: its create is refused before
    // the name is looked up.)
    for (existing, code) in [("default", 403), ("shop", 409)] {
        refused(
            code,
            &format!("create {existing} again"),
            namespaces
                .create(&pp, &namespace(existing, Some(CONSUMER)))
                .await,
        );
        refused(
            403,
            &format!("label {existing} as its own"),
            namespaces
                .patch(
                    existing,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({ "metadata": { "labels": { labels::TENANT: CONSUMER } } }),
                    ),
                )
                .await,
        );
        refused(
            403,
            &format!("delete {existing}"),
            namespaces.delete(existing, &Default::default()).await,
        );
    }
    refused(
        403,
        "delete its tenant namespace",
        namespaces
            .delete(
                &peering::tenant_namespace(&ClusterId::new(CONSUMER)?),
                &Default::default(),
            )
            .await,
    );
    // Nor give its own away or unlabel it.
    refused(
        403,
        "relabel its namespace for another tenant",
        namespaces
            .patch(
                "shop-consumer",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({ "metadata": { "labels": { labels::TENANT: "someone-else" } } }),
                ),
            )
            .await,
    );
    // Its own may change otherwise.
    namespaces
        .patch(
            "shop-consumer",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { "note": "ok" } } })),
        )
        .await?;

    // After unpeer: nothing.
    namespaces
        .create(&pp, &namespace("after-consumer", Some(CONSUMER)))
        .await?;
    liqoctl(
        Some(consumer.kubeconfig_path()),
        &["unpeer", "--remote-kubeconfig", remote, "--timeout=90"],
    )
    .success();
    refused(
        403,
        "create a twin namespace after unpeer",
        namespaces
            .create(&pp, &namespace("late-consumer", Some(CONSUMER)))
            .await,
    );
    refused(
        403,
        "delete a twin namespace after unpeer",
        namespaces
            .delete("after-consumer", &Default::default())
            .await,
    );
    // Unpeer removed the twin namespace the consumer left behind.
    let left = Api::<Namespace>::all(provider_client.clone())
        .get_opt("after-consumer")
        .await?;
    assert!(
        left.is_none_or(|n| n.metadata.deletion_timestamp.is_some()),
        "unpeer left a twin namespace"
    );
    drop(pair);
    Ok(())
}

/// In its own twin namespace, a peer acts only once it bound its
/// ClusterRole there, to itself; it can bind nothing else, nowhere else,
/// and acts nowhere else.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_binds_only_its_role_to_itself_in_its_own_twin_namespace() -> Result<()> {
    let pair = Pair::with_nodes(1, 1, Stage::Peered).await?;
    let consumer = pair.consumer();
    let provider_client = pair.provider_client.clone();
    let peer = liqo_e2e::peer_client(consumer, &pair.consumer_client, "provider-1").await?;
    let namespaces: Api<Namespace> = Api::all(peer.clone());
    let pp = PostParams::default();
    let role = peering::tenant_role(&ClusterId::new(CONSUMER)?);
    // A namespace of the provider's own, and the peer's twin.
    Api::<Namespace>::all(provider_client.clone())
        .create(&pp, &namespace("shop", None))
        .await?;
    namespaces
        .create(&pp, &namespace("shop-consumer", Some(CONSUMER)))
        .await?;

    // Before the binding it cannot act in its namespace.
    let twin_cms: Api<ConfigMap> = Api::namespaced(peer.clone(), "shop-consumer");
    refused(
        403,
        "act in its namespace before binding",
        twin_cms.create(&pp, &cm("early")).await,
    );
    // Bindings: only its ClusterRole, only to itself, only in its own.
    let twin_rbs: Api<RoleBinding> = Api::namespaced(peer.clone(), "shop-consumer");
    refused(
        403,
        "bind cluster-admin",
        twin_rbs.create(&pp, &binding("cluster-admin", USER)).await,
    );
    refused(
        403,
        "bind its role to another user",
        twin_rbs.create(&pp, &binding(&role, "mallory")).await,
    );
    // Another tenant's ClusterRole exists, so that RBAC's own check (the
    // role must exist) does not answer in place of the policy.
    let other_role: k8s_openapi::api::rbac::v1::ClusterRole = serde_json::from_value(json!({
        "metadata": { "name": "liqo-tenant-someone-else" },
        "rules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"] }],
    }))?;
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(provider_client.clone())
        .create(&pp, &other_role)
        .await?;
    refused(
        403,
        "bind another tenant's role",
        twin_rbs
            .create(&pp, &binding("liqo-tenant-someone-else", USER))
            .await,
    );
    for other in ["shop", "default"] {
        refused(
            403,
            &format!("bind in {other}"),
            Api::<RoleBinding>::namespaced(peer.clone(), other)
                .create(&pp, &binding(&role, USER))
                .await,
        );
    }
    twin_rbs.create(&pp, &binding(&role, USER)).await?;
    // After it: acts inside, and only there. The API server's authorizer
    // sees a new binding through its own cache, a moment later: until
    // then the request is refused (403); and nothing is made in the twin
    // before the provider's gateway has given it its share (422,
    // liqo-twin-share).
    liqo_e2e::wait_for(
        "the binding to take effect",
        Duration::from_secs(10),
        || async {
            match twin_cms.create(&pp, &cm("probe")).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => Ok(false),
                Err(e) => Err(e.into()),
            }
        },
    )
    .await?;
    twin_cms.delete("probe", &Default::default()).await?;
    refused(
        403,
        "act in shop",
        Api::<ConfigMap>::namespaced(peer.clone(), "shop")
            .create(&pp, &cm("probe"))
            .await,
    );
    // And deletes its own namespace.
    namespaces
        .delete("shop-consumer", &Default::default())
        .await?;

    Ok(())
}
