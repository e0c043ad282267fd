//! The virtual kubelet's kubelet API end to end, through the consumer's
//! real API server: the node registers its address and port; `kubectl
//! logs` (with `--tail`, `-f`, `--previous`) of an offloaded pod returns
//! the lines the provider's kwok node serves for its remote pod; `kubectl
//! exec` runs a command there, with its output, input and status; and the
//! API itself refuses an anonymous caller (401) and a caller without
//! `nodes/proxy` (403, through a real SubjectAccessReview). The node
//! proxy's `/pods`, `/stats/summary` and `/metrics/resource`, and `kubectl
//! top`, are in `kubelet_api_metrics`, which shares this module's setup
//! ([`Offloaded`]).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use liqo_api::ClusterId;
use liqo_api::names::peering;
use liqo_e2e::fixture::{Pair, Stage, WAIT};
use liqo_e2e::{run, wait_for};
use liqo_testbed::Toolchain;
use serde_json::json;
use tokio::io::AsyncBufReadExt;

pub(crate) const NS: &str = "logs";
pub(crate) const POD: &str = "logger";
/// What the provider's kwok node measures for the offloaded pod (the
/// local pod's annotations, which the agent copies to the remote pod).
pub(crate) const USAGE_CPU: &str = "250m";
pub(crate) const USAGE_MEMORY: &str = "20Mi";
fn pod() -> Pod {
    serde_json::from_value(liqo_e2e::restricted(json!({
        "metadata": {
            "name": POD,
            "namespace": NS,
            "annotations": {
                "kwok.x-k8s.io/usage-cpu": USAGE_CPU,
                "kwok.x-k8s.io/usage-memory": USAGE_MEMORY,
            },
        },
        "spec": {
            "nodeSelector": liqo_e2e::virtual_node_selector(),
            "tolerations": liqo_e2e::virtual_node_tolerations(),
            "terminationGracePeriodSeconds": 1,
            "containers": [{ "name": POD, "image": "busybox" }],
        },
    })))
    .expect("pod")
}

/// What the virtual node's kubelet API answers at `path`, through the
/// consumer's API server (its node proxy); the call must succeed.
pub(crate) fn node_proxy(
    kubectl: &impl Fn(&[&str]) -> liqo_e2e::Run,
    node_name: &str,
    path: &str,
) -> liqo_e2e::Run {
    let raw = kubectl(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{node_name}/proxy{path}"),
    ]);
    assert_eq!(raw.code, 0, "{raw:?}");
    raw
}

/// Appends `lines` to kwok's log file, in the container runtimes' log
/// format kwok reads (time, stream, full-line tag, text).
fn append(path: &std::path::Path, lines: &[&str]) -> Result<()> {
    let mut file = std::fs::OpenOptions::new().append(true).open(path)?;
    for line in lines {
        let now = k8s_openapi::jiff::Timestamp::now();
        writeln!(file, "{now} stdout F {line}")?;
    }
    Ok(())
}

/// A consumer and a provider with [`NS`] offloaded, the virtual node Ready
/// at the address and port it registers (checked: the agent's pod IP and
/// the manifests' port), and [`pod`] Running on the provider's kwok node.
pub(crate) struct Offloaded {
    pub(crate) pair: Pair,
    pub(crate) node_name: String,
    pub(crate) nodes: Api<Node>,
    pub(crate) pods: Api<Pod>,
    pub(crate) kubectl_bin: PathBuf,
    pub(crate) kubeconfig: PathBuf,
}

impl Offloaded {
    pub(crate) async fn start() -> Result<Self> {
        let pair = Pair::at(Stage::Offloaded(NS)).await?;
        let local = pair.consumer_client.clone();
        let node_name = peering::virtual_node(&ClusterId::new("provider-1")?);
        let nodes: Api<Node> = Api::all(local.clone());
        wait_for(
            "the virtual node Ready with its kubelet endpoint",
            WAIT,
            || async {
                let status = nodes.get_opt(&node_name).await?.and_then(|n| n.status);
                let ready = status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                let port = status
                    .as_ref()
                    .and_then(|s| s.daemon_endpoints.as_ref())
                    .and_then(|d| d.kubelet_endpoint.as_ref())
                    .map(|k| k.port);
                Ok(ready && port.is_some_and(|p| p > 0))
            },
        )
        .await?;
        let status = nodes.get(&node_name).await?.status.context("status")?;
        let address = status
            .addresses
            .iter()
            .flatten()
            .find(|a| a.type_ == "InternalIP")
            .context("an InternalIP")?
            .address
            .clone();
        let port = status
            .daemon_endpoints
            .and_then(|d| d.kubelet_endpoint)
            .context("port")?
            .port;
        // The agent's pod IP, a loopback address of the host-process node,
        // and the manifests' port.
        assert!(address.starts_with("127."), "{address}");
        assert_eq!(port, 10250);
        eprintln!("kubelet API at {address}:{port}");

        // An offloaded pod, Running on the provider's kwok node.
        let pods: Api<Pod> = Api::namespaced(local.clone(), NS);
        pods.create(&PostParams::default(), &pod()).await?;
        wait_for("the offloaded pod Running", WAIT, || async {
            let p = pods.get(POD).await?;
            Ok(p.status.and_then(|s| s.phase).as_deref() == Some("Running"))
        })
        .await?;

        let kubectl_bin = Toolchain::locate()?.binary("kubectl");
        let kubeconfig = pair.consumer().kubeconfig_path().to_owned();
        Ok(Self {
            pair,
            node_name,
            nodes,
            pods,
            kubectl_bin,
            kubeconfig,
        })
    }

    /// `kubectl` on the consumer.
    pub(crate) fn kubectl(&self, args: &[&str]) -> liqo_e2e::Run {
        run(std::process::Command::new(&self.kubectl_bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--request-timeout=30s"])
            .args(args))
    }

    /// The API server proxies to a node only at a global unicast address,
    /// and the host-process node's pod IPs are loopback ones: the agent is
    /// moved to this machine's own address (local delivery, nothing leaves
    /// the host) with port 0, the way several agents share one address.
    /// Its address and port, once registered.
    pub(crate) async fn move_agent(&self) -> Result<(String, i32)> {
        let (local, nodes) = (&self.pair.consumer_client, &self.nodes);
        let node_name = &self.node_name;
        let host_ip = liqo_e2e::host_address()?;
        liqo_e2e::set_agent_args(
            local,
            "provider-1",
            |a| {
                if a.starts_with("--kubelet-addr=") {
                    format!("--kubelet-addr={host_ip}:0")
                } else {
                    a
                }
            },
            &[format!("--node-ip={host_ip}")],
        )
        .await?;
        let registered = || async {
            let status = nodes.get(node_name).await?.status.unwrap_or_default();
            let ip = status
                .addresses
                .iter()
                .flatten()
                .find(|a| a.type_ == "InternalIP")
                .map(|a| a.address.clone());
            let port = status
                .daemon_endpoints
                .and_then(|d| d.kubelet_endpoint)
                .map_or(0, |k| k.port);
            anyhow::Ok((ip, port))
        };
        wait_for(
            "the node at the host's address and a free port",
            WAIT,
            || async {
                let (ip, port) = registered().await?;
                Ok(ip.as_deref() == Some(host_ip.as_str()) && port > 0 && port != 10250)
            },
        )
        .await?;
        let (_, port) = registered().await?;
        let address = host_ip;
        eprintln!("kubelet API moved to {address}:{port}");
        Ok((address, port))
    }
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_reads_tails_and_follows_the_remote_container() -> Result<()> {
    let offloaded = Offloaded::start().await?;
    let provider = offloaded.pair.provider();
    let kubectl_bin = offloaded.kubectl_bin.clone();
    let kubeconfig = offloaded.kubeconfig.clone();
    let kubectl = |args: &[&str]| offloaded.kubectl(args);
    let logs_file = provider.kwok_logs_path();
    append(&logs_file, &["line one", "line two", "line three"])?;

    // All lines, then the last one only.
    let all = kubectl(&["logs", "-n", NS, POD]);
    assert_eq!(all.code, 0, "{all:?}");
    assert_eq!(all.stdout, "line one\nline two\nline three\n", "{all:?}");
    let tail = kubectl(&["logs", "-n", NS, POD, "--tail=1"]);
    assert_eq!(tail.code, 0, "{tail:?}");
    assert_eq!(tail.stdout, "line three\n", "{tail:?}");

    // No previous instance: the kubelet's error, through the API server.
    let previous = kubectl(&["logs", "-n", NS, POD, "--previous"]);
    assert_ne!(previous.code, 0, "{previous:?}");
    assert!(
        previous
            .stderr
            .contains(r#"previous terminated container "logger" in pod "logger" not found"#),
        "{previous:?}"
    );
    // A container the pod does not have: the API server says so itself.
    let missing = kubectl(&["logs", "-n", NS, POD, "-c", "nope"]);
    assert_ne!(missing.code, 0, "{missing:?}");

    // Followed: a line appended later comes through the open stream.
    let mut follow = tokio::process::Command::new(&kubectl_bin)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["logs", "-f", "-n", NS, POD, "--tail=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = tokio::io::BufReader::new(follow.stdout.take().context("stdout")?).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await??;
    assert_eq!(first.as_deref(), Some("line three"));
    append(&logs_file, &["line four"])?;
    let next = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await??;
    assert_eq!(next.as_deref(), Some("line four"));
    follow.kill().await?;
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_exec_runs_in_the_remote_container_with_its_input_and_status() -> Result<()> {
    let offloaded = Offloaded::start().await?;
    let provider = offloaded.pair.provider();
    let kubectl_bin = offloaded.kubectl_bin.clone();
    let kubeconfig = offloaded.kubeconfig.clone();
    let kubectl = |args: &[&str]| offloaded.kubectl(args);

    // kubectl exec: kwok runs the command on this machine, in the
    // provider's folder; the virtual kubelet carries it (SPDY from the
    // API server, the provider's exec behind).
    let echo = kubectl(&[
        "exec",
        "-n",
        NS,
        POD,
        "--",
        "echo",
        "hello from the provider",
    ]);
    assert_eq!(echo.code, 0, "{echo:?}");
    assert_eq!(echo.stdout, "hello from the provider\n", "{echo:?}");
    let folder = kubectl(&["exec", "-n", NS, POD, "--", "pwd"]);
    assert_eq!(
        std::path::Path::new(folder.stdout.trim()),
        std::fs::canonicalize(provider.dir())?,
        "{folder:?}"
    );
    let failed = kubectl(&[
        "exec",
        "-n",
        NS,
        POD,
        "--",
        "sh",
        "-c",
        "echo oops >&2; exit 3",
    ]);
    // The provider's status comes back as it is: kwok's local exec says
    // a failed command with an internal error (a kubelet would say
    // NonZeroExitCode, and kubectl would exit 3).
    assert_ne!(failed.code, 0, "{failed:?}");
    assert!(
        failed.stderr.contains("oops") && failed.stderr.contains("exit status 3"),
        "{failed:?}"
    );
    // Input: a line read by the command (kwok's local exec does not pass
    // the end of input on, so the command must not wait for it).
    let mut read = tokio::process::Command::new(&kubectl_bin)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "exec",
            "-i",
            "-n",
            NS,
            POD,
            "--",
            "sh",
            "-c",
            "read line; echo \"got $line\"",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = read.stdin.take().context("stdin")?;
        stdin.write_all(b"through stdin\n").await?;
        stdin.flush().await?;
        // Held open: kwok would not pass its end on anyway.
        let read = tokio::time::timeout(Duration::from_secs(30), read.wait_with_output())
            .await
            .context("kubectl exec -i did not end")??;
        assert!(read.status.success(), "{read:?}");
        assert_eq!(
            String::from_utf8_lossy(&read.stdout),
            "got through stdin\n",
            "{read:?}"
        );
        drop(stdin);
    }
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_api_refuses_anonymous_callers_and_callers_without_nodes_proxy() -> Result<()> {
    let offloaded = Offloaded::start().await?;
    let consumer = offloaded.pair.consumer();
    let node_name = offloaded.node_name.clone();
    let kubectl = |args: &[&str]| offloaded.kubectl(args);
    let (address, port) = offloaded.move_agent().await?;

    // Straight to the kubelet API: no credentials at all, then a service
    // account without nodes/proxy, then the same once granted it.
    let direct = |token: Option<&str>| -> Result<kube::Client> {
        let mut config = kube::Config::new(format!("https://{address}:{port}").parse()?);
        config.accept_invalid_certs = true;
        if let Some(token) = token {
            // In the cluster's folder, removed with the testbed.
            let path = consumer.dir().join("nobody.token");
            std::fs::write(&path, token)?;
            config.auth_info.token_file = Some(path.display().to_string());
        }
        Ok(kube::Client::try_from(config)?)
    };
    let get_pods = |client: kube::Client| async move {
        let request = http::Request::get("/pods").body(Vec::new())?;
        anyhow::Ok(client.request_text(request).await)
    };
    match get_pods(direct(None)?).await? {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 401, "{s:?}");
            assert_eq!(s.message, "Unauthorized", "{s:?}");
        }
        other => panic!("an anonymous caller got {other:?}"),
    }
    kubectl(&["create", "serviceaccount", "nobody", "-n", NS]).success();
    let token = kubectl(&["create", "token", "nobody", "-n", NS]).success();
    let token = token.stdout.trim().to_owned();
    match get_pods(direct(Some(&token))?).await? {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 403, "{s:?}");
            assert!(
                s.message.contains("user=system:serviceaccount:logs:nobody")
                    && s.message.contains("subresource=proxy"),
                "{s:?}"
            );
        }
        other => panic!("a caller without nodes/proxy got {other:?}"),
    }
    kubectl(&[
        "create",
        "clusterrole",
        "vnode-proxy",
        "--verb=get",
        "--resource=nodes/proxy",
        &format!("--resource-name={node_name}"),
    ])
    .success();
    kubectl(&[
        "create",
        "clusterrolebinding",
        "vnode-proxy",
        "--clusterrole=vnode-proxy",
        &format!("--serviceaccount={NS}:nobody"),
    ])
    .success();
    let granted = direct(Some(&token))?;
    wait_for("the granted token to get /pods", WAIT, || async {
        Ok(get_pods(granted.clone())
            .await?
            .is_ok_and(|body| body.contains("PodList")))
    })
    .await?;
    Ok(())
}
