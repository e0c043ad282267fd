//! Reflection end to end, on two real clusters (set up as in
//! `offloading.rs`): the ConfigMaps and Secrets of an offloaded namespace
//! appear in its twin on the provider with our labels, and follow their
//! local updates and deletion; a copy changed or deleted by the provider's
//! admin is put back; what is opted out, the provider's own
//! `kube-root-ca.crt`, service account token Secrets and an object of the
//! same name that the admin made are left alone. Pods that reference a
//! missing ConfigMap wait as on a kubelet (`CreateContainerConfigError`
//! for env, `ContainerCreating` and a `FailedMount` Event for a volume,
//! nothing on the provider), an optional reference does not hold a pod
//! back, and waiting pods run once the ConfigMap exists. A Service gets
//! its remote copy (ClusterIP), the endpoint on the consumer's own node
//! appears on the provider in an EndpointSlice of ours, the provider's
//! own controller lists the offloaded pod, and the local EndpointSlice
//! lists the offloaded pod's IP. A pod that mounts its service account
//! token gets a Secret in the twin whose token authenticates on the
//! consumer's API as that account (at the address its env says, with the
//! CA it mounts), and that goes with the pod. Events of the remote pod
//! come back onto the local pod, counts included, and a restarted
//! virtual kubelet duplicates none.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Namespace, Pod, ResourceQuota, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::names::{self, labels, peering};
use liqo_api::shares::SHARE_QUOTA;
use liqo_e2e::fixture::pod::{ip, running, waiting_reason};
use liqo_e2e::fixture::{PROVIDER_ID, Pair, Stage, WAIT};
use liqo_e2e::wait_for;
use serde_json::{Value, json};

const NS: &str = "shop";
/// DefaultName: `<namespace>-<consumer cluster name>`.
const TWIN: &str = "shop-consumer";
fn config_map(name: &str, data: Value, annotations: Value) -> Result<ConfigMap> {
    Ok(serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": NS, "labels": { "app": "web" }, "annotations": annotations },
        "data": data,
    }))?)
}

/// A pod placed on the virtual node by hand (as in `offloading.rs`) whose
/// container reads `env_from` and mounts `volumes`.
fn pod(name: &str, env_from: Value, volumes: Value) -> Result<Pod> {
    let mounts: Vec<Value> = volumes
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| json!({ "name": v["name"], "mountPath": format!("/etc/{}", v["name"].as_str().unwrap_or("x")) }))
        .collect();
    Ok(serde_json::from_value(liqo_e2e::restricted(json!({
        "metadata": { "name": name, "namespace": NS, "labels": { "test": "refs" } },
        "spec": {
            "nodeSelector": liqo_e2e::virtual_node_selector(),
            "tolerations": liqo_e2e::virtual_node_tolerations(),
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": "nginx",
                "envFrom": env_from,
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        },
    })))?)
}

fn label<'a>(meta: &'a kube::core::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// Whether an object carries our managed-by label.
fn is_ours(meta: &kube::core::ObjectMeta) -> bool {
    label(meta, labels::MANAGED_BY) == Some(labels::MANAGED_BY_VALUE)
}

/// A ConfigMap's value under `key`.
fn value<'a>(config_map: &'a ConfigMap, key: &str) -> Option<&'a str> {
    config_map.data.as_ref()?.get(key).map(String::as_str)
}

/// The namespace `NS` on the consumer and its twin on the provider, as
/// the tests read and write them.
struct Shop {
    pair: Pair,
    pods: Api<Pod>,
    cms: Api<ConfigMap>,
    secrets: Api<Secret>,
    events: Api<Event>,
    remote_cms: Api<ConfigMap>,
    remote_secrets: Api<Secret>,
    remote_rs: Api<ReplicaSet>,
}

impl Shop {
    async fn at(stage: Stage<'_>) -> Result<Self> {
        let pair = Pair::at(stage).await?;
        let local = pair.consumer_client.clone();
        let prov = pair.provider_client.clone();
        Ok(Self {
            pods: Api::namespaced(local.clone(), NS),
            cms: Api::namespaced(local.clone(), NS),
            secrets: Api::namespaced(local.clone(), NS),
            events: Api::namespaced(local, NS),
            remote_cms: Api::namespaced(prov.clone(), TWIN),
            remote_secrets: Api::namespaced(prov.clone(), TWIN),
            remote_rs: Api::namespaced(prov, TWIN),
            pair,
        })
    }

    fn local(&self) -> kube::Client {
        self.pair.consumer_client.clone()
    }

    fn provider(&self) -> kube::Client {
        self.pair.provider_client.clone()
    }
}

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

/// A Service gets its remote copy, and its endpoints on either cluster
/// appear in the other's EndpointSlices.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_is_copied_and_its_endpoints_are_seen_on_both_sides() -> Result<()> {
    let shop = Shop::at(Stage::Offloaded(NS)).await?;
    let (pods, local, prov) = (&shop.pods, shop.local(), shop.provider());
    let pp = PostParams::default();
    let node_name = peering::virtual_node(&ClusterId::new(PROVIDER_ID)?);

    // A Service with one endpoint on the consumer's own node and one
    // offloaded pod.
    let mut on_local_node = pod("local-web", json!([]), json!([]))?;
    let spec = on_local_node.spec.as_mut().context("spec")?;
    // On the consumer's kwok node: in an offloaded namespace, a pod the
    // placement leaves free may land on either side.
    spec.node_selector = Some(BTreeMap::from([("type".to_owned(), "kwok".to_owned())]));
    spec.tolerations = None;
    on_local_node.metadata.labels = Some(BTreeMap::from([("app".to_owned(), "web".to_owned())]));
    let mut offloaded = pod("remote-web", json!([]), json!([]))?;
    offloaded.metadata.labels = Some(BTreeMap::from([("app".to_owned(), "web".to_owned())]));
    pods.create(&pp, &on_local_node).await?;
    pods.create(&pp, &offloaded).await?;
    let services: Api<Service> = Api::namespaced(local.clone(), NS);
    services
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": "web", "namespace": NS },
                "spec": {
                    "type": "NodePort",
                    "selector": { "app": "web" },
                    "ports": [{ "name": "http", "port": 80, "targetPort": 8080 }],
                },
            }))?,
        )
        .await?;
    wait_for("both web pods Running with IPs", WAIT, || async {
        let l = pods.get("local-web").await?;
        let r = pods.get("remote-web").await?;
        Ok(running(&l) && running(&r) && ip(&l).is_some() && ip(&r).is_some())
    })
    .await?;
    let local_ip = ip(&pods.get("local-web").await?).context("ip")?;
    let offloaded_ip = ip(&pods.get("remote-web").await?).context("ip")?;
    let local_node = pods
        .get("local-web")
        .await?
        .spec
        .and_then(|s| s.node_name)
        .context("node")?;
    assert_ne!(local_node, node_name, "local-web runs on a real node");
    let slice_ips = |api: Api<EndpointSlice>, selector: String| async move {
        let ips: Vec<String> = api
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .into_iter()
            .flat_map(|s| s.endpoints)
            .flat_map(|e| e.addresses)
            .collect();
        Ok::<_, anyhow::Error>(ips)
    };
    let local_slices: Api<EndpointSlice> = Api::namespaced(local.clone(), NS);
    let remote_slices: Api<EndpointSlice> = Api::namespaced(prov.clone(), TWIN);
    let ours = format!(
        "kubernetes.io/service-name=web,endpointslice.kubernetes.io/managed-by=virtual-kubelet.liqo.io,{}={}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE
    );
    let providers = "kubernetes.io/service-name=web,endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io".to_owned();
    let seen = std::sync::Mutex::new((Vec::new(), Vec::new(), Vec::new()));
    let waited = wait_for("the endpoints on both sides", WAIT, || {
        let (seen, local_slices, remote_slices) = (&seen, &local_slices, &remote_slices);
        let (ours, providers, local_ip, offloaded_ip) =
            (&ours, &providers, &local_ip, &offloaded_ip);
        async move {
            let now = (
                slice_ips(
                    local_slices.clone(),
                    "kubernetes.io/service-name=web".to_owned(),
                )
                .await?,
                slice_ips(remote_slices.clone(), ours.clone()).await?,
                slice_ips(remote_slices.clone(), providers.clone()).await?,
            );
            let done = now.0.contains(local_ip)
                && now.0.contains(offloaded_ip)
                && now.1 == vec![local_ip.clone()]
                && now.2 == vec![offloaded_ip.clone()];
            *seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))? = now;
            Ok(done)
        }
    })
    .await;
    waited.with_context(|| format!("local-web {local_ip}, remote-web {offloaded_ip}; (local slices, our remote slices, the provider's slices): {seen:?}"))?;
    let remote_svc = Api::<Service>::namespaced(prov.clone(), TWIN)
        .get("web")
        .await?;
    assert!(is_ours(&remote_svc.metadata));
    let spec = remote_svc.spec.context("spec")?;
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(
        spec.selector,
        Some(BTreeMap::from([("app".to_owned(), "web".to_owned())]))
    );
    let ports = spec.ports.context("ports")?;
    assert_eq!((ports[0].port, ports[0].node_port), (80, None));
    let local_cluster_ip = services.get("web").await?.spec.and_then(|s| s.cluster_ip);
    assert!(spec.cluster_ip.is_some());
    eprintln!(
        "service web: local {local_cluster_ip:?}, remote {:?}",
        spec.cluster_ip
    );
    Ok(())
}

/// A pod that mounts its service account token gets a Secret in the twin
/// whose token authenticates on the consumer's API, gone with the pod.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_mounts_its_token_gets_one_of_the_consumer_that_works_there() -> Result<()> {
    let shop = Shop::at(Stage::Offloaded(NS)).await?;
    let Shop {
        pods,
        cms,
        remote_secrets,
        remote_rs,
        ..
    } = &shop;
    let pp = PostParams::default();

    // A pod that mounts its service account token gets one of the
    // consumer's, for its own account, that works on the consumer's API.
    let accounts: Api<ServiceAccount> = Api::namespaced(shop.local(), NS);
    accounts
        .create(
            &pp,
            &serde_json::from_value(json!({ "metadata": { "name": "builder", "namespace": NS } }))?,
        )
        .await?;
    let mut token_user = pod("token-user", json!([]), json!([]))?;
    token_user
        .spec
        .as_mut()
        .context("spec")?
        .service_account_name = Some("builder".to_owned());
    pods.create(&pp, &token_user).await?;
    let token_secret = "liqo-sa-token-token-user";
    // The Secret is written before the pod's ReplicaSet, which mounts it.
    wait_for(
        "the token Secret and the pod's ReplicaSet in the twin",
        WAIT,
        || async {
            Ok(remote_secrets.get_opt(token_secret).await?.is_some()
                && remote_rs.get_opt("token-user").await?.is_some())
        },
    )
    .await?;
    let secret = remote_secrets.get(token_secret).await?;
    assert!(is_ours(&secret.metadata));
    let data = secret.data.context("data")?;
    let token = String::from_utf8(data.get("token").context("token")?.0.clone())?;
    let ca = data.get("ca.crt").context("ca.crt")?.0.clone();
    assert_eq!(
        data.get("namespace").map(|b| b.0.as_slice()),
        Some(NS.as_bytes())
    );
    let local_ca = cms.get("kube-root-ca.crt").await?.data.context("data")?;
    assert_eq!(
        local_ca.get("ca.crt").map(String::as_bytes),
        Some(ca.as_slice()),
        "the consumer's CA"
    );
    let rs = remote_rs.get("token-user").await?;
    let spec = rs
        .spec
        .and_then(|s| s.template)
        .and_then(|t| t.spec)
        .context("remote pod spec")?;
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name.starts_with("kube-api-access-"))
        .context("the token volume")?;
    assert_eq!(
        volume
            .secret
            .as_ref()
            .and_then(|s| s.secret_name.as_deref()),
        Some(token_secret)
    );
    let container = &spec.containers[0];
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume.name)
        .context("the token mount")?;
    assert_eq!(
        mount.mount_path,
        "/var/run/secrets/kubernetes.io/serviceaccount"
    );
    let env = |name: &str| {
        container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    let host = env("KUBERNETES_SERVICE_HOST").context("KUBERNETES_SERVICE_HOST")?;
    let port = env("KUBERNETES_SERVICE_PORT").context("KUBERNETES_SERVICE_PORT")?;
    // What an in-cluster client of the remote pod does: the address from
    // its env, the CA and token from its mount.
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "c", "cluster": {
            "server": format!("https://{host}:{port}"),
            "certificate-authority-data": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &ca),
        } }],
        "users": [{ "name": "u", "user": { "token": token } }],
        "contexts": [{ "name": "c", "context": { "cluster": "c", "user": "u" } }],
        "current-context": "c",
    });
    let kubeconfig: kube::config::Kubeconfig = serde_json::from_value(kubeconfig)?;
    let as_pod = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?,
    )?;
    let review = Api::<SelfSubjectReview>::all(as_pod)
        .create(&pp, &SelfSubjectReview::default())
        .await?;
    let user = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username);
    assert_eq!(user.as_deref(), Some("system:serviceaccount:shop:builder"));
    // Deleted with the pod.
    pods.delete("token-user", &DeleteParams::default()).await?;
    wait_for("the token Secret gone with the pod", WAIT, || async {
        Ok(remote_secrets.get_opt(token_secret).await?.is_none())
    })
    .await?;
    Ok(())
}

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
