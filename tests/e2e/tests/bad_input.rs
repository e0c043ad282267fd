//! Bad input gets one clear line, a meaningful exit code, and leaves nothing
//! half-done; and liqoctl finds its cluster the way kubectl does.

use std::path::Path;

use anyhow::Result;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use liqo_api::names;
use liqo_e2e::fixture::{One, spec};
use liqo_e2e::{liqoctl, run};
use liqo_testbed::{Cluster, Toolchain};
use serde_json::json;

/// A kubeconfig for a service account that may only read (the built-in
/// `view` role), made with a real token from the TokenRequest API; returns
/// the token.
async fn viewer_kubeconfig(cluster: &Cluster, path: &Path) -> Result<String> {
    let client = cluster.client().await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "viewer"}}))?,
        )
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "viewer-view" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view" },
        "subjects": [{ "kind": "ServiceAccount", "name": "viewer", "namespace": "default" }],
    }))?;
    Api::<ClusterRoleBinding>::all(client)
        .create(&PostParams::default(), &binding)
        .await?;
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))?;
    let token = accounts
        .create_token_request("viewer", &PostParams::default(), &request)
        .await?
        .status
        .map(|s| s.token)
        .unwrap_or_default();
    use base64::Engine as _;
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "c", "cluster": {
            "server": cluster.server(),
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(cluster.ca_pem()?),
        }}],
        "users": [{ "name": "viewer", "user": { "token": token } }],
        "contexts": [{ "name": "viewer", "context": { "cluster": "c", "user": "viewer" } }],
        "current-context": "viewer",
    });
    std::fs::write(path, serde_json::to_string(&kubeconfig)?)?;
    Ok(token)
}

/// The kubeconfig with another certificate authority.
fn with_ca(kubeconfig: &str, ca_pem: &str) -> String {
    use base64::Engine as _;
    let config = kube::config::Kubeconfig::from_yaml(kubeconfig).expect("a valid kubeconfig");
    let mut config = serde_json::to_value(config).expect("a kubeconfig serializes");
    config["clusters"][0]["cluster"]["certificate-authority-data"] =
        json!(base64::engine::general_purpose::STANDARD.encode(ca_pem));
    config.to_string()
}

/// A reader that has gone before liqoctl writes: `liqoctl ... | head -0`.
fn closed_stdout(kubeconfig: Option<&Path>, args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(liqo_e2e::bin_dir().join("liqoctl"));
    if let Some(kubeconfig) = kubeconfig {
        cmd.arg("--kubeconfig").arg(kubeconfig);
    }
    let mut child = cmd
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("liqoctl runs");
    // Closed before liqoctl has even parsed its arguments.
    drop(child.stdout.take());
    child.wait_with_output().expect("liqoctl ends")
}

async fn nothing_installed(cluster: &Cluster) -> Result<()> {
    let client = cluster.client().await?;
    assert!(
        Api::<Namespace>::all(client.clone())
            .get_opt(names::NAMESPACE)
            .await?
            .is_none()
    );
    let crds = Api::<CustomResourceDefinition>::all(client)
        .list(&ListParams::default())
        .await?;
    assert!(
        !crds.items.iter().any(|c| c.spec.group == names::GROUP),
        "CRDs were created"
    );
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_one_line_and_changes_nothing() -> Result<()> {
    let one = One::start(spec("cluster-1", 1, 3)).await?;
    let cluster = one.cluster();
    let kubeconfig = cluster.kubeconfig_path();
    let scratch = cluster.dir();

    // An unreachable cluster: a kubeconfig pointing at a closed port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let unreachable = scratch.join("unreachable.kubeconfig");
    let text = std::fs::read_to_string(kubeconfig)?
        .replace(cluster.server(), &format!("https://{closed}"));
    std::fs::write(&unreachable, text)?;
    let out = liqoctl(Some(&unreachable), &["install", "--timeout=5"]).user_error(4);
    assert!(
        out.error_line().contains("cannot reach")
            && out.error_line().contains("connection refused"),
        "{}",
        out.stderr
    );
    // Only our line: no library log line (kube's client logs failed
    // connections at ERROR) reaches the user by default.
    let others: Vec<&str> = (out.stderr.lines())
        .filter(|l| !l.starts_with("error: ") && !l.ends_with("..."))
        .collect();
    assert!(others.is_empty(), "{}", out.stderr);
    // `version` says what it knows before it fails, as kubectl does.
    let out = liqoctl(Some(&unreachable), &["version"]).user_error(4);
    assert!(
        out.stdout
            .contains(&format!("Client:     {}", liqo_api::VERSION)),
        "{}",
        out.stdout
    );

    // A server whose certificate the kubeconfig does not trust.
    let stranger = rcgen::generate_simple_self_signed(vec!["stranger".to_owned()])?;
    let untrusted = scratch.join("untrusted.kubeconfig");
    std::fs::write(
        &untrusted,
        with_ca(&std::fs::read_to_string(kubeconfig)?, &stranger.cert.pem()),
    )?;
    let out = liqoctl(Some(&untrusted), &["info"]).user_error(4);
    assert!(
        out.error_line().contains("certificate is not trusted"),
        "{}",
        out.stderr
    );

    // A context that the kubeconfig does not have.
    let out = liqoctl(Some(kubeconfig), &["--context", "nope", "install"]).user_error(3);
    assert!(out.error_line().contains("\"nope\""), "{}", out.stderr);

    // A file that is not a kubeconfig, and one that does not exist.
    let out = liqoctl(Some(&cluster.dir().join("pki/ca.crt")), &["info"]).user_error(3);
    assert!(out.error_line().contains("ca.crt"), "{}", out.stderr);
    liqoctl(Some(&scratch.join("missing")), &["info"]).user_error(3);

    // Flags that make no sense are refused before the cluster is touched.
    for (flag, mention) in [
        ("--cluster-id=Not_A_Label", "Not_A_Label"),
        ("--cluster-name=-x", "-x"),
        ("--pod-cidr=10.0.0.0/33", "10.0.0.0/33"),
        ("--service-cidr=nonsense", "nonsense"),
        ("--node-selector=novalue", "novalue"),
        ("--cluster-labels=k=bad value", "bad value"),
        ("--cluster-labels=Bad.Prefix/k=v", "Bad.Prefix"),
        ("--cluster-labels=liqo.io/virtual-node=x", "set by liqo-rs"),
        ("--pod-cidr=127.0.0.0/8", "loopback"),
        ("--toleration=k=v:Never", "Never"),
    ] {
        let out = liqoctl(Some(kubeconfig), &["install", flag]).user_error(2);
        assert!(out.error_line().contains(mention), "{flag}: {}", out.stderr);
    }
    liqoctl(Some(kubeconfig), &["install", "--no-such-flag"]).user_error(2);

    // Too few permissions: the check happens before any write.
    let viewer = scratch.join("viewer.kubeconfig");
    let token = viewer_kubeconfig(cluster, &viewer).await?;
    assert!(token.len() > 20, "a real token");
    // A token the cluster does not accept: 401, told apart from 403.
    let stale = scratch.join("stale.kubeconfig");
    std::fs::write(
        &stale,
        std::fs::read_to_string(&viewer)?.replace(&token, "not-a-token"),
    )?;
    let out = liqoctl(Some(&stale), &["info"]).user_error(3);
    assert!(
        out.error_line()
            .contains("does not accept the kubeconfig's credentials"),
        "{}",
        out.stderr
    );
    let out = liqoctl(Some(&viewer), &["install", "--timeout=5"]).user_error(5);
    assert!(
        out.error_line()
            .contains("create customresourcedefinitions"),
        "{}",
        out.stderr
    );
    nothing_installed(cluster).await?;

    // Secrets stay out of the output, even with the most verbose logs.
    let verbose = liqoctl(Some(&viewer), &["-vv", "info"]);
    assert!(
        verbose.stderr.contains("DEBUG"),
        "-vv logs: {}",
        verbose.stderr
    );
    for text in [&verbose.stdout, &verbose.stderr] {
        assert!(!text.contains(&token), "the token leaked");
    }

    // A run that fails halfway (the gateway cannot be scheduled) leaves a
    // state that the same command, corrected, resumes.
    let cidrs = ["--pod-cidr=10.201.0.0/16", "--service-cidr=10.101.0.0/16"];
    let stuck = liqoctl(
        Some(kubeconfig),
        &[
            &["install", "--node-selector=nowhere=true", "--timeout=3"],
            &cidrs[..],
        ]
        .concat(),
    )
    .user_error(8);
    // The gateway's wait, or on a loaded machine an earlier one of the
    // same 3 s: either way the run stopped half-way.
    assert!(stuck.error_line().contains("after 3s"), "{}", stuck.stderr);
    let pin = format!("--node-selector={}=true", liqo_testbed::HOST_PROCESS_LABEL);
    let tolerate = format!(
        "--toleration={}=true:NoSchedule",
        liqo_testbed::HOST_PROCESS_TAINT
    );
    let resumed = liqoctl(
        Some(kubeconfig),
        &[&["install", &pin, &tolerate, "--timeout=60"], &cidrs[..]].concat(),
    )
    .success();
    assert!(resumed.stdout.contains("updated on"), "{}", resumed.stdout);
    liqoctl(Some(kubeconfig), &["uninstall", "--purge", "--yes"]).success();
    nothing_installed(cluster).await?;

    // A namespace of the same name that liqoctl did not make is not adopted.
    let namespaces: Api<Namespace> = Api::all(cluster.client().await?);
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": names::NAMESPACE } }))?,
        )
        .await?;
    let taken = liqoctl(Some(kubeconfig), &[&["install"], &cidrs[..]].concat()).user_error(6);
    assert!(
        taken.error_line().contains("did not create"),
        "{}",
        taken.stderr
    );
    let crds = Api::<CustomResourceDefinition>::all(cluster.client().await?);
    assert!(
        !crds
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|c| c.spec.group == names::GROUP),
        "a refused install created CRDs"
    );
    namespaces
        .delete(names::NAMESPACE, &Default::default())
        .await?;
    liqo_e2e::wait_for(
        "the namespace to go",
        std::time::Duration::from_secs(30),
        || {
            let namespaces = namespaces.clone();
            async move { Ok(namespaces.get_opt(names::NAMESPACE).await?.is_none()) }
        },
    )
    .await?;

    // Not installed: info says so and how to fix it; uninstall is a no-op.
    let out = liqoctl(Some(kubeconfig), &["info"]).user_error(7);
    assert!(
        out.error_line().contains("liqoctl install"),
        "{}",
        out.stderr
    );
    liqoctl(Some(kubeconfig), &["uninstall", "--yes"]).success();
    nothing_installed(cluster).await?;
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn liqoctl_finds_its_cluster_like_kubectl_and_runs_as_a_plugin() -> Result<()> {
    let one = One::start(spec("cluster-1", 1, 3)).await?;
    let cluster = one.cluster();
    let kubeconfig = cluster.kubeconfig_path();
    let kubectl = Toolchain::locate()?.binary("kubectl");

    // KUBECONFIG, with several files, and --context picking among them.
    let other = cluster.dir().join("other.kubeconfig");
    let renamed = std::fs::read_to_string(kubeconfig)?.replace(cluster.name(), "renamed");
    std::fs::write(&other, renamed)?;
    let joined = std::env::join_paths([other.as_path(), kubeconfig])?;
    let out = run(
        std::process::Command::new(liqo_e2e::bin_dir().join("liqoctl"))
            .args(["--context", cluster.name(), "version", "-o", "json"])
            .env("KUBECONFIG", &joined),
    );
    let out = out.success();
    let version: serde_json::Value = serde_json::from_str(&out.stdout)?;
    assert!(
        version["kubernetes"]
            .as_str()
            .is_some_and(|v| v.starts_with("v1.")),
        "{}",
        out.stdout
    );
    assert!(version["server"].is_null(), "not installed: {}", out.stdout);

    // As a kubectl plugin: kubectl finds `kubectl-liqo` on the PATH.
    let plugins = cluster.dir().join("plugins");
    std::fs::create_dir_all(&plugins)?;
    std::os::unix::fs::symlink(
        liqo_e2e::bin_dir().join("liqoctl"),
        plugins.join("kubectl-liqo"),
    )?;
    let path = std::env::join_paths([plugins.as_path(), Path::new("/usr/bin"), Path::new("/bin")])?;
    let out = run(std::process::Command::new(&kubectl)
        .args(["liqo", "version"])
        .env("PATH", &path)
        .env("KUBECONFIG", kubeconfig))
    .success();
    assert!(out.stdout.contains("Kubernetes: v1."), "{}", out.stdout);
    let help = run(std::process::Command::new(&kubectl)
        .args(["liqo", "--help"])
        .env("PATH", &path))
    .success();
    assert!(help.stdout.contains("kubectl liqo"), "{}", help.stdout);

    // Completion scripts for the three shells.
    for shell in ["bash", "zsh", "fish"] {
        let out = liqoctl(None, &["completion", shell]).success();
        assert!(out.stdout.contains("install"), "{shell}: {}", out.stdout);
    }
    liqoctl(None, &["completion", "tcsh"]).user_error(2);
    Ok(())
}

#[test]
fn a_closed_stdout_ends_liqoctl_quietly() {
    for args in [
        &["completion", "bash"][..],
        &["version", "--client"],
        &["--help"],
    ] {
        let out = closed_stdout(None, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        // clap's own --help leaves like `head` expects: quietly.
        assert!(out.status.code().is_some(), "{args:?} killed by a signal");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
}

/// What must stay on a cluster is not offloaded, and a zero request is
/// not read as "all": each refused with one line, before any cluster is
/// contacted (exit 2).
#[test]
fn what_must_stay_is_not_offloaded_and_zero_asks_for_nothing() {
    for ns in [
        "liqo",
        "kube-system",
        "kube-public",
        "liqo-tenant-consumer-1",
    ] {
        let out = liqoctl(None, &["offload", "namespace", ns]).user_error(2);
        assert!(
            out.error_line().contains(ns) && out.error_line().contains("cannot be offloaded"),
            "{}",
            out.error_line()
        );
    }
    for flag in ["--pods=0", "--cpu=0", "--memory=0Mi"] {
        let out = liqoctl(None, &["peer", "--remote-kubeconfig=/nonexistent", flag]).user_error(2);
        assert!(
            out.error_line().contains("asks for nothing"),
            "{flag}: {}",
            out.error_line()
        );
    }
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_cidr_nothing_tells_is_asked_for_and_nothing_is_written() -> Result<()> {
    // No node at all: neither a node's spec.podCIDR nor a kube-proxy
    // ConfigMap nor a controller-manager pod says the pod CIDR.
    let mut spec = spec("no-cidr", 1, 0);
    spec.agent_bin_dir = None;
    let one = One::start(spec).await?;
    let cluster = one.cluster();
    let kubeconfig = Some(cluster.kubeconfig_path());
    let out = liqoctl(kubeconfig, &["install", "--timeout=10"]).user_error(7);
    let line = out.error_line();
    assert!(
        line.contains("cannot find the pod CIDR of cluster no-cidr")
            && line.ends_with("give it with --pod-cidr"),
        "{line}"
    );
    nothing_installed(cluster).await?;
    // Given, it is taken (printed, not applied: no node could run the
    // gateway).
    let out = liqoctl(
        kubeconfig,
        &[
            "install",
            "--pod-cidr=10.230.0.0/16",
            "--dry-run",
            "-o",
            "json",
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("10.230.0.0/16"), "{}", out.stdout);
    nothing_installed(cluster).await?;
    Ok(())
}
