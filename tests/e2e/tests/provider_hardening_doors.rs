//! What a peer under its provider's default terms (Pod Security
//! `baseline`) still cannot do with its own credential straight against the
//! provider's API server: reach a volume, a token or a resource beyond its
//! grant, take a name the provider reserves, pass its namespaces for
//! others by their labels, or move the network its tunnel routes. Each
//! refusal is paired with the allowed form of the same request (see
//! `provider_hardening`), and names the rule that made it.

use std::collections::BTreeMap;

use anyhow::Result;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolume, PersistentVolumeClaim, Pod, ResourceQuota, Service,
};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, Patch, PatchParams, PostParams};
use liqo_api::authentication::Tenant;
use liqo_api::names::peering;
use liqo_api::networking::Connection;
use liqo_api::shares::SHARE_QUOTA;
use liqo_e2e::fixture::{CONSUMER_ID, PROVIDER_ID, Pair, Stage, WAIT};
use liqo_e2e::wait_for;
use serde_json::{Value, json};

use crate::provider_hardening::{
    PODS, PSA, RBAC, SERVICES, Tally, WORKLOADS, from, make_twin, own_binding, pod, service, twin,
};

const NAMES: &str = "ValidatingAdmissionPolicy 'liqo-peer-namespace-names'";
const CONNECTIONS: &str = "ValidatingAdmissionPolicy 'liqo-peer-connections'";
const QUOTA: &str = "exceeded quota";
const SHARE: &str = "ValidatingAdmissionPolicy 'liqo-twin-share'";
const CLAIMS: &str = "ValidatingAdmissionPolicy 'liqo-peer-claims'";

/// consumer-1's twin on the provider, at the default level.
const TWIN: &str = "doors-consumer-1";

/// consumer-1 peered under the provider's default terms, its credential
/// there, and its twin [`TWIN`] made as the peer makes it.
async fn at_default_terms(t: &mut Tally) -> Result<(Pair, kube::Client)> {
    let pair = Pair::at(Stage::Peered).await?;
    let one = liqo_e2e::peer_client(pair.consumer(), &pair.consumer_client, PROVIDER_ID).await?;
    let record = Api::<Tenant>::all(pair.provider_client.clone())
        .get(CONSUMER_ID)
        .await?;
    assert_eq!(record.spec.admission.pod_security.as_str(), "baseline");
    make_twin(
        t,
        &one,
        &pair.provider_client,
        TWIN,
        CONSUMER_ID,
        "baseline",
    )
    .await?;
    Ok((pair, one))
}

/// Removes the local disk limit `restricted` gave container 0.
fn no_disk_limit(p: &mut Value) {
    if let Some(limits) = p["spec"]["containers"][0]["resources"]["limits"].as_object_mut() {
        limits.remove("ephemeral-storage");
    }
}

/// The same pod spec, for templates.
fn pod_spec(change: impl FnOnce(&mut Value)) -> Value {
    serde_json::to_value(pod("t", change)).expect("json")["spec"].clone()
}

/// Volumes, tokens and resources: what a pod may mount and ask for.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_reaches_no_volume_token_or_resource_beyond_its_grant() -> Result<()> {
    let mut t = Tally::default();
    let (pair, one) = at_default_terms(&mut t).await?;
    provider_root_volume(&pair.provider_client).await?;
    pods_reach_nothing_of_the_providers(&mut t, &one).await;
    workload_templates_are_refused_at_once(&mut t, &one).await;
    subresources_change_nothing_admitted(&mut t, &one).await;
    no_storage_without_a_grant(&mut t, &one).await;
    the_share_bounds_storage_services_and_objects(&mut t, &pair, &one).await?;
    t.at_least(21, 9);
    Ok(())
}

/// A volume of the provider's that names the node's root, as a cluster
/// with a hostPath provisioner holds one.
async fn provider_root_volume(prov: &kube::Client) -> Result<()> {
    let pp = PostParams::default();
    Api::<PersistentVolume>::all(prov.clone())
        .create(
            &pp,
            &from(json!({
                "metadata": { "name": "doors-root" },
                "spec": {
                    "capacity": { "storage": "10Gi" }, "accessModes": ["ReadWriteOnce"],
                    "hostPath": { "path": "/" }, "storageClassName": "manual",
                },
            })),
        )
        .await?;
    Ok(())
}

/// A pod may run as root and mount what pods ordinarily mount, within
/// the grant; every way out of the twin a pod spec can name is refused.
async fn pods_reach_nothing_of_the_providers(t: &mut Tally, one: &kube::Client) {
    let pp = PostParams::default();
    let pods: Api<Pod> = Api::namespaced(one.clone(), TWIN);
    t.allowed(
        "a pod that runs as root (an ordinary image, admitted at baseline)",
        pods.create(
            &pp,
            &pod("ok-root", |p| {
                p["spec"]["securityContext"] = json!({ "runAsUser": 0 });
            }),
        )
        .await,
    );
    t.allowed(
        "a pod mounting a ConfigMap, a Secret, an emptyDir and the downward API",
        pods.create(
            &pp,
            &pod("ok-volumes", |p| {
                p["spec"]["volumes"] = json!([
                    { "name": "a", "configMap": { "name": "x", "optional": true } },
                    { "name": "b", "secret": { "secretName": "x", "optional": true } },
                    { "name": "c", "emptyDir": { "sizeLimit": "1Gi" } },
                    { "name": "d", "downwardAPI": { "items": [{ "path": "n", "fieldRef": { "fieldPath": "metadata.name" } }] } },
                ]);
            }),
        )
        .await,
    );
    let escapes: Vec<(&str, &str, Pod)> = vec![
        (
            "a generic ephemeral volume bound to the provider's volume of /",
            PODS,
            pod("esc-ephemeral", |p| {
                p["spec"]["volumes"] = json!([{ "name": "root", "ephemeral": { "volumeClaimTemplate": { "spec": {
                    "accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                    "volumeName": "doors-root", "resources": { "requests": { "storage": "10Gi" } },
                } } } }]);
            }),
        ),
        (
            "a claim",
            PODS,
            pod("esc-claim", |p| {
                p["spec"]["volumes"] =
                    json!([{ "name": "c", "persistentVolumeClaim": { "claimName": "x" } }]);
            }),
        ),
        (
            "an NFS volume (which baseline admits)",
            PODS,
            pod("esc-nfs", |p| {
                p["spec"]["volumes"] =
                    json!([{ "name": "n", "nfs": { "server": "192.0.2.1", "path": "/" } }]);
            }),
        ),
        (
            "an inline CSI volume",
            PODS,
            pod("esc-csi", |p| {
                p["spec"]["volumes"] =
                    json!([{ "name": "s", "csi": { "driver": "secrets-store.csi.k8s.io" } }]);
            }),
        ),
        (
            "a hostPath volume",
            PSA,
            pod("esc-hostpath", |p| {
                p["spec"]["volumes"] = json!([{ "name": "h", "hostPath": { "path": "/" } }]);
            }),
        ),
        (
            "the twin's default service account token, mounted by default",
            PODS,
            pod("esc-default-token", |p| {
                p["spec"]
                    .as_object_mut()
                    .map(|s| s.remove("automountServiceAccountToken"));
            }),
        ),
        (
            "a projected token of the provider's issuer for a cloud's audience",
            PODS,
            pod("esc-sts-token", |p| {
                p["spec"]["volumes"] = json!([{ "name": "t", "projected": { "sources": [{ "serviceAccountToken": {
                    "path": "token", "audience": "sts.amazonaws.com", "expirationSeconds": 86400,
                } }] } }]);
            }),
        ),
        (
            "a CPU limit of 1000",
            PODS,
            pod("esc-cpu-limit", |p| {
                p["spec"]["containers"][0]["resources"]["limits"]["cpu"] = json!("1000");
            }),
        ),
        (
            "a memory limit of 1000Gi",
            PODS,
            pod("esc-memory-limit", |p| {
                p["spec"]["containers"][0]["resources"]["limits"]["memory"] = json!("1000Gi");
            }),
        ),
        (
            "no local disk limit",
            PODS,
            pod("esc-no-disk-limit", no_disk_limit),
        ),
        (
            "a local disk limit of 100Gi",
            PODS,
            pod("esc-disk-limit", |p| {
                p["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] =
                    json!("100Gi");
            }),
        ),
        (
            "a GPU",
            PODS,
            pod("esc-gpu", |p| {
                p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("1");
                p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = json!("1");
            }),
        ),
        (
            "huge pages",
            PODS,
            pod("esc-hugepages", |p| {
                p["spec"]["containers"][0]["resources"]["limits"]["hugepages-2Mi"] = json!("2Mi");
                p["spec"]["containers"][0]["resources"]["limits"]["memory"] = json!("64Mi");
            }),
        ),
    ];
    t.refused_pods(&pods, escapes).await;
    t.allowed(
        "limits within the grant and the terms' local disk",
        pods.create(
            &pp,
            &pod("ok-limits", |p| {
                p["spec"]["containers"][0]["resources"]["limits"] =
                    json!({ "cpu": "100m", "memory": "64Mi", "ephemeral-storage": "4Gi" });
            }),
        )
        .await,
    );
}

/// Templates: refused at once, not pod by pod.
async fn workload_templates_are_refused_at_once(t: &mut Tally, one: &kube::Client) {
    let pp = PostParams::default();
    let template = |change: fn(&mut Value)| -> ReplicaSet {
        from(json!({
            "metadata": { "name": "esc-rs" },
            "spec": {
                "replicas": 0,
                "selector": { "matchLabels": { "app": "esc" } },
                "template": { "metadata": { "labels": { "app": "esc" } }, "spec": pod_spec(change) },
            },
        }))
    };
    let sets: Api<ReplicaSet> = Api::namespaced(one.clone(), TWIN);
    t.refused(
        "a ReplicaSet whose pods mount a generic ephemeral volume",
        WORKLOADS,
        sets.create(
            &pp,
            &template(|p| {
                p["spec"]["volumes"] = json!([{ "name": "e", "ephemeral": { "volumeClaimTemplate": { "spec": {
                    "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": "1Gi" } },
                } } } }]);
            }),
        )
        .await,
    );
    let mut job_spec = pod_spec(|p| {
        p["spec"]["volumes"] = json!([{ "name": "t", "projected": { "sources": [{ "serviceAccountToken": { "path": "t" } }] } }]);
    });
    job_spec["restartPolicy"] = json!("Never");
    t.refused(
        "a Job whose pods mount a token of the provider's",
        WORKLOADS,
        Api::<Job>::namespaced(one.clone(), TWIN)
            .create(
                &pp,
                &from(json!({ "metadata": { "name": "esc-job" }, "spec": { "suspend": true, "template": { "spec": job_spec } } })),
            )
            .await,
    );
    t.allowed(
        "a ReplicaSet of an ordinary pod",
        sets.create(&pp, &template(|_| ())).await,
    );
}

/// Subresources that would change what was admitted.
async fn subresources_change_nothing_admitted(t: &mut Tally, one: &kube::Client) {
    let pods: Api<Pod> = Api::namespaced(one.clone(), TWIN);
    let sets: Api<ReplicaSet> = Api::namespaced(one.clone(), TWIN);
    let patch = PatchParams::default();
    t.refused(
        "resize its pod's limits in place past the grant",
        RBAC,
        pods.patch_subresource(
            "resize",
            "ok-limits",
            &patch,
            &Patch::Merge(json!({ "spec": { "containers": [{ "name": "c",
                "resources": { "limits": { "cpu": "1000" } } }] } })),
        )
        .await,
    );
    t.refused(
        "scale a ReplicaSet through its scale subresource",
        RBAC,
        sets.patch_scale(
            "esc-rs",
            &patch,
            &Patch::Merge(json!({ "spec": { "replicas": 1 } })),
        )
        .await,
    );
    t.allowed(
        "scale it by its spec",
        sets.patch(
            "esc-rs",
            &patch,
            &Patch::Merge(json!({ "spec": { "replicas": 1 } })),
        )
        .await,
    );
}

/// No storage granted: the quota holds no claim, and the claims policy
/// refuses a volume named.
async fn no_storage_without_a_grant(t: &mut Tally, one: &kube::Client) {
    let pp = PostParams::default();
    t.refused(
        "a claim of its own",
        CLAIMS,
        Api::<PersistentVolumeClaim>::namespaced(one.clone(), TWIN)
            .create(
                &pp,
                &from(json!({ "metadata": { "name": "esc" }, "spec": {
                    "accessModes": ["ReadWriteOnce"], "volumeName": "doors-root",
                    "resources": { "requests": { "storage": "1Gi" } },
                } })),
            )
            .await,
    );
    t.refused(
        "a volume of its own",
        RBAC,
        Api::<PersistentVolume>::all(one.clone())
            .create(
                &pp,
                &from(json!({ "metadata": { "name": "esc-pv" }, "spec": {
                    "capacity": { "storage": "1Gi" }, "accessModes": ["ReadWriteOnce"], "hostPath": { "path": "/" },
                } })),
            )
            .await,
    );
}

/// Storage and objects are bounded by its share too, whoever makes
/// them (a controller's claim of a generic ephemeral volume included).
async fn the_share_bounds_storage_services_and_objects(
    t: &mut Tally,
    pair: &Pair,
    one: &kube::Client,
) -> Result<()> {
    let prov = &pair.provider_client;
    let pp = PostParams::default();
    let share = Api::<ResourceQuota>::namespaced(prov.clone(), TWIN)
        .get(SHARE_QUOTA)
        .await?;
    let hard: BTreeMap<String, String> = share
        .spec
        .and_then(|s| s.hard)
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    for (key, value) in [
        ("persistentvolumeclaims", "0"),
        ("requests.storage", "0"),
        ("configmaps", "1k"),
        ("secrets", "1k"),
        ("services", "1k"),
        ("count/replicasets.apps", "1k"),
    ] {
        let got = hard.get(key).map(String::as_str);
        assert!(
            got == Some(value) || got == Some(value.replace("1k", "1000").as_str()),
            "{key}: {hard:?}"
        );
    }
    let services: Api<Service> = Api::namespaced(one.clone(), TWIN);
    t.refused(
        "an ExternalName Service",
        SERVICES,
        services
            .create(
                &pp,
                &service(
                    "esc-alias",
                    json!({ "type": "ExternalName", "externalName": "kubernetes.default.svc.cluster.local" }),
                ),
            )
            .await,
    );
    t.allowed(
        "a ClusterIP Service",
        services
            .create(
                &pp,
                &service("ok-svc", json!({ "selector": { "app": "x" } })),
            )
            .await,
    );
    // A count of objects per namespace: lowered to 4 ConfigMaps (the
    // namespace's kube-root-ca.crt is one).
    pair.on_provider(&["sharing-policy", "set", "--objects=4"])
        .success();
    let quotas: Api<ResourceQuota> = Api::namespaced(prov.clone(), TWIN);
    wait_for("the share to count 4 objects", WAIT, || async {
        let q = quotas.get(SHARE_QUOTA).await?;
        Ok(q.status
            .and_then(|s| s.hard)
            .and_then(|h| h.get("configmaps").map(|q| q.0 == "4"))
            .unwrap_or(false))
    })
    .await?;
    let maps: Api<ConfigMap> = Api::namespaced(one.clone(), TWIN);
    for i in 0..3 {
        t.allowed(
            &format!("ConfigMap {i} within the count"),
            maps.create(
                &pp,
                &from(json!({ "metadata": { "name": format!("ok-{i}") } })),
            )
            .await,
        );
    }
    t.refused(
        "a ConfigMap beyond the count",
        QUOTA,
        maps.create(&pp, &from(json!({ "metadata": { "name": "esc-many" } })))
            .await,
    );
    Ok(())
}

/// Names, labels and the tunnel's network.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_takes_no_reserved_name_no_label_and_cannot_move_its_tunnel() -> Result<()> {
    let mut t = Tally::default();
    let (pair, one) = at_default_terms(&mut t).await?;
    let prov = &pair.provider_client;
    let pp = PostParams::default();
    pair.on_provider(&[
        "sharing-policy",
        "set",
        "--reserved-namespaces=cert-manager,team-*",
        "--namespaces=2",
    ])
    .success();
    let namespaces: Api<Namespace> = Api::all(one.clone());
    let own = |name: &str| twin(name, CONSUMER_ID, ["baseline"; 3], json!({}));
    for (what, name, extra) in [
        (
            "a future tenant's namespace, labelled as liqoctl's",
            "liqo-tenant-consumer-9",
            json!({ "app.kubernetes.io/managed-by": "liqoctl" }),
        ),
        ("this project's namespace", "liqo", json!({})),
        ("a kube- namespace", "kube-flannel", json!({})),
        ("a -system namespace", "istio-system", json!({})),
    ] {
        t.refused(
            &format!("create {what} ({name})"),
            NAMES,
            namespaces
                .create(&pp, &twin(name, CONSUMER_ID, ["baseline"; 3], extra))
                .await,
        );
    }
    // The provider's own reserved names, once its terms say them.
    wait_for(
        "the tenant's terms to reserve cert-manager",
        WAIT,
        || async {
            let r = Api::<Tenant>::all(prov.clone()).get(CONSUMER_ID).await?;
            Ok(r.spec
                .admission
                .reserved_namespaces
                .contains(&"cert-manager".to_owned()))
        },
    )
    .await?;
    for name in ["cert-manager", "team-blue"] {
        t.refused(
            &format!("create {name}, reserved by the provider"),
            NAMES,
            namespaces.create(&pp, &own(name)).await,
        );
    }
    // Its second twin gets a share; a third holds nothing.
    make_twin(&mut t, &one, prov, "blue-team", CONSUMER_ID, "baseline").await?;
    t.allowed(
        "create a third namespace",
        namespaces.create(&pp, &own("third-team")).await,
    );
    t.allowed(
        "bind its role there",
        Api::<RoleBinding>::namespaced(one.clone(), "third-team")
            .create(&pp, &own_binding(CONSUMER_ID))
            .await,
    );
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert!(
        Api::<ResourceQuota>::namespaced(prov.clone(), "third-team")
            .get_opt(SHARE_QUOTA)
            .await?
            .is_none(),
        "no share beyond the terms' number of namespaces"
    );
    let map = || -> ConfigMap { from(json!({ "metadata": { "name": "probe" } })) };
    t.refused(
        "a ConfigMap in a namespace beyond the number",
        SHARE,
        Api::<ConfigMap>::namespaced(one.clone(), "third-team")
            .create(&pp, &map())
            .await,
    );
    t.allowed(
        "a ConfigMap in its second",
        Api::<ConfigMap>::namespaced(one.clone(), "blue-team")
            .create(&pp, &map())
            .await,
    );
    t.refused(
        "create a namespace that passes for kube-system by its labels",
        NAMES,
        namespaces
            .create(
                &pp,
                &twin(
                    "spoof-consumer-1",
                    CONSUMER_ID,
                    ["baseline"; 3],
                    json!({ "name": "kube-system" }),
                ),
            )
            .await,
    );
    t.refused(
        "label its twin name=kube-system",
        NAMES,
        namespaces
            .patch(
                TWIN,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "name": "kube-system" } } })),
            )
            .await,
    );
    t.allowed(
        "annotate its twin (its demand)",
        namespaces
            .patch(
                TWIN,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "annotations": { "probe": "yes" } } })),
            )
            .await,
    );
    // Its end of the tunnel: the pod CIDR it peered with, fixed.
    let record = Api::<Tenant>::all(prov.clone()).get(CONSUMER_ID).await?;
    let pinned = record
        .spec
        .pod_cidr
        .clone()
        .expect("peering fixes the pod CIDR");
    let tenant_ns = peering::tenant_namespace(&liqo_api::ClusterId::new(CONSUMER_ID)?);
    let connections: Api<Connection> = Api::namespaced(one.clone(), &tenant_ns);
    let end = |cidr: &str| -> Connection {
        from(json!({
            "apiVersion": "liqo.io/v1alpha1", "kind": "Connection",
            "metadata": { "name": "doors" },
            "spec": {
                "clusterId": CONSUMER_ID, "clusterName": "consumer",
                "publicKey": "29QfL/gCYN3ASZ39Gf7A/UOqE+SFK1jbHwKLwaTgVhs=",
                "podCidr": cidr,
            },
        }))
    };
    t.refused(
        "name another network as its pods'",
        CONNECTIONS,
        connections.create(&pp, &end("10.0.0.0/8")).await,
    );
    t.allowed(
        "name the network it peered with",
        connections.create(&pp, &end(&pinned)).await,
    );
    t.refused(
        "move it later",
        CONNECTIONS,
        connections
            .patch(
                "doors",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "podCidr": "192.168.0.0/16" } })),
            )
            .await,
    );
    t.allowed(
        "label it",
        connections
            .patch(
                "doors",
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "probe": "yes" } } })),
            )
            .await,
    );
    t.at_least(11, 10);
    Ok(())
}
