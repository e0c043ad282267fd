//! The testbed's pod-network mode: two clusters whose host-process nodes
//! give pods real network namespaces. Pods get addresses of their node's
//! pod CIDR and reach each other, a Service's ClusterIP (through the
//! cluster's kube-proxy), the host-network pods in the node namespace and
//! every API server of the machine at its usual URL; the nodes reach each
//! other over the testbed's internet until the link is cut; containers'
//! termination messages are reported; a deleted pod's namespace and veth
//! are gone. Needs root, iproute2, nftables, curl, ping and python3.
//!
//! The pods' "images" are shell scripts in a folder of their own,
//! allow-listed for the test: a web server that says which pod it is, and
//! a one-shot that leaves a termination message or fails.

use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use kube::api::{Api, DeleteParams, PostParams};
use liqo_e2e::fixture;
use liqo_e2e::fixture::pod;
use liqo_e2e::wait_for;
use liqo_testbed::{Cluster, ClusterSpec, HOST_PROCESS_LABEL, HOST_PROCESS_TAINT, Testbed};
use serde_json::json;

const NS: &str = "podnet";
const SERVER_IMAGE: &str = "example.test/podnet-server";
const SAY_IMAGE: &str = "example.test/podnet-say";
const TIMEOUT: Duration = Duration::from_secs(60);

/// Serves its working folder (the pod's folder on the host node) on
/// `$PORT`, with a file `whoami` that names the pod.
const SERVER: &str = r#"#!/bin/bash
echo "$POD_NAME" > whoami
exec python3 -m http.server --bind 0.0.0.0 "${PORT:-8080}"
"#;

/// Leaves `$MESSAGE` as its termination message, if any, says something
/// in its log, and exits with `$CODE`.
const SAY: &str = r#"#!/bin/bash
if [ -n "$MESSAGE" ]; then printf '%s' "$MESSAGE" > /dev/termination-log; fi
echo "first words"
echo "last words"
exit "${CODE:-0}"
"#;

fn spec(name: &str, index: u8, bin_dir: &Path) -> ClusterSpec {
    let mut spec = fixture::spec(name, index, 1);
    spec.agent_bin_dir = Some(bin_dir.to_owned());
    spec.pod_network = true;
    spec.host_images.extend([
        (SERVER_IMAGE.to_owned(), "podnet-server".to_owned()),
        (SAY_IMAGE.to_owned(), "podnet-say".to_owned()),
    ]);
    spec
}

/// A pod of `image` on the host node, with `env`, labelled `app=<name>`.
fn pod(name: &str, image: &str, env: serde_json::Value, extra: serde_json::Value) -> Result<Pod> {
    let mut value = json!({
        "metadata": { "name": name, "labels": { "app": name } },
        "spec": {
            "nodeSelector": { HOST_PROCESS_LABEL: "true" },
            "tolerations": [{
                "key": HOST_PROCESS_TAINT, "operator": "Equal", "value": "true", "effect": "NoSchedule",
            }],
            "containers": [{
                "name": "main",
                "image": image,
                "env": env,
            }],
        },
    });
    merge(&mut value["spec"], extra);
    Ok(serde_json::from_value(value)?)
}

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    match (into, from) {
        (serde_json::Value::Object(into), serde_json::Value::Object(from)) => {
            for (k, v) in from {
                merge(into.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (into, from) => *into = from,
    }
}

/// A web server pod, Ready once the node's HTTP probe reaches it.
fn server(name: &str, port: u16, host_network: bool) -> Result<Pod> {
    let env = json!([
        { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
        { "name": "PORT", "value": port.to_string() },
    ]);
    let mut extra = json!({
        "containers": [{
            "name": "main",
            "image": SERVER_IMAGE,
            "env": env,
            "readinessProbe": {
                "httpGet": { "path": "/whoami", "port": port },
                "periodSeconds": 1,
            },
        }],
    });
    if host_network {
        extra["hostNetwork"] = json!(true);
    }
    pod(name, SERVER_IMAGE, env, extra)
}

/// Waits until the pod is Ready, and returns it.
async fn ready(pods: &Api<Pod>, name: &str) -> Result<Pod> {
    wait_for(&format!("pod {name} to be Ready"), TIMEOUT, || async {
        Ok(pods.get_opt(name).await?.is_some_and(|p| pod::ready(&p)))
    })
    .await?;
    Ok(pods.get(name).await?)
}

fn pod_ip(pod: &Pod) -> Result<Ipv4Addr> {
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
    ip.context("no pod IP")?.parse().context("pod IP")
}

/// Whether IPv4 `cidr` holds `ip`.
fn contains(cidr: &str, ip: Ipv4Addr) -> Result<bool> {
    let (net, prefix) = cidr.split_once('/').context("not a CIDR")?;
    let (net, prefix): (Ipv4Addr, u32) = (net.parse()?, prefix.parse()?);
    let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
    Ok(u32::from(ip) & mask == u32::from(net) & mask)
}

fn pid(pod: &Pod) -> Result<u32> {
    let id = (pod.status.as_ref())
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .and_then(|c| c.container_id.as_deref())
        .context("no container id")?;
    Ok(id
        .strip_prefix("hostprocess://")
        .context(id.to_owned())?
        .parse()?)
}

/// Whether process `pid` runs in the named network namespace.
fn runs_in(pid: u32, netns: &str) -> Result<bool> {
    let process = std::fs::metadata(format!("/proc/{pid}/ns/net"))?;
    let named = std::fs::metadata(Path::new("/run/netns").join(netns))?;
    Ok(process.ino() == named.ino() && process.dev() == named.dev())
}

/// What `curl` fetched from `url` inside namespace `netns`, if it could.
fn fetch(netns: &str, url: &str) -> Option<String> {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            netns,
            "curl",
            "-sfk",
            "--max-time",
            "3",
            url,
        ])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Waits until `url`, fetched from `netns`, answers `want`.
async fn fetches(netns: &str, url: &str, want: &str) -> Result<()> {
    let mut last = None;
    let got = wait_for(&format!("{url} from {netns}"), TIMEOUT, || {
        last = fetch(netns, url);
        let ok = last.as_deref() == Some(want);
        async move { Ok(ok) }
    })
    .await;
    got.with_context(|| format!("last answer: {last:?}, want {want:?}"))
}

/// Whether the node of `from` gets an answer to one ping of `to`.
fn pings(from: &Cluster, to: Ipv4Addr) -> Result<bool> {
    let mut cmd = from.node_command("ping").context("no node namespace")?;
    let out = cmd.args(["-c", "1", "-W", "1", &to.to_string()]).output()?;
    Ok(out.status.success())
}

fn terminated_message(pod: &Pod) -> Option<(i32, Option<String>)> {
    let status = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let terminated = status.state.as_ref()?.terminated.as_ref()?;
    Some((terminated.exit_code, terminated.message.clone()))
}

async fn terminated(pods: &Api<Pod>, name: &str) -> Result<(i32, Option<String>)> {
    wait_for(&format!("pod {name} to terminate"), TIMEOUT, || async {
        Ok(pods
            .get_opt(name)
            .await?
            .is_some_and(|p| terminated_message(&p).is_some()))
    })
    .await?;
    terminated_message(&pods.get(name).await?).context("not terminated")
}

/// A pid that no process has.
fn dead_pid() -> Result<u32> {
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")?
        .trim()
        .parse()?;
    (1..max)
        .rev()
        .find(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        .context("every pid is taken")
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_get_namespaces_addresses_services_and_an_internet() -> Result<()> {
    let bin =
        liqo_e2e::ScriptDir::new("podnet", &[("podnet-server", SERVER), ("podnet-say", SAY)])?;
    // What a testbed killed with SIGKILL would leave: the next one deletes
    // it. (Our pid in place of a port: two runs of this test at once.)
    let stale = format!("lqtb-{}-{}-node", dead_pid()?, std::process::id());
    liqo_e2e::netns::ip(&["netns", "add", &stale])?;
    let testbed = fixture::start(vec![spec("a", 1, &bin.0), spec("b", 2, &bin.0)]).await?;
    let left = Path::new("/run/netns").join(&stale).exists();
    if left {
        let _ = liqo_e2e::netns::ip(&["netns", "del", &stale]);
    }
    ensure!(!left, "{stale} was left");
    let result = exercise(&testbed).await;
    if result.is_err() {
        for cluster in testbed.clusters() {
            eprintln!("--- {} pods ---\n{}", cluster.name(), cluster.pod_logs());
            let log = cluster.dir().join("logs").join("kube-proxy.log");
            eprintln!(
                "--- {} kube-proxy ---\n{}",
                cluster.name(),
                liqo_testbed::tail(&log, 40)
            );
        }
    }
    result
}

async fn exercise(testbed: &Testbed) -> Result<()> {
    let a = testbed.cluster("a");
    let b = testbed.cluster("b");
    let client = a.client().await?;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": NS } }))?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let post = PostParams::default();

    // The nodes: on the internet at 192.168.100.<place>, their InternalIP.
    let node_a = a.node_address().context("a has no node address")?;
    let node_b = b.node_address().context("b has no node address")?;
    assert_eq!(node_a, Ipv4Addr::new(192, 168, 100, 1));
    assert_eq!(node_b, Ipv4Addr::new(192, 168, 100, 2));
    let host = a.host_node_name().context("no host node")?;
    let node = Api::<Node>::all(client.clone()).get(host).await?;
    let internal = (node.status.as_ref())
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address.clone());
    assert_eq!(internal, Some(node_a.to_string()));
    let pod_cidr = (node.spec.as_ref())
        .and_then(|s| s.pod_cidr.clone())
        .context("no pod CIDR")?;

    // Pods: an address of the node's pod CIDR, a namespace of their own,
    // Ready through the node's HTTP probe of that address.
    for name in ["server-1", "server-2"] {
        pods.create(&post, &server(name, 8080, false)?).await?;
    }
    pods.create(&post, &server("host-server", 8081, true)?)
        .await?;
    let one = ready(&pods, "server-1").await?;
    let two = ready(&pods, "server-2").await?;
    let (ip1, ip2) = (pod_ip(&one)?, pod_ip(&two)?);
    for (pod, ip) in [(&one, ip1), (&two, ip2)] {
        ensure!(contains(&pod_cidr, ip)?, "{ip} is not in {pod_cidr}");
        let netns = a.pod_netns(ip).context("no pod namespace")?;
        ensure!(runs_in(pid(pod)?, &netns)?, "{ip} does not run in {netns}");
        let host_ip = pod.status.as_ref().and_then(|s| s.host_ip.clone());
        assert_eq!(host_ip, Some(node_a.to_string()));
    }
    let ns2 = a.pod_netns(ip2).context("no pod namespace")?;

    // Pod to pod.
    fetches(&ns2, &format!("http://{ip1}:8080/whoami"), "server-1").await?;

    // A host-network pod: in the node namespace, at the node's address.
    let host_pod = ready(&pods, "host-server").await?;
    assert_eq!(pod_ip(&host_pod)?, node_a);
    let node_netns = a.node_netns().context("no node namespace")?;
    ensure!(runs_in(pid(&host_pod)?, node_netns)?, "not in {node_netns}");
    fetches(&ns2, &format!("http://{node_a}:8081/whoami"), "host-server").await?;

    // Pod to a Service's ClusterIP, whose endpoint is server-1: kube-proxy.
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let service = services
        .create(
            &post,
            &serde_json::from_value(json!({
                "metadata": { "name": "web" },
                "spec": {
                    "selector": { "app": "server-1" },
                    "ports": [{ "port": 80, "targetPort": 8080 }],
                },
            }))?,
        )
        .await?;
    let cluster_ip = service
        .spec
        .and_then(|s| s.cluster_ip)
        .context("no ClusterIP")?;
    fetches(&ns2, &format!("http://{cluster_ip}/whoami"), "server-1").await?;
    // And to itself through its own Service (the packet comes back on the
    // veth it left by).
    let ns1 = a.pod_netns(ip1).context("no pod namespace")?;
    fetches(&ns1, &format!("http://{cluster_ip}/whoami"), "server-1").await?;

    // Every API server of the machine, at its usual URL, from a pod.
    for cluster in [a, b] {
        let version = fetch(&ns2, &format!("{}/version", cluster.server()))
            .with_context(|| format!("{} from a pod", cluster.server()))?;
        ensure!(version.contains("gitVersion"), "{version}");
    }

    // The internet: node a reaches node b, not while its link is cut.
    wait_for("node a to reach node b", TIMEOUT, || async {
        pings(a, node_b)
    })
    .await?;
    a.set_internet_link(false)?;
    ensure!(!pings(a, node_b)?, "reached node b with the link cut");
    ensure!(
        !pings(b, node_a)?,
        "node b reached node a with its link cut"
    );
    a.set_internet_link(true)?;
    wait_for("node a to reach node b again", TIMEOUT, || async {
        pings(a, node_b)
    })
    .await?;
    // Pods keep their node while it is cut off.
    a.set_internet_link(false)?;
    fetches(&ns2, &format!("http://{ip1}:8080/whoami"), "server-1").await?;
    a.set_internet_link(true)?;

    // Termination messages: the file, or the log of a failure.
    let once = json!({ "restartPolicy": "Never" });
    pods.create(
        &post,
        &pod(
            "says-bye",
            SAY_IMAGE,
            json!([{ "name": "MESSAGE", "value": "bye" }]),
            once.clone(),
        )?,
    )
    .await?;
    let mut fails = once.clone();
    fails["containers"] = json!([{
        "name": "main",
        "image": SAY_IMAGE,
        "env": [{ "name": "CODE", "value": "3" }],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }]);
    pods.create(&post, &pod("fails", SAY_IMAGE, json!([]), fails)?)
        .await?;
    let mut quiet = once.clone();
    quiet["containers"] = json!([{
        "name": "main",
        "image": SAY_IMAGE,
        "env": [{ "name": "CODE", "value": "3" }],
    }]);
    pods.create(&post, &pod("fails-quietly", SAY_IMAGE, json!([]), quiet)?)
        .await?;
    assert_eq!(
        terminated(&pods, "says-bye").await?,
        (0, Some("bye".to_owned()))
    );
    assert_eq!(
        terminated(&pods, "fails").await?,
        (3, Some("first words\nlast words\n".to_owned()))
    );
    assert_eq!(terminated(&pods, "fails-quietly").await?, (3, None));

    // A deleted pod's namespace and veth go with it.
    let veth = a.pod_veth(ip2).context("no veth")?;
    let has_veth = || {
        Command::new("ip")
            .args(["-n", node_netns, "link", "show", &veth])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    ensure!(has_veth(), "no veth {veth} in {node_netns}");
    pods.delete("server-2", &DeleteParams::default()).await?;
    wait_for("server-2 to be gone", TIMEOUT, || async {
        Ok(pods.get_opt("server-2").await?.is_none())
    })
    .await?;
    ensure!(
        !Path::new("/run/netns").join(&ns2).exists(),
        "{ns2} outlived its pod"
    );
    ensure!(!has_veth(), "{veth} outlived its pod");
    Ok(())
}
