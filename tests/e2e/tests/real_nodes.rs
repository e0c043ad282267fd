//! The mission on real nodes (the testbed's real-node mode): each cluster's
//! node is a kubelet with containerd, runc and CNI, holding the agents'
//! images built from this build. `liqoctl install` with no image flag runs
//! the gateway and the virtual kubelet as real pods; a peering's offloaded
//! Deployment runs as real containers on the provider's node; a consumer
//! pod reaches it through its Service, and one of its containers reaches a
//! consumer Service back, through the two gateways' WireGuard tunnel;
//! `kubectl logs` and `exec` reach the remote containers; mounted
//! ConfigMaps and Secrets follow their changes; a Job runs to completion;
//! `liqoctl test network` is green; unpeer leaves both clusters as they
//! were before the peering. Once with
//! disjoint pod CIDRs (peered with two kubeconfigs), once with the same
//! (NAT, peered with a token). Needs root, containerd, runc, CNI plugins.
//!
//! With `LIQO_AGENT_IMAGES` naming a folder of the shipped image archives
//! (`cargo run -p liqo-images` writes them; `bash tests/images.sh` runs the
//! mission so), the nodes hold those instead of images made from this
//! build's binaries, and the mission checks that the agents run them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams, PostParams};
use liqo_e2e::fixture::WAIT;
use liqo_e2e::fixture::pod::ready;
use liqo_e2e::{Run, liqoctl, run, snapshot, wait_for};
use liqo_testbed::{Cluster, ClusterSpec, TOOLBOX_IMAGE, Testbed, Toolchain};
use serde_json::json;

const OFFLOADED: &str = "demo";
/// The namespace both clusters have, of the clusterset's Service.
const SHARED: &str = "shared";

fn spec(name: &str, index: u8, pod_cidr: Option<&str>) -> ClusterSpec {
    let mut spec = ClusterSpec::new(name, index);
    // Every pod runs on the real node: no kwok node to pick instead.
    spec.nodes = 0;
    spec.real_node = true;
    spec.agent_bin_dir = Some(liqo_e2e::bin_dir());
    spec.agent_images = shipped_images();
    if let Some(cidr) = pod_cidr {
        spec.pod_cidr = cidr.to_owned();
    }
    spec
}

/// The folder of the shipped image archives the nodes hold, if the mission
/// runs with them.
fn shipped_images() -> Option<PathBuf> {
    std::env::var_os("LIQO_AGENT_IMAGES").map(PathBuf::from)
}

/// Checks that the container of pod `pod` (a JSON object) runs the shipped
/// image of `program`, when the mission runs with the shipped images.
fn runs_the_shipped_image(pod: &serde_json::Value, program: &str) -> Result<()> {
    let Some(folder) = shipped_images() else {
        return Ok(());
    };
    let archive = folder.join(format!("{program}-{}.oci.tar", liqo_api::VERSION));
    let digest = super::images::archive_image_id(&archive)?;
    let image_id = pod["status"]["containerStatuses"][0]["imageID"]
        .as_str()
        .unwrap_or_default();
    ensure!(
        image_id.ends_with(&digest),
        "{program} runs {image_id:?}, not the shipped image {digest}"
    );
    Ok(())
}

/// The pod of namespace `liqo` of `cluster` whose name starts with
/// `prefix`, as kubectl prints it in JSON.
fn liqo_pod(cluster: &Cluster, prefix: &str) -> Result<serde_json::Value> {
    let listed = kubectl(cluster, &["-n", "liqo", "get", "pods", "-o", "json"])?.success();
    let pods: serde_json::Value = serde_json::from_str(&listed.stdout)?;
    pods["items"]
        .as_array()
        .and_then(|a| {
            a.iter().find(|p| {
                p["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(prefix))
            })
        })
        .cloned()
        .with_context(|| format!("no pod {prefix}… in namespace liqo"))
}

fn kubectl(cluster: &Cluster, args: &[&str]) -> Result<Run> {
    let mut cmd = std::process::Command::new(Toolchain::locate()?.binary("kubectl"));
    cmd.arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args(args);
    Ok(run(&mut cmd))
}

/// A pod of the toolbox image that runs `script` as a non-root user, as the
/// provider's `restricted` Pod Security level wants.
fn toolbox(name: &str, script: &str, extra: serde_json::Value) -> serde_json::Value {
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

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
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
const WEB: &str = "echo \"hello from $POD_NAME on $NODE_NAME\" > /www/index.html; \
                   echo \"serving on $NODE_NAME\"; exec httpd -f -p 8080 -h /www";

/// A pod `name` of the HTTP server, its page in an emptyDir.
fn web_pod(name: &str) -> serde_json::Value {
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
async fn service(client: &kube::Client, namespace: &str, app: &str) -> Result<()> {
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

async fn create(client: &kube::Client, namespace: &str, object: serde_json::Value) -> Result<()> {
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
async fn ready_pods(
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

async fn cluster_ip(client: &kube::Client, namespace: &str, name: &str) -> Result<String> {
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
async fn curl_until(
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
fn without(set: BTreeSet<String>, namespaces: &[&str]) -> BTreeSet<String> {
    set.into_iter()
        .filter(|o| {
            let ns = o.split('/').nth(1).unwrap_or("");
            let name = o.split('/').nth(2).unwrap_or("");
            let is_one = o.starts_with("namespaces/") && namespaces.contains(&name);
            !(namespaces.contains(&ns) || is_one)
        })
        .collect()
}

struct Mission<'a> {
    home: &'a Cluster,
    foreign: &'a Cluster,
    /// More `liqoctl install` flags for the foreign cluster.
    foreign_install: Vec<String>,
}

impl Mission<'_> {
    async fn run(&self, peer: impl FnOnce() -> Result<()>) -> Result<()> {
        let (home, foreign) = (self.home, self.foreign);
        let hc = home.client().await?;
        let fc = foreign.client().await?;

        // 1. The agents from their images, as real pods.
        for (cluster, id, extra) in [
            (home, "home-1", &[][..]),
            (foreign, "foreign-1", &self.foreign_install[..]),
        ] {
            let id = format!("--cluster-id={id}");
            let cidr = format!("--pod-cidr={}", cluster.spec().pod_cidr);
            let mut args = vec!["install", &id, &cidr, "--timeout=90"];
            args.extend(extra.iter().map(String::as_str));
            liqoctl(Some(cluster.kubeconfig_path()), &args).success();
        }
        let gw = &liqo_pod(home, "liqo-gateway")?;
        ensure!(
            gw["spec"]["nodeName"] == home.real_node_name().unwrap_or("?"),
            "the gateway runs on {}",
            gw["spec"]["nodeName"]
        );
        ensure!(
            gw["status"]["containerStatuses"][0]["imageID"]
                .as_str()
                .is_some_and(|i| i.contains("sha256:")),
            "the gateway's container has no image digest: {}",
            gw["status"]
        );
        runs_the_shipped_image(gw, "liqo-gateway")?;

        // 2. Peer.
        let foreign_before = snapshot(&fc).await?;
        let home_before = snapshot(&hc).await?;
        peer()?;
        let vk = kubectl(home, &["-n", "liqo", "get", "pods", "-o", "wide"])?.success();
        ensure!(
            vk.stdout
                .lines()
                .any(|l| l.starts_with("liqo-vk-") && l.contains(" Running ")),
            "the virtual kubelet is not a running pod: {}",
            vk.stdout
        );
        runs_the_shipped_image(&liqo_pod(home, "liqo-vk-")?, "liqo-virtual-kubelet")?;

        // 3. Offload; the web Deployment runs on the provider's real node.
        kubectl(home, &["create", "namespace", OFFLOADED])?.success();
        liqoctl(
            Some(home.kubeconfig_path()),
            &["offload", "namespace", OFFLOADED],
        )
        .success();
        let mut template = web_pod("web");
        template["spec"]["nodeSelector"] = liqo_e2e::virtual_node_selector();
        template["spec"]["tolerations"] = liqo_e2e::virtual_node_tolerations();
        create(
            &hc,
            OFFLOADED,
            json!({
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": template["metadata"], "spec": template["spec"]},
                },
            }),
        )
        .await?;
        service(&hc, OFFLOADED, "web").await?;
        let web = ready_pods(&hc, OFFLOADED, "web", 2).await?;
        let foreign_node = foreign.real_node_name().context("foreign's node")?;
        let remote = ready_pods(&fc, &format!("{OFFLOADED}-home"), "web", 2).await;
        // The twin namespace's name is the provider's; find it by the pods.
        let remote_pods = match remote {
            Ok(pods) => pods,
            Err(_) => {
                let all: Api<Pod> = Api::all(fc.clone());
                all.list(&ListParams::default().labels("app=web"))
                    .await?
                    .items
            }
        };
        ensure!(
            remote_pods.len() == 2
                && remote_pods
                    .iter()
                    .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                        == Some(foreign_node)),
            "the provider's web pods are not on its real node"
        );
        let twin = remote_pods[0]
            .metadata
            .namespace
            .clone()
            .context("twin namespace")?;
        let pod = web[0].metadata.name.clone().context("pod name")?;

        // 4. A consumer pod reaches them through the Service.
        create(&hc, "default", toolbox("client", "sleep 3600", json!({}))).await?;
        ready_pods(&hc, "default", "client", 1).await?;
        let web_ip = cluster_ip(&hc, OFFLOADED, "web").await?;
        let answer = curl_until(
            home,
            "default",
            "client",
            &format!("http://{web_ip}/"),
            &format!("on {foreign_node}"),
        )
        .await?;
        eprintln!("consumer pod -> offloaded Service: {}", answer.trim());

        // ... and a provider pod reaches a consumer Service.
        let home_node = home.real_node_name().context("home's node")?;
        let mut echo = web_pod("echo");
        echo["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": home_node});
        create(&hc, OFFLOADED, echo).await?;
        service(&hc, OFFLOADED, "echo").await?;
        ready_pods(&hc, OFFLOADED, "echo", 1).await?;
        let reflected = cluster_ip(&fc, &twin, "echo").await?;
        let back = match curl_until(
            home,
            OFFLOADED,
            &pod,
            &format!("http://{reflected}/"),
            &format!("on {home_node}"),
        )
        .await
        {
            Ok(back) => back,
            Err(e) => {
                let provider = kubectl(
                    foreign,
                    &["get", "endpointslices,pods,svc", "-A", "-o", "wide"],
                )?;
                let consumer = kubectl(
                    home,
                    &["get", "endpointslices,pods,svc", "-A", "-o", "wide"],
                )?;
                let connection = kubectl(home, &["get", "connections", "-A", "-o", "yaml"])?;
                anyhow::bail!(
                    "{e}\nprovider:\n{}\nconsumer:\n{}\n{}",
                    provider.stdout,
                    consumer.stdout,
                    connection.stdout
                );
            }
        };
        eprintln!("offloaded pod -> consumer Service: {}", back.trim());

        // 5. Names, as at home: the offloaded pod resolves the consumer's
        // Service by each of its names, though its twin namespace is
        // called otherwise (where the provider's DNS would find nothing,
        // or the provider's own namespace of that name), and the Service
        // was made after the pod; a consumer pod reaches the offloaded
        // Service by name.
        ensure!(twin != OFFLOADED, "the twin is named otherwise: {twin}");
        for name in [
            "echo".to_owned(),
            format!("echo.{OFFLOADED}"),
            format!("echo.{OFFLOADED}.svc.cluster.local"),
        ] {
            let answer = curl_until(
                home,
                OFFLOADED,
                &pod,
                &format!("http://{name}/"),
                &format!("on {home_node}"),
            )
            .await?;
            eprintln!("offloaded pod -> http://{name}/: {}", answer.trim());
        }
        let resolv = kubectl(
            home,
            &[
                "-n",
                OFFLOADED,
                "exec",
                &pod,
                "--",
                "cat",
                "/etc/resolv.conf",
            ],
        )?
        .success();
        ensure!(
            resolv.stdout.contains(&format!(
                "search {OFFLOADED}.svc.cluster.local svc.cluster.local cluster.local"
            )),
            "the offloaded pod's search path is not its home's: {}",
            resolv.stdout
        );
        let by_name = curl_until(
            home,
            "default",
            "client",
            &format!("http://web.{OFFLOADED}/"),
            &format!("on {foreign_node}"),
        )
        .await?;
        eprintln!(
            "consumer pod -> http://web.{OFFLOADED}/: {}",
            by_name.trim()
        );

        // 6. logs and exec reach the remote container.
        let logs = kubectl(home, &["-n", OFFLOADED, "logs", &pod])?.success();
        ensure!(
            logs.stdout.contains(&format!("serving on {foreign_node}")),
            "logs: {}",
            logs.stdout
        );
        let exec = kubectl(
            home,
            &[
                "-n",
                OFFLOADED,
                "exec",
                &pod,
                "--",
                "cat",
                "/www/index.html",
            ],
        )?
        .success();
        ensure!(
            exec.stdout.contains(&format!("on {foreign_node}")),
            "exec: {}",
            exec.stdout
        );

        // 7. liqoctl test network.
        liqoctl(
            Some(home.kubeconfig_path()),
            &["test", "network", "--timeout=120"],
        )
        .success();

        // 8. A ConfigMap and a Secret, mounted, followed.
        kubectl(
            home,
            &[
                "-n",
                OFFLOADED,
                "create",
                "configmap",
                "settings",
                "--from-literal=greeting=first",
            ],
        )?
        .success();
        kubectl(
            home,
            &[
                "-n",
                OFFLOADED,
                "create",
                "secret",
                "generic",
                "password",
                "--from-literal=word=alpha",
            ],
        )?
        .success();
        let reader = toolbox(
            "reader",
            "while true; do echo \"$(cat /cfg/greeting) $(cat /sec/word)\"; sleep 1; done",
            json!({"spec": {
                "nodeSelector": liqo_e2e::virtual_node_selector(),
                "tolerations": liqo_e2e::virtual_node_tolerations(),
                "volumes": [
                    {"name": "cfg", "configMap": {"name": "settings"}},
                    {"name": "sec", "secret": {"secretName": "password"}},
                ],
            }}),
        );
        let mut reader = reader;
        reader["spec"]["containers"][0]["volumeMounts"] = json!([
            {"name": "cfg", "mountPath": "/cfg"},
            {"name": "sec", "mountPath": "/sec"},
        ]);
        create(&hc, OFFLOADED, reader).await?;
        ready_pods(&hc, OFFLOADED, "reader", 1).await?;
        let read = |expect: &'static str| async move {
            wait_for(
                &format!("the offloaded pod to read {expect:?}"),
                WAIT,
                || async {
                    let out = kubectl(
                        home,
                        &[
                            "-n",
                            OFFLOADED,
                            "exec",
                            "reader",
                            "--",
                            "sh",
                            "-c",
                            "echo $(cat /cfg/greeting) $(cat /sec/word)",
                        ],
                    )?;
                    Ok(out.stdout.trim() == expect)
                },
            )
            .await
        };
        read("first alpha").await?;
        kubectl(
            home,
            &[
                "-n",
                OFFLOADED,
                "patch",
                "configmap",
                "settings",
                "-p",
                r#"{"data":{"greeting":"second"}}"#,
            ],
        )?
        .success();
        kubectl(
            home,
            &[
                "-n",
                OFFLOADED,
                "patch",
                "secret",
                "password",
                "-p",
                r#"{"stringData":{"word":"beta"}}"#,
            ],
        )?
        .success();
        read("second beta").await?;

        // 9. A Job runs to completion.
        let job = toolbox(
            "job",
            "echo counted $(seq 1 3 | wc -l)",
            json!({"spec": {
                "restartPolicy": "Never",
                "nodeSelector": liqo_e2e::virtual_node_selector(),
                "tolerations": liqo_e2e::virtual_node_tolerations(),
            }}),
        );
        create(&hc, OFFLOADED, json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "count"},
            "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": "job"}}, "spec": job["spec"]}},
        }))
        .await?;
        kubectl(
            home,
            &[
                "-n",
                OFFLOADED,
                "wait",
                "--for=condition=Complete",
                "job/count",
                "--timeout=120s",
            ],
        )?
        .success();
        let job_logs = kubectl(home, &["-n", OFFLOADED, "logs", "job/count"])?.success();
        ensure!(
            job_logs.stdout.contains("counted 3"),
            "the Job's logs: {}",
            job_logs.stdout
        );

        // 10. The clusterset: a Service exported on the provider is
        // imported on the consumer, in the namespace of the same name, and
        // a consumer pod reaches it by its clusterset name (CoreDNS's
        // multicluster zone, the clusterset IP, the tunnel).
        for cluster in [home, foreign] {
            kubectl(cluster, &["create", "namespace", SHARED])?.success();
        }
        create(&fc, SHARED, web_pod("exported")).await?;
        service(&fc, SHARED, "exported").await?;
        create(
            &fc,
            SHARED,
            json!({"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport", "metadata": {"name": "exported"}}),
        )
        .await?;
        let by_clusterset_name = curl_until(
            home,
            "default",
            "client",
            &format!("http://exported.{SHARED}.svc.clusterset.local/"),
            &format!("on {foreign_node}"),
        )
        .await?;
        eprintln!(
            "consumer pod -> the provider's exported Service: {}",
            by_clusterset_name.trim()
        );

        // 11. Unpeer: nothing of the peering is left, its imports neither.
        kubectl(home, &["delete", "namespace", OFFLOADED, "--timeout=120s"])?.success();
        let remote_kubeconfig = foreign
            .kubeconfig_path()
            .to_str()
            .context("path")?
            .to_owned();
        liqoctl(
            Some(home.kubeconfig_path()),
            &["unpeer", "--remote-kubeconfig", &remote_kubeconfig, "--yes"],
        )
        .success();
        let imported = |kind: &'static str| async move {
            let listed = kubectl(home, &["-n", SHARED, "get", kind, "-o", "name"])?;
            anyhow::Ok(
                listed
                    .stdout
                    .lines()
                    .filter(|l| l.contains("exported"))
                    .count(),
            )
        };
        wait_for("the import to go with the peering", WAIT, || async {
            Ok(imported("serviceimports").await? == 0
                && imported("services").await? == 0
                && imported("endpointslices").await? == 0)
        })
        .await?;
        // The test's own Services go, and the addresses they held.
        for cluster in [home, foreign] {
            kubectl(cluster, &["delete", "namespace", SHARED, "--timeout=120s"])?.success();
        }
        let mine = [OFFLOADED, "default", SHARED];
        let home_after = without(snapshot(&hc).await?, &mine);
        let foreign_after = without(snapshot(&fc).await?, &[SHARED]);
        let leftovers = |before: &BTreeSet<String>, after: &BTreeSet<String>| {
            after.difference(before).cloned().collect::<Vec<_>>()
        };
        let home_left = leftovers(&without(home_before, &mine), &home_after);
        ensure!(home_left.is_empty(), "left on home: {home_left:?}");
        let foreign_left = leftovers(&without(foreign_before, &[SHARED]), &foreign_after);
        ensure!(foreign_left.is_empty(), "left on foreign: {foreign_left:?}");
        Ok(())
    }
}

/// Two real-node clusters, `home` and `foreign`, with these pod CIDRs.
async fn home_and_foreign(home: &str, foreign: &str) -> Result<Testbed> {
    Ok(Testbed::start(vec![
        spec("home", 1, Some(home)),
        spec("foreign", 2, Some(foreign)),
    ])
    .await?)
}

fn path(p: &Path) -> Result<&str> {
    p.to_str().context("a UTF-8 path")
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mission_runs_on_real_nodes_with_disjoint_pod_cidrs() -> Result<()> {
    let testbed = home_and_foreign("10.201.0.0/16", "10.202.0.0/16").await?;
    let (home, foreign) = (&testbed.clusters()[0], &testbed.clusters()[1]);
    // Another program of the foreign node holds the one port its tunnels
    // may use (the gateway pod is on the node's network): the first peer
    // is refused in one line and undone, and goes through once it is free.
    let squatter = udp_socket_in(foreign.node_netns().context("the node's netns")?)?;
    let port = squatter.local_addr()?.port();
    let mission = Mission {
        home,
        foreign,
        foreign_install: vec![format!("--tunnel-ports={port}-{port}")],
    };
    mission
        .run(|| {
            let remote = path(foreign.kubeconfig_path())?;
            let peer = || {
                liqoctl(
                    Some(home.kubeconfig_path()),
                    &["peer", "--remote-kubeconfig", remote, "--timeout=120"],
                )
            };
            let refused = peer().user_error(6);
            let line = refused.error_line();
            for part in [
                "the gateway of cluster foreign cannot run the tunnel: ",
                &format!(":{port}"),
                "in use",
                "run the same command again",
            ] {
                ensure!(line.contains(part), "{part:?} not in: {line}");
            }
            // Undone on both sides.
            for (cluster, kind) in [(home, "foreignclusters"), (foreign, "tenants")] {
                let left = kubectl(cluster, &["get", kind, "-o", "name"])?.success();
                ensure!(
                    left.stdout.trim().is_empty(),
                    "{kind} left: {}",
                    left.stdout
                );
            }
            drop(squatter);
            peer().success();
            Ok(())
        })
        .await
}

/// A UDP socket bound to a free port in the network namespace `netns`
/// (by name, as `ip netns` knows it).
fn udp_socket_in(netns: &str) -> Result<std::net::UdpSocket> {
    let path = Path::new("/run/netns").join(netns);
    std::thread::spawn(move || -> Result<std::net::UdpSocket> {
        let ns =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
        Ok(std::net::UdpSocket::bind("0.0.0.0:0")?)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the thread binding the socket panicked"))?
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mission_runs_on_real_nodes_with_identical_pod_cidrs_through_nat() -> Result<()> {
    let testbed = home_and_foreign("10.200.0.0/16", "10.200.0.0/16").await?;
    let (home, foreign) = (&testbed.clusters()[0], &testbed.clusters()[1]);
    let mission = Mission {
        home,
        foreign,
        foreign_install: Vec::new(),
    };
    mission
        .run(|| {
            let token = liqoctl(
                Some(foreign.kubeconfig_path()),
                &["generate", "peering-token"],
            )
            .success();
            let dir = tempfile::tempdir()?;
            let file = dir.path().join("token");
            std::fs::write(&file, token.stdout.trim())?;
            liqoctl(
                Some(home.kubeconfig_path()),
                &["peer", "--token-file", path(&file)?],
            )
            .success();
            Ok(())
        })
        .await
}

/// On real nodes, what a node cannot give the agents is told in one line
/// with what to do: a node without `/dev/net/tun` (the other cluster's
/// node has it, and installs), and an image no node has; the same command
/// resumes once the image is loaded.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_real_nodes_a_missing_tun_device_or_image_is_told_in_one_line() -> Result<()> {
    let mut no_tun = spec("no-tun", 1, None);
    no_tun.real_node_without_tun = true;
    let testbed = Testbed::start(vec![no_tun, spec("plain", 2, None)]).await?;
    let (no_tun, plain) = (&testbed.clusters()[0], &testbed.clusters()[1]);

    let refused =
        liqoctl(Some(no_tun.kubeconfig_path()), &["install", "--timeout=90"]).user_error(7);
    let line = refused.error_line();
    assert!(
        line.contains("node no-tun-node has no /dev/net/tun") && line.contains("modprobe tun"),
        "{line}"
    );

    let missing = format!(
        "{}/liqo-gateway:0.0.0-missing",
        liqo_api::images::DEFAULT_REGISTRY
    );
    let refused = liqoctl(
        Some(plain.kubeconfig_path()),
        &["install", "--image-tag=0.0.0-missing", "--timeout=90"],
    )
    .user_error(7);
    let line = refused.error_line();
    assert!(
        line.contains(&format!(
            "the image {missing} cannot be pulled on node plain-node"
        )),
        "{line}"
    );
    // The image loaded, the same command resumes.
    let registry = liqo_api::images::DEFAULT_REGISTRY;
    for image in ["liqo-gateway", "liqo-virtual-kubelet"] {
        plain.tag_node_image(
            &format!("{registry}/{image}:{}", liqo_api::VERSION),
            &format!("{registry}/{image}:0.0.0-missing"),
        )?;
    }
    liqoctl(
        Some(plain.kubeconfig_path()),
        &["install", "--image-tag=0.0.0-missing", "--timeout=90"],
    )
    .success();
    let pods = kubectl(plain, &["-n", "liqo", "get", "pods"])?.success();
    ensure!(
        pods.stdout
            .lines()
            .filter(|l| l.contains(" Running "))
            .count()
            == 1
            && !pods.stdout.contains("ImagePull"),
        "after the resumed install: {}",
        pods.stdout
    );
    Ok(())
}
