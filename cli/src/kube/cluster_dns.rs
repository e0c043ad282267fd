//! Whether a cluster's DNS serves the clusterset's names
//! (`<svc>.<ns>.svc.clusterset.local`, docs/services.md): read from
//! CoreDNS's Corefile, as kubeadm deploys it.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde::Serialize;

use crate::factory::ClusterClient;

/// Whether CoreDNS serves the clusterset's names.
#[derive(Serialize, Debug, Default, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum DnsState {
    /// Its Corefile has the `multicluster` option for `clusterset.local`.
    Serves,
    /// Its Corefile has not.
    NotServed,
    /// No CoreDNS ConfigMap to read (another DNS, or no right to read it).
    #[default]
    Unknown,
}

/// Whether the Corefile in `kube-system/coredns` serves `clusterset.local`
/// from ServiceImports.
pub async fn dns_state(cluster: &ClusterClient) -> DnsState {
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "kube-system");
    match maps.get_opt("coredns").await {
        Ok(Some(map)) => {
            let corefile = map
                .data
                .and_then(|mut d| d.remove("Corefile"))
                .unwrap_or_default();
            if serves_clusterset(&corefile) {
                DnsState::Serves
            } else {
                DnsState::NotServed
            }
        }
        _ => DnsState::Unknown,
    }
}

/// Whether a Corefile has the `kubernetes` plugin's `multicluster`
/// option for `clusterset.local` (comments aside).
pub fn serves_clusterset(corefile: &str) -> bool {
    corefile.lines().any(|line| {
        let line = line.split('#').next().unwrap_or_default();
        let mut words = line.split_whitespace();
        words.next() == Some("multicluster")
            && words.any(|w| w.trim_end_matches('.') == "clusterset.local")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_corefile_serves_the_clusterset_only_with_the_multicluster_option() {
        let on = ".:53 {\n  kubernetes cluster.local clusterset.local {\n    multicluster clusterset.local\n  }\n}\n";
        let kubeadm = ".:53 {\n  kubernetes cluster.local in-addr.arpa ip6.arpa {\n    pods insecure\n  }\n}\n";
        let commented =
            ".:53 {\n  kubernetes cluster.local {\n    # multicluster clusterset.local\n  }\n}\n";
        assert!(serves_clusterset(on));
        assert!(!serves_clusterset(kubeadm));
        assert!(!serves_clusterset(commented));
    }
}
