//! Starting the cluster's processes: etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and kwok, in that order, each
//! once the one before answers; then its nodes and, with a node
//! namespace, kube-proxy.

use std::net::IpAddr;
use std::path::Path;

use super::credentials::{Certificates, FRONT_PROXY_CLIENT, Kubeconfigs};
use super::{ApiServer, ApiServerState, Cluster, ClusterSpec, KWOK_ANNOTATION, Uplink, kwok};
use crate::hostnode::{self, HostNodeConfig, PodNetworkConfig};
use crate::podnet::NodeNet;
use crate::podnet::relay::ApiService;
use crate::ports::free_port;
use crate::process::{self, Process};
use crate::realnode::{self, AddOns, RealNode, RealNodeConfig};
use crate::toolchain::Toolchain;
use crate::{Error, io_error};

/// The port kube-proxy answers `/healthz` on, at the node's address.
const KUBE_PROXY_HEALTHZ_PORT: u16 = 10256;

impl Cluster {
    pub(super) async fn start_once(
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

        let Certificates {
            ca,
            ca_crt,
            ca_key,
            serving_crt,
            serving_key,
            kubelet_client_crt,
            kubelet_client_key,
            front_proxy_ca_crt,
            front_proxy_crt,
            front_proxy_key,
            sa_key,
            sa_pub,
        } = Certificates::write(&spec, &pki_dir)?;

        let etcd_port = free_port().map_err(io_error(dir))?;
        let etcd_peer_port = free_port().map_err(io_error(dir))?;
        let api_port = free_port().map_err(io_error(dir))?;
        let kwok_port = free_port().map_err(io_error(dir))?;
        let server = format!("https://127.0.0.1:{api_port}");

        let Kubeconfigs {
            admin: kubeconfig,
            controller_manager: kcm_kubeconfig,
            scheduler: scheduler_kubeconfig,
            kwok: kwok_kubeconfig,
            kube_proxy: kube_proxy_kubeconfig,
            kubelet: kubelet_kubeconfig,
        } = Kubeconfigs::write(&ca, &spec, dir, &server, uplink.is_some())?;

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
        // Its config: see `kwok::write_config`.
        let kwok_config = kwok::write_config(dir)?;
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
                agent_images: spec.agent_images.as_deref().map(absolute).transpose()?,
                service,
                egress_socket: absolute(&egress_socket)?,
                api_port,
                without_tun: spec.real_node_without_tun,
                cluster_dns: crate::dns::service_ip(&spec)?,
                add_ons: AddOns {
                    coredns: toolchain.binary("coredns"),
                    local_path_provisioner: toolchain.binary("local-path-provisioner"),
                },
            };
            let node = config.node_name.clone();
            cluster.start_real_node(config, &client).await?;
            crate::dns::deploy(&client, crate::dns::service_ip(&spec)?, &node).await?;
            // The volumes' folders: the node's, on this machine.
            let storage = absolute(&crate::storage::folder(dir))?;
            std::fs::create_dir_all(&storage).map_err(io_error(&storage))?;
            crate::storage::deploy(&client, &storage, &node).await?;
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

    fn spawn(&mut self, toolchain: &Toolchain, name: &str, args: Vec<String>) -> Result<(), Error> {
        let log = self.dir.join("logs").join(format!("{name}.log"));
        let process = Process::spawn(name, &toolchain.binary(name), &args, &log)
            .map_err(io_error(&toolchain.binary(name)))?;
        tracing::debug!(cluster = %self.spec.name, %name, pid = process.pid(), "started");
        self.processes.push(process);
        Ok(())
    }
}
