//! A peering made with both administrators' kubeconfigs, in one
//! direction: `liqoctl peer --remote-kubeconfig` (and `--bidirectional`)
//! and `liqoctl tether` run it. Checks everything it can before it writes
//! (both installed, versions, the provider's policy and the grant), then
//! runs the [`super::phases`] of
//! [`super::phases::BY_KUBECONFIGS`].

use liqo_api::sharing::Amounts;

use crate::factory::ClusterClient;
use crate::kube::cluster::installed;
use crate::peering::agreement::Agreement;
use crate::peering::check_compatible;
use crate::peering::phases::{Administrator, Credentials, Peering};
use crate::peering::report::Report;
use crate::printer::Printer;
use crate::show::show_resources;

/// What the consumer asks of the peering.
pub(crate) struct Asked<'a> {
    /// The resources it asks for; what the policy offers when `None`.
    pub request: Option<&'a Amounts>,
    /// Refuse a grant smaller than the request.
    pub require_request: bool,
    /// Issue a new certificate whatever the current one's state.
    pub renew: bool,
    pub certificate_lifetime: Option<u64>,
    /// Link the pod networks.
    pub network: bool,
    /// The command's timeout, in seconds (to say so).
    pub timeout: u64,
}

/// One direction: `consumer` peers with `provider`.
pub(crate) async fn peer(
    consumer: &ClusterClient,
    provider: &ClusterClient,
    asked: &Asked<'_>,
    printer: &Printer,
    deadline: tokio::time::Instant,
) -> anyhow::Result<Report> {
    let step = printer.step(format!(
        "Checking clusters {} and {}",
        consumer.name, provider.name
    ));
    let agreement = match agree(consumer, provider, asked).await {
        Ok(agreement) => agreement,
        Err(e) => {
            step.fail("");
            return Err(e);
        }
    };
    step.done(format!("grant {}", show_resources(&agreement.grant)));

    let run = Peering {
        consumer_id: agreement.consumer_id.clone(),
        granted: agreement.granted(),
        printer,
    };
    let credentials = Credentials::Administrator {
        admin: Administrator {
            provider,
            provider_id: &agreement.provider_id,
            policy: &agreement.policy,
            certificate_lifetime: asked.certificate_lifetime,
        },
        renew: asked.renew,
    };
    let made = run.run(consumer, &credentials, asked.network).await?;
    made.finish(&run, consumer, deadline, asked.timeout).await
}

/// Checks the consumer (installed, of a compatible version), then what
/// the provider grants it.
async fn agree(
    consumer: &ClusterClient,
    provider: &ClusterClient,
    asked: &Asked<'_>,
) -> anyhow::Result<Agreement> {
    let consumer_id = installed(consumer).await?;
    check_compatible(&consumer.name, &consumer_id.version)?;
    Agreement::for_consumer(
        consumer_id,
        &consumer.name,
        provider,
        asked.request,
        asked.require_request,
    )
    .await
}
