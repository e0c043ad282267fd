//! The virtual kubelet's flags and environment.

use std::net::IpAddr;

use super::{DEFAULT_HEALTH_ADDR, ListenAddr, env};

/// The port of the kubelet API on the agent's pod IP.
pub const KUBELET_PORT: u16 = 10250;

/// The port of the placement webhook on the agent's pod IP.
pub const PLACEMENT_PORT: u16 = 9443;

/// The port of the names server on the agent's pod IP: what offloaded
/// pods resolve the consumer's names with (docs/offloading.md, "Names").
pub const DNS_PORT: u16 = 10053;

/// The consumer's cluster domain unless told.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct VirtualKubeletFlags {
    /// The local ForeignCluster of the provider this node stands for.
    #[arg(long, env = env::FOREIGN_CLUSTER)]
    pub foreign_cluster: String,
    /// The Secret in `liqo` whose key `kubeconfig` reaches the provider's
    /// API as this cluster (the peering's identity): followed through the
    /// API, waited for when it does not exist yet, used again whenever its
    /// kubeconfig changes.
    #[arg(long, env = env::PROVIDER_SECRET)]
    pub provider_secret: String,
    /// The virtual node's name.
    #[arg(long, env = env::NODE_NAME)]
    pub node_name: String,
    /// Where to serve /healthz and /readyz.
    #[arg(long, env = env::HEALTH_ADDR, default_value_t = DEFAULT_HEALTH_ADDR)]
    pub health_addr: ListenAddr,
    /// The consumer's API as the provider's pods reach it (`host:port`),
    /// given to offloaded pods that mount their service account token;
    /// by default, the address this agent reaches it at.
    #[arg(long, env = env::CONSUMER_API_ADDRESS)]
    pub consumer_api_address: Option<String>,
    /// Where to serve the kubelet API (TLS); port 0 picks a free port.
    /// The port bound is registered on the Node. Not served when unset.
    #[arg(long, env = env::KUBELET_ADDR)]
    pub kubelet_addr: Option<ListenAddr>,
    /// The address the API server reaches the kubelet API at (the
    /// agent's pod IP); by default the address of `--kubelet-addr`.
    #[arg(long, env = env::POD_IP)]
    pub node_ip: Option<IpAddr>,
    /// Where to serve the placement webhook (TLS, with the Secret
    /// `liqo/liqo-placement-tls`), for clusters without
    /// MutatingAdmissionPolicy. Not served when unset.
    #[arg(long, env = env::PLACEMENT_ADDR)]
    pub placement_addr: Option<ListenAddr>,
    /// How long an offloaded pod may wait unschedulable on the provider, in
    /// seconds, before it is failed here with the provider's reason and
    /// removed there, so that its controller makes a new one.
    #[arg(long, default_value_t = DEFAULT_UNSCHEDULABLE_TIMEOUT)]
    pub unschedulable_timeout: u64,
    /// Where to serve the names of the offloaded namespaces' Services to
    /// the offloaded pods (DNS, UDP and TCP), which reach it through the
    /// tunnel. Offloaded pods use the provider's DNS when unset.
    #[arg(long, env = env::DNS_ADDR)]
    pub dns_addr: Option<ListenAddr>,
    /// The consumer's cluster domain, in which offloaded pods resolve the
    /// consumer's names.
    #[arg(long, default_value = DEFAULT_CLUSTER_DOMAIN)]
    pub cluster_domain: String,
}

/// `--unschedulable-timeout` when not given: two minutes.
pub const DEFAULT_UNSCHEDULABLE_TIMEOUT: u64 = 120;

impl VirtualKubeletFlags {
    /// The container's `args` liqoctl gives a virtual kubelet in a pod:
    /// its servers on the pod's IP (several virtual kubelets on one host
    /// network do not clash). The peering's names go in its environment
    /// ([`Self::to_env`]).
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![format!("--health-addr={}", self.health_addr)];
        if let Some(addr) = self.kubelet_addr {
            args.push(format!("--kubelet-addr={addr}"));
        }
        if let Some(addr) = self.placement_addr {
            args.push(format!("--placement-addr={addr}"));
        }
        if let Some(addr) = self.dns_addr {
            args.push(format!("--dns-addr={addr}"));
        }
        if self.cluster_domain != DEFAULT_CLUSTER_DOMAIN {
            args.push(format!("--cluster-domain={}", self.cluster_domain));
        }
        if let Some(address) = &self.consumer_api_address {
            args.push(format!("--consumer-api-address={address}"));
        }
        if self.unschedulable_timeout != DEFAULT_UNSCHEDULABLE_TIMEOUT {
            args.push(format!(
                "--unschedulable-timeout={}",
                self.unschedulable_timeout
            ));
        }
        args
    }

    /// The container's environment of the peering's names: (name, value).
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        vec![
            (env::FOREIGN_CLUSTER, self.foreign_cluster.clone()),
            (env::NODE_NAME, self.node_name.clone()),
            (env::PROVIDER_SECRET, self.provider_secret.clone()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_liqoctl_renders_the_agent_parses_back() {
        let flags = VirtualKubeletFlags {
            foreign_cluster: "provider-1".to_owned(),
            provider_secret: "liqo-identity-provider-1".to_owned(),
            node_name: "liqo-provider-1".to_owned(),
            health_addr: ListenAddr::PodIp { port: 8081 },
            consumer_api_address: None,
            kubelet_addr: Some(ListenAddr::PodIp { port: KUBELET_PORT }),
            node_ip: None,
            placement_addr: Some(ListenAddr::PodIp {
                port: PLACEMENT_PORT,
            }),
            unschedulable_timeout: DEFAULT_UNSCHEDULABLE_TIMEOUT,
            dns_addr: Some(ListenAddr::PodIp { port: DNS_PORT }),
            cluster_domain: "corp.example".to_owned(),
        };
        let mut args: Vec<String> = flags.to_args();
        assert_eq!(
            args,
            [
                "--health-addr=$(POD_IP):8081",
                "--kubelet-addr=$(POD_IP):10250",
                "--placement-addr=$(POD_IP):9443",
                "--dns-addr=$(POD_IP):10053",
                "--cluster-domain=corp.example",
            ]
        );
        for (name, value) in flags.to_env() {
            let flag = match name {
                env::FOREIGN_CLUSTER => "--foreign-cluster",
                env::NODE_NAME => "--node-name",
                env::PROVIDER_SECRET => "--provider-secret",
                other => panic!("unexpected {other}"),
            };
            args.push(format!("{flag}={value}"));
        }
        let parsed: VirtualKubeletFlags =
            super::super::parse_args("liqo-virtual-kubelet", &args).expect("parses");
        assert_eq!(parsed, flags);
    }
}
