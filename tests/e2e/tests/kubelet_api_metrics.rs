//! The virtual kubelet's node proxy end to end, through the consumer's
//! real API server, on the setup of `kubelet_api` ([`Offloaded`], the
//! agent moved to this machine's address): it answers `/pods`,
//! `/stats/summary` and `/metrics/resource`, with no figure while the
//! provider has no metrics API, and with the provider's figures and CPU
//! counters once it has one, which a real metrics-server reads for
//! `kubectl top pod` and `kubectl top node`.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use liqo_e2e::fixture::WAIT;
use liqo_e2e::{run, wait_for};
use liqo_testbed::Toolchain;
use serde_json::json;

use crate::kubelet_api::{NS, Offloaded, POD, USAGE_CPU, USAGE_MEMORY, node_proxy};

/// The twin namespace and name of the remote pod of local pod `uid`.
async fn remote_pod(remote: &kube::Client, uid: &str) -> Result<(String, String)> {
    use kube::api::ListParams;
    let pod = Api::<Pod>::all(remote.clone())
        .list(&ListParams::default().labels(&format!("liqo.io/local-pod-uid={uid}")))
        .await?
        .items
        .into_iter()
        .next()
        .context("the remote pod")?;
    Ok((
        pod.metadata.namespace.context("its namespace")?,
        pod.metadata.name.context("its name")?,
    ))
}

async fn local_uid(pods: &Api<Pod>) -> Result<String> {
    pods.get(POD).await?.metadata.uid.context("the pod's UID")
}

/// The value and time (ms) of the line of `family` for the offloaded pod
/// (and its container, for a container family) in `/metrics/resource`.
fn sample(text: &str, family: &str) -> Option<(f64, i64)> {
    let labels = if family.starts_with("container_") {
        format!("{{container=\"{POD}\",namespace=\"{NS}\",pod=\"{POD}\"}}")
    } else if family.starts_with("pod_") {
        format!("{{namespace=\"{NS}\",pod=\"{POD}\"}}")
    } else {
        String::new()
    };
    let rest = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{family}{labels} ")))?;
    let mut fields = rest.split_whitespace();
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

/// Figures once the provider has a metrics API. metrics-server is not
/// part of the testbed (kwok's nodes measure nothing): the provider's real
/// API server serves `metrics.k8s.io/v1beta1` PodMetrics from a CRD of the
/// same group, version and shape, which the test writes as metrics-server
/// would (a rate over a window, at a time); the virtual kubelet reads them
/// with the tenant's credentials, through real RBAC.
async fn provider_metrics(
    provider: &liqo_testbed::Cluster,
    kubectl: &impl Fn(&[&str]) -> liqo_e2e::Run,
    node_name: &str,
    uid: &str,
) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};

    let remote = provider.client().await?;
    let crds: Api<CustomResourceDefinition> = Api::all(remote.clone());
    crds.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {
                "name": "pods.metrics.k8s.io",
                // A group of Kubernetes' own: the API server serves it,
                // marked unapproved.
                "annotations": { "api-approved.kubernetes.io": "unapproved, test stand-in for metrics-server" },
            },
            "spec": {
                "group": "metrics.k8s.io",
                "scope": "Namespaced",
                "names": { "plural": "pods", "kind": "PodMetrics", "listKind": "PodMetricsList" },
                "versions": [{
                    "name": "v1beta1", "served": true, "storage": true,
                    "schema": { "openAPIV3Schema": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } },
                }],
            },
        }))?,
    )
    .await?;
    wait_for("the PodMetrics CRD established", WAIT, || async {
        let crd = crds.get("pods.metrics.k8s.io").await?;
        Ok(crd.status.and_then(|s| s.conditions).is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        }))
    })
    .await?;
    let (twin, name) = remote_pod(&remote, uid).await?;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("metrics.k8s.io", "v1beta1", "PodMetrics"),
        "pods",
    );
    let metrics: Api<DynamicObject> = Api::namespaced_with(remote, &twin, &resource);
    // Measured 200m over 10 s, then 400m over the 15 s after.
    let t1 = k8s_openapi::jiff::Timestamp::from_second(
        k8s_openapi::jiff::Timestamp::now().as_second() - 30,
    )?;
    let t2 = t1 + k8s_openapi::jiff::SignedDuration::from_secs(15);
    let write = |at: k8s_openapi::jiff::Timestamp, window: &str, cpu: &str| {
        let metrics = metrics.clone();
        let (name, window, cpu) = (name.clone(), window.to_owned(), cpu.to_owned());
        async move {
            let object = json!({
                "apiVersion": "metrics.k8s.io/v1beta1",
                "kind": "PodMetrics",
                "metadata": { "name": name },
                "timestamp": at.to_string(),
                "window": window,
                "containers": [{ "name": POD, "usage": { "cpu": cpu, "memory": "10Mi" } }],
            });
            metrics
                .patch(
                    &name,
                    &PatchParams::apply("liqo-e2e").force(),
                    &Patch::Apply(&object),
                )
                .await?;
            anyhow::Ok(())
        }
    };
    let read = || node_proxy(kubectl, node_name, "/metrics/resource").stdout;

    write(t1, "10s", "200m").await?;
    let text = read();
    assert!(text.lines().any(|l| l == "scrape_error 0"), "{text}");
    // The first sample counts its rate over its window: 2 CPU-seconds,
    // at the provider's time.
    let t1_ms = t1.as_millisecond();
    let first = sample(&text, "container_cpu_usage_seconds_total").context(text.clone())?;
    assert_eq!(first, (2.0, t1_ms), "{text}");
    assert_eq!(
        sample(&text, "container_memory_working_set_bytes"),
        Some((10.0 * 1024.0 * 1024.0, t1_ms)),
        "{text}"
    );
    assert_eq!(
        sample(&text, "pod_cpu_usage_seconds_total"),
        Some((2.0, t1_ms)),
        "{text}"
    );
    // Read again before a new sample: the counter stays.
    let text = read();
    assert_eq!(
        sample(&text, "container_cpu_usage_seconds_total"),
        Some(first),
        "{text}"
    );

    write(t2, "15s", "400m").await?;
    let text = read();
    let second = sample(&text, "container_cpu_usage_seconds_total").context(text.clone())?;
    assert_eq!(second, (8.0, t2.as_millisecond()), "{text}");
    // What metrics-server computes from the two readings: the provider's
    // rate.
    #[allow(clippy::cast_precision_loss)]
    let rate = (second.0 - first.0) / ((second.1 - first.1) as f64 / 1e3);
    assert!((rate - 0.4).abs() < 1e-9, "{rate}");
    let node = sample(&text, "node_cpu_usage_seconds_total").context(text.clone())?;
    assert!((node.0 - 8.0).abs() < 1e-9, "{text}");

    let raw = node_proxy(kubectl, node_name, "/stats/summary");
    let summary: serde_json::Value = serde_json::from_str(&raw.stdout)?;
    let pod = &summary["pods"][0];
    assert_eq!(pod["podRef"]["name"], POD, "{summary}");
    assert_eq!(pod["cpu"]["usageNanoCores"], 400_000_000, "{summary}");
    assert_eq!(
        pod["cpu"]["usageCoreNanoSeconds"], 8_000_000_000_u64,
        "{summary}"
    );
    assert_eq!(
        pod["memory"]["workingSetBytes"],
        10 * 1024 * 1024,
        "{summary}"
    );
    assert_eq!(
        summary["node"]["cpu"]["usageCoreNanoSeconds"], 8_000_000_000_u64,
        "{summary}"
    );
    Ok(())
}

/// The consumer's objects for a metrics-server run beside the cluster (at
/// `host_ip:port`, where the API server can reach it), with the rights its
/// own manifests give it: read pods and nodes, `nodes/metrics` of every
/// kubelet (the virtual one's included, checked by the agent with a real
/// SubjectAccessReview), delegated authentication and authorization; and
/// `v1beta1.metrics.k8s.io` served by it through the aggregation layer.
fn metrics_server_objects(host_ip: &str, port: u16) -> serde_json::Value {
    const NAME: &str = "metrics-server";
    const SYSTEM: &str = "kube-system";
    let subject = json!([{ "kind": "ServiceAccount", "name": NAME, "namespace": SYSTEM }]);
    json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            { "apiVersion": "v1", "kind": "ServiceAccount", "metadata": { "name": NAME, "namespace": SYSTEM } },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": { "name": "system:metrics-server" },
                "rules": [
                    { "apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"] },
                    { "apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"] },
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": { "name": "system:metrics-server" },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:metrics-server" },
                "subjects": subject,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": { "name": "metrics-server:system:auth-delegator" },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator" },
                "subjects": subject,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": { "name": "metrics-server-auth-reader", "namespace": SYSTEM },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "extension-apiserver-authentication-reader" },
                "subjects": subject,
            },
            // No selector: the endpoint is this process, outside any pod.
            // The API server routes to endpoints (--enable-aggregator-routing).
            {
                "apiVersion": "v1", "kind": "Service",
                "metadata": { "name": NAME, "namespace": SYSTEM },
                "spec": { "ports": [{ "name": "https", "port": 443, "targetPort": port }] },
            },
            {
                "apiVersion": "v1", "kind": "Endpoints",
                "metadata": { "name": NAME, "namespace": SYSTEM },
                "subsets": [{ "addresses": [{ "ip": host_ip }], "ports": [{ "name": "https", "port": port }] }],
            },
            {
                "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                "metadata": { "name": "v1beta1.metrics.k8s.io" },
                "spec": {
                    "group": "metrics.k8s.io", "version": "v1beta1",
                    "service": { "name": NAME, "namespace": SYSTEM, "port": 443 },
                    // metrics-server serves a certificate it made itself.
                    "insecureSkipTLSVerify": true,
                    "groupPriorityMinimum": 100, "versionPriority": 100,
                },
            },
        ],
    })
}

/// A metrics-server for `cluster`, run beside it at `host_ip` (where the
/// API server reaches it) with [`metrics_server_objects`], as a
/// ServiceAccount of the cluster; its log is in the cluster's folder.
/// Killed when dropped.
fn metrics_server(cluster: &liqo_testbed::Cluster, host_ip: &str) -> Result<tokio::process::Child> {
    let toolchain = Toolchain::locate()?;
    let kubectl = |args: &[&str]| {
        run(std::process::Command::new(toolchain.binary("kubectl"))
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig_path())
            .args(args))
    };
    let port = std::net::TcpListener::bind((host_ip, 0))?
        .local_addr()?
        .port();
    let folder = cluster.dir().join("metrics-server");
    std::fs::create_dir_all(&folder)?;
    let manifest = folder.join("objects.json");
    std::fs::write(&manifest, metrics_server_objects(host_ip, port).to_string())?;
    kubectl(&["apply", "-f", &manifest.display().to_string()]).success();
    let token = kubectl(&[
        "create",
        "token",
        "metrics-server",
        "-n",
        "kube-system",
        "--duration=1h",
    ])
    .success();
    let token_file = folder.join("token");
    std::fs::write(&token_file, token.stdout.trim())?;
    let kubeconfig = folder.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{ "name": cluster.name(), "cluster": {
                "server": cluster.server(),
                "certificate-authority": cluster.dir().join("pki/ca.crt"),
            } }],
            "users": [{ "name": "metrics-server", "user": { "tokenFile": token_file } }],
            "contexts": [{ "name": "metrics-server", "context": { "cluster": cluster.name(), "user": "metrics-server" } }],
            "current-context": "metrics-server",
        })
        .to_string(),
    )?;
    let kubeconfig_arg = |flag: &str| format!("--{flag}={}", kubeconfig.display());
    let log = std::fs::File::create(folder.join("metrics-server.log"))?;
    Ok(
        tokio::process::Command::new(toolchain.binary("metrics-server"))
            .args([
                kubeconfig_arg("kubeconfig"),
                kubeconfig_arg("authentication-kubeconfig"),
                kubeconfig_arg("authorization-kubeconfig"),
                format!("--bind-address={host_ip}"),
                format!("--secure-port={port}"),
                format!("--cert-dir={}", folder.display()),
                // The virtual kubelet's certificate is its own
                // (docs/virtual-kubelet.md), kwok's too.
                "--kubelet-insecure-tls".into(),
                "--kubelet-preferred-address-types=InternalIP".into(),
                "--kubelet-use-node-status-port".into(),
                "--metric-resolution=10s".into(),
                "--kubelet-request-timeout=5s".into(),
            ])
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?,
    )
}

/// Waits until `kubectl top pod` in `namespace` of `cluster` shows pod
/// `name` at about [`USAGE_CPU`] and exactly [`USAGE_MEMORY`] (once its
/// metrics-server has two readings); the line it showed.
async fn top_pod(cluster: &liqo_testbed::Cluster, namespace: &str, name: &str) -> Result<String> {
    let kubectl = Toolchain::locate()?.binary("kubectl");
    let mut shown = String::new();
    let result = wait_for(
        &format!(
            "kubectl top pod to show {namespace}/{name} on {}",
            cluster.name()
        ),
        WAIT,
        || {
            let top = run(std::process::Command::new(&kubectl)
                .arg("--kubeconfig")
                .arg(cluster.kubeconfig_path())
                .args(["top", "pod", "-n", namespace, name, "--no-headers"]));
            shown = top.stdout.trim().to_owned();
            let line: Vec<&str> = shown.split_whitespace().collect();
            let ok = top.code == 0
                && matches!(line.as_slice(), [pod, cpu, memory]
                    if *pod == name && about_usage_cpu(cpu) && *memory == USAGE_MEMORY);
            async move { Ok(ok) }
        },
    )
    .await;
    match result {
        Ok(()) => Ok(shown),
        Err(e) => {
            let log =
                std::fs::read_to_string(cluster.dir().join("metrics-server/metrics-server.log"))
                    .unwrap_or_default();
            let start = log.len().saturating_sub(4000);
            Err(e.context(format!(
                "kubectl top pod showed {shown:?}; metrics-server's log ends with:\n{}",
                &log[start..]
            )))
        }
    }
}

/// Whether a `kubectl top` CPU figure is [`USAGE_CPU`] give or take 4 %
/// (two rates measured over windows of a few seconds, one after the
/// other).
fn about_usage_cpu(cpu: &str) -> bool {
    let millis = |q: &str| q.strip_suffix('m').and_then(|m| m.parse::<u32>().ok());
    let want = millis(USAGE_CPU).expect("USAGE_CPU in millicores");
    millis(cpu).is_some_and(|m| m.abs_diff(want) <= want / 25)
}

/// `kubectl top` on the consumer, with nothing standing in: on the
/// provider, kwok's node serves a kubelet's `/metrics/resource` for the
/// remote pod (its usage from the annotations the local pod has and the
/// agent copies) and a metrics-server there serves the provider's
/// metrics API; the agent reads it as the tenant and serves its own
/// `/metrics/resource`; a metrics-server on the consumer scrapes every
/// node, the virtual one among them, and `kubectl top pod` and `kubectl
/// top node` show the figures.
async fn kubectl_top(
    consumer: &liqo_testbed::Cluster,
    provider: &liqo_testbed::Cluster,
    node_name: &str,
    uid: &str,
    host_ip: &str,
) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
    use kube::api::DeleteParams;

    // The stand-in of `provider_metrics` goes first: the metrics API is
    // then the aggregated one.
    let remote = provider.client().await?;
    let crds: Api<CustomResourceDefinition> = Api::all(remote.clone());
    crds.delete("pods.metrics.k8s.io", &DeleteParams::default())
        .await?;
    let api_services: Api<APIService> = Api::all(remote.clone());
    wait_for("the stand-in's APIService gone", WAIT, || async {
        Ok(crds.get_opt("pods.metrics.k8s.io").await?.is_none()
            && api_services
                .get_opt("v1beta1.metrics.k8s.io")
                .await?
                .is_none())
    })
    .await?;
    let _on_provider = metrics_server(provider, host_ip)?;
    let (twin, name) = remote_pod(&remote, uid).await?;
    eprintln!(
        "kubectl top pod on the provider: {}",
        top_pod(provider, &twin, &name).await?
    );

    let _on_consumer = metrics_server(consumer, host_ip)?;
    eprintln!(
        "kubectl top pod on the consumer: {}",
        top_pod(consumer, NS, POD).await?
    );
    // The node: the sum of its pods, the figures a kubelet's node has.
    let top_node = run(
        std::process::Command::new(Toolchain::locate()?.binary("kubectl"))
            .arg("--kubeconfig")
            .arg(consumer.kubeconfig_path())
            .args(["top", "node", node_name, "--no-headers"]),
    )
    .success();
    eprintln!(
        "kubectl top node on the consumer: {}",
        top_node.stdout.trim()
    );
    let line: Vec<&str> = top_node.stdout.split_whitespace().collect();
    assert!(
        matches!(line.as_slice(), [n, cpu, _, memory, _]
            if *n == node_name && about_usage_cpu(cpu) && *memory == USAGE_MEMORY),
        "{top_node:?}"
    );
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_proxy_serves_the_providers_figures_and_kubectl_top_shows_them() -> Result<()> {
    let offloaded = Offloaded::start().await?;
    let (consumer, provider) = (offloaded.pair.consumer(), offloaded.pair.provider());
    let node_name = offloaded.node_name.clone();
    let pods = offloaded.pods.clone();
    let kubectl = |args: &[&str]| offloaded.kubectl(args);
    let (address, _) = offloaded.move_agent().await?;

    // The node proxy: the pods bound to the node, and the summary.
    let raw = node_proxy(&kubectl, &node_name, "/pods");
    let list: serde_json::Value = serde_json::from_str(&raw.stdout)?;
    assert_eq!(list["kind"], "PodList");
    let names: Vec<&str> = list["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, [POD], "{list}");
    assert!(
        list["items"][0]["metadata"].get("managedFields").is_none(),
        "read without their managedFields: {list}"
    );
    let raw = node_proxy(&kubectl, &node_name, "/stats/summary");
    let summary: serde_json::Value = serde_json::from_str(&raw.stdout)?;
    assert_eq!(summary["node"]["nodeName"], node_name.as_str(), "{summary}");
    // kwok's provider serves no metrics API: no figure rather than zeros.
    assert!(summary["node"].get("cpu").is_none(), "{summary}");
    assert_eq!(summary["pods"], json!([]), "{summary}");
    let raw = node_proxy(&kubectl, &node_name, "/metrics/resource");
    assert!(raw.stdout.lines().any(|l| l == "scrape_error 1"), "{raw:?}");

    provider_metrics(provider, &kubectl, &node_name, &local_uid(&pods).await?).await?;
    kubectl_top(
        consumer,
        provider,
        &node_name,
        &local_uid(&pods).await?,
        &address,
    )
    .await?;
    Ok(())
}
