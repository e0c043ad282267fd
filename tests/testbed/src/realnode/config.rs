//! The files a real node's daemons read: containerd's config, the CNI
//! network's template, the kubelet's configuration and the API server's
//! egress selection.

use std::net::Ipv4Addr;
use std::path::Path;

/// The image containerd runs each pod's sandbox from (it must be there:
/// nothing is pulled).
pub(crate) const PAUSE_IMAGE: &str = "liqo.test/pause:1";

/// The image of the tests' workloads: busybox (a shell, an HTTP server,
/// `nc`, `wget`), curl, and iperf3 where the machine has it.
pub const TOOLBOX_IMAGE: &str = "liqo.test/toolbox:1";

/// The CNI network's name, also the name of the IPAM's folder.
const NETWORK: &str = "testbed";

/// containerd's config: its files under `dir`, CRI with runc and cgroupfs,
/// CNI plugins from `dir/cni/bin` and the network written from the
/// template once the kubelet tells the node's pod CIDR. Its streaming
/// server (exec, attach, port-forward, which the kubelet proxies) listens
/// on the node's `address`: loopback connections of the node's namespace
/// are the relay's.
pub(crate) fn containerd(dir: &Path, address: Ipv4Addr) -> String {
    let d = |name: &str| dir.join(name).display().to_string();
    format!(
        "{own}\
         [plugins.\"io.containerd.grpc.v1.cri\"]\n\
         \x20 disable_tcp_service = true\n\
         \x20 stream_server_address = \"{address}\"\n\
         \x20 sandbox_image = \"{PAUSE_IMAGE}\"\n\
         \x20 # Not below containerd's own score: this machine's root may not lower it.\n\
         \x20 restrict_oom_score_adj = true\n\
         \x20 # Pods' network namespaces are pinned here, not in /run/netns.\n\
         \x20 netns_mounts_under_state_dir = true\n\
         [plugins.\"io.containerd.grpc.v1.cri\".cni]\n\
         \x20 bin_dir = \"{bin}\"\n\
         \x20 conf_dir = \"{conf}\"\n\
         \x20 conf_template = \"{template}\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n\
         \x20 runtime_type = \"io.containerd.runc.v2\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n\
         \x20 SystemdCgroup = false\n",
        own = crate::containerd::own_files(dir),
        bin = d("cni/bin"),
        conf = d("cni/net.d"),
        template = d("cni/template.json"),
    )
}

/// The CNI network: routed pods (`ptp`, a /32 on a veth, as the
/// pod-network mode's pods), addresses of the node's pod CIDR
/// (`host-local`, its state under `dir`), then the testbed's plugin that
/// gives each pod the way to the API servers (see `crate::realnode::cni`).
pub(crate) fn cni_template(dir: &Path, relay_socket: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "dataDir": dir.join("cni/ipam").display().to_string(),
                    // containerd fills the CIDR in.
                    "ranges": [[{"subnet": "{{.PodCIDR}}"}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {
                "type": super::CNI_PLUGIN,
                "socket": relay_socket.display().to_string(),
            },
        ],
    })
    .to_string()
}

/// What makes one kubelet of the machine apart from another: its folder,
/// its cgroup, its address.
pub(crate) struct Kubelet<'a> {
    pub(crate) dir: &'a Path,
    pub(crate) ca_crt: &'a Path,
    pub(crate) address: Ipv4Addr,
    pub(crate) cgroup_root: &'a str,
    /// The `kube-dns` Service's address, which pods are given as their
    /// nameserver.
    pub(crate) cluster_dns: Ipv4Addr,
}

/// The port the kubelet serves its API on, in its node's namespace.
pub(crate) const KUBELET_PORT: u16 = 10250;

/// The kubelet's configuration: webhook authentication and authorization
/// against the cluster, cgroupfs under a cgroup of its own, no image
/// garbage collection and no eviction (the images cannot be pulled back;
/// the machine's disk is not the node's to judge), the cluster's DNS at
/// `cluster_dns` (the machine's own resolver is not the pods': they have
/// no upstream).
pub(crate) fn kubelet(k: &Kubelet<'_>) -> String {
    serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": k.ca_crt.display().to_string()},
        },
        "authorization": {"mode": "Webhook"},
        "address": k.address.to_string(),
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": k.cgroup_root,
        "cgroupsPerQOS": true,
        // This machine has cgroup v1, which 1.35 refuses by default.
        "failCgroupV1": false,
        "failSwapOn": false,
        "containerRuntimeEndpoint": format!("unix://{}", k.dir.join("containerd.sock").display()),
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "0%",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
        },
        "podLogsDir": k.dir.join("pod-logs").display().to_string(),
        "resolvConf": "",
        "clusterDomain": crate::dns::CLUSTER_DOMAIN,
        "clusterDNS": [k.cluster_dns.to_string()],
        "serializeImagePulls": false,
        "maxPods": 110,
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
    })
    .to_string()
}

/// The API server's egress selection: whatever it dials in the cluster's
/// network (kubelets, pods, Services: logs, exec, webhooks) goes through
/// the HTTP CONNECT proxy on `socket`, which dials from the node's
/// namespace (see `crate::realnode::egress`).
pub(crate) fn egress_selection(socket: &Path) -> String {
    serde_json::json!({
        "apiVersion": "apiserver.k8s.io/v1beta1",
        "kind": "EgressSelectorConfiguration",
        "egressSelections": [{
            "name": "cluster",
            "connection": {
                "proxyProtocol": "HTTPConnect",
                "transport": {"uds": {"udsName": socket.display().to_string()}},
            },
        }],
    })
    .to_string()
}
