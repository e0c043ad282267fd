//! kwok, which fakes the cluster's worker nodes: its configuration (the
//! logs, exec, metrics and usage of its pods) and the Nodes it manages.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde_json::json;

use super::Cluster;
use crate::{Error, io_error};

/// Writes kwok's config, `kwok.yaml`, in `dir` (and an empty
/// [`KWOK_LOGS_FILE`]): a config of our own, so that a ~/.kwok/kwok.yaml of
/// the machine's user does not change the test clusters; with no stages in
/// it, kwok uses its default node and pod lifecycles. Every container of a
/// kwok pod has the same logs: the lines of `kwok-pods.log` (see
/// [`Cluster::kwok_logs_path`]), followed as they are appended; and
/// `kubectl exec` into one runs the command here, on this machine, in the
/// cluster's folder (kwok's local exec). Each node serves the resource
/// metrics a kubelet serves (KWOK_METRICS), from a usage each pod states in
/// annotations (KWOK_USAGE). Each node keeps a lease, renewed every 10 s,
/// as kubelets do: the options of a config file are not defaulted, and
/// without a lease a node's only heartbeat is its status, every 20 to 45 s,
/// which the controller-manager's 50 s grace period missed under load
/// (nodes NotReady, pods not Ready, while 1,000 pods started).
pub(super) fn write_config(dir: &Path) -> Result<PathBuf, Error> {
    let p = |path: &Path| path.display().to_string();
    let kwok_config = dir.join("kwok.yaml");
    let kwok_logs = dir.join(KWOK_LOGS_FILE);
    std::fs::write(&kwok_logs, "").map_err(io_error(&kwok_logs))?;
    let kwok_logs_json =
        serde_json::to_string(&p(&kwok_logs)).map_err(|e| Error::Spec(e.to_string()))?;
    let dir_json = serde_json::to_string(&p(dir)).map_err(|e| Error::Spec(e.to_string()))?;
    std::fs::write(
        &kwok_config,
        format!(
            "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\n\
             options:\n  nodeLeaseDurationSeconds: 40\n  nodeLeaseParallelism: 4\n\
             ---\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: ClusterLogs\nmetadata:\n  name: all-pods\n\
             spec:\n  logs:\n  - logsFile: {kwok_logs_json}\n    follow: true\n\
             ---\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: ClusterExec\nmetadata:\n  name: all-pods\n\
             spec:\n  execs:\n  - local:\n      workDir: {dir_json}\n\
             ---\n{KWOK_METRICS}---\n{KWOK_USAGE}"
        ),
    )
    .map_err(io_error(&kwok_config))?;
    Ok(kwok_config)
}

impl Cluster {
    pub(super) async fn create_nodes(&self, client: &kube::Client) -> Result<(), Error> {
        let spec = &self.spec;
        for i in 0..spec.nodes {
            create_node(
                client,
                &spec.node_name(i),
                &spec.node_cpu,
                &spec.node_memory,
                spec.node_pods,
            )
            .await?;
        }
        Ok(())
    }

    /// Adds a kwok node `name` of this size to the running cluster (it is
    /// Ready once kwok sees it); the cluster's kwok nodes are named
    /// `<cluster>-node-<i>`, so another name does not meet them.
    pub async fn add_kwok_node(
        &self,
        name: &str,
        cpu: &str,
        memory: &str,
        pods: u32,
    ) -> Result<(), Error> {
        create_node(&self.client().await?, name, cpu, memory, pods).await
    }
}

/// Creates kwok's Node `name`, of this size.
async fn create_node(
    client: &kube::Client,
    name: &str,
    cpu: &str,
    memory: &str,
    pods: u32,
) -> Result<(), Error> {
    let capacity = json!({ "cpu": cpu, "memory": memory, "pods": pods.to_string() });
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {
                KWOK_ANNOTATION: "fake",
                "node.alpha.kubernetes.io/ttl": "0",
                // Where metrics-server finds the node's figures on
                // kwok's server (the `Metric` of kwok.yaml).
                "metrics.k8s.io/resource-metrics-path":
                    format!("/metrics/nodes/{name}/metrics/resource"),
            },
            "labels": {
                "type": "kwok",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": name,
                "node-role.kubernetes.io/worker": "",
            },
        },
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "kubeProxyVersion": "fake",
                "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "",
                "machineID": "", "osImage": "", "systemUUID": "",
            },
        },
    }))
    .map_err(|e| Error::Spec(e.to_string()))?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .map_err(|source| Error::Kube {
            what: format!("creating node {name}"),
            source,
        })?;
    Ok(())
}

/// The file (in the cluster's folder) kwok serves as every container's logs.
pub(super) const KWOK_LOGS_FILE: &str = "kwok-pods.log";

/// kwok's `/metrics/nodes/<node>/metrics/resource`: the families of a
/// kubelet's `/metrics/resource` that metrics-server reads, made of the
/// usage of [`KWOK_USAGE`] (CPU counters integrate it since each pod
/// started).
const KWOK_METRICS: &str = r#"apiVersion: kwok.x-k8s.io/v1alpha1
kind: Metric
metadata:
  name: resource
spec:
  path: /metrics/nodes/{nodeName}/metrics/resource
  metrics:
  - name: scrape_error
    dimension: node
    kind: gauge
    value: "0"
  - name: node_cpu_usage_seconds_total
    dimension: node
    kind: counter
    value: node.CumulativeUsage("cpu")
  - name: node_memory_working_set_bytes
    dimension: node
    kind: gauge
    value: node.Usage("memory")
  - name: container_start_time_seconds
    dimension: container
    kind: gauge
    labels: &container
    - { name: container, value: container.name }
    - { name: namespace, value: pod.metadata.namespace }
    - { name: pod, value: pod.metadata.name }
    value: pod.SinceSecond()
  - name: container_cpu_usage_seconds_total
    dimension: container
    kind: counter
    labels: *container
    value: pod.CumulativeUsage("cpu", container.name)
  - name: container_memory_working_set_bytes
    dimension: container
    kind: gauge
    labels: *container
    value: pod.Usage("memory", container.name)
"#;

/// What each kwok pod uses: the annotations
/// `kwok.x-k8s.io/usage-cpu` and `kwok.x-k8s.io/usage-memory` (quantities),
/// else 1m and 1Mi.
const KWOK_USAGE: &str = r#"apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterResourceUsage
metadata:
  name: from-annotations
spec:
  usages:
  - usage:
      cpu:
        expression: >-
          "kwok.x-k8s.io/usage-cpu" in pod.metadata.annotations
          ? Quantity(pod.metadata.annotations["kwok.x-k8s.io/usage-cpu"]) : Quantity("1m")
      memory:
        expression: >-
          "kwok.x-k8s.io/usage-memory" in pod.metadata.annotations
          ? Quantity(pod.metadata.annotations["kwok.x-k8s.io/usage-memory"]) : Quantity("1Mi")
"#;

/// The annotation that puts a node under kwok's management.
pub const KWOK_ANNOTATION: &str = "kwok.x-k8s.io/node";
