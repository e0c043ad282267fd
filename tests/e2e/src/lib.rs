//! Helpers for the end-to-end tests in `tests/`: running the workspace's
//! binaries, built current first, as a user would, and waiting on cluster
//! state.

pub mod fixture;
pub mod netns;
mod probe;
pub mod refusal;

pub use probe::least_privilege_probe;

pub use liqo_e2e_macros::test;
pub use liqo_testbed::failure;

/// Whether a test's outcome is a failure, as `#[liqo_e2e::test]` reads it
/// (a panic is seen on its own).
pub trait Outcome {
    fn failed(&self) -> bool;
}

impl Outcome for () {
    fn failed(&self) -> bool {
        false
    }
}

impl<T, E> Outcome for Result<T, E> {
    fn failed(&self) -> bool {
        self.is_err()
    }
}

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The folder of the workspace's binaries (`target/debug`), current: the
/// first call in a test process runs `cargo build --workspace --bins
/// --locked` (see [`liqo_testbed::built_bin_dir`]), so a test never runs a
/// binary older than the sources.
///
/// # Panics
/// If the build fails; the compiler's errors are on stderr.
pub fn bin_dir() -> PathBuf {
    liqo_testbed::built_bin_dir().unwrap_or_else(|e| panic!("{e}"))
}

/// The result of running a command: its exit code and output as text.
#[derive(Debug)]
pub struct Run {
    /// The command line, as failures print it.
    pub command: String,
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub(crate) fn from(command: String, output: Output) -> Self {
        Self {
            command,
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Panics with the output unless the command exited 0.
    #[track_caller]
    pub fn success(self) -> Self {
        assert_eq!(
            self.code, 0,
            "command failed: {}\nstdout:\n{}\nstderr:\n{}",
            self.command, self.stdout, self.stderr
        );
        self
    }

    /// Panics with the output unless the command exited `code`, printing
    /// exactly one line on stderr that starts with `error: `.
    #[track_caller]
    pub fn user_error(self, code: i32) -> Self {
        assert_eq!(
            self.code, code,
            "wrong exit code: {}\nstdout:\n{}\nstderr:\n{}",
            self.command, self.stdout, self.stderr
        );
        let errors: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| l.starts_with("error: "))
            .collect();
        assert_eq!(
            errors.len(),
            1,
            "expected one error line, stderr:\n{}",
            self.stderr
        );
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
        self
    }

    /// The one `error: ` line.
    pub fn error_line(&self) -> &str {
        self.stderr
            .lines()
            .find(|l| l.starts_with("error: "))
            .unwrap_or_default()
    }
}

/// `liqoctl` from this build, run against `kubeconfig` (when given) with a
/// clean environment: no KUBECONFIG or HOME of the machine leaks in.
pub fn liqoctl(kubeconfig: Option<&Path>, args: &[&str]) -> Run {
    let mut cmd = Command::new(bin_dir().join("liqoctl"));
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", "/nonexistent");
    if let Some(kubeconfig) = kubeconfig {
        cmd.arg("--kubeconfig").arg(kubeconfig);
    }
    cmd.args(args);
    Run::from(
        command_line(&cmd),
        cmd.output()
            .expect("invariant: bin_dir() has just built liqoctl"),
    )
}

/// The [`Run`] of a finished process's output; `command` says what ran.
pub fn run_output(command: &str, output: Output) -> Run {
    Run::from(command.to_owned(), output)
}

/// Runs any command, capturing its output.
pub fn run(cmd: &mut Command) -> Run {
    Run::from(command_line(cmd), cmd.output().expect("the command runs"))
}

/// A command's program and arguments, as a shell would show them.
pub(crate) fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Polls `check` until it is true; fails after `timeout`.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await? {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the virtual node of provider `provider_id` on the
/// consumer (`client`) is Ready; fails after `timeout`.
pub async fn virtual_node_ready(
    client: &kube::Client,
    provider_id: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let name = liqo_api::names::peering::virtual_node(&liqo_api::ClusterId::new(provider_id)?);
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    wait_for("the virtual node to be Ready", timeout, || async {
        Ok(nodes
            .get_opt(&name)
            .await?
            .and_then(|n| n.status?.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")))
    })
    .await
}

/// The node selector that puts a pod on a virtual node by hand (not by the
/// placement policy): with [`virtual_node_tolerations`], in a pod spec.
pub fn virtual_node_selector() -> serde_json::Value {
    serde_json::json!({ liqo_api::names::labels::VIRTUAL_NODE: "true" })
}

/// The toleration of the virtual nodes' taint.
pub fn virtual_node_tolerations() -> serde_json::Value {
    serde_json::json!([{
        "key": liqo_api::names::VIRTUAL_NODE_TAINT,
        "operator": "Exists",
        "effect": "NoExecute",
    }])
}

/// An agent the host-process node runs as a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    /// One per outgoing peering.
    VirtualKubelet,
    Gateway,
}

impl Agent {
    fn prefix(self) -> &'static str {
        match self {
            Self::VirtualKubelet => "liqo-virtual",
            Self::Gateway => "liqo-gateway",
        }
    }
}

/// The processes of `agent` the host-process node of `cluster` runs: the
/// agents themselves, not the processes they start (the gateway runs
/// each tunnel in a process of its own binary).
pub fn agents(cluster: &liqo_testbed::Cluster, agent: Agent) -> Vec<liqo_testbed::ProcessInfo> {
    let all: Vec<liqo_testbed::ProcessInfo> = liqo_testbed::agent_processes(cluster.dir())
        .into_iter()
        .filter(|p| p.name.starts_with(agent.prefix()))
        .collect();
    let parent = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid ...`; comm may hold spaces.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    all.iter()
        .filter(|p| parent(p.pid).is_none_or(|pp| !all.iter().any(|o| o.pid == pp)))
        .cloned()
        .collect()
}

/// Kills the one `agent` of `cluster` with SIGKILL, as a crash would
/// (nothing flushed, nothing said); its pid.
pub fn kill_agent(cluster: &liqo_testbed::Cluster, agent: Agent) -> anyhow::Result<u32> {
    let running = agents(cluster, agent);
    anyhow::ensure!(running.len() == 1, "not one {agent:?}: {running:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(running[0].pid)?),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    Ok(running[0].pid)
}

/// Waits until the host-process node has started the `agent` killed at
/// `pid` again: one of it, of another pid.
pub async fn agent_restarted(
    cluster: &liqo_testbed::Cluster,
    agent: Agent,
    pid: u32,
    timeout: Duration,
) -> anyhow::Result<()> {
    wait_for(
        &format!("the host node to restart the {agent:?}"),
        timeout,
        || async {
            let now = agents(cluster, agent);
            Ok(now.len() == 1 && now[0].pid != pid)
        },
    )
    .await
}

/// The kubeconfig the peering with provider `provider_id` keeps in the
/// consumer's (`local`) Secret `liqo/liqo-identity-<provider>`.
pub async fn identity_kubeconfig(
    local: &kube::Client,
    provider_id: &str,
) -> anyhow::Result<Vec<u8>> {
    use anyhow::Context as _;
    let provider = liqo_api::ClusterId::new(provider_id)?;
    let secret: k8s_openapi::api::core::v1::Secret =
        kube::Api::namespaced(local.clone(), liqo_api::names::NAMESPACE)
            .get(&liqo_api::names::peering::identity_secret(&provider))
            .await?;
    Ok(secret
        .data
        .and_then(|d| d.get("kubeconfig").cloned())
        .context("no kubeconfig in the identity secret")?
        .0)
}

/// A client that acts on provider `provider_id` as the consumer
/// (`consumer`, reached with `local`) is known there: its
/// [`identity_kubeconfig`], written into the cluster's folder.
pub async fn peer_client(
    consumer: &liqo_testbed::Cluster,
    local: &kube::Client,
    provider_id: &str,
) -> anyhow::Result<kube::Client> {
    let kubeconfig = identity_kubeconfig(local, provider_id).await?;
    let identity_file = consumer.dir().join("peer-identity.kubeconfig");
    std::fs::write(&identity_file, &kubeconfig)?;
    Ok(liqo_testbed::client_from_kubeconfig(&identity_file).await?)
}

/// This machine's first global IPv4 address: where a test moves an agent's
/// server that the API server must reach, since the testbed's pod IPs are
/// loopback addresses (docs/testbed.md); local delivery, nothing leaves
/// the host.
pub fn host_address() -> anyhow::Result<String> {
    use anyhow::Context as _;
    let out = run(Command::new("hostname").arg("-I")).success();
    out.stdout
        .split_whitespace()
        .filter_map(|a| a.parse::<std::net::Ipv4Addr>().ok())
        .find(|ip| !ip.is_loopback() && !ip.is_link_local() && !ip.is_unspecified())
        .map(|ip| ip.to_string())
        .context("this machine has no global IPv4 address")
}

/// Rewrites the args of the virtual kubelet of provider `provider_id`
/// on the consumer (`local`): each arg through `change`, then `extra`
/// appended. Its Deployment rolls the agent.
pub async fn set_agent_args(
    local: &kube::Client,
    provider_id: &str,
    change: impl Fn(String) -> String,
    extra: &[String],
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use k8s_openapi::api::apps::v1::Deployment;
    let deployments: kube::Api<Deployment> =
        kube::Api::namespaced(local.clone(), liqo_api::names::NAMESPACE);
    let name = liqo_api::names::peering::virtual_kubelet(&liqo_api::ClusterId::new(provider_id)?);
    let args: Vec<String> = deployments
        .get(&name)
        .await?
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.args)
        .context("the agent's args")?
        .into_iter()
        .map(change)
        .chain(extra.iter().cloned())
        .collect();
    let patch = serde_json::json!([
        { "op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args },
    ]);
    deployments
        .patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::<()>::Json(serde_json::from_value(patch)?),
        )
        .await?;
    Ok(())
}

/// Whether a process is running: it exists and is not a zombie.
pub fn process_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// Every object of a cluster, as `plural/namespace/name`, but what the
/// cluster churns by itself (events, leases, endpoints, the CSRs of its
/// own nodes): compared before and after a command, it shows what the
/// command left behind.
pub async fn snapshot(client: &kube::Client) -> anyhow::Result<BTreeSet<String>> {
    use kube::api::{Api, DynamicObject, ListParams};
    use kube::discovery::{Discovery, verbs};
    const CHURN: [&str; 4] = ["events", "leases", "endpointslices", "endpoints"];
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut out = BTreeSet::new();
    for group in discovery.groups() {
        for (resource, caps) in group.recommended_resources() {
            if !caps.supports_operation(verbs::LIST) || CHURN.contains(&resource.plural.as_str()) {
                continue;
            }
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let Ok(list) = api.list(&ListParams::default()).await else {
                continue;
            };
            for o in list.items {
                let name = o.metadata.name.clone().unwrap_or_default();
                if resource.plural == "certificatesigningrequests" && name.starts_with("csr-") {
                    continue;
                }
                out.insert(format!(
                    "{}/{}/{}",
                    resource.plural,
                    o.metadata.namespace.unwrap_or_default(),
                    name
                ));
            }
        }
    }
    Ok(out)
}

/// `liqoctl install` on a testbed cluster with the given cluster ID and pod
/// CIDR (and its name as the cluster name), the agents pinned to the
/// host-process node that runs them; `extra` flags are added.
pub fn install(cluster: &liqo_testbed::Cluster, id: &str, pod_cidr: &str, extra: &[&str]) -> Run {
    let selector = format!("--node-selector={}=true", liqo_testbed::HOST_PROCESS_LABEL);
    let toleration = format!(
        "--toleration={}=true:NoSchedule",
        liqo_testbed::HOST_PROCESS_TAINT
    );
    let id = format!("--cluster-id={id}");
    let name = format!("--cluster-name={}", cluster.name());
    let cidr = format!("--pod-cidr={pod_cidr}");
    let mut args = vec![
        "install",
        &id,
        &name,
        &cidr,
        &selector,
        &toleration,
        "--timeout=60",
    ];
    args.extend_from_slice(extra);
    liqoctl(Some(cluster.kubeconfig_path()), &args)
}

/// Installs liqo-rs on `consumer` (ID `consumer-1`, pods 10.201.0.0/16)
/// and `provider` (`provider-1`, 10.202.0.0/16), and peers them with
/// `liqoctl peer --remote-kubeconfig` run on the consumer, which returns
/// once the virtual node and its agent are ready.
pub fn install_and_peer(
    consumer: &liqo_testbed::Cluster,
    provider: &liqo_testbed::Cluster,
) -> anyhow::Result<()> {
    for (cluster, id, cidr) in [
        (consumer, "consumer-1", "10.201.0.0/16"),
        (provider, "provider-1", "10.202.0.0/16"),
    ] {
        install(cluster, id, cidr, &[]).success();
    }
    let remote = provider
        .kubeconfig_path()
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("the provider's kubeconfig path is not UTF-8"))?;
    liqoctl(
        Some(consumer.kubeconfig_path()),
        &["peer", "--remote-kubeconfig", remote],
    )
    .success();
    Ok(())
}

/// A folder of executable scripts that stand for the "binaries" of
/// test-only images on the host-process node; removed when dropped.
#[derive(Debug)]
pub struct ScriptDir(pub PathBuf);

impl ScriptDir {
    /// `label` names the folder (with this process's ID); `scripts` are
    /// file name and content, each made executable.
    pub fn new(label: &str, scripts: &[(&str, &str)]) -> anyhow::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("liqo-{label}-bin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        for (name, script) in scripts {
            let path = dir.join(name);
            std::fs::write(&path, script)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
        Ok(Self(dir))
    }
}

impl Drop for ScriptDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `object` (JSON of a Pod, or of anything holding pod templates: a
/// Deployment, a Job) with every pod spec in it made to pass the Pod
/// Security `restricted` level, the strictest a provider gives its peers:
/// not root, no privilege escalation, no capabilities, the runtime's
/// seccomp profile; and every container stating the local disk limit a
/// provider asks of what a peer writes (1Gi, no request). Fields the
/// object sets itself are kept.
pub fn restricted(mut object: serde_json::Value) -> serde_json::Value {
    use serde_json::json;
    fn harden(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                if map.get("containers").is_some_and(|c| c.is_array()) {
                    let pod = map.entry("securityContext").or_insert_with(|| json!({}));
                    for (k, v) in [
                        ("runAsNonRoot", json!(true)),
                        ("runAsUser", json!(65534)),
                        ("seccompProfile", json!({ "type": "RuntimeDefault" })),
                    ] {
                        pod.as_object_mut().map(|p| p.entry(k).or_insert(v));
                    }
                    for list in ["containers", "initContainers"] {
                        for c in map
                            .get_mut(list)
                            .and_then(|c| c.as_array_mut())
                            .into_iter()
                            .flatten()
                        {
                            let sc = c
                                .as_object_mut()
                                .map(|c| c.entry("securityContext").or_insert_with(|| json!({})));
                            if let Some(sc) = sc.and_then(|s| s.as_object_mut()) {
                                sc.entry("allowPrivilegeEscalation").or_insert(json!(false));
                                sc.entry("capabilities")
                                    .or_insert(json!({ "drop": ["ALL"] }));
                            }
                            // The local disk a provider's terms ask every
                            // container a peer writes to state.
                            let resources = c
                                .as_object_mut()
                                .map(|c| c.entry("resources").or_insert_with(|| json!({})));
                            if let Some(r) = resources.and_then(|r| r.as_object_mut()) {
                                for (k, v) in [("limits", "1Gi"), ("requests", "0")] {
                                    let list = r.entry(k).or_insert_with(|| json!({}));
                                    list.as_object_mut()
                                        .map(|l| l.entry("ephemeral-storage").or_insert(json!(v)));
                                }
                            }
                        }
                    }
                    return;
                }
                for v in map.values_mut() {
                    harden(v);
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(harden),
            _ => {}
        }
    }
    harden(&mut object);
    object
}
