//! The network phase: both ends of the tunnel between the two gateways
//! ([`crate::peering::network`]), written with whatever credentials reach
//! the provider. Removed on both clusters when the provider is reached;
//! otherwise the provider's end goes with the tenant namespace.

use liqo_api::names::peering::tenant_namespace;

use super::{Ends, Peering, Reached};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::peering::journal::Journal;
use crate::peering::network::{self, Linked};

pub(super) async fn apply(
    run: &Peering<'_>,
    consumer: &ClusterClient,
    reached: &Reached,
    journal: &mut Journal,
) -> anyhow::Result<Linked> {
    network::connect(
        consumer,
        &run.consumer_id,
        &reached.provider,
        &reached.provider_id,
        &tenant_namespace(&reached.tenant),
        journal,
        run.printer,
    )
    .await
}

pub(super) async fn remove(
    ends: &Ends<'_>,
    consumer: &ClusterClient,
) -> anyhow::Result<Vec<String>> {
    let namespace = tenant_namespace(&ends.tenant);
    let provider_end = ends
        .provider
        .map(|p| (p, namespace.as_str(), &ends.consumer_id));
    match network::disconnect(consumer, &ends.provider_id, provider_end).await {
        Ok(_) => Ok(Vec::new()),
        // The provider no longer accepts the peering's credential: it
        // ended the tenancy, and the provider's end went with it.
        Err(e) if matches!(e.downcast_ref(), Some(UserError::Unauthenticated(_))) => {
            network::disconnect(consumer, &ends.provider_id, None).await?;
            Ok(Vec::new())
        }
        Err(e) => Err(e),
    }
}
