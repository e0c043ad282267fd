//! What `info` says of the clusterset's Services (docs/services.md): this
//! cluster's exports and why any is not valid or conflicts, its imports,
//! and whether its DNS serves `clusterset.local`.

use kube::ResourceExt;
use kube::api::{Api, ListParams};
use liqo_api::clusterset::{ServiceExport, ServiceImport, conditions};
use serde::Serialize;

use crate::factory::ClusterClient;
use crate::kube::cluster_dns::{DnsState, dns_state};

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
