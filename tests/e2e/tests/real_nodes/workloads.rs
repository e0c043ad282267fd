//! The workloads of the mission, and the requests that make and reach them.

use super::*;

pub(super) fn kubectl(cluster: &Cluster, args: &[&str]) -> Result<Run> {
    let mut cmd = std::process::Command::new(Toolchain::locate()?.binary("kubectl"));
    cmd.arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args(args);
    Ok(run(&mut cmd))
}

/// A pod of the toolbox image that runs `script` as a non-root user, as the
/// provider's `restricted` Pod Security level wants.
pub(super) fn toolbox(name: &str, script: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "containers": [{
                "name": "main",
                "image": TOOLBOX_IMAGE,
                "command": ["sh", "-c", script],
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                ],
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "runAsNonRoot": true,
                    "runAsUser": 1000,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
            }],
        },
    });
    merge(&mut pod, extra);
    pod
}

pub(super) fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    match (into, from) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// An HTTP server answering with its pod's name and node.
pub(super) const WEB: &str = "echo \"hello from $POD_NAME on $NODE_NAME\" > /www/index.html; \
                   echo \"serving on $NODE_NAME\"; exec httpd -f -p 8080 -h /www";

/// A pod `name` of the HTTP server, its page in an emptyDir.
pub(super) fn web_pod(name: &str) -> serde_json::Value {
    let mut pod = toolbox(
        name,
        WEB,
        json!({"spec": {
            "volumes": [{"name": "www", "emptyDir": {}}],
        }}),
    );
    pod["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "www", "mountPath": "/www"}]);
    pod
}

/// A Service on port 80 for the pods labelled `app=<app>`, port 8080.
pub(super) async fn service(client: &kube::Client, namespace: &str, app: &str) -> Result<()> {
    create(
        client,
        namespace,
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": app},
            "spec": {"selector": {"app": app}, "ports": [{"port": 80, "targetPort": 8080}]},
        }),
    )
    .await
}

pub(super) async fn create(
    client: &kube::Client,
    namespace: &str,
    object: serde_json::Value,
) -> Result<()> {
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            object["apiVersion"]
                .as_str()
                .unwrap_or("v1")
                .rsplit_once('/')
                .map_or("", |(g, _)| g),
            object["apiVersion"]
                .as_str()
                .unwrap_or("v1")
                .rsplit('/')
                .next()
                .unwrap_or("v1"),
            object["kind"].as_str().context("kind")?,
        )),
    );
    api.create(&PostParams::default(), &serde_json::from_value(object)?)
        .await?;
    Ok(())
}

/// The pods labelled `app=<app>`, once `replicas` of them are Ready.
pub(super) async fn ready_pods(
    client: &kube::Client,
    namespace: &str,
    app: &str,
    replicas: usize,
) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("app={app}");
    wait_for(&format!("{replicas} {app} pods Ready"), WAIT, || {
        let pods = pods.clone();
        let selector = selector.clone();
        async move {
            let list = pods.list(&ListParams::default().labels(&selector)).await?;
            let n = list.items.iter().filter(|p| ready(p)).count();
            Ok(n == replicas)
        }
    })
    .await?;
    Ok(pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items)
}

pub(super) async fn cluster_ip(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<String> {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let ip = |service: Option<Service>| service.and_then(|s| s.spec?.cluster_ip);
    wait_for(&format!("service {namespace}/{name}"), WAIT, || {
        let services = services.clone();
        async move { Ok(ip(services.get_opt(name).await?).is_some()) }
    })
    .await?;
    ip(services.get_opt(name).await?).context("a ClusterIP")
}

/// `curl` from pod `pod` of `cluster` (through `kubectl exec`, which reaches
/// an offloaded pod through the virtual kubelet) until it answers with
/// `expect`, or the wait ends.
pub(super) async fn curl_until(
    cluster: &Cluster,
    namespace: &str,
    pod: &str,
    url: &str,
    expect: &str,
) -> Result<String> {
    let mut last = String::new();
    let deadline = std::time::Instant::now() + WAIT;
    while std::time::Instant::now() < deadline {
        let out = kubectl(
            cluster,
            &[
                "-n", namespace, "exec", pod, "--", "curl", "-s", "-m", "3", url,
            ],
        )?;
        last = format!("{}{}", out.stdout, out.stderr);
        if out.stdout.contains(expect) {
            return Ok(out.stdout);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    anyhow::bail!("{url} from {namespace}/{pod} never answered {expect:?}; last: {last}")
}

/// Objects of a cluster but those in the namespaces the test made for its
/// own workloads.
pub(super) fn without(set: BTreeSet<String>, namespaces: &[&str]) -> BTreeSet<String> {
    set.into_iter()
        .filter(|o| {
            let ns = o.split('/').nth(1).unwrap_or("");
            let name = o.split('/').nth(2).unwrap_or("");
            let is_one = o.starts_with("namespaces/") && namespaces.contains(&name);
            !(namespaces.contains(&ns) || is_one)
        })
        .collect()
}
