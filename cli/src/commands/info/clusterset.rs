//! What `info` says of the clusterset's Services (docs/services.md): this
//! cluster's exports and why any is not valid or conflicts, its imports,
//! and whether its DNS serves `clusterset.local`.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use liqo_api::clusterset::{ServiceExport, ServiceImport, conditions};
use serde::Serialize;

use crate::factory::ClusterClient;

/// The clusterset's Services as this cluster sees them.
#[derive(Serialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClustersetView {
    /// This cluster's ServiceExports, `namespace/name`.
    pub exports: Vec<String>,
    /// Exports that are not valid or conflict: `namespace/name: reason: message`.
    pub problems: Vec<String>,
    /// ServiceImports here, `namespace/name`.
    pub imports: Vec<String>,
    /// Whether the cluster's DNS serves `clusterset.local`.
    pub dns: DnsState,
}

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

impl ClustersetView {
    /// Reads it; nothing when the MCS API is not served.
    pub async fn read(cluster: &ClusterClient) -> anyhow::Result<Self> {
        let exports: Api<ServiceExport> = Api::all(cluster.client.clone());
        let exports = match exports.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => Vec::new(),
            Err(e) => return Err(cluster.explain(e, "listing the ServiceExports")),
        };
        let imports: Api<ServiceImport> = Api::all(cluster.client.clone());
        let imports = match imports.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => Vec::new(),
            Err(e) => return Err(cluster.explain(e, "listing the ServiceImports")),
        };
        let key = |ns: Option<String>, name: String| format!("{}/{name}", ns.unwrap_or_default());
        let problems = exports
            .iter()
            .flat_map(|e| {
                let at = key(e.metadata.namespace.clone(), e.name_any());
                e.status
                    .iter()
                    .flat_map(|s| s.conditions.iter())
                    .filter(|c| {
                        (c.type_ == conditions::VALID && c.status == "False")
                            || (c.type_ == conditions::CONFLICT && c.status == "True")
                    })
                    .map(move |c| format!("{at}: {}: {}", c.reason, c.message))
                    .collect::<Vec<_>>()
            })
            .collect();
        Ok(Self {
            exports: exports
                .iter()
                .map(|e| key(e.metadata.namespace.clone(), e.name_any()))
                .collect(),
            problems,
            imports: imports
                .iter()
                .map(|i| key(i.namespace(), i.name_any()))
                .collect(),
            dns: dns_state(cluster).await,
        })
    }

    /// Its lines, for the human output.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "Clusterset services: {} exported here, {} imported (docs/services.md)",
            self.exports.len(),
            self.imports.len()
        )];
        out.extend(self.problems.iter().map(|p| format!("  export {p}")));
        match self.dns {
            DnsState::Serves => {}
            DnsState::NotServed => out.extend([
                "  DNS: CoreDNS does not serve clusterset.local: imports answer at their"
                    .to_owned(),
                "  clusterset IP only (docs/services.md, \"DNS\", says how to turn it on)"
                    .to_owned(),
            ]),
            DnsState::Unknown => out.extend([
                "  DNS: no CoreDNS ConfigMap (kube-system/coredns) to read: whether".to_owned(),
                "  clusterset.local resolves here is not known".to_owned(),
            ]),
        }
        out
    }
}

/// Whether the Corefile in `kube-system/coredns` serves `clusterset.local`
/// from ServiceImports.
async fn dns_state(cluster: &ClusterClient) -> DnsState {
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
