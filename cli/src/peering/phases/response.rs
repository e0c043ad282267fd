//! The response phase of `peer complete`: the certificate the provider
//! signed for the consumer's pending request, checked by the command
//! already, kept in the consumer's identity Secret. Removed with it.

use super::{Peering, Reached, WithResponse};
use crate::factory::ClusterClient;
use crate::peering::journal::Journal;
use crate::peering::{PEER_AGAIN, identity, refuse_foreign};

pub(super) async fn apply(
    run: &Peering<'_>,
    consumer: &ClusterClient,
    response: &WithResponse<'_>,
    journal: &mut Journal,
) -> anyhow::Result<Reached> {
    let provider_id = &response.provider_id.cluster_id;
    let secret = identity::secret(provider_id, response.kubeconfig, Default::default());
    refuse_foreign(consumer, std::slice::from_ref(&secret), PEER_AGAIN).await?;
    journal.apply(consumer, secret).await?;
    Ok(Reached {
        provider: response.provider.clone(),
        provider_id: response.provider_id.clone(),
        tenant: run.consumer_id.cluster_id.clone(),
        expiry: response.expiry.to_owned(),
    })
}
