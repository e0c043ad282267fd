//! What a peering reports when it is done: the report `peer -o json|yaml`
//! prints, or a line each for people.

use std::collections::BTreeMap;

use kube::Api;
use liqo_api::admission::Admission;
use liqo_api::authentication::Tenant;
use liqo_api::sharing::{self, Resources};
use serde::Serialize;

use super::consumer::wait_for_virtual_node;
use super::network;
use super::offloading;
use super::phases::{Made, Peering, Reached};
use crate::cli::OutputFormat;
use crate::factory::ClusterClient;
use crate::printer::Printer;
use crate::show::show_resources;

/// What `peer` reports (`-o json|yaml`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Report {
    pub consumer: String,
    pub provider: String,
    pub provider_cluster_id: String,
    pub grant: Resources,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<sharing::Cost>,
    pub certificate_expiry: String,
    pub tenant_namespace: String,
    pub virtual_node: String,
    /// What the provider admits from this cluster beyond the grant (its
    /// Pod Security level, ...), as its record of this cluster says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terms: Option<Admission>,
    /// The tunnel, unless peered with --no-network.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<network::Linked>,
}

impl Made {
    /// Once the phases of `run` are done, waits for the virtual node on
    /// `consumer`, and reports. Past the phases everything is in place: a
    /// slow node is waited for (until `deadline`; `timeout` seconds, to
    /// say so), not rolled back, and the same command picks up from here.
    pub(crate) async fn finish(
        &self,
        run: &Peering<'_>,
        consumer: &ClusterClient,
        deadline: tokio::time::Instant,
        timeout: u64,
    ) -> anyhow::Result<Report> {
        let provider_id = &self.reached.provider_id.cluster_id;
        let virtual_node =
            wait_for_virtual_node(consumer, provider_id, deadline, timeout, run.printer).await?;
        let terms = self.terms().await?;
        // The namespaces offloaded already to every peer hold its pods to
        // its level too, where it is stricter.
        if let Some(terms) = &terms {
            let known = BTreeMap::from([(
                provider_id.to_string(),
                (terms.clone(), run.granted.grant.clone()),
            )]);
            offloading::follow_levels(consumer, &known).await?;
        }
        let Reached {
            provider,
            tenant,
            expiry,
            ..
        } = &self.reached;
        Ok(Report {
            consumer: consumer.name.clone(),
            // As this run reached it: by its kubeconfig's name, or by the
            // name it gave itself (token, response).
            provider: provider.name.clone(),
            provider_cluster_id: provider_id.to_string(),
            grant: run.granted.grant.clone(),
            cost: run.granted.cost.clone(),
            certificate_expiry: expiry.clone(),
            tenant_namespace: liqo_api::names::peering::tenant_namespace(tenant),
            virtual_node,
            terms,
            network: self.linked.clone(),
        })
    }

    /// The provider's terms for this cluster, from its Tenant record (the
    /// consumer may read its own); `None` from a provider that states
    /// none.
    async fn terms(&self) -> anyhow::Result<Option<Admission>> {
        let provider = &self.reached.provider;
        let records: Api<Tenant> = Api::all(provider.client.clone());
        match records.get_opt(self.reached.tenant.as_str()).await {
            Ok(record) => Ok(record.map(|r| r.spec.admission)),
            Err(kube::Error::Api(s)) if s.code == 403 => Ok(None),
            Err(e) => Err(provider.explain(e, "reading this cluster's terms")),
        }
    }
}

/// What `peer` prints: the reports as asked, else a line each.
pub(crate) fn print_reports(
    reports: &[Report],
    output: Option<OutputFormat>,
    printer: &Printer,
) -> anyhow::Result<()> {
    if let Some(format) = output {
        return match reports {
            [one] => printer.structured(one, format),
            all => printer.structured(&all, format),
        };
    }
    for report in reports {
        printer.result(format!(
            "cluster {} now peers with {} ({}): virtual node {} offers {}",
            report.consumer,
            report.provider,
            report.provider_cluster_id,
            report.virtual_node,
            show_resources(&report.grant)
        ));
        if let Some(terms) = &report.terms {
            printer.result(format!(
                "  terms: its pods run at Pod Security {} there (liqoctl info peer {} says the rest)",
                terms.pod_security, report.provider_cluster_id
            ));
        }
        if let Some(linked) = &report.network {
            printer.result(format!(
                "  network: tunnel to {}; its pods are seen here as {}, ours there as {}",
                linked.endpoint, linked.provider_pods_seen_as, linked.consumer_pods_seen_as
            ));
        }
    }
    Ok(())
}
