//! What a cluster should look like ([`ClusterSpec`]): its nodes, its CIDRs,
//! its modes (host-process node, pod network, real node) and the flags of
//! its control plane; and the names and addresses that follow from it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::Error;

/// What a cluster should look like.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSpec {
    pub name: String,
    /// Fake worker nodes managed by kwok.
    pub nodes: u32,
    /// CPU capacity of each worker node (a Kubernetes quantity).
    pub node_cpu: String,
    /// Memory capacity of each worker node (a Kubernetes quantity).
    pub node_memory: String,
    /// Pod capacity of each worker node.
    pub node_pods: u32,
    /// The cluster's pod CIDR, from which each node gets a /24.
    pub pod_cidr: String,
    /// The cluster's service CIDR.
    pub service_cidr: String,
    /// A folder of agent binaries. When set, the cluster gets a
    /// host-process node, `<name>-host`, that runs the pods of the images of
    /// [`Self::host_images`] as local processes.
    #[serde(default)]
    pub agent_bin_dir: Option<PathBuf>,
    /// The host-process node's allow-list: image repository (no tag or
    /// digest) → the binary of `agent_bin_dir` it runs. Pods of other images
    /// fail to pull there. [`crate::default_host_images`] by default.
    #[serde(default = "crate::default_host_images")]
    pub host_images: BTreeMap<String, String>,
    /// The pod-network mode: the host-process node gets a network namespace
    /// of its own joined to the testbed's "internet", its pods get
    /// namespaces of their own with addresses of its pod CIDR, and
    /// kube-proxy serves the cluster's Services there (see
    /// `docs/testbed.md`). Needs `agent_bin_dir`. Off: pods share the
    /// host's network, with loopback addresses.
    #[serde(default)]
    pub pod_network: bool,
    /// The real-node mode: the node namespace of the pod-network mode runs
    /// a real kubelet with containerd, runc and CNI instead of the
    /// host-process node, and kube-proxy (see `docs/testbed.md`, "Real
    /// nodes"). Its node, `<name>-node`, holds the agents' images made from
    /// `agent_bin_dir` (needed) and a toolbox ([`crate::TOOLBOX_IMAGE`]).
    /// Needs root, Debian's containerd, runc and CNI plugins.
    #[serde(default)]
    pub real_node: bool,
    /// A folder of the agents' image archives as `liqo-images` writes them
    /// (the shipped, static images): a real node imports these instead of
    /// the images made from `agent_bin_dir`'s binaries.
    #[serde(default)]
    pub agent_images: Option<PathBuf>,
    /// The real node has no `/dev/net/tun`, as a node without the tun
    /// module (hidden in its mount namespace only).
    #[serde(default)]
    pub real_node_without_tun: bool,
    /// The controller-manager's client rate limit, requests per second
    /// (`--kube-api-qps`; its burst is twice that). `None`: the
    /// controller-manager's own default (20, burst 30), as on most
    /// clusters. Benchmarks raise it to show where a limit lies.
    #[serde(default)]
    pub controller_manager_qps: Option<u32>,
    /// Leave MutatingAdmissionPolicy off, as it is by default in 1.34
    /// (most clusters): what liqo-rs does there is tested on such a
    /// cluster.
    #[serde(default)]
    pub without_mutating_admission_policy: bool,
    /// Serve the control plane's profiles (`--profiling`: the API
    /// server's `/debug/pprof`). Off by default: nothing reads them in
    /// tests.
    #[serde(default)]
    pub profiling: bool,
}

impl ClusterSpec {
    /// A cluster with three 4-CPU, 16 GiB worker nodes. `index` sets the
    /// default CIDRs, so that clusters with different indexes do not overlap.
    pub fn new(name: impl Into<String>, index: u8) -> Self {
        Self {
            name: name.into(),
            nodes: 3,
            node_cpu: "4".to_owned(),
            node_memory: "16Gi".to_owned(),
            node_pods: 110,
            pod_cidr: format!("10.{}.0.0/16", 200u16 + u16::from(index)),
            service_cidr: format!("10.{}.0.0/16", 100u16 + u16::from(index)),
            agent_bin_dir: None,
            host_images: crate::default_host_images(),
            pod_network: false,
            real_node: false,
            agent_images: None,
            real_node_without_tun: false,
            controller_manager_qps: None,
            without_mutating_admission_policy: false,
            profiling: false,
        }
    }

    /// Whether its node has a network namespace on the testbed's internet
    /// (the pod-network and real-node modes).
    pub fn has_node_netns(&self) -> bool {
        self.pod_network || self.real_node
    }

    /// The address of the `kubernetes` service: the first of the service CIDR.
    pub(super) fn kubernetes_service_ip(&self) -> Result<IpAddr, Error> {
        let net: ipnet::IpNet = self.service_cidr.parse().map_err(|_| {
            Error::Spec(format!(
                "service CIDR {:?} is not a CIDR",
                self.service_cidr
            ))
        })?;
        net.hosts().next().ok_or_else(|| {
            Error::Spec(format!(
                "service CIDR {:?} has no host address",
                self.service_cidr
            ))
        })
    }

    pub(super) fn node_name(&self, i: u32) -> String {
        format!("{}-worker-{i}", self.name)
    }

    pub(super) fn host_node_name(&self) -> String {
        format!("{}-host", self.name)
    }

    pub(super) fn real_node_name(&self) -> String {
        format!("{}-node", self.name)
    }
}
