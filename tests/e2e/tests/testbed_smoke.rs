//! The test clusters are real: workloads schedule and run on kwok nodes,
//! certificates issued through the CSR API authenticate, RBAC refuses what
//! it does not grant, two clusters share neither objects nor identities,
//! and stopping leaves no process behind.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestStatus,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use liqo_e2e::{process_running, wait_for};
use liqo_testbed::{CertAndKey, Cluster, Testbed};
use serde_json::json;

/// A namespace and a 3-replica Deployment reach Running on kwok nodes, with
/// pod IPs from the cluster's own pod CIDR.
async fn deployment_runs(cluster: &Cluster) -> Result<()> {
    let client = cluster.client().await?;
    let ns = "smoke";
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "web" },
        "spec": {
            "replicas": 3,
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": {
                    "nodeSelector": { "type": "kwok" },
                    "containers": [{ "name": "web", "image": "nginx:1.27" }],
                },
            },
        },
    }))?;
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &deployment)
        .await?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for("3 running pods", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&ListParams::default().labels("app=web")).await?;
            let running = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            Ok(running == 3)
        }
    })
    .await
    .with_context(|| format!("cluster {}", cluster.name()))?;

    let prefix = cluster
        .spec()
        .pod_cidr
        .split('.')
        .take(2)
        .collect::<Vec<_>>()
        .join(".")
        + ".";
    for pod in pods.list(&ListParams::default().labels("app=web")).await? {
        let spec = pod.spec.context("pod without spec")?;
        let node = spec.node_name.context("running pod without node")?;
        assert!(
            node.starts_with(&format!("{}-worker-", cluster.name())),
            "pod on {node}"
        );
        let ip = pod
            .status
            .and_then(|s| s.pod_ip)
            .context("running pod without IP")?;
        assert!(
            ip.starts_with(&prefix),
            "pod IP {ip} is outside {}",
            cluster.spec().pod_cidr
        );
    }
    // The deployment controller reports the pods' readiness a moment after
    // they are Running: wait for it, bounded.
    let deployments: Api<Deployment> = Api::namespaced(client, ns);
    wait_for(
        "the Deployment to report 3 ready replicas",
        Duration::from_secs(30),
        || {
            let deployments = deployments.clone();
            async move {
                let ready = deployments
                    .get("web")
                    .await?
                    .status
                    .and_then(|s| s.ready_replicas);
                Ok(ready == Some(3))
            }
        },
    )
    .await?;
    Ok(())
}

/// A client certificate requested through the CSR API and approved is
/// issued by the controller-manager, authenticates as the requested user,
/// and gets nothing RBAC does not grant.
async fn csr_certificate_authenticates(cluster: &Cluster) -> Result<()> {
    let admin = cluster.client().await?;
    let user = "smoke-tester";
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, user);
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "smoke-group");
    let request_pem = params.serialize_request(&key)?.pem()?;

    use base64::Engine as _;
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": { "name": "smoke-tester" },
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(&request_pem),
            "signerName": "kubernetes.io/kube-apiserver-client",
            "usages": ["client auth"],
            "expirationSeconds": 3600,
        },
    }))?;
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    csrs.create(&PostParams::default(), &csr).await?;

    let mut approval = csrs.get("smoke-tester").await?;
    approval.status = Some(CertificateSigningRequestStatus {
        conditions: Some(vec![CertificateSigningRequestCondition {
            type_: "Approved".to_owned(),
            status: "True".to_owned(),
            reason: Some("SmokeTest".to_owned()),
            message: Some("approved by the smoke test".to_owned()),
            ..Default::default()
        }]),
        ..Default::default()
    });
    csrs.patch_approval(
        "smoke-tester",
        &PatchParams::default(),
        &Patch::Merge(&approval),
    )
    .await?;

    wait_for("the signed certificate", Duration::from_secs(30), || {
        let csrs = csrs.clone();
        async move {
            let csr = csrs.get("smoke-tester").await?;
            Ok(csr.status.and_then(|s| s.certificate).is_some())
        }
    })
    .await?;
    let issued = csrs
        .get("smoke-tester")
        .await?
        .status
        .and_then(|s| s.certificate)
        .context("the certificate went away")?;
    let issued = String::from_utf8(issued.0)?;

    // The certificate is what was asked for.
    let (_, pem) = x509_parser::pem::parse_x509_pem(issued.as_bytes())?;
    let cert = pem.parse_x509()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .context("no CN")?
        .as_str()?;
    assert_eq!(cn, user);
    let (_, ca_pem) = x509_parser::pem::parse_x509_pem(cluster.ca_pem()?.as_bytes())?;
    assert_eq!(
        cert.issuer(),
        ca_pem.parse_x509()?.subject(),
        "signed by the cluster CA"
    );

    // It authenticates as that user...
    let kubeconfig = cluster.dir().join("smoke-tester.kubeconfig");
    let pair = CertAndKey {
        cert: issued,
        key: key.serialize_pem(),
    };
    std::fs::write(
        &kubeconfig,
        liqo_testbed::kubeconfig_json(
            cluster.name(),
            cluster.server(),
            &cluster.ca_pem()?,
            user,
            &pair,
        ),
    )?;
    let tester = liqo_testbed::client_from_kubeconfig(&kubeconfig).await?;
    let review: SelfSubjectReview = Api::all(tester.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({}))?)
        .await?;
    let info = review
        .status
        .and_then(|s| s.user_info)
        .context("no user info")?;
    assert_eq!(info.username.as_deref(), Some(user));
    assert!(
        info.groups
            .unwrap_or_default()
            .contains(&"smoke-group".to_owned())
    );

    // ...which RBAC gives no rights to list namespaces...
    let namespaces: Api<Namespace> = Api::all(tester.clone());
    match namespaces.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => bail!("listing namespaces without rights gave {other:?}"),
    }

    // ...until a binding grants them, and then only those.
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": { "name": "smoke-namespace-reader" },
        "rules": [{ "apiGroups": [""], "resources": ["namespaces"], "verbs": ["list"] }],
    }))?;
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "smoke-namespace-reader" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "smoke-namespace-reader" },
        "subjects": [{ "kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io" }],
    }))?;
    Api::<ClusterRoleBinding>::all(admin)
        .create(&PostParams::default(), &binding)
        .await?;
    wait_for(
        "the binding to take effect",
        Duration::from_secs(10),
        || {
            let namespaces = namespaces.clone();
            async move { Ok(namespaces.list(&ListParams::default()).await.is_ok()) }
        },
    )
    .await?;
    match Api::<Pod>::namespaced(tester, "smoke")
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => bail!("listing pods with only namespace rights gave {other:?}"),
    }
    Ok(())
}

/// `x` shares nothing with `y`: an object made in `x` is not in `y`, and
/// `y` refuses `x`'s admin certificate (401), its CA being another. Each
/// check has a control that the same probe aimed at `x` itself passes, so
/// that a broken probe cannot pass for independence.
async fn independent(x: &Cluster, y: &Cluster) -> Result<()> {
    let name = format!("made-in-{}", x.name());
    let in_x: Api<ConfigMap> = Api::namespaced(x.client().await?, "default");
    in_x.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}}))?,
    )
    .await?;
    assert!(
        in_x.get_opt(&name).await?.is_some(),
        "control: {name} is in {}",
        x.name()
    );
    let in_y: Api<ConfigMap> = Api::namespaced(y.client().await?, "default");
    assert!(
        in_y.get_opt(&name).await?.is_none(),
        "{name}, made in {}, shows in {}",
        x.name(),
        y.name()
    );

    assert_ne!(x.ca_pem()?, y.ca_pem()?, "each cluster has its own CA");
    let own = Api::<Namespace>::all(admin_of_x_trusting(x, x).await?);
    own.list(&ListParams::default()).await.with_context(|| {
        format!(
            "control: {}'s admin authenticates to {}",
            x.name(),
            x.name()
        )
    })?;
    let foreign = Api::<Namespace>::all(admin_of_x_trusting(x, y).await?);
    match foreign.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(
            status.code,
            401,
            "{} answers {}'s admin certificate with {status:?}",
            y.name(),
            x.name()
        ),
        Err(e) => bail!(
            "{} answers {}'s admin certificate with {e}",
            y.name(),
            x.name()
        ),
        Ok(list) => bail!(
            "{} accepted {}'s admin certificate: it listed {} namespaces",
            y.name(),
            x.name(),
            list.items.len()
        ),
    }
    Ok(())
}

/// A client with `x`'s admin certificate aimed at `server`'s API, trusting
/// `server`'s CA: so the TLS handshake succeeds and the certificate reaches
/// authentication.
async fn admin_of_x_trusting(x: &Cluster, server: &Cluster) -> Result<kube::Client> {
    use base64::Engine as _;
    let mut kubeconfig = Kubeconfig::read_from(x.kubeconfig_path())?;
    let cluster = kubeconfig
        .clusters
        .first_mut()
        .and_then(|c| c.cluster.as_mut())
        .context("the kubeconfig has a cluster")?;
    cluster.server = Some(server.server().to_owned());
    cluster.certificate_authority_data =
        Some(base64::engine::general_purpose::STANDARD.encode(server.ca_pem()?));
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_run_workloads_issue_certificates_and_stop_clean() -> Result<()> {
    let testbed = Testbed::start_default(2).await?;
    let [a, b] = testbed.clusters() else {
        bail!("expected two clusters");
    };
    assert_ne!(
        a.spec().pod_cidr,
        b.spec().pod_cidr,
        "pod CIDRs differ by default"
    );
    assert_ne!(a.server(), b.server());

    tokio::try_join!(deployment_runs(a), deployment_runs(b))?;
    tokio::try_join!(
        csr_certificate_authenticates(a),
        csr_certificate_authenticates(b)
    )?;

    independent(a, b).await?;
    independent(b, a).await?;

    let pids: Vec<u32> = testbed
        .clusters()
        .iter()
        .flat_map(|c| c.processes())
        .map(|p| p.pid)
        .collect();
    assert_eq!(pids.len(), 10, "five processes per cluster");
    let ports: Vec<String> = testbed
        .clusters()
        .iter()
        .map(|c| c.server().to_owned())
        .collect();
    let root = testbed.root().to_owned();
    testbed.stop();

    for pid in pids {
        assert!(!process_running(pid), "process {pid} outlived the testbed");
    }
    for server in ports {
        let addr = server.trim_start_matches("https://");
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "{addr} still accepts connections after stop"
        );
    }
    assert!(!root.exists(), "the testbed's temporary folder is removed");
    Ok(())
}

/// A test that fails keeps its clusters' folder, logs included, and one
/// that passes leaves nothing: the panic is the test's, in a thread of its
/// own here.
#[test]
fn a_failed_test_keeps_its_clusters_folder_and_a_passed_one_does_not() -> Result<()> {
    // Each run's folder, told before the thread passes or panics.
    let run = |fail: bool| -> Result<(std::path::PathBuf, bool)> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || -> Result<()> {
            let runtime = tokio::runtime::Runtime::new()?;
            let mut spec = liqo_testbed::ClusterSpec::new("kept", 1);
            spec.nodes = 0;
            let testbed = runtime.block_on(Testbed::start(vec![spec]))?;
            tx.send(testbed.root().to_owned())?;
            if fail {
                panic!("failing on purpose");
            }
            Ok(())
        });
        let panicked = thread.join().is_err();
        let root = rx.recv().context("the thread started a testbed")?;
        Ok((root, panicked))
    };
    let (passed, panicked) = run(false)?;
    assert!(!panicked);
    assert!(!passed.exists(), "a passed test's folder is removed");

    let (kept, panicked) = run(true)?;
    assert!(panicked, "the failing thread panics");
    let log = kept.join("kept/logs/kube-apiserver.log");
    let found = log.exists();
    if kept.exists() {
        std::fs::remove_dir_all(&kept)?;
    }
    assert!(found, "the API server's log is kept: {}", log.display());
    Ok(())
}
