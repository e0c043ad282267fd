//! The virtual kubelet of one outgoing peering, on two real clusters: it
//! registers the virtual node from its ForeignCluster (labels, taint, cost,
//! capacity = the grant), renews its Lease, a new grant resizes the node,
//! and deleting the ForeignCluster removes it; the node is Ready exactly
//! while the provider's API answers as the expected cluster: NotReady
//! within 40 s of the provider's API hanging or going away, Ready again
//! when it is back; a renewed identity is picked up without a restart; a
//! provider that refuses the identity makes it NotReady (forbidden). Each
//! test starts from its own pair of clusters ([`start`], [`peer_by_hand`]).
//!
//! The peering is set up by hand here (`liqoctl peer` comes separately):
//! the provider's side is a CSR-issued identity with the one right the
//! agent needs; the consumer's side is the ForeignCluster, the identity
//! Secret, and the objects of liqoctl's `peering::virtual_kubelet::manifests`
//! as rendered into `fixtures/virtual-kubelet.json` (a liqoctl unit test
//! keeps that file equal to the function's output).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestStatus,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use liqo_api::core::ForeignCluster;
use liqo_api::names;
use liqo_e2e::fixture::{self, spec};
use liqo_e2e::{liqoctl, wait_for};
use liqo_testbed::{CertAndKey, Cluster, HOST_PROCESS_LABEL, HOST_PROCESS_TAINT, Testbed};
use serde_json::json;

const CONSUMER_ID: &str = "vn-consumer";
/// The provider's cluster ID: the one the fixture was rendered for.
const PROVIDER_ID: &str = "vn-provider";
const NODE: &str = "liqo-vn-provider";
/// The provider's Role and RoleBinding that let the consumer read its identity.
const READER: &str = "vn-peer-identity-reader";
/// The bound the issue sets on noticing a lost provider.
const NOT_READY_WITHIN: Duration = Duration::from_secs(40);

/// Two clusters of one kwok node each, with this build's agents; the
/// consumer's agent logs are printed by [`finish`] if the test fails.
async fn start() -> Result<Testbed> {
    // The provider runs its gateway too, for install to complete.
    fixture::start(vec![spec("vn-consumer", 1, 1), spec("vn-provider", 2, 1)]).await
}

/// Prints the consumer's agent logs if `result` is a failure, and stops
/// the clusters.
fn finish(testbed: Testbed, result: Result<()>) -> Result<()> {
    if result.is_err() {
        eprintln!(
            "--- agent logs of the consumer ---\n{}",
            testbed.clusters()[0].pod_logs()
        );
    }
    testbed.stop();
    result
}

/// What [`peer_by_hand`] made.
struct ByHand {
    consumer: kube::Client,
    provider: kube::Client,
    /// The consumer's user on the provider.
    user: String,
    /// The identity the consumer's Secret holds.
    kubeconfig: String,
    fcs: Api<ForeignCluster>,
    secrets: Api<Secret>,
    secret_name: String,
    fc_uid: String,
    nodes: Api<Node>,
}

/// Installs liqo-rs on both clusters (IDs [`CONSUMER_ID`], [`PROVIDER_ID`])
/// and peers them by hand (the grant is 2 CPUs), returning once the
/// virtual node is registered.
async fn peer_by_hand(testbed: &Testbed) -> Result<ByHand> {
    let selector = format!("--node-selector={HOST_PROCESS_LABEL}=true");
    let toleration = format!("--toleration={HOST_PROCESS_TAINT}=true:NoSchedule");
    for (cluster, id, cidr) in [
        (&testbed.clusters()[0], CONSUMER_ID, "10.201.0.0/16"),
        (&testbed.clusters()[1], PROVIDER_ID, "10.202.0.0/16"),
    ] {
        let id = format!("--cluster-id={id}");
        let cidr = format!("--pod-cidr={cidr}");
        let args = [
            "install",
            &id,
            &cidr,
            &selector,
            &toleration,
            "--timeout=90",
        ];
        liqoctl(Some(cluster.kubeconfig_path()), &args).success();
    }
    let consumer = testbed.clusters()[0].client().await?;
    let provider_cluster = &testbed.clusters()[1];
    let provider = provider_cluster.client().await?;

    // The provider's side: the consumer's identity, allowed to read the
    // provider's identity and nothing else.
    let user = liqo_api::authentication::peer_user(&liqo_api::ClusterId::new(CONSUMER_ID)?);
    let kubeconfig = issue_kubeconfig(provider_cluster, &provider, &user, "vn-peer-1").await?;
    grant_identity_read(&provider, &user).await?;

    // The consumer's side: the ForeignCluster with its grant and cost, the
    // identity Secret, and the agent's objects.
    let fcs: Api<ForeignCluster> = Api::all(consumer.clone());
    let fc: ForeignCluster = serde_json::from_value(json!({
        "apiVersion": "liqo.io/v1alpha1",
        "kind": "ForeignCluster",
        "metadata": { "name": PROVIDER_ID },
        "spec": {
            "clusterId": PROVIDER_ID,
            "clusterName": "provider",
            "outgoing": true,
            "clusterLabels": { "region": "eu-south" },
        },
    }))?;
    let fc = fcs.create(&PostParams::default(), &fc).await?;
    let fc_uid = fc
        .metadata
        .uid
        .clone()
        .context("a created object has a UID")?;
    set_grant(&fcs, "2").await?;
    let secrets: Api<Secret> = Api::namespaced(consumer.clone(), names::NAMESPACE);
    let secret_name = format!("liqo-identity-{PROVIDER_ID}");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": secret_name },
        "stringData": { "kubeconfig": kubeconfig },
    }))?;
    secrets.create(&PostParams::default(), &secret).await?;
    apply_fixture(&consumer).await?;

    // Registered as the ForeignCluster says.
    let nodes: Api<Node> = Api::all(consumer.clone());
    wait_for("the virtual node", Duration::from_secs(60), || {
        let nodes = nodes.clone();
        async move { Ok(nodes.get_opt(NODE).await?.is_some()) }
    })
    .await?;
    Ok(ByHand {
        consumer,
        provider,
        user,
        kubeconfig,
        fcs,
        secrets,
        secret_name,
        fc_uid,
        nodes,
    })
}

/// The agent ran throughout, never restarted.
async fn agent_ran_throughout(consumer: &kube::Client) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(consumer.clone(), names::NAMESPACE);
    let ready_replicas = deployments
        .get(&format!("liqo-vk-{PROVIDER_ID}"))
        .await?
        .status
        .and_then(|s| s.ready_replicas);
    assert_eq!(ready_replicas, Some(1));
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_virtual_node_is_registered_resized_and_removed_as_its_foreign_cluster_says()
-> Result<()> {
    let testbed = start().await?;
    let result = registered_resized_and_removed(&testbed).await;
    finish(testbed, result)
}

async fn registered_resized_and_removed(testbed: &Testbed) -> Result<()> {
    let ByHand {
        consumer,
        fcs,
        fc_uid,
        nodes,
        ..
    } = peer_by_hand(testbed).await?;
    let node = nodes.get(NODE).await?;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    for (k, v) in [
        ("liqo.io/virtual-node", "true"),
        ("liqo.io/remote-cluster-id", PROVIDER_ID),
        ("liqo.io/remote-cluster-name", "provider"),
        ("type", "virtual-kubelet"),
        ("kubernetes.io/hostname", NODE),
        ("app.kubernetes.io/managed-by", "liqoctl"),
        ("region", "eu-south"),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "label {k}");
    }
    let taints = node.spec.clone().and_then(|s| s.taints).unwrap_or_default();
    assert!(
        taints.iter().any(|t| t.key == names::VIRTUAL_NODE_TAINT
            && t.value.as_deref() == Some("true")
            && t.effect == "NoExecute"),
        "{taints:?}"
    );
    let cost = node
        .metadata
        .annotations
        .clone()
        .and_then(|a| a.get(names::COST_ANNOTATION).cloned())
        .context("no cost annotation")?;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&cost)?,
        json!({ "cpuHour": "0.05", "currency": "EUR" })
    );
    let owners = node.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        owners
            .iter()
            .any(|o| o.kind == "ForeignCluster" && o.uid == fc_uid),
        "{owners:?}"
    );
    wait_for("the grant as capacity", Duration::from_secs(30), || {
        let nodes = nodes.clone();
        async move { Ok(capacity_is(&nodes.get(NODE).await?, "2")) }
    })
    .await?;

    wait_ready(&nodes, "True", Duration::from_secs(60), "Ready").await?;

    // The Lease is renewed.
    let leases: Api<Lease> = Api::namespaced(consumer.clone(), "kube-node-lease");
    let renewed = |lease: &Lease| lease.spec.as_ref().and_then(|s| s.renew_time.clone());
    // Created beside the node's status, not before it: it may lag Ready.
    wait_for("the Lease", Duration::from_secs(10), || {
        let leases = leases.clone();
        async move { Ok(leases.get_opt(NODE).await?.is_some()) }
    })
    .await?;
    let first = renewed(&leases.get(NODE).await?).context("a Lease without renewTime")?;
    let lease = leases.get(NODE).await?;
    let spec = lease.spec.clone().unwrap_or_default();
    assert_eq!(spec.holder_identity.as_deref(), Some(NODE));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    wait_for("the Lease to be renewed", Duration::from_secs(25), || {
        let leases = leases.clone();
        let first = first.clone();
        async move { Ok(renewed(&leases.get(NODE).await?) != Some(first)) }
    })
    .await?;
    // And the Ready condition gets a fresh heartbeat while nothing changes.
    let beat = heartbeat(&nodes.get(NODE).await?);
    wait_for("a fresh heartbeat", Duration::from_secs(25), || {
        let nodes = nodes.clone();
        let beat = beat.clone();
        async move { Ok(heartbeat(&nodes.get(NODE).await?) != beat) }
    })
    .await?;

    // A new grant resizes the node.
    set_grant(&fcs, "3").await?;
    wait_for("the new grant as capacity", Duration::from_secs(30), || {
        let nodes = nodes.clone();
        async move { Ok(capacity_is(&nodes.get(NODE).await?, "3")) }
    })
    .await?;

    // Deleting the peering's ForeignCluster removes the node (the
    // garbage collector, through the owner reference).
    fcs.delete(PROVIDER_ID, &DeleteParams::default()).await?;
    wait_for(
        "the node to go with its ForeignCluster",
        Duration::from_secs(60),
        || {
            let nodes = nodes.clone();
            async move { Ok(nodes.get_opt(NODE).await?.is_none()) }
        },
    )
    .await?;
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_virtual_node_is_not_ready_while_the_providers_api_hangs_or_is_gone() -> Result<()> {
    let mut testbed = start().await?;
    let result = not_ready_while_the_provider_is_unreachable(&mut testbed).await;
    finish(testbed, result)
}

async fn not_ready_while_the_provider_is_unreachable(testbed: &mut Testbed) -> Result<()> {
    let ByHand {
        consumer, nodes, ..
    } = peer_by_hand(testbed).await?;
    wait_ready(&nodes, "True", Duration::from_secs(60), "Ready").await?;

    // The provider's API hangs: NotReady within 40 s, Ready once it answers.
    let started = Instant::now();
    testbed.cluster_mut("vn-provider").pause_apiserver()?;
    let reason = wait_ready(&nodes, "False", NOT_READY_WITHIN, "NotReady after a pause").await?;
    eprintln!(
        "NotReady {:.1}s after pausing the provider's API ({reason})",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(reason, "ProviderUnreachable");
    let started = Instant::now();
    testbed.cluster_mut("vn-provider").resume_apiserver()?;
    wait_ready(
        &nodes,
        "True",
        Duration::from_secs(30),
        "Ready after resume",
    )
    .await?;
    eprintln!(
        "Ready {:.1}s after resuming it",
        started.elapsed().as_secs_f64()
    );

    // It goes away: the same.
    let started = Instant::now();
    testbed.cluster_mut("vn-provider").stop_apiserver().await?;
    let reason = wait_ready(&nodes, "False", NOT_READY_WITHIN, "NotReady after a stop").await?;
    eprintln!(
        "NotReady {:.1}s after stopping the provider's API ({reason})",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(reason, "ProviderUnreachable");
    testbed.cluster_mut("vn-provider").start_apiserver().await?;
    let started = Instant::now();
    wait_ready(
        &nodes,
        "True",
        Duration::from_secs(30),
        "Ready after restart",
    )
    .await?;
    eprintln!(
        "Ready {:.1}s after the API is back",
        started.elapsed().as_secs_f64()
    );
    agent_ran_throughout(&consumer).await
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_virtual_node_picks_up_a_renewed_identity_and_is_not_ready_while_forbidden()
-> Result<()> {
    let testbed = start().await?;
    let result = renewed_and_forbidden(&testbed).await;
    finish(testbed, result)
}

async fn renewed_and_forbidden(testbed: &Testbed) -> Result<()> {
    let ByHand {
        consumer,
        provider,
        user,
        kubeconfig,
        secrets,
        secret_name,
        nodes,
        ..
    } = peer_by_hand(testbed).await?;
    wait_ready(&nodes, "True", Duration::from_secs(60), "Ready").await?;

    // The identity is renewed in place: reloaded, still Ready.
    let provider_cluster = &testbed.clusters()[1];
    let renewed_kubeconfig =
        issue_kubeconfig(provider_cluster, &provider, &user, "vn-peer-2").await?;
    assert_ne!(renewed_kubeconfig, kubeconfig);
    let patch = json!({ "stringData": { "kubeconfig": renewed_kubeconfig } });
    secrets
        .patch(&secret_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let consumer_cluster = &testbed.clusters()[0];
    wait_for(
        "the agent to reload the kubeconfig",
        Duration::from_secs(30),
        || async move {
            Ok(consumer_cluster
                .pod_logs()
                .contains("reloaded the provider kubeconfig"))
        },
    )
    .await?;
    // Three check periods on the new client, Ready throughout.
    let until = Instant::now() + Duration::from_secs(16);
    while Instant::now() < until {
        let (status, reason) = ready(&nodes.get(NODE).await?);
        assert_eq!(status, "True", "not Ready after the renewal: {reason}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // The provider withdraws the consumer's right: ProviderForbidden; it
    // grants it again: Ready.
    let bindings: Api<RoleBinding> = Api::namespaced(provider.clone(), names::NAMESPACE);
    let withdrawn = bindings.get(READER).await?;
    bindings.delete(READER, &DeleteParams::default()).await?;
    let reason = wait_ready(&nodes, "False", NOT_READY_WITHIN, "NotReady once forbidden").await?;
    assert_eq!(reason, "ProviderForbidden");
    let mut again = withdrawn;
    again.metadata = kube::core::ObjectMeta {
        name: again.metadata.name,
        namespace: again.metadata.namespace,
        ..Default::default()
    };
    bindings.create(&PostParams::default(), &again).await?;
    wait_ready(
        &nodes,
        "True",
        Duration::from_secs(30),
        "Ready once allowed again",
    )
    .await?;
    agent_ran_throughout(&consumer).await
}

/// Sets the ForeignCluster's grant (CPU `cpu`, 4Gi, 20 pods) and cost, as
/// `liqoctl peer` records them.
async fn set_grant(fcs: &Api<ForeignCluster>, cpu: &str) -> Result<()> {
    let status = json!({ "status": {
        "grant": { "cpu": cpu, "memory": "4Gi", "pods": "20" },
        "cost": { "cpuHour": "0.05", "currency": "EUR" },
    }});
    fcs.patch_status(PROVIDER_ID, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

fn capacity_is(node: &Node, cpu: &str) -> bool {
    let Some(status) = &node.status else {
        return false;
    };
    let want = [("cpu", cpu), ("memory", "4Gi"), ("pods", "20")];
    [&status.capacity, &status.allocatable].iter().all(|r| {
        r.as_ref().is_some_and(|r| {
            r.len() == want.len()
                && want
                    .iter()
                    .all(|(k, v)| r.get(*k).is_some_and(|q| q.0 == *v))
        })
    })
}

/// The node's Ready status and reason.
fn ready(node: &Node) -> (String, String) {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
        .unwrap_or_default()
}

/// The Ready condition's lastHeartbeatTime.
fn heartbeat(node: &Node) -> Option<Time> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_heartbeat_time.clone())
}

/// Waits for the node's Ready condition to have `status`; its reason.
async fn wait_ready(
    nodes: &Api<Node>,
    status: &str,
    timeout: Duration,
    what: &str,
) -> Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let (have, reason) = ready(&nodes.get(NODE).await?);
        if have == status {
            return Ok(reason);
        }
        if Instant::now() > deadline {
            bail!("{what}: the node's Ready is still {have:?} ({reason}) after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A kubeconfig for `user` on `cluster`, with a certificate issued through
/// an approved CSR named `csr_name`.
async fn issue_kubeconfig(
    cluster: &Cluster,
    admin: &kube::Client,
    user: &str,
    csr_name: &str,
) -> Result<String> {
    use base64::Engine as _;
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, user);
    params.distinguished_name.push(
        rcgen::DnType::OrganizationName,
        liqo_api::authentication::PEER_GROUP,
    );
    let request_pem = params.serialize_request(&key)?.pem()?;
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": { "name": csr_name },
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(&request_pem),
            "signerName": "kubernetes.io/kube-apiserver-client",
            "usages": ["client auth"],
            "expirationSeconds": 3600,
        },
    }))?;
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    csrs.create(&PostParams::default(), &csr).await?;
    let mut approval = csrs.get(csr_name).await?;
    approval.status = Some(CertificateSigningRequestStatus {
        conditions: Some(vec![CertificateSigningRequestCondition {
            type_: "Approved".to_owned(),
            status: "True".to_owned(),
            reason: Some("E2E".to_owned()),
            message: Some("approved by the virtual node test".to_owned()),
            ..Default::default()
        }]),
        ..Default::default()
    });
    csrs.patch_approval(csr_name, &PatchParams::default(), &Patch::Merge(&approval))
        .await?;
    // Right after the provider's API was stopped and started again, its
    // controller-manager may still be taking its leader lease back (it
    // gives it up when the API is gone): the signer can take that long.
    wait_for("the signed certificate", Duration::from_secs(120), || {
        let csrs = csrs.clone();
        async move {
            let csr = csrs.get(csr_name).await?;
            Ok(csr.status.and_then(|s| s.certificate).is_some())
        }
    })
    .await?;
    let cert = csrs
        .get(csr_name)
        .await?
        .status
        .and_then(|s| s.certificate)
        .context("the certificate went away")?;
    let pair = CertAndKey {
        cert: String::from_utf8(cert.0)?,
        key: key.serialize_pem(),
    };
    Ok(liqo_testbed::kubeconfig_json(
        cluster.name(),
        cluster.server(),
        &cluster.ca_pem()?,
        user,
        &pair,
    ))
}

/// On the provider: `user` may get the identity ConfigMap, and nothing else.
async fn grant_identity_read(provider: &kube::Client, user: &str) -> Result<()> {
    let name = READER;
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": names::NAMESPACE },
        "rules": [{
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [names::IDENTITY_CONFIGMAP],
            "verbs": ["get"],
        }],
    }))?;
    Api::<Role>::namespaced(provider.clone(), names::NAMESPACE)
        .create(&PostParams::default(), &role)
        .await?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": names::NAMESPACE },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
        "subjects": [{ "kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io" }],
    }))?;
    Api::<RoleBinding>::namespaced(provider.clone(), names::NAMESPACE)
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(())
}

/// Server-side applies the objects of `fixtures/virtual-kubelet.json`, as
/// liqoctl applies them.
async fn apply_fixture(client: &kube::Client) -> Result<()> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/virtual-kubelet.json");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let objects: Vec<DynamicObject> = serde_json::from_str(&text)?;
    for object in objects {
        let kind = object
            .types
            .as_ref()
            .map(|t| t.kind.as_str())
            .unwrap_or_default();
        let resource = match kind {
            "ServiceAccount" => ApiResource::erase::<ServiceAccount>(&()),
            "ClusterRole" => ApiResource::erase::<ClusterRole>(&()),
            "ClusterRoleBinding" => ApiResource::erase::<ClusterRoleBinding>(&()),
            "Role" => ApiResource::erase::<Role>(&()),
            "RoleBinding" => ApiResource::erase::<RoleBinding>(&()),
            "Deployment" => ApiResource::erase::<Deployment>(&()),
            other => bail!("the fixture holds a {other:?}, which this test does not apply"),
        };
        let api: Api<DynamicObject> = match &object.metadata.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let name = object.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply("liqoctl").force(),
            &Patch::Apply(&object),
        )
        .await
        .with_context(|| format!("applying {kind}/{name}"))?;
    }
    Ok(())
}
