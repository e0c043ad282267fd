//! The response phase of `peer complete`: the certificate the provider
//! signed for the consumer's pending request, checked by the command
//! already, kept in the consumer's identity Secret. Removed with it.

use super::{Credentials, Peering};
use crate::peering::journal::Journal;
use crate::peering::{PEER_AGAIN, identity, refuse_foreign};

pub(super) async fn apply(run: &mut Peering<'_>, journal: &mut Journal) -> anyhow::Result<()> {
    let Credentials::Response { kubeconfig, expiry } = run.credentials else {
        anyhow::bail!("invariant: the response phase runs with a response");
    };
    let provider_id = &run.provider_id()?.cluster_id;
    let secret = identity::secret(provider_id, kubeconfig, Default::default());
    refuse_foreign(run.consumer()?, std::slice::from_ref(&secret), PEER_AGAIN).await?;
    journal.apply(run.consumer()?, secret).await?;
    run.expiry = Some(expiry.to_owned());
    run.tenant = Some(run.consumer_id.cluster_id.clone());
    Ok(())
}
