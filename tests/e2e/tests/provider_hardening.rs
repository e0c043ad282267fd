//! What a peer can run on its provider, proven with the consumer's own
//! credential straight against the provider's API server (as a consumer
//! that bypasses its virtual kubelet would), never through its agent.
//!
//! Each attempt the provider must refuse is paired with the allowed form
//! of the same request, which it admits, so that nothing here passes by
//! refusing everything; each refusal names the rule that made it (Pod
//! Security admission, one of the `liqo-peer-*` admission policies, or
//! RBAC). Two consumers peer with one provider: `consumer-1` under terms
//! of `restricted` and nothing else, `consumer-2` under terms its
//! provider opted into for it alone (baseline, NodePort Services, a
//! priority class, a toleration, then privileged), and each is held to
//! its own. The consumer's virtual kubelet reads its terms: a pod they
//! refuse is refused on the consumer with the reason, before it is sent.
//! Twin namespaces of an earlier version are brought under the rules by
//! `liqoctl install`, which reports the running pods they would refuse.
//!
//! One test per behaviour, each from its own clusters: this module holds
//! the namespaces, RBAC, the virtual kubelet and the upgrade, and the
//! helpers the others share; `provider_hardening_workloads` what
//! `consumer-1` may run and touch in its twin (pods, pod templates,
//! Services, EndpointSlices, everything else); `provider_hardening_terms`
//! `consumer-2` under its own terms, beside `consumer-1`.

use std::fmt::Debug;

use anyhow::Result;
use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota, Service};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use liqo_api::core::ForeignCluster;
use liqo_api::names::{labels, peering};
use liqo_api::shares::{DEMAND_ANNOTATION, SHARE_QUOTA};
use liqo_e2e::fixture::{PROVIDER_ID, Pair, Stage, WAIT};
use liqo_e2e::{liqoctl, wait_for};
use serde_json::{Value, json};

/// The rules a refusal names.
pub(crate) const PSA: &str = "violates PodSecurity";
pub(crate) const PODS: &str = "ValidatingAdmissionPolicy 'liqo-peer-pods'";
pub(crate) const WORKLOADS: &str = "ValidatingAdmissionPolicy 'liqo-peer-workloads'";
pub(crate) const SERVICES: &str = "ValidatingAdmissionPolicy 'liqo-peer-services'";
pub(crate) const SLICES: &str = "ValidatingAdmissionPolicy 'liqo-peer-endpointslices'";
pub(crate) const NS_SECURITY: &str = "ValidatingAdmissionPolicy 'liqo-peer-pod-security'";
const NAMESPACES: &str = "ValidatingAdmissionPolicy 'liqo-peer-namespaces'";
const ROLEBINDINGS: &str = "ValidatingAdmissionPolicy 'liqo-peer-rolebindings'";
pub(crate) const SECRETS: &str = "ValidatingAdmissionPolicy 'liqo-peer-secrets'";
pub(crate) const RBAC: &str = "cannot";
const ESCALATION: &str = "attempting to grant RBAC permissions not currently held";

/// consumer-1's twin namespace on the provider, where it tries its luck.
pub(crate) const T1: &str = "probe-consumer-1";

/// The attempts made, refused and allowed.
#[derive(Default)]
pub(crate) struct Tally {
    refused: usize,
    allowed: usize,
}

impl Tally {
    /// `r` was refused with 403 (or 422) and a message naming `rule`.
    pub(crate) fn refused<T: Debug>(&mut self, what: &str, rule: &str, r: Result<T, kube::Error>) {
        match &r {
            Err(kube::Error::Api(s))
                if (s.code == 403 || s.code == 422) && s.message.contains(rule) =>
            {
                self.refused += 1;
            }
            _ => panic!("{what}: wanted a refusal naming {rule:?}, got {r:?}"),
        }
    }

    /// Each pod of `escapes` (what it tries, the rule that refuses it,
    /// the pod) was refused when made in `pods`.
    pub(crate) async fn refused_pods(&mut self, pods: &Api<Pod>, escapes: Vec<(&str, &str, Pod)>) {
        for (what, rule, p) in escapes {
            let made = pods.create(&PostParams::default(), &p).await;
            self.refused(&format!("a pod with {what}"), rule, made);
        }
    }

    /// `r`, the allowed form, was admitted.
    pub(crate) fn allowed<T: Debug>(&mut self, what: &str, r: Result<T, kube::Error>) -> T {
        match r {
            Ok(t) => {
                self.allowed += 1;
                t
            }
            Err(e) => panic!("{what}: the allowed form was refused: {e}"),
        }
    }

    /// At the end of a test: at least `refused` attempts were refused and
    /// `allowed` allowed forms admitted, so that none was skipped.
    pub(crate) fn at_least(&self, refused: usize, allowed: usize) {
        eprintln!(
            "{} attempts refused, {} allowed forms admitted",
            self.refused, self.allowed
        );
        assert!(
            self.refused >= refused,
            "only {} refused attempts",
            self.refused
        );
        assert!(
            self.allowed >= allowed,
            "only {} allowed forms",
            self.allowed
        );
    }
}

pub(crate) fn from<T: k8s_openapi::serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

/// A pod of the peer that its default terms admit (restricted, requests
/// stated for its share's quota), changed by `change` on its JSON.
pub(crate) fn pod(name: &str, change: impl FnOnce(&mut Value)) -> Pod {
    let mut v = liqo_e2e::restricted(json!({
        "metadata": { "name": name },
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "c",
                "image": "nginx",
                "resources": { "requests": { "cpu": "1m", "memory": "1Mi" } },
            }],
        },
    }));
    change(&mut v);
    from(v)
}

pub(crate) fn service(name: &str, spec: Value) -> Service {
    let mut spec = spec;
    spec["ports"] = json!([{ "port": 80 }]);
    from(json!({ "metadata": { "name": name }, "spec": spec }))
}

/// A namespace of tenant `tenant` with the Pod Security labels `levels`
/// (enforce, audit, warn) and any `extra` labels.
pub(crate) fn twin(name: &str, tenant: &str, levels: [&str; 3], extra: Value) -> Namespace {
    let mut l = json!({
        labels::TENANT: tenant,
        labels::ORIGIN_NAMESPACE: "probe",
        "pod-security.kubernetes.io/enforce": levels[0],
        "pod-security.kubernetes.io/audit": levels[1],
        "pod-security.kubernetes.io/warn": levels[2],
    });
    if let (Some(l), Some(extra)) = (l.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            if v.is_null() {
                l.remove(k);
            } else {
                l.insert(k.clone(), v.clone());
            }
        }
    }
    from(json!({ "metadata": { "name": name, "labels": l } }))
}

pub(crate) fn own_binding(tenant: &str) -> RoleBinding {
    from(json!({
        "metadata": { "name": peering::TWIN_ROLE_BINDING },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("liqo-tenant-{tenant}") },
        "subjects": [{ "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": format!("liqo.io:peer:{tenant}") }],
    }))
}

/// Makes twin `ns` of `tenant` as the peer does, binds its role there,
/// and waits for its share (the provider's gateway makes it).
pub(crate) async fn make_twin(
    tally: &mut Tally,
    peer: &kube::Client,
    prov: &kube::Client,
    ns: &str,
    tenant: &str,
    level: &str,
) -> Result<()> {
    let pp = PostParams::default();
    tally.allowed(
        &format!("create twin {ns} at level {level}"),
        Api::<Namespace>::all(peer.clone())
            .create(&pp, &twin(ns, tenant, [level; 3], json!({})))
            .await,
    );
    tally.allowed(
        &format!("bind its own role in {ns}"),
        Api::<RoleBinding>::namespaced(peer.clone(), ns)
            .create(&pp, &own_binding(tenant))
            .await,
    );
    let quotas: Api<ResourceQuota> = Api::namespaced(prov.clone(), ns);
    wait_for(&format!("the share of {ns}"), WAIT, || async {
        Ok(quotas.get_opt(SHARE_QUOTA).await?.is_some())
    })
    .await
}

/// consumer-1 peered with provider-1 (the fixture's [`Pair`], IDs, pod
/// CIDRs and node counts as the tests need them), and its own credential
/// on the provider.
pub(crate) async fn consumer_one() -> Result<(Pair, kube::Client)> {
    let pair = Pair::at(Stage::Peered).await?;
    // The strictest level, which a provider may choose for every peer
    // (the default is baseline: `provider_hardening_doors`).
    pair.on_provider(&["sharing-policy", "set", "--pod-security=restricted"])
        .success();
    let one = liqo_e2e::peer_client(pair.consumer(), &pair.consumer_client, PROVIDER_ID).await?;
    Ok((pair, one))
}

/// [`consumer_one`], with its twin [`T1`] made as the peer makes it (its
/// two requests counted in `t`).
pub(crate) async fn consumer_one_with_twin(t: &mut Tally) -> Result<(Pair, kube::Client)> {
    let (pair, one) = consumer_one().await?;
    make_twin(
        t,
        &one,
        &pair.provider_client,
        T1,
        "consumer-1",
        "restricted",
    )
    .await?;
    Ok((pair, one))
}

/// Namespaces: the Pod Security labels of its level, fixed.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_change_the_pod_security_labels_of_its_twin_namespaces() -> Result<()> {
    let (pair, one) = consumer_one().await?;
    let prov = pair.provider_client.clone();
    let pp = PostParams::default();
    let mut t = Tally::default();

    let namespaces: Api<Namespace> = Api::all(one.clone());
    t.refused(
        "create its namespace labelled privileged",
        NS_SECURITY,
        namespaces
            .create(
                &pp,
                &twin("esc-privileged", "consumer-1", ["privileged"; 3], json!({})),
            )
            .await,
    );
    t.refused(
        "create its namespace with no Pod Security labels",
        NS_SECURITY,
        namespaces
            .create(
                &pp,
                &twin(
                    "esc-unlabelled",
                    "consumer-1",
                    ["restricted"; 3],
                    json!({
                        "pod-security.kubernetes.io/enforce": null,
                        "pod-security.kubernetes.io/audit": null,
                        "pod-security.kubernetes.io/warn": null,
                    }),
                ),
            )
            .await,
    );
    t.refused(
        "create its namespace warning at privileged",
        NS_SECURITY,
        namespaces
            .create(
                &pp,
                &twin(
                    "esc-warn",
                    "consumer-1",
                    ["restricted", "restricted", "privileged"],
                    json!({}),
                ),
            )
            .await,
    );
    t.refused(
        "pin an old Pod Security version",
        NS_SECURITY,
        namespaces
            .create(
                &pp,
                &twin(
                    "esc-version",
                    "consumer-1",
                    ["restricted"; 3],
                    json!({ "pod-security.kubernetes.io/enforce-version": "v1.22" }),
                ),
            )
            .await,
    );
    t.allowed(
        "pin the latest version",
        namespaces
            .create(
                &pp,
                &twin(
                    "ok-latest",
                    "consumer-1",
                    ["restricted"; 3],
                    json!({ "pod-security.kubernetes.io/enforce-version": "latest" }),
                ),
            )
            .await,
    );
    t.refused(
        "create a namespace for another tenant",
        NAMESPACES,
        namespaces
            .create(
                &pp,
                &twin("esc-other", "consumer-2", ["baseline"; 3], json!({})),
            )
            .await,
    );
    make_twin(&mut t, &one, &prov, T1, "consumer-1", "restricted").await?;
    t.refused(
        "relabel its twin privileged",
        NS_SECURITY,
        namespaces
            .patch(
                T1,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "pod-security.kubernetes.io/enforce": "privileged" } } })),
            )
            .await,
    );
    t.refused(
        "remove its twin's enforce label",
        NS_SECURITY,
        namespaces
            .patch(
                T1,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "pod-security.kubernetes.io/enforce": null } } })),
            )
            .await,
    );
    t.allowed(
        "annotate its twin",
        namespaces
            .patch(
                T1,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "annotations": { "probe": "yes" } } })),
            )
            .await,
    );
    t.at_least(7, 4);
    Ok(())
}

/// RBAC: nothing beyond its own role in its own namespaces.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_bind_more_than_its_own_role_in_its_own_namespaces() -> Result<()> {
    let mut t = Tally::default();
    let (_pair, one) = consumer_one_with_twin(&mut t).await?;
    let pp = PostParams::default();

    let cluster_admin: RoleBinding = from(json!({
        "metadata": { "name": "escalate" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "liqo.io:peer:consumer-1" }],
    }));
    // RBAC's escalation check refuses it before admission sees it.
    t.refused(
        "bind cluster-admin in its twin",
        ESCALATION,
        Api::<RoleBinding>::namespaced(one.clone(), T1)
            .create(&pp, &cluster_admin)
            .await,
    );
    t.refused(
        "bind its role to someone else in its twin",
        ROLEBINDINGS,
        Api::<RoleBinding>::namespaced(one.clone(), T1)
            .create(
                &pp,
                &from(json!({
                    "metadata": { "name": "lend" },
                    "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "liqo-tenant-consumer-1" },
                    "subjects": [{ "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "mallory" }],
                })),
            )
            .await,
    );
    let crb: ClusterRoleBinding = from(json!({
        "metadata": { "name": "escalate" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "liqo.io:peer:consumer-1" }],
    }));
    t.refused(
        "bind cluster-admin cluster-wide",
        RBAC,
        Api::<ClusterRoleBinding>::all(one.clone())
            .create(&pp, &crb)
            .await,
    );
    t.at_least(3, 2);
    Ok(())
}

/// The consumer's virtual kubelet sends only what its terms admit.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_virtual_kubelet_refuses_on_the_consumer_a_pod_its_terms_refuse() -> Result<()> {
    let pair = Pair::at(Stage::Peered).await?;
    pair.on_provider(&["sharing-policy", "set", "--pod-security=restricted"])
        .success();
    let consumer = pair.consumer();
    let local = consumer.client().await?;
    let peers: Api<ForeignCluster> = Api::all(local.clone());
    wait_for("the consumer to read restricted", WAIT, || async {
        let fc = peers.get(PROVIDER_ID).await?;
        Ok(fc
            .status
            .and_then(|s| s.admission)
            .is_some_and(|a| a.pod_security.as_str() == "restricted"))
    })
    .await?;
    let pp = PostParams::default();
    Api::<Namespace>::all(local.clone())
        .create(&pp, &from(json!({ "metadata": { "name": "web" } })))
        .await?;
    liqoctl(
        Some(consumer.kubeconfig_path()),
        &[
            "offload",
            "namespace",
            "web",
            // Pods may stay home: the namespace only warns at the
            // providers' level, so a pod below it reaches the virtual
            // kubelet when it is bound to the virtual node by hand.
            "--pod-offloading-strategy=LocalAndRemote",
            "--wait",
            "--timeout=90",
        ],
    )
    .success();
    let pods: Api<Pod> = Api::namespaced(local.clone(), "web");
    let on_virtual = |mut p: Pod| {
        let spec = p.spec.as_mut().expect("spec");
        spec.node_selector =
            Some(serde_json::from_value(liqo_e2e::virtual_node_selector()).expect("map"));
        spec.tolerations =
            Some(serde_json::from_value(liqo_e2e::virtual_node_tolerations()).expect("list"));
        p
    };
    pods.create(&pp, &on_virtual(pod("fine", |_| ()))).await?;
    // Bound by hand: the scheduler would keep it off the virtual node
    // (its level is labelled there: `placement_levels`).
    let mut root = on_virtual(pod("as-root", |p| {
        p["spec"]["securityContext"] = json!({ "runAsUser": 0 });
    }));
    root.metadata.name = Some("as-root".to_owned());
    if let Some(spec) = root.spec.as_mut() {
        spec.node_name = Some(peering::virtual_node(&liqo_api::ClusterId::new(
            PROVIDER_ID,
        )?));
    }
    pods.create(&pp, &root).await?;
    let phase = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.clone());
    wait_for("the fine pod to run on the provider", WAIT, || async {
        Ok(phase(&pods.get("fine").await?).as_deref() == Some("Running"))
    })
    .await?;
    wait_for(
        "the pod as root to be refused on the consumer",
        WAIT,
        || async {
            let p = pods.get("as-root").await?;
            let status = p.status.unwrap_or_default();
            // Pending, not Failed: a controller would replace a failed
            // pod at once, and the new one would be refused the same way.
            Ok(status.phase.as_deref() == Some("Pending")
                && status.reason.as_deref() == Some("OffloadingRefused")
                && status
                    .message
                    .as_deref()
                    .is_some_and(|m| m.contains("restricted") && m.contains("runAsUser")))
        },
    )
    .await?;
    Ok(())
}

/// A twin of an earlier version: brought under the rules by install, its
/// running pods reported, not killed.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_brings_the_twins_of_an_earlier_version_under_the_rules() -> Result<()> {
    let pair = Pair::at(Stage::Peered).await?;
    let provider = pair.provider();
    let prov = &pair.provider_client;
    let pp = PostParams::default();
    // As a version without Pod Security labels left it: a twin of
    // consumer-1 with no labels, and a pod there the rules now refuse (on
    // the node's network, which even baseline refuses).
    const OLD: &str = "old-twin";
    Api::<Namespace>::all(prov.clone())
        .create(
            &pp,
            &from(json!({ "metadata": {
                "name": OLD,
                "labels": { labels::TENANT: "consumer-1" },
                // What its consumer says it needs there, for its share.
                "annotations": { DEMAND_ANNOTATION: r#"{"cpu":"1m","memory":"1Mi","pods":"1"}"# },
            } })),
        )
        .await?;
    let quotas: Api<ResourceQuota> = Api::namespaced(prov.clone(), OLD);
    wait_for("the old twin's share to hold a pod", WAIT, || async {
        Ok(quotas.get_opt(SHARE_QUOTA).await?.is_some_and(|q| {
            q.status
                .and_then(|s| s.hard)
                .and_then(|h| h.get("pods").cloned())
                .is_some_and(|p| p.0 != "0")
        }))
    })
    .await?;
    Api::<Pod>::namespaced(prov.clone(), OLD)
        .create(
            &pp,
            &pod("old-root", |p| {
                p["spec"]["hostNetwork"] = json!(true);
            }),
        )
        .await?;
    let out = liqo_e2e::install(provider, "provider-1", "10.202.0.0/16", &[]).success();
    assert!(
        out.stderr.contains("old-twin/old-root") && out.stderr.contains("keeps running"),
        "install reports the pod the rules would refuse: {}",
        out.stderr
    );
    let ns = Api::<Namespace>::all(prov.clone()).get(OLD).await?;
    assert_eq!(
        ns.metadata.labels.unwrap_or_default()["pod-security.kubernetes.io/enforce"],
        "baseline"
    );
    let kept = Api::<Pod>::namespaced(prov.clone(), OLD)
        .get("old-root")
        .await?;
    assert!(
        kept.metadata.deletion_timestamp.is_none(),
        "the pod was not disturbed"
    );
    Ok(())
}
