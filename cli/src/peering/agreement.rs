//! What a provider agrees to grant a consumer, checked with the
//! provider's administrator's credentials before anything is written:
//! both installed, not the same cluster, compatible versions, the
//! provider's sharing policy, and the grant from its free capacity now.

use kube::api::Api;
use liqo_api::ClusterIdentity;
use liqo_api::authentication::Tenant;
use liqo_api::sharing::{self, AboveOffer, Amounts, Resources, SharingError, SharingPolicySpec};

use super::phases::Granted;
use super::{capacity, check_compatible, terms};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::cluster::installed;

/// Everything decided before anything is written.
pub(crate) struct Agreement {
    pub consumer_id: ClusterIdentity,
    pub provider_id: ClusterIdentity,
    pub policy: SharingPolicySpec,
    pub request: Option<Resources>,
    pub grant: Resources,
}

impl Agreement {
    /// What `provider` grants the consumer `consumer_id` (called
    /// `consumer_name` in messages), checked as `liqoctl peer`
    /// checks it.
    pub(crate) async fn for_consumer(
        consumer_id: ClusterIdentity,
        consumer_name: &str,
        provider: &ClusterClient,
        request: Option<&Amounts>,
        require_request: bool,
    ) -> anyhow::Result<Self> {
        let provider_id = installed(provider).await?;
        if consumer_id.cluster_id == provider_id.cluster_id {
            return Err(UserError::Refused(format!(
                "cluster {} and cluster {} are the same cluster ({}); a cluster cannot peer with itself",
                consumer_name, provider.name, consumer_id.cluster_id
            ))
            .into());
        }
        check_compatible(&provider.name, &provider_id.version)?;

        let policy = terms::policy_for(provider, Some(&consumer_id.cluster_id)).await?;
        let tenants: Api<Tenant> = Api::all(provider.client.clone());
        let known = tenants
            .get_opt(consumer_id.cluster_id.as_str())
            .await
            .map_err(|e| provider.explain(e, "reading the tenants"))?
            .is_some();
        if !policy.accept_new_peers && !known {
            return Err(UserError::Refused(format!(
                "cluster {} accepts no new peers (its sharing policy says so); ask its administrator",
                provider.name
            ))
            .into());
        }
        let grant = grant_for(
            provider,
            &policy,
            Some(&consumer_id.cluster_id),
            request,
            require_request,
        )
        .await?;
        Ok(Self {
            consumer_id,
            provider_id,
            policy,
            request: request.map(|r| r.to_resources()),
            grant,
        })
    }

    /// What the peering records of it.
    pub(crate) fn granted(&self) -> Granted {
        Granted {
            request: self.request.clone(),
            grant: self.grant.clone(),
            cost: self.policy.cost.clone(),
        }
    }
}

/// What `provider` grants under `policy` for `request`, from its free
/// capacity now as `tenant` (when known) sees it.
pub(crate) async fn grant_for(
    provider: &ClusterClient,
    policy: &SharingPolicySpec,
    tenant: Option<&liqo_api::ClusterId>,
    request: Option<&Amounts>,
    require_request: bool,
) -> anyhow::Result<Resources> {
    let free = capacity::free_for(provider, tenant).await?;
    let offer = sharing::offered(policy, free).map_err(|e| {
        UserError::Refused(format!(
            "the sharing policy of cluster {} is not valid: {e}",
            provider.name
        ))
    })?;
    let above = if require_request {
        AboveOffer::Refuse
    } else {
        AboveOffer::Clamp
    };
    let grant = sharing::grant(request.copied(), offer, above).map_err(|e| match e {
        SharingError::AboveOffer { .. } => UserError::Refused(format!(
            "cluster {} cannot grant the request: {e}; ask for less, or drop --require-request to take what it offers",
            provider.name
        )),
        other => UserError::Refused(other.to_string()),
    })?;
    Ok(grant.to_resources())
}
