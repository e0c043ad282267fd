//! One test cluster: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, kwok with its fake worker nodes and, if asked for, a
//! host-process node (see [`crate::hostnode`]), all on loopback, and in the
//! pod-network mode its node namespace and kube-proxy (see
//! [`crate::podnet`]); all stopped when the [`Cluster`] is dropped.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::hostnode::{self, HostNode, HostNodeConfig, PodNetworkConfig};
use crate::pki::{self, Authority, Pair};
use crate::podnet::relay::ApiService;
use crate::podnet::{self, Internet, NodeNet};
use crate::ports::free_port;
use crate::process::{self, Process, resident_bytes};
use crate::realnode::{self, RealNode, RealNodeConfig};
use crate::toolchain::Toolchain;
use crate::{Error, io_error, write_private};

/// How long each start-up phase may take before the start fails.
const PHASE_TIMEOUT: Duration = Duration::from_secs(90);

/// The common name of the API server's front-proxy client certificate, the
/// one name aggregated API servers accept request headers from.
const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

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
    fn kubernetes_service_ip(&self) -> Result<IpAddr, Error> {
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

    fn node_name(&self, i: u32) -> String {
        format!("{}-worker-{i}", self.name)
    }

    fn host_node_name(&self) -> String {
        format!("{}-host", self.name)
    }

    fn real_node_name(&self) -> String {
        format!("{}-node", self.name)
    }
}

/// A process of a running cluster, as [`Cluster::processes`] reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub name: String,
    pub pid: u32,
    /// Resident memory in bytes, if the process is still running.
    pub resident_bytes: Option<u64>,
}

/// What a test has done to a cluster's kube-apiserver (see
/// [`Cluster::stop_apiserver`], [`Cluster::pause_apiserver`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApiServerState {
    Running,
    /// Stopped with SIGSTOP: it still holds its port, so connections are
    /// accepted by the kernel and then hang.
    Paused,
    /// Exited on request: its port refuses connections.
    Stopped,
}

impl std::fmt::Display for ApiServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Stopped => "stopped",
        })
    }
}

/// How the kube-apiserver was started, to start it again the same way.
#[derive(Debug)]
struct ApiServer {
    /// Its place in [`Cluster::processes`].
    index: usize,
    program: PathBuf,
    args: Vec<String>,
    state: ApiServerState,
}

/// A pod-network cluster's place on its testbed's internet.
#[derive(Debug, Clone)]
pub(crate) struct Uplink {
    pub(crate) internet: Arc<Internet>,
    /// The last byte of the node's address there.
    pub(crate) place: u8,
}

/// The port kube-proxy answers `/healthz` on, at the node's address.
const KUBE_PROXY_HEALTHZ_PORT: u16 = 10256;

/// How long a stopping kube-apiserver may take to exit before it is killed.
/// It stops listening at once on SIGTERM, but then waits on the watches of
/// the controllers, kwok and agents, which do not end: it would linger for
/// a minute. It keeps no state of its own (etcd does), so the kill loses
/// nothing.
const APISERVER_STOP_GRACE: Duration = Duration::from_secs(3);

/// A running cluster.
#[derive(Debug)]
pub struct Cluster {
    spec: ClusterSpec,
    dir: PathBuf,
    kubeconfig: PathBuf,
    server: String,
    /// In start order; stopped in reverse.
    processes: Vec<Process>,
    /// Set once the kube-apiserver has been started.
    apiserver: Option<ApiServer>,
    /// Stopped before the control plane, while the API still answers.
    host_node: Option<HostNode>,
    /// The real-node mode's node; stopped before the control plane.
    real_node: Option<RealNode>,
    /// The node namespace of the pod-network mode; deleted last.
    node_net: Option<NodeNet>,
}

impl Cluster {
    /// Starts a cluster whose files live in `dir` (created if missing), and
    /// returns once its API answers, its nodes (the host-process node too,
    /// if any) are Ready with a pod CIDR and its controllers have created
    /// the default service account.
    ///
    /// A pod-network cluster started alone has an internet of its own;
    /// [`crate::Testbed`] joins its clusters on one.
    pub async fn start(
        spec: ClusterSpec,
        dir: &Path,
        toolchain: &Toolchain,
    ) -> Result<Self, Error> {
        Self::start_with(spec, dir, toolchain, None).await
    }

    /// [`Cluster::start`], with the node of a pod-network cluster on
    /// `uplink`'s internet.
    pub(crate) async fn start_with(
        spec: ClusterSpec,
        dir: &Path,
        toolchain: &Toolchain,
        uplink: Option<Uplink>,
    ) -> Result<Self, Error> {
        if (spec.pod_network || spec.real_node) && spec.agent_bin_dir.is_none() {
            return Err(Error::Spec(format!(
                "cluster {}: the pod-network and real-node modes need an agent folder",
                spec.name
            )));
        }
        let uplink = match uplink {
            Some(uplink) => Some(uplink),
            None if spec.has_node_netns() => Some(Uplink {
                internet: Internet::new()?,
                place: 1,
            }),
            None => None,
        };
        // Ports are picked free but taken only later, so another process may
        // win one in between; that shows as an exit at start, and a new set
        // of ports fixes it.
        let mut attempt = 1;
        loop {
            match Self::start_once(spec.clone(), dir, toolchain, uplink.clone()).await {
                Err(Error::Exited { ref log, .. })
                    if attempt < 3 && log.contains("address already in use") =>
                {
                    attempt += 1;
                    tracing::warn!(cluster = %spec.name, "a port was taken meanwhile; starting again");
                }
                result => return result,
            }
        }
    }

    async fn start_once(
        spec: ClusterSpec,
        dir: &Path,
        toolchain: &Toolchain,
        uplink: Option<Uplink>,
    ) -> Result<Self, Error> {
        crate::dirs::make_fresh(dir)?;
        let pki_dir = dir.join("pki");
        let logs = dir.join("logs");
        for d in [&pki_dir, &logs] {
            std::fs::create_dir_all(d).map_err(io_error(d))?;
        }

        let ca = Authority::new(&spec.name)?;
        let write = |name: &str, contents: &str| -> Result<PathBuf, Error> {
            let path = pki_dir.join(name);
            write_private(&path, contents).map_err(io_error(&path))?;
            Ok(path)
        };
        let ca_crt = write("ca.crt", &ca.pair().cert)?;
        let ca_key = write("ca.key", &ca.pair().key)?;
        let serving = ca.serving(spec.kubernetes_service_ip()?)?;
        let serving_crt = write("apiserver.crt", &serving.cert)?;
        let serving_key = write("apiserver.key", &serving.key)?;
        // The API server's identity towards kubelets (`kubectl logs`, the
        // node proxy): a client of the cluster CA in system:masters, as
        // kubeadm makes it, so that a kubelet's SubjectAccessReview allows
        // it.
        let kubelet_client = ca.client("kube-apiserver-kubelet-client", &["system:masters"])?;
        let kubelet_client_crt = write("apiserver-kubelet-client.crt", &kubelet_client.cert)?;
        let kubelet_client_key = write("apiserver-kubelet-client.key", &kubelet_client.key)?;
        // The aggregation layer's identity towards aggregated API servers
        // (metrics-server): a CA of its own, as kubeadm makes it, so that no
        // ordinary client certificate can pass for the front proxy.
        let front_proxy_ca = Authority::new(&format!("{} front-proxy", spec.name))?;
        let front_proxy_ca_crt = write("front-proxy-ca.crt", &front_proxy_ca.pair().cert)?;
        let front_proxy = front_proxy_ca.client(FRONT_PROXY_CLIENT, &[])?;
        let front_proxy_crt = write("front-proxy-client.crt", &front_proxy.cert)?;
        let front_proxy_key = write("front-proxy-client.key", &front_proxy.key)?;
        let sa = pki::service_account_key()?;
        let sa_key = write("service-account.key", &sa.key)?;
        let sa_pub = write("service-account.pub", &sa.cert)?;

        let etcd_port = free_port().map_err(io_error(dir))?;
        let etcd_peer_port = free_port().map_err(io_error(dir))?;
        let api_port = free_port().map_err(io_error(dir))?;
        let kwok_port = free_port().map_err(io_error(dir))?;
        let server = format!("https://127.0.0.1:{api_port}");

        let kubeconfig_for = |file: &str, user: &str, groups: &[&str]| -> Result<PathBuf, Error> {
            let pair = ca.client(user, groups)?;
            let path = dir.join(file);
            let yaml = kubeconfig_yaml(&spec.name, &server, &ca.pair().cert, user, &pair);
            write_private(&path, &yaml).map_err(io_error(&path))?;
            Ok(path)
        };
        let kubeconfig = kubeconfig_for("kubeconfig", "testbed-admin", &["system:masters"])?;
        let kcm_kubeconfig = kubeconfig_for(
            "kube-controller-manager.kubeconfig",
            "system:kube-controller-manager",
            &[],
        )?;
        let scheduler_kubeconfig =
            kubeconfig_for("kube-scheduler.kubeconfig", "system:kube-scheduler", &[])?;
        let kwok_kubeconfig = kubeconfig_for("kwok.kubeconfig", "kwok", &["system:masters"])?;
        // The default ClusterRoleBinding system:node-proxier gives this
        // user what kube-proxy needs.
        let kube_proxy_kubeconfig = match &uplink {
            Some(_) => Some(kubeconfig_for(
                "kube-proxy.kubeconfig",
                "system:kube-proxy",
                &[],
            )?),
            None => None,
        };

        // The real node's kubelet, as the Node authorizer knows a node.
        let kubelet_kubeconfig = spec
            .real_node
            .then(|| {
                kubeconfig_for(
                    "kubelet.kubeconfig",
                    &format!("system:node:{}", spec.real_node_name()),
                    &["system:nodes"],
                )
            })
            .transpose()?;

        let mut cluster = Self {
            spec,
            dir: dir.to_owned(),
            kubeconfig,
            server: server.clone(),
            processes: Vec::new(),
            apiserver: None,
            host_node: None,
            real_node: None,
            node_net: None,
        };
        let spec = cluster.spec.clone();
        let p = |path: &Path| path.display().to_string();

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let etcd_peer = format!("http://127.0.0.1:{etcd_peer_port}");
        cluster.spawn(
            toolchain,
            "etcd",
            vec![
                "--name=testbed".into(),
                format!("--data-dir={}", p(&dir.join("etcd"))),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={etcd_peer}"),
                format!("--initial-advertise-peer-urls={etcd_peer}"),
                format!("--initial-cluster=testbed={etcd_peer}"),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        )?;
        let http = reqwest::Client::new();
        cluster
            .wait_for("etcd to be healthy", || {
                let http = http.clone();
                let url = format!("{etcd_url}/health");
                async move {
                    let Ok(resp) = http.get(url).send().await else {
                        return Ok(false);
                    };
                    Ok(resp.text().await.is_ok_and(|t| t.contains("\"true\"")))
                }
            })
            .await?;

        let mut apiserver_args: Vec<String> = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            format!("--tls-cert-file={}", p(&serving_crt)),
            format!("--tls-private-key-file={}", p(&serving_key)),
            format!("--client-ca-file={}", p(&ca_crt)),
            format!("--service-cluster-ip-range={}", spec.service_cidr),
            "--authorization-mode=Node,RBAC".into(),
            format!("--kubelet-client-certificate={}", p(&kubelet_client_crt)),
            format!("--kubelet-client-key={}", p(&kubelet_client_key)),
            // kwok's nodes also give their name as Hostname, which resolves
            // nowhere: the node proxy and logs go to the InternalIP.
            "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
            "--allow-privileged=true".into(),
            format!("--service-account-issuer={server}"),
            format!("--service-account-key-file={}", p(&sa_pub)),
            format!("--service-account-signing-key-file={}", p(&sa_key)),
            // Webhooks (and aggregated APIs) are reached at their
            // Service's endpoints: there is no route to ClusterIPs here.
            "--enable-aggregator-routing=true".into(),
            format!("--requestheader-client-ca-file={}", p(&front_proxy_ca_crt)),
            format!("--requestheader-allowed-names={FRONT_PROXY_CLIENT}"),
            "--requestheader-username-headers=X-Remote-User".into(),
            "--requestheader-group-headers=X-Remote-Group".into(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
            format!("--proxy-client-cert-file={}", p(&front_proxy_crt)),
            format!("--proxy-client-key-file={}", p(&front_proxy_key)),
            format!("--profiling={}", spec.profiling),
            "--v=1".into(),
        ];
        // MutatingAdmissionPolicy (placement of offloaded pods) is beta in
        // 1.34 and off by default; ValidatingAdmissionPolicy is GA.
        if !spec.without_mutating_admission_policy {
            apiserver_args.push("--feature-gates=MutatingAdmissionPolicy=true".into());
            apiserver_args
                .push("--runtime-config=admissionregistration.k8s.io/v1beta1=true".into());
        }
        let egress_socket = dir.join("egress.sock");
        if spec.real_node {
            let egress = dir.join("egress-selection.json");
            std::fs::write(
                &egress,
                realnode::config::egress_selection(
                    &std::path::absolute(&egress_socket).map_err(io_error(&egress_socket))?,
                ),
            )
            .map_err(io_error(&egress))?;
            apiserver_args.push(format!("--egress-selector-config-file={}", p(&egress)));
        }
        cluster.spawn(toolchain, "kube-apiserver", apiserver_args.clone())?;
        cluster.apiserver = Some(ApiServer {
            index: cluster.processes.len() - 1,
            program: toolchain.binary("kube-apiserver"),
            args: apiserver_args,
            state: ApiServerState::Running,
        });
        let client = cluster.client().await?;
        cluster.wait_for_apiserver(&client).await?;

        let mut kcm_args = vec![
            format!("--kubeconfig={}", p(&kcm_kubeconfig)),
            format!("--authentication-kubeconfig={}", p(&kcm_kubeconfig)),
            format!("--authorization-kubeconfig={}", p(&kcm_kubeconfig)),
            "--secure-port=0".into(),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=true".into(),
            format!("--service-account-private-key-file={}", p(&sa_key)),
            format!("--root-ca-file={}", p(&ca_crt)),
            format!("--cluster-signing-cert-file={}", p(&ca_crt)),
            format!("--cluster-signing-key-file={}", p(&ca_key)),
            "--allocate-node-cidrs=true".into(),
            format!("--cluster-cidr={}", spec.pod_cidr),
            format!("--service-cluster-ip-range={}", spec.service_cidr),
            "--controllers=*,bootstrapsigner,tokencleaner".into(),
            format!("--profiling={}", spec.profiling),
            "--v=1".into(),
        ];
        if let Some(qps) = spec.controller_manager_qps {
            kcm_args.push(format!("--kube-api-qps={qps}"));
            kcm_args.push(format!("--kube-api-burst={}", qps * 2));
        }
        cluster.spawn(toolchain, "kube-controller-manager", kcm_args)?;
        cluster.spawn(
            toolchain,
            "kube-scheduler",
            vec![
                format!("--kubeconfig={}", p(&scheduler_kubeconfig)),
                format!("--authentication-kubeconfig={}", p(&scheduler_kubeconfig)),
                format!("--authorization-kubeconfig={}", p(&scheduler_kubeconfig)),
                "--secure-port=0".into(),
                "--leader-elect=false".into(),
                format!("--profiling={}", spec.profiling),
                "--v=1".into(),
            ],
        )?;
        // A config of our own, so that a ~/.kwok/kwok.yaml of the machine's
        // user does not change the test clusters; with no stages in it, kwok
        // uses its default node and pod lifecycles. Every container of a
        // kwok pod has the same logs: the lines of `kwok-pods.log` (see
        // [`Cluster::kwok_logs_path`]), followed as they are appended; and
        // `kubectl exec` into one runs the command here, on this machine,
        // in the cluster's folder (kwok's local exec). Each node serves
        // the resource metrics a kubelet serves (KWOK_METRICS), from a
        // usage each pod states in annotations (KWOK_USAGE). Each node
        // keeps a lease, renewed every 10 s, as kubelets do: the options
        // of a config file are not defaulted, and without a lease a node's
        // only heartbeat is its status, every 20 to 45 s, which the
        // controller-manager's 50 s grace period missed under load (nodes
        // NotReady, pods not Ready, while 1,000 pods started).
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
        cluster.spawn(
            toolchain,
            "kwok",
            vec![
                format!("--kubeconfig={}", p(&kwok_kubeconfig)),
                format!("--config={}", p(&kwok_config)),
                "--manage-all-nodes=false".into(),
                format!("--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake"),
                "--manage-nodes-with-label-selector=".into(),
                format!("--cidr={}", spec.pod_cidr),
                "--node-ip=127.0.0.1".into(),
                format!("--node-port={kwok_port}"),
                "--server-address=".into(),
            ],
        )?;

        cluster.create_nodes(&client).await?;
        cluster.wait_until_usable(&client).await?;
        let service = ApiService {
            cluster_ip: match spec.kubernetes_service_ip()? {
                IpAddr::V4(ip) => ip,
                IpAddr::V6(_) => return Err(Error::Spec("an IPv6 service CIDR".into())),
            },
            api_server: ([127, 0, 0, 1], api_port).into(),
        };
        if let Some(uplink) = uplink {
            cluster.node_net = Some(NodeNet::new(
                api_port,
                uplink.internet,
                uplink.place,
                spec.real_node.then_some(service),
            )?);
        }
        if let (Some(net), Some(bin_dir), Some(kubeconfig)) =
            (&cluster.node_net, &spec.agent_bin_dir, &kubelet_kubeconfig)
        {
            net.route_services(&spec.service_cidr)?;
            let absolute = |path: &Path| std::path::absolute(path).map_err(io_error(path));
            let name = spec.real_node_name();
            let config = RealNodeConfig {
                cluster: spec.name.clone(),
                node_name: name,
                dir: dir.join("node"),
                netns: net.path(),
                address: net.address(),
                kubelet: toolchain.binary("kubelet"),
                kubeconfig: absolute(kubeconfig)?,
                ca_crt: absolute(&ca_crt)?,
                agent_bin_dir: absolute(bin_dir)?,
                service,
                egress_socket: absolute(&egress_socket)?,
                api_port,
                without_tun: spec.real_node_without_tun,
            };
            cluster.start_real_node(config, &client).await?;
        } else if let Some(bin_dir) = &spec.agent_bin_dir {
            // Absolute: the pods' processes run in folders of their own.
            let absolute = |path: &Path| std::path::absolute(path).map_err(io_error(path));
            let config = HostNodeConfig {
                cluster: spec.name.clone(),
                node_name: spec.host_node_name(),
                admin_kubeconfig: cluster.kubeconfig.clone(),
                server: server.clone(),
                ca_pem: ca.pair().cert.clone(),
                bin_dir: absolute(bin_dir)?,
                images: spec.host_images.clone(),
                pods_dir: absolute(&dir.join("pods"))?,
                subnet: hostnode::loopback_subnet(api_port),
                node_ip: match &cluster.node_net {
                    Some(net) => net.address(),
                    None => hostnode::node_address(hostnode::loopback_subnet(api_port)),
                },
                pod_network: cluster.node_net.as_ref().map(|net| PodNetworkConfig {
                    node_netns: net.name().to_owned(),
                    api_port,
                }),
            };
            cluster.start_host_node(config, &client).await?;
        }
        if let Some(kubeconfig) = &kube_proxy_kubeconfig {
            cluster.start_kube_proxy(toolchain, kubeconfig).await?;
        }
        Ok(cluster)
    }

    /// Starts kube-proxy in the node namespace, in nftables mode, for the
    /// host-process node, and returns once it has programmed the Services
    /// (its `/healthz` answers 200). It leaves the machine's conntrack
    /// settings alone: they are not the test's to change.
    async fn start_kube_proxy(
        &mut self,
        toolchain: &Toolchain,
        kubeconfig: &Path,
    ) -> Result<(), Error> {
        let node = self
            .host_node_name()
            .or_else(|| self.real_node.as_ref().map(RealNode::name));
        let (Some(net), Some(node)) = (&self.node_net, node) else {
            return Ok(());
        };
        let netns = net.path();
        let healthz = net.address();
        let args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--proxy-mode=nftables".into(),
            format!("--hostname-override={node}"),
            format!("--cluster-cidr={}", self.spec.pod_cidr),
            format!("--healthz-bind-address={healthz}:{KUBE_PROXY_HEALTHZ_PORT}"),
            "--conntrack-max-per-core=0".into(),
            "--conntrack-tcp-timeout-established=0".into(),
            "--conntrack-tcp-timeout-close-wait=0".into(),
            "--oom-score-adj=0".into(),
            "--v=1".into(),
        ];
        let name = "kube-proxy";
        let program = toolchain.binary(name);
        let log = self.dir.join("logs").join(format!("{name}.log"));
        let mut cmd = std::process::Command::new(&program);
        cmd.args(&args);
        process::with_netns(&mut cmd, Some(&netns)).map_err(io_error(&netns))?;
        let process = Process::spawn_command(name, cmd, &log).map_err(io_error(&program))?;
        tracing::debug!(cluster = %self.spec.name, %name, pid = process.pid(), "started");
        self.processes.push(process);
        let dialer = hostnode::Dialer {
            netns: Some(netns.clone()),
        };
        self.wait_for("kube-proxy to be healthy", || {
            let dialer = dialer.clone();
            let host = healthz.to_string();
            async move {
                let status =
                    hostnode::http_get(&dialer, &host, KUBE_PROXY_HEALTHZ_PORT, "/healthz", &[])
                        .await;
                Ok(status.is_ok_and(|s| s == 200))
            }
        })
        .await
    }

    async fn start_real_node(
        &mut self,
        config: RealNodeConfig,
        client: &kube::Client,
    ) -> Result<(), Error> {
        let name = config.node_name.clone();
        self.real_node = Some(RealNode::start(config)?);
        self.wait_for_node(client, name, "the real node to be Ready")
            .await
    }

    async fn start_host_node(
        &mut self,
        config: HostNodeConfig,
        client: &kube::Client,
    ) -> Result<(), Error> {
        let name = config.node_name.clone();
        self.host_node = Some(HostNode::start(config).await?);
        self.wait_for_node(client, name, "the host-process node to be Ready")
            .await
    }

    /// Waits for node `name` to be Ready and free of the node lifecycle's taints.
    async fn wait_for_node(
        &mut self,
        client: &kube::Client,
        name: String,
        what: &str,
    ) -> Result<(), Error> {
        let nodes: Api<Node> = Api::all(client.clone());
        self.wait_for(what, || {
            let nodes = nodes.clone();
            let name = name.clone();
            async move {
                let Ok(Some(node)) = nodes.get_opt(&name).await else {
                    return Ok(false);
                };
                // The node lifecycle controller may have tainted it before
                // its first status; the scheduler skips it until untainted.
                let not_ready_taint = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|ts| ts.iter().any(|t| t.key.starts_with("node.kubernetes.io/")));
                Ok(node_is_ready(&node) && !not_ready_taint)
            }
        })
        .await
    }

    fn spawn(&mut self, toolchain: &Toolchain, name: &str, args: Vec<String>) -> Result<(), Error> {
        let log = self.dir.join("logs").join(format!("{name}.log"));
        let process = Process::spawn(name, &toolchain.binary(name), &args, &log)
            .map_err(io_error(&toolchain.binary(name)))?;
        tracing::debug!(cluster = %self.spec.name, %name, pid = process.pid(), "started");
        self.processes.push(process);
        Ok(())
    }

    async fn wait_for_apiserver(&mut self, client: &kube::Client) -> Result<(), Error> {
        self.wait_for("kube-apiserver to be ready", || {
            let client = client.clone();
            async move {
                let request = http::Request::get("/readyz")
                    .body(Vec::new())
                    .map_err(|e| Error::Spec(e.to_string()))?;
                Ok(client.request_text(request).await.is_ok_and(|t| t == "ok"))
            }
        })
        .await
    }

    async fn create_nodes(&self, client: &kube::Client) -> Result<(), Error> {
        let nodes: Api<Node> = Api::all(client.clone());
        let spec = &self.spec;
        for i in 0..spec.nodes {
            let name = spec.node_name(i);
            let capacity = json!({
                "cpu": spec.node_cpu,
                "memory": spec.node_memory,
                "pods": spec.node_pods.to_string(),
            });
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
            nodes
                .create(&PostParams::default(), &node)
                .await
                .map_err(|source| Error::Kube {
                    what: format!("creating node {name}"),
                    source,
                })?;
        }
        Ok(())
    }

    async fn wait_until_usable(&mut self, client: &kube::Client) -> Result<(), Error> {
        let want = self.spec.nodes as usize;
        let nodes: Api<Node> = Api::all(client.clone());
        self.wait_for("the worker nodes to be Ready with a pod CIDR", || {
            let nodes = nodes.clone();
            async move {
                let Ok(list) = nodes.list(&ListParams::default()).await else {
                    return Ok(false);
                };
                let ready = list.items.iter().filter(|n| node_is_ready(n)).count();
                Ok(ready == want)
            }
        })
        .await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        self.wait_for("the default service account", || {
            let accounts = accounts.clone();
            async move { Ok(accounts.get_opt("default").await.ok().flatten().is_some()) }
        })
        .await
    }

    /// Polls `check` until it answers true, failing early if a process of
    /// the cluster exits, and after [`PHASE_TIMEOUT`].
    async fn wait_for<F, Fut>(&mut self, what: &str, mut check: F) -> Result<(), Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<bool, Error>>,
    {
        let deadline = Instant::now() + PHASE_TIMEOUT;
        loop {
            self.ensure_running()?;
            if check().await? {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log = self
                    .processes
                    .last()
                    .map(|p| format!("{}:\n{}", p.name(), p.log_tail(20)))
                    .unwrap_or_default();
                return Err(Error::Timeout {
                    cluster: self.spec.name.clone(),
                    what: what.to_owned(),
                    log,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Fails if any process of the cluster has exited, or the loop of its
    /// host-process node has; a kube-apiserver stopped with
    /// [`Cluster::stop_apiserver`] has not crashed, and does not count.
    pub fn ensure_running(&mut self) -> Result<(), Error> {
        if let Some(host) = &self.host_node {
            host.ensure_running()?;
        }
        if let Some(node) = &mut self.real_node {
            node.ensure_running()?;
        }
        let stopped_on_purpose = self
            .apiserver
            .as_ref()
            .filter(|a| a.state == ApiServerState::Stopped)
            .map(|a| a.index);
        for (i, process) in self.processes.iter_mut().enumerate() {
            if Some(i) == stopped_on_purpose {
                continue;
            }
            if let Some(status) = process.exited() {
                return Err(Error::Exited {
                    cluster: self.spec.name.clone(),
                    process: process.name().to_owned(),
                    status: status.to_string(),
                    log: process.log_tail(30),
                });
            }
        }
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// The folder with the cluster's PKI, logs and kubeconfig files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file whose lines every container of a kwok pod logs (`kubectl
    /// logs`, followed as lines are appended).
    pub fn kwok_logs_path(&self) -> PathBuf {
        self.dir.join(KWOK_LOGS_FILE)
    }

    /// An admin kubeconfig (a client certificate in `system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The cluster CA certificate (PEM), which also signs approved CSRs.
    pub fn ca_pem(&self) -> Result<String, Error> {
        let path = self.dir.join("pki").join("ca.crt");
        std::fs::read_to_string(&path).map_err(io_error(&path))
    }

    /// A client with the admin's rights.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// The node namespace's name, for a pod-network cluster: where its
    /// kube-proxy and host-network pods run (`ip netns exec <name> …`).
    pub fn node_netns(&self) -> Option<&str> {
        self.node_net.as_ref().map(NodeNet::name)
    }

    /// The node's address on the testbed's internet (192.168.100.N/24, N
    /// being the cluster's place in its testbed), for a pod-network
    /// cluster: its InternalIP and host-network pods' IP.
    pub fn node_address(&self) -> Option<Ipv4Addr> {
        self.node_net.as_ref().map(NodeNet::address)
    }

    /// The name of the network namespace of the pod with address `pod_ip`,
    /// for a pod-network cluster (whether or not such a pod exists).
    pub fn pod_netns(&self, pod_ip: Ipv4Addr) -> Option<String> {
        let port = self.api_port()?;
        self.node_net
            .as_ref()
            .map(|_| podnet::names::pod(port, pod_ip))
    }

    /// The node namespace's end of the veth of the pod with address
    /// `pod_ip`, for a pod-network cluster.
    pub fn pod_veth(&self, pod_ip: Ipv4Addr) -> Option<String> {
        self.node_net.as_ref().map(|_| podnet::names::veth(pod_ip))
    }

    /// Cuts (`false`) or mends (`true`) the node's link to the testbed's
    /// internet: the node keeps its address, and its pods their gateway;
    /// packets to and from other nodes are lost meanwhile.
    pub fn set_internet_link(&self, up: bool) -> Result<(), Error> {
        match &self.node_net {
            Some(net) => net.set_internet_link(up),
            None => Err(Error::Spec(format!(
                "cluster {} has no pod network",
                self.spec.name
            ))),
        }
    }

    /// A command that runs `program` in the node namespace (through `ip
    /// netns exec`), for a pod-network cluster.
    pub fn node_command(&self, program: &str) -> Option<std::process::Command> {
        let netns = self.node_netns()?;
        let mut cmd = std::process::Command::new("ip");
        cmd.args(["netns", "exec", netns, program]);
        Some(cmd)
    }

    /// The API server's port, from its URL.
    fn api_port(&self) -> Option<u16> {
        self.server.rsplit_once(':')?.1.parse().ok()
    }

    /// The name of the host-process node, if the cluster has one.
    pub fn host_node_name(&self) -> Option<&str> {
        self.host_node.as_ref().map(HostNode::name)
    }

    /// Gives image `source` of the real node the name `target` too, as
    /// loading an image under that name into the node would.
    pub fn tag_node_image(&self, source: &str, target: &str) -> Result<(), Error> {
        let node = self
            .real_node
            .as_ref()
            .ok_or_else(|| Error::Spec(format!("cluster {} has no real node", self.spec.name)))?;
        node.containerd()
            .tag(source, target)
            .map_err(|e| Error::Spec(format!("real node {}: {e}", node.name())))
    }

    /// The name of the real node, in the real-node mode.
    pub fn real_node_name(&self) -> Option<&str> {
        self.real_node.as_ref().map(RealNode::name)
    }

    /// The end (100 lines) of the log of every container the host-process
    /// node ran, each under a `==> <namespace>_<pod>_<container>.log <==`
    /// header: what a failing test prints to show the agents' side.
    pub fn pod_logs(&self) -> String {
        hostnode::pod_logs(&self.dir.join("pods"))
    }

    /// The cluster's control-plane processes and their resident memory.
    pub fn processes(&self) -> Vec<ProcessInfo> {
        self.processes
            .iter()
            .map(|p| (p.name().to_owned(), p.pid()))
            .chain(
                self.real_node
                    .as_ref()
                    .and_then(RealNode::pid)
                    .map(|pid| ("real node".to_owned(), pid)),
            )
            .map(|(name, pid)| ProcessInfo {
                name,
                pid,
                resident_bytes: resident_bytes(pid),
            })
            .collect()
    }

    /// What has been done to the kube-apiserver.
    pub fn apiserver_state(&self) -> ApiServerState {
        self.apiserver
            .as_ref()
            .map_or(ApiServerState::Stopped, |a| a.state)
    }

    /// Stops the kube-apiserver with SIGTERM (SIGKILL if it has not exited
    /// after 3 s, as it will not while clients hold watches) and returns
    /// once it has exited, in about 3 s: its port then refuses
    /// connections. The rest of the cluster keeps running (etcd keeps the
    /// data), and [`Cluster::ensure_running`] does not count it as a crash.
    /// Stopping a paused one resumes it first; stopping a stopped one does
    /// nothing.
    pub async fn stop_apiserver(&mut self) -> Result<(), Error> {
        match self.apiserver_state() {
            ApiServerState::Stopped => return Ok(()),
            // A stopped process would hold SIGTERM pending until SIGCONT.
            ApiServerState::Paused => self.resume_apiserver()?,
            ApiServerState::Running => {}
        }
        let api = self
            .apiserver
            .as_mut()
            .expect("invariant: a running kube-apiserver has its launch recorded");
        // Before the signal: if this future is dropped while waiting, the
        // exit is still one that was asked for.
        api.state = ApiServerState::Stopped;
        let process = &mut self.processes[api.index];
        process.terminate();
        let deadline = Instant::now() + APISERVER_STOP_GRACE;
        while process.exited().is_none() {
            if Instant::now() > deadline {
                tracing::debug!(cluster = %self.spec.name, "kube-apiserver still draining watches; killing it");
                process.kill();
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tracing::info!(cluster = %self.spec.name, "kube-apiserver stopped");
        Ok(())
    }

    /// Starts a stopped kube-apiserver again with the same address, port,
    /// certificates and flags, so that [`Cluster::server`], every
    /// kubeconfig and every client made before keep working, and returns
    /// once `/readyz` answers (at most 90 s). Starting a running one does
    /// nothing; a paused one must be resumed instead.
    ///
    /// Like every process of the cluster, the new one is tied to the thread
    /// that calls this (it is killed when that thread ends): call it from
    /// the thread, or the runtime, that started the cluster.
    pub async fn start_apiserver(&mut self) -> Result<(), Error> {
        match self.apiserver_state() {
            ApiServerState::Running => return Ok(()),
            state @ ApiServerState::Paused => {
                return Err(Error::ApiServerState {
                    cluster: self.spec.name.clone(),
                    action: "start",
                    state,
                });
            }
            ApiServerState::Stopped => {}
        }
        let api = self
            .apiserver
            .as_ref()
            .expect("invariant: a stopped kube-apiserver has its launch recorded");
        let log = self.dir.join("logs").join("kube-apiserver.log");
        let process = Process::spawn("kube-apiserver", &api.program, &api.args, &log)
            .map_err(io_error(&api.program))?;
        tracing::info!(cluster = %self.spec.name, pid = process.pid(), "kube-apiserver started again");
        let index = api.index;
        // The old process has exited and been reaped: dropping it is a no-op.
        self.processes[index] = process;
        if let Some(api) = self.apiserver.as_mut() {
            api.state = ApiServerState::Running;
        }
        let client = self.client().await?;
        self.wait_for_apiserver(&client).await
    }

    /// [`Cluster::stop_apiserver`], then [`Cluster::start_apiserver`].
    pub async fn restart_apiserver(&mut self) -> Result<(), Error> {
        self.stop_apiserver().await?;
        self.start_apiserver().await
    }

    /// Freezes the kube-apiserver with SIGSTOP, so that it looks dead
    /// without going away: connections to it are accepted by the kernel and
    /// then hang, requests time out. Returns once the process is stopped.
    /// Pausing a paused one does nothing; a stopped one cannot be paused.
    pub fn pause_apiserver(&mut self) -> Result<(), Error> {
        match self.apiserver_state() {
            ApiServerState::Paused => return Ok(()),
            state @ ApiServerState::Stopped => {
                return Err(Error::ApiServerState {
                    cluster: self.spec.name.clone(),
                    action: "pause",
                    state,
                });
            }
            ApiServerState::Running => {}
        }
        self.signal_apiserver(Signal::SIGSTOP)?;
        if let Some(api) = self.apiserver.as_mut() {
            api.state = ApiServerState::Paused;
        }
        Ok(())
    }

    /// Lets a paused kube-apiserver run again (SIGCONT); the requests that
    /// hung meanwhile are then answered. Resuming a running one does
    /// nothing; a stopped one must be started instead.
    pub fn resume_apiserver(&mut self) -> Result<(), Error> {
        match self.apiserver_state() {
            ApiServerState::Running => return Ok(()),
            state @ ApiServerState::Stopped => {
                return Err(Error::ApiServerState {
                    cluster: self.spec.name.clone(),
                    action: "resume",
                    state,
                });
            }
            ApiServerState::Paused => {}
        }
        self.signal_apiserver(Signal::SIGCONT)?;
        if let Some(api) = self.apiserver.as_mut() {
            api.state = ApiServerState::Running;
        }
        Ok(())
    }

    /// Sends `signal` to the running kube-apiserver and waits (at most 2 s)
    /// until /proc shows it stopped (SIGSTOP) or not (otherwise), so that a
    /// caller's next request meets the new state.
    fn signal_apiserver(&mut self, signal: Signal) -> Result<(), Error> {
        let api = self
            .apiserver
            .as_ref()
            .expect("invariant: only a started kube-apiserver is signalled");
        let process = &mut self.processes[api.index];
        let failed = |source| Error::Signal {
            cluster: self.spec.name.clone(),
            signal: signal.as_str().to_owned(),
            source,
        };
        // An exited child may be reaped and its pid reused: never signal it.
        if process.exited().is_some() {
            return Err(failed(nix::errno::Errno::ESRCH));
        }
        let pid = process.pid();
        kill(Pid::from_raw(pid as i32), signal).map_err(failed)?;
        let want_stopped = signal == Signal::SIGSTOP;
        let deadline = Instant::now() + Duration::from_secs(2);
        while is_stopped(pid) != want_stopped && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Stops every process, the last started first.
    pub fn stop(mut self) {
        self.stop_processes();
    }

    fn stop_processes(&mut self) {
        if let Some(mut host) = self.host_node.take() {
            host.stop();
        }
        self.real_node.take();
        // A paused kube-apiserver would hold SIGTERM pending until killed
        // after the grace period; resumed, it exits at once.
        if self.apiserver_state() == ApiServerState::Paused {
            let _ = self.resume_apiserver();
        }
        while let Some(mut process) = self.processes.pop() {
            process.stop(Duration::from_secs(5));
        }
        // Once nothing runs in it.
        self.node_net.take();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_processes();
    }
}

/// The file (in the cluster's folder) kwok serves as every container's logs.
const KWOK_LOGS_FILE: &str = "kwok-pods.log";

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

/// Whether a process is stopped by a signal (state `T` in /proc).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name, which is in parentheses and
        // may itself hold spaces or parentheses.
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
}

fn node_is_ready(node: &Node) -> bool {
    let has_cidr = node.spec.as_ref().is_some_and(|s| s.pod_cidr.is_some());
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    has_cidr && ready
}

/// A client for a kubeconfig file, using its current context.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, Error> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    kube::Client::try_from(config).map_err(|source| Error::Kube {
        what: "building a client".to_owned(),
        source,
    })
}

/// A kubeconfig with one cluster, one user and one context, all named after
/// the cluster, with certificates embedded.
pub fn kubeconfig_yaml(
    cluster: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    pair: &Pair,
) -> String {
    use base64::Engine as _;
    let auth = kube::config::AuthInfo {
        client_certificate_data: Some(base64::engine::general_purpose::STANDARD.encode(&pair.cert)),
        client_key_data: Some(
            base64::engine::general_purpose::STANDARD
                .encode(&pair.key)
                .into(),
        ),
        ..Default::default()
    };
    kubeconfig(cluster, server, ca_pem, user, auth, None)
}

/// A kubeconfig with one cluster, one user (`auth`) and one context (with
/// `namespace` as its default one), all named after the cluster, as YAML.
pub(crate) fn kubeconfig(
    cluster: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    auth: kube::config::AuthInfo,
    namespace: Option<&str>,
) -> String {
    use base64::Engine as _;
    use kube::config::{Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};
    let config = Kubeconfig {
        api_version: Some("v1".to_owned()),
        kind: Some("Config".to_owned()),
        clusters: vec![NamedCluster {
            name: cluster.to_owned(),
            cluster: Some(kube::config::Cluster {
                server: Some(server.to_owned()),
                certificate_authority_data: Some(
                    base64::engine::general_purpose::STANDARD.encode(ca_pem),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: user.to_owned(),
            auth_info: Some(auth),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: cluster.to_owned(),
            context: Some(Context {
                cluster: cluster.to_owned(),
                user: Some(user.to_owned()),
                namespace: namespace.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some(cluster.to_owned()),
        ..Default::default()
    };
    serde_yaml::to_string(&config).expect("invariant: a kubeconfig always serializes")
}
