use super::resolve::{covering, default_name, first_cidr, kube_proxy_cidr, kubeadm_pod_subnet};
use super::*;

#[test]
fn kube_proxy_cluster_cidr_is_read_from_yaml() {
    let config = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
                      # clusterCIDR: 192.168.0.0/16 in a comment is not it\n\
                      clusterCIDR: \"10.244.0.0/16,fd00::/48\"\nmode: iptables\n";
    assert_eq!(
        kube_proxy_cidr(config),
        Some("10.244.0.0/16".parse().expect("net"))
    );
    assert_eq!(kube_proxy_cidr("mode: ipvs\n"), None);
    assert_eq!(kube_proxy_cidr("{ not yaml"), None);
}

#[test]
fn kubeadm_pod_subnet_is_read_from_its_cluster_configuration() {
    // As kind writes it.
    let config = "apiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\n\
                  kubernetesVersion: v1.34.4\nnetworking:\n  dnsDomain: cluster.local\n\
                  \x20 podSubnet: 10.244.0.0/16\n  serviceSubnet: 10.96.0.0/16\n";
    assert_eq!(
        kubeadm_pod_subnet(config),
        Some("10.244.0.0/16".parse().expect("net"))
    );
    assert_eq!(
        kubeadm_pod_subnet("networking:\n  serviceSubnet: 10.96.0.0/16\n"),
        None
    );
    assert_eq!(kubeadm_pod_subnet("{ not yaml"), None);
}

#[test]
fn covering_network_of_node_cidrs() {
    let nets = ["10.201.0.0/24", "10.201.1.0/24", "10.201.2.0/24"].map(|n| n.parse().expect("net"));
    assert_eq!(
        covering(nets.into_iter()).map(|n| n.to_string()).as_deref(),
        Some("10.201.0.0/22")
    );
    assert_eq!(covering(std::iter::empty()), None);
}

#[test]
fn first_cidr_of_a_dual_stack_list() {
    assert_eq!(
        first_cidr("10.244.0.0/16,fd00::/48")
            .map(|n| n.to_string())
            .as_deref(),
        Some("10.244.0.0/16")
    );
    assert_eq!(
        first_cidr("10.244.1.7/16")
            .map(|n| n.to_string())
            .as_deref(),
        Some("10.244.0.0/16")
    );
    assert_eq!(first_cidr("nonsense"), None);
}

#[test]
fn default_names_are_dns_labels() {
    let id = ClusterId::new("0f3c9a1e-7d2b").expect("valid");
    assert_eq!(default_name("kind-Home_1", &id), "kind-home-1");
    assert_eq!(
        default_name("https://127.0.0.1:6443/", &id),
        "cluster-0f3c9a1e"
    );
    assert_eq!(default_name("---", &id), "cluster-0f3c9a1e");
}
