//! The host-process node runs the pods of allow-listed agent images as real
//! local processes: with the pod's environment, volumes and a pod-bound
//! token of its service account, Ready only once its readiness probe
//! (HTTP or exec) passes, restarted when killed or unhealthy, stopped and
//! removed when deleted; nothing outlives the cluster. It fails where a
//! kubelet fails: other images do not pull, pods that do not tolerate its
//! taint do not land on it, a missing Secret stops a container, a grpc probe
//! never passes (see [`crate::hostnode_failures`]).
//!
//! The "agent" is a shell script in a folder of its own, standing for the
//! freshly built agent binaries, allow-listed as image [`AGENT_IMAGE`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, ContainerStatus, Event, Namespace, Node, Pod, Secret, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use liqo_e2e::fixture::pod::ready;
use liqo_e2e::fixture::{One, spec};
use liqo_e2e::{process_running, wait_for};
use liqo_testbed::{Cluster, HOST_PROCESS_LABEL, HOST_PROCESS_TAINT, KWOK_ANNOTATION};
use serde_json::json;

use crate::hostnode_failures::fails_like_a_kubelet;

const NS: &str = "agents";
const ACCOUNT: &str = "test-agent";
/// The stand-in agent's image repository, allow-listed for the test.
pub(crate) const AGENT_IMAGE: &str = "example.test/test-agent";

/// Stands for an agent: says who it is, how it was called and with what
/// environment, waits for the test's go-ahead, then answers HTTP (its
/// readiness probe) on its pod IP.
const AGENT: &str = r#"#!/bin/bash
echo "pod=$POD_NAME namespace=$POD_NAMESPACE ip=$POD_IP args=$*"
env | sed 's/^/env: /'
until [ -e "$GATE" ]; do sleep 0.2; done
echo "serving ${SERVE_DIR:-.} on $POD_IP:8080"
exec python3 -m http.server --bind "$POD_IP" --directory "${SERVE_DIR:-.}" 8080
"#;

/// The environment the agent printed when it first started, from the log
/// of `pod`'s container. (Not `/proc/<pid>/environ`: the `python3` the agent
/// execs may be a shim that adds to its environment.)
fn agent_env(cluster: &Cluster, pod: &str) -> Result<BTreeMap<String, String>> {
    let log = cluster
        .dir()
        .join("pods")
        .join(format!("{NS}_{pod}_agent.log"));
    let text = std::fs::read_to_string(&log).with_context(|| format!("{}", log.display()))?;
    let mut env = BTreeMap::new();
    for line in text.lines() {
        let Some((key, value)) = line.strip_prefix("env: ").and_then(|l| l.split_once('=')) else {
            continue;
        };
        // The first start's, not a restart's.
        env.entry(key.to_owned())
            .or_insert_with(|| value.to_owned());
    }
    Ok(env)
}

pub(crate) fn container(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.first()
}

pub(crate) fn pid(status: &ContainerStatus) -> Option<u32> {
    status
        .container_id
        .as_deref()?
        .strip_prefix("hostprocess://")?
        .parse()
        .ok()
}

pub(crate) fn pod_ip(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.pod_ip.as_deref()
}

/// The pod of the agent Deployment, once there is one that is not going away.
async fn agent_pod(pods: &Api<Pod>) -> Result<Option<Pod>> {
    let list = pods
        .list(&ListParams::default().labels("app=test-agent"))
        .await?;
    Ok(list
        .items
        .into_iter()
        .find(|p| p.metadata.deletion_timestamp.is_none()))
}

pub(crate) async fn create<K>(api: &Api<K>, value: serde_json::Value) -> Result<K>
where
    K: kube::Resource + Clone + std::fmt::Debug,
    K: k8s_openapi::serde::de::DeserializeOwned + k8s_openapi::serde::Serialize,
{
    Ok(api
        .create(&PostParams::default(), &serde_json::from_value(value)?)
        .await?)
}

/// What a pod needs to land on the host node: to select it and to tolerate
/// its taint.
pub(crate) fn on_host_node() -> serde_json::Value {
    json!({
        "nodeSelector": { HOST_PROCESS_LABEL: "true" },
        "tolerations": [{
            "key": HOST_PROCESS_TAINT, "operator": "Equal", "value": "true", "effect": "NoSchedule",
        }],
    })
}

/// The host node is a Node like a kubelet's: labelled, not kwok's, Ready
/// with its capacity and a pod CIDR, heart-beating through its Lease.
async fn host_node_is_registered(cluster: &Cluster) -> Result<()> {
    let client = cluster.client().await?;
    let name = cluster.host_node_name().context("no host node")?;
    assert_eq!(name, format!("{}-host", cluster.name()));
    let node = Api::<Node>::all(client.clone()).get(name).await?;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get(HOST_PROCESS_LABEL).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        labels.get("kubernetes.io/hostname").map(String::as_str),
        Some(name)
    );
    assert_eq!(
        labels.get("kubernetes.io/os").map(String::as_str),
        Some("linux")
    );
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    assert!(
        !annotations.contains_key(KWOK_ANNOTATION),
        "kwok must not manage it"
    );
    let spec = node.spec.context("node without spec")?;
    let taints = spec.taints.clone().unwrap_or_default();
    assert!(
        taints.iter().any(|t| t.key == HOST_PROCESS_TAINT
            && t.value.as_deref() == Some("true")
            && t.effect == "NoSchedule"),
        "not tainted: {taints:?}"
    );
    assert!(
        spec.pod_cidr.is_some(),
        "the controller-manager gives it a pod CIDR"
    );
    let status = node.status.context("node without status")?;
    let capacity = status.capacity.context("no capacity")?;
    assert_eq!(capacity.get("cpu").map(|q| q.0.as_str()), Some("8"));
    assert_eq!(capacity.get("memory").map(|q| q.0.as_str()), Some("16Gi"));
    assert_eq!(capacity.get("pods").map(|q| q.0.as_str()), Some("110"));
    let ready = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .context("no Ready condition")?;
    assert_eq!(ready.status, "True");
    let addresses = status.addresses.unwrap_or_default();
    // The node's own address: `.1` of the cluster's loopback /24.
    assert!(
        addresses.iter().any(|a| a.type_ == "InternalIP"
            && a.address.starts_with("127.")
            && a.address.ends_with(".1")
            && a.address != "127.0.0.1"),
        "{addresses:?}"
    );
    let lease = Api::<Lease>::namespaced(client, "kube-node-lease")
        .get(name)
        .await?;
    let lease = lease.spec.context("lease without spec")?;
    assert_eq!(lease.holder_identity.as_deref(), Some(name));
    assert_eq!(lease.lease_duration_seconds, Some(40));
    Ok(())
}

/// The reason a pod's first container waits, if it does.
pub(crate) fn waiting_reason(pod: &Pod) -> Option<(String, String)> {
    let waiting = container(pod)?.state.as_ref()?.waiting.as_ref()?;
    Some((
        waiting.reason.clone().unwrap_or_default(),
        waiting.message.clone().unwrap_or_default(),
    ))
}

/// `reason: message` of the events of pod `name`.
pub(crate) async fn events(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Vec<String>> {
    let list = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect())
}

/// The body of `GET path` from `ip:8080` (the stand-in agent's server).
pub(crate) fn http_get(ip: &str, path: &str) -> Result<String> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect((ip, 8080))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let (head, body) = answer.split_once("\r\n\r\n").context("no HTTP answer")?;
    ensure!(head.starts_with("HTTP/1.0 200"), "GET {path}: {head}");
    Ok(body.to_owned())
}

/// Waits until `check` holds of pod `name`, and returns the pod.
pub(crate) async fn wait_pod(
    pods: &Api<Pod>,
    name: &str,
    what: &str,
    check: impl Fn(&Pod) -> bool,
) -> Result<Pod> {
    let check = &check;
    wait_for(what, Duration::from_secs(30), || {
        let pods = pods.clone();
        async move { Ok(pods.get_opt(name).await?.as_ref().is_some_and(check)) }
    })
    .await?;
    Ok(pods.get(name).await?)
}

/// Everything about the agent pod; returns the pids of agent processes
/// still meant to be running (to check that stopping the cluster ends them).
async fn agent_lifecycle(cluster: &Cluster, gate: &Path) -> Result<Vec<u32>> {
    let client = cluster.client().await?;
    create(
        &Api::<Namespace>::all(client.clone()),
        json!({ "metadata": { "name": NS } }),
    )
    .await?;
    create(
        &Api::<ServiceAccount>::namespaced(client.clone(), NS),
        json!({ "metadata": { "name": ACCOUNT } }),
    )
    .await?;
    create(
        &Api::<ConfigMap>::namespaced(client.clone(), NS),
        json!({ "metadata": { "name": "agent-config" }, "data": { "greeting": "hello" } }),
    )
    .await?;
    create(
        &Api::<Secret>::namespaced(client.clone(), NS),
        json!({ "metadata": { "name": "agent-secret" }, "stringData": { "word": "swordfish" } }),
    )
    .await?;
    // The agent may read ConfigMaps, nothing else.
    create(
        &Api::<Role>::namespaced(client.clone(), NS),
        json!({
            "metadata": { "name": "config-reader" },
            "rules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"] }],
        }),
    )
    .await?;
    create(
        &Api::<RoleBinding>::namespaced(client.clone(), NS),
        json!({
            "metadata": { "name": "config-reader" },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "config-reader" },
            "subjects": [{ "kind": "ServiceAccount", "name": ACCOUNT, "namespace": NS }],
        }),
    )
    .await?;

    let mut pod_spec = on_host_node();
    pod_spec["serviceAccountName"] = json!(ACCOUNT);
    pod_spec["terminationGracePeriodSeconds"] = json!(5);
    pod_spec["containers"] = json!([{
        "name": "agent",
        "image": format!("{AGENT_IMAGE}:1"),
        "args": ["--greeting=$(GREETING)", "--escaped=$$(GREETING)", "--unknown=$(NOPE)"],
        "ports": [{ "name": "http", "containerPort": 8080 }],
        "env": [
            { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
            { "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
            { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
            { "name": "GATE", "value": gate.display().to_string() },
            { "name": "GREETING", "valueFrom": { "configMapKeyRef": { "name": "agent-config", "key": "greeting" } } },
            { "name": "WORD", "valueFrom": { "secretKeyRef": { "name": "agent-secret", "key": "word" } } },
        ],
        "readinessProbe": {
            "httpGet": { "path": "/", "port": "http" },
            "periodSeconds": 1,
            "failureThreshold": 1,
        },
    }]);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    create(
        &deployments,
        json!({
            "metadata": { "name": "test-agent" },
            "spec": {
                "replicas": 1,
                "selector": { "matchLabels": { "app": "test-agent" } },
                "template": { "metadata": { "labels": { "app": "test-agent" } }, "spec": pod_spec },
            },
        }),
    )
    .await?;

    // It runs as a process of the host node, with a loopback pod IP of its own...
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    wait_for("the agent process", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let pod = agent_pod(&pods).await?;
            Ok(pod.as_ref().and_then(container).and_then(pid).is_some())
        }
    })
    .await?;
    let pod = agent_pod(&pods).await?.context("the agent pod went away")?;
    let pod_name = pod.metadata.name.clone().context("nameless pod")?;
    let status = container(&pod).context("no container status")?;
    let first_pid = pid(status).context("no pid")?;
    assert!(process_running(first_pid), "pid {first_pid} is not running");
    assert_eq!(status.started, Some(true));
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        cluster.host_node_name()
    );
    let ip = pod_ip(&pod).context("no pod IP")?.to_owned();
    let octets: Vec<u8> = ip.split('.').map(str::parse).collect::<Result<_, _>>()?;
    assert!(
        octets.len() == 4 && octets[0] == 127 && octets[1] != 0,
        "pod IP {ip} is not a loopback address of its own"
    );
    let node_ip = format!("{}.{}.{}.1", octets[0], octets[1], octets[2]);
    assert_eq!(
        pod.status.as_ref().and_then(|s| s.host_ip.as_deref()),
        Some(node_ip.as_str())
    );

    // ...and is not Ready while nothing answers its readiness probe...
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pod = agent_pod(&pods).await?.context("the agent pod went away")?;
    assert!(!ready(&pod), "Ready before its probe answered");
    assert!(std::net::TcpStream::connect((ip.as_str(), 8080)).is_err());
    assert_eq!(
        container(&pod).and_then(pid),
        Some(first_pid),
        "it did not restart"
    );

    // ...and is once it does.
    std::fs::write(gate, "")?;
    wait_for("the agent to be Ready", Duration::from_secs(30), || {
        let pods = pods.clone();
        async move { Ok(agent_pod(&pods).await?.is_some_and(|p| ready(&p))) }
    })
    .await?;
    assert!(
        std::net::TcpStream::connect((ip.as_str(), 8080)).is_ok(),
        "Ready, but nothing answers on {ip}:8080"
    );
    // Probes keep passing, every second, and the status is not rewritten.
    let version = |pod: Option<Pod>| pod.and_then(|p| p.metadata.resource_version);
    let before = version(agent_pod(&pods).await?);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        version(agent_pod(&pods).await?),
        before,
        "an unchanged status is written again"
    );

    // Its environment is the pod's, and nothing of the harness'.
    let env = agent_env(cluster, &pod_name)?;
    assert_eq!(env.get("POD_NAME"), Some(&pod_name));
    assert_eq!(env.get("POD_NAMESPACE").map(String::as_str), Some(NS));
    assert_eq!(env.get("POD_IP"), Some(&ip));
    assert_eq!(env.get("GREETING").map(String::as_str), Some("hello"));
    assert_eq!(env.get("WORD").map(String::as_str), Some("swordfish"));
    let allowed = [
        "POD_NAME",
        "POD_NAMESPACE",
        "POD_IP",
        "GATE",
        "GREETING",
        "WORD",
        "KUBECONFIG",
        "PATH",
        "HOME",
        "RUST_LOG",
        "RUST_BACKTRACE",
        // What bash itself exports to the programs it runs.
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
    ];
    for key in env.keys() {
        assert!(
            allowed.contains(&key.as_str()),
            "{key} leaked into the agent's environment"
        );
    }
    let logs = cluster.pod_logs();
    assert!(
        logs.contains(&format!(
            "pod={pod_name} namespace={NS} ip={ip} args=--greeting=hello --escaped=$(GREETING) --unknown=$(NOPE)"
        )),
        "the agent's arguments are not expanded as the kubelet does:\n{logs}"
    );
    assert!(logs.contains(&format!("==> {NS}_{pod_name}_agent.log <==")));

    // Its KUBECONFIG authenticates as its service account, with a token
    // bound to the pod, and gets only what RBAC grants that account.
    let kubeconfig = PathBuf::from(env.get("KUBECONFIG").context("no KUBECONFIG")?);
    let agent = liqo_testbed::client_from_kubeconfig(&kubeconfig).await?;
    let review: SelfSubjectReview = create(&Api::all(agent.clone()), json!({})).await?;
    let user = review
        .status
        .and_then(|s| s.user_info)
        .context("no user info")?;
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{NS}:{ACCOUNT}").as_str())
    );
    let extra = user.extra.unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-name"),
        Some(&vec![pod_name.clone()]),
        "the token is bound to the pod"
    );
    let config_maps: Api<ConfigMap> = Api::default_namespaced(agent.clone());
    assert!(
        config_maps.get("agent-config").await.is_ok(),
        "the Role grants it"
    );
    match Api::<Secret>::default_namespaced(agent.clone())
        .get("agent-secret")
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => bail!("reading a secret without rights gave {other:?}"),
    }

    // Killed, it is restarted, and the API says so.
    let killed = std::process::Command::new("kill")
        .args(["-9", &first_pid.to_string()])
        .status()?;
    ensure!(killed.success(), "kill -9 {first_pid} failed");
    wait_for("the agent to restart", Duration::from_secs(30), || {
        let pods = pods.clone();
        async move {
            let Some(pod) = agent_pod(&pods).await? else {
                return Ok(false);
            };
            let restarted = container(&pod).is_some_and(|c| {
                c.restart_count == 1 && pid(c).is_some_and(|p| p != first_pid) && c.ready
            });
            Ok(restarted && ready(&pod))
        }
    })
    .await?;
    let pod = agent_pod(&pods).await?.context("the agent pod went away")?;
    assert_eq!(pod.metadata.name.as_ref(), Some(&pod_name), "same pod");
    let status = container(&pod).context("no container status")?;
    let second_pid = pid(status).context("no pid")?;
    assert!(!process_running(first_pid));
    assert!(process_running(second_pid));
    let last = status
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .context("no lastState.terminated")?;
    assert_eq!(last.exit_code, 137, "128 + SIGKILL");

    // A container that fails its liveness probe is stopped (SIGTERM) and
    // restarted.
    let mut unhealthy_spec = on_host_node();
    unhealthy_spec["containers"] = json!([{
        "name": "agent",
        "image": format!("{AGENT_IMAGE}:1"),
        "env": [
            { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
            { "name": "GATE", "value": gate.display().to_string() },
        ],
        "livenessProbe": { "tcpSocket": { "port": 8081 }, "periodSeconds": 1, "failureThreshold": 2 },
    }]);
    create(
        &pods,
        json!({ "metadata": { "name": "unhealthy" }, "spec": unhealthy_spec }),
    )
    .await?;
    wait_for(
        "the unhealthy agent to be restarted",
        Duration::from_secs(30),
        || {
            let pods = pods.clone();
            async move {
                let pod = pods.get_opt("unhealthy").await?;
                let last_exit = pod.as_ref().and_then(container).and_then(|c| {
                    let terminated = c.last_state.as_ref()?.terminated.as_ref()?;
                    Some((c.restart_count, terminated.exit_code))
                });
                Ok(last_exit.is_some_and(|(restarts, code)| restarts >= 1 && code == 143))
            }
        },
    )
    .await?;

    // Deleting the Deployment and the pods leaves no process and no pod, and
    // the pod-bound token stops working.
    let deleting = Instant::now();
    deployments
        .delete("test-agent", &DeleteParams::default())
        .await?;
    pods.delete("unhealthy", &DeleteParams::default()).await?;
    wait_for("the pods to be gone", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move { Ok(pods.list(&ListParams::default()).await?.items.is_empty()) }
    })
    .await?;
    eprintln!("pods deleted in {:.1}s", deleting.elapsed().as_secs_f64());
    assert!(!process_running(second_pid), "the agent outlived its pod");
    wait_for(
        "the pod-bound token to be refused",
        Duration::from_secs(10),
        || {
            let agent = agent.clone();
            async move {
                let review: Result<SelfSubjectReview, _> = Api::all(agent)
                    .create(&PostParams::default(), &serde_json::from_value(json!({}))?)
                    .await;
                Ok(matches!(review, Err(kube::Error::Api(s)) if s.code == 401))
            }
        },
    )
    .await?;

    // With no pod left hanging, the namespace goes too.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.delete(NS, &DeleteParams::default()).await?;
    wait_for("the namespace to be gone", Duration::from_secs(60), || {
        let namespaces = namespaces.clone();
        async move { Ok(namespaces.get_opt(NS).await?.is_none()) }
    })
    .await?;

    // One more agent, left running for the cluster's stop to end.
    let mut spec = on_host_node();
    spec["containers"] = json!([{
        "name": "agent",
        "image": format!("{AGENT_IMAGE}:1"),
        "env": [
            { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
            { "name": "GATE", "value": gate.display().to_string() },
        ],
    }]);
    let default_pods: Api<Pod> = Api::namespaced(client, "default");
    create(
        &default_pods,
        json!({ "metadata": { "name": "leftover" }, "spec": spec }),
    )
    .await?;
    wait_for("the leftover agent", Duration::from_secs(30), || {
        let pods = default_pods.clone();
        async move {
            let pod = pods.get_opt("leftover").await?;
            Ok(pod.as_ref().is_some_and(ready))
        }
    })
    .await?;
    let leftover = default_pods.get("leftover").await?;
    let leftover_pid = container(&leftover).and_then(pid).context("no pid")?;
    assert!(process_running(leftover_pid));
    Ok(vec![leftover_pid])
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_node_runs_agent_pods_as_processes() -> Result<()> {
    let bin = liqo_e2e::ScriptDir::new("hostnode", &[("test-agent", AGENT)])?;
    let gate = bin.0.join("go");
    let mut spec = spec("hostnode", 7, 1);
    spec.agent_bin_dir = Some(bin.0.clone());
    spec.host_images
        .insert(AGENT_IMAGE.to_owned(), "test-agent".to_owned());
    let one = One::start(spec).await?;
    let cluster = one.cluster();

    let result = async {
        host_node_is_registered(cluster).await?;
        fails_like_a_kubelet(cluster).await?;
        agent_lifecycle(cluster, &gate).await
    }
    .await;
    let pids = match result {
        Ok(pids) => pids,
        Err(e) => {
            eprintln!("the host node's pod logs:\n{}", cluster.pod_logs());
            return Err(e);
        }
    };

    one.stop();
    for pid in pids {
        assert!(!process_running(pid), "agent {pid} outlived the cluster");
    }
    Ok(())
}

#[test]
fn the_default_allow_list_holds_the_agents_images() {
    let images = liqo_testbed::default_host_images();
    assert_eq!(
        images
            .get(liqo_api::names::GATEWAY_IMAGE)
            .map(String::as_str),
        Some("liqo-gateway")
    );
    assert_eq!(
        images
            .get(liqo_api::names::VIRTUAL_KUBELET_IMAGE)
            .map(String::as_str),
        Some("liqo-virtual-kubelet")
    );
    assert_eq!(images.len(), 2);
}
