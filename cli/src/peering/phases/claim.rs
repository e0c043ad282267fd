//! The claim phase of `peer --token`: with the token's bootstrap
//! credential, the consumer claims the first tenant of the token still
//! free and mints that tenant's credential, bound to the claim; the
//! credential is kept in the consumer's identity Secret at once, since it
//! is where a re-run resumes (a claim cannot be made twice). Every later
//! phase reaches the provider as the tenant. Removed as the tenant: its
//! twin namespaces and its Tenant record, whose dependents the provider's
//! garbage collector removes.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Resource as _;
use kube::api::{Api, DeleteParams, PostParams};
use liqo_api::authentication::{Tenant, peer_user};
use liqo_api::names;
use liqo_api::offloading::NamespaceOffloading;
use liqo_api::token::{PeeringToken, TokenTenant, objects};
use liqo_api::{ClusterId, ClusterIdentity};

use super::{Ends, Peering, Reached, WithToken};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::apply;
use crate::kube::cluster::installed;
use crate::manifests::peering_token as token;
use crate::peering::held_tokens::mint;
use crate::peering::outgoing::{Identity, identity_of};
use crate::peering::{PEER_AGAIN, check_compatible, identity, refuse_foreign};

/// How long a tenant's credential lives when `peer --certificate-lifetime`
/// does not say: a year, as a kubeadm signer's certificates.
const CREDENTIAL_LIFETIME: u64 = 365 * 24 * 3600;

pub(super) async fn apply(
    run: &Peering<'_>,
    consumer: &ClusterClient,
    with: &WithToken<'_>,
) -> anyhow::Result<Reached> {
    let token = with.token;
    // An earlier run's identity is where this one resumes.
    let (tenant, kubeconfig, expiry) =
        match identity_of(consumer, &token.provider_cluster_id).await? {
            Identity::Token {
                tenant,
                kubeconfig,
                expiry,
            } => (tenant, kubeconfig, expiry),
            Identity::Certificate => {
                return Err(UserError::Refused(format!(
                    "cluster {} already peers with {} through a certificate; unpeer first to peer \
                 again with a token",
                    consumer.name, token.provider_cluster_id
                ))
                .into());
            }
            Identity::Absent => claim_and_mint(run, consumer, with).await?,
        };

    // From here on, everything on the provider is done as the tenant.
    let step = run.printer.step(format!(
        "Checking cluster {} as tenant {tenant}",
        token.provider_cluster_name
    ));
    let checked = async {
        let provider =
            ClusterClient::from_kubeconfig_yaml(&token.provider_cluster_name, &kubeconfig).await?;
        let provider_id = check_tenant(&provider, &tenant, token).await?;
        anyhow::Ok((provider, provider_id))
    }
    .await;
    let (provider, provider_id) = match checked {
        Ok(checked) => checked,
        Err(e) => {
            step.fail("");
            return Err(e);
        }
    };
    step.done("");
    Ok(Reached {
        provider,
        provider_id,
        tenant,
        expiry,
    })
}

/// With the token's bootstrap credential: checks the provider is the one
/// the token names, claims the first tenant still free, mints that
/// tenant's credential and keeps it. Returns the tenant, its kubeconfig
/// and when it expires.
async fn claim_and_mint(
    run: &Peering<'_>,
    consumer: &ClusterClient,
    with: &WithToken<'_>,
) -> anyhow::Result<(ClusterId, String, String)> {
    let WithToken {
        token,
        ca_pem,
        fingerprint,
        credential_lifetime,
    } = *with;
    let step = run.printer.step(format!(
        "Claiming a tenant on cluster {} with token {}",
        token.provider_cluster_name, token.id
    ));
    let outcome = async {
        let bootstrap_config = identity::kubeconfig_with(
            token.provider_cluster_id.as_str(),
            &token.api_server,
            Some(ca_pem),
            &objects::bootstrap(&token.id),
            kube::config::AuthInfo {
                token: Some(token.bootstrap.clone().into()),
                ..Default::default()
            },
        )?;
        let bootstrap =
            ClusterClient::from_kubeconfig_yaml(&token.provider_cluster_name, &bootstrap_config)
                .await?;
        let provider_id = installed(&bootstrap)
            .await
            .map_err(|e| spent_or(e, token))?;
        check_provider(&provider_id, token)?;
        let (tenant, claim_uid) = claim(&bootstrap, token, &run.consumer_id).await?;
        let lifetime = credential_lifetime.unwrap_or(CREDENTIAL_LIFETIME);
        let (credential, expires) = mint(
            &bootstrap,
            &objects::tenant_account(&tenant.id),
            &objects::claim(&token.id, &tenant.id),
            &claim_uid,
            lifetime,
        )
        .await
        .map_err(|e| bootstrap.explain(e, "minting the tenant's credential"))?;
        // The last tenant taken: the token has no use left; revoke it now
        // rather than at its expiry.
        if token.tenants.last().map(|t| &t.id) == Some(&tenant.id) {
            let secrets: Api<Secret> = Api::namespaced(bootstrap.client.clone(), names::NAMESPACE);
            if let Err(error) = secrets
                .delete(&objects::bootstrap(&token.id), &DeleteParams::background())
                .await
            {
                tracing::debug!(%error, "the spent token could not revoke itself");
            }
        }
        let kubeconfig = identity::token_kubeconfig(
            token.provider_cluster_id.as_str(),
            &token.api_server,
            ca_pem,
            &peer_user(&tenant.id),
            &credential,
        )?;
        // As a certificate's expiry is shown (RFC 2822), for `info`.
        let expiry = k8s_openapi::jiff::fmt::rfc2822::DateTimePrinter::new()
            .timestamp_to_string(&expires)
            .unwrap_or_else(|_| expires.to_string());
        let secret = identity::secret(
            &token.provider_cluster_id,
            &kubeconfig,
            [
                (token::TENANT_ANNOTATION, tenant.id.as_str()),
                (token::TOKEN_LABEL, token.id.as_str()),
                (token::EXPIRES_ANNOTATION, expiry.as_str()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        );
        refuse_foreign(consumer, std::slice::from_ref(&secret), PEER_AGAIN).await?;
        apply::apply(consumer, &secret).await?;
        anyhow::Ok((tenant.id, kubeconfig, expiry))
    }
    .await;
    match outcome {
        Ok(claimed) => {
            step.done(format!("tenant {}, CA {fingerprint}", claimed.0));
            Ok(claimed)
        }
        Err(e) => {
            step.fail("");
            Err(e)
        }
    }
}

/// A 401 with the bootstrap credential means the token was revoked or has
/// expired (its anchor deleted when its last tenant was taken, too).
fn spent_or(e: anyhow::Error, token: &PeeringToken) -> anyhow::Error {
    let unauthorized = e
        .downcast_ref::<UserError>()
        .is_some_and(|u| matches!(u, UserError::Unauthenticated(_)));
    if unauthorized {
        return UserError::Refused(format!(
            "cluster {} does not accept the peering token {}: it was revoked, used up or has \
             expired; ask its administrator for a new one",
            token.provider_cluster_name, token.id
        ))
        .into();
    }
    e
}

fn check_provider(provider: &ClusterIdentity, token: &PeeringToken) -> anyhow::Result<()> {
    if provider.cluster_id != token.provider_cluster_id {
        return Err(UserError::Refused(format!(
            "the API server at {} is cluster {}, not cluster {} that the peering token names",
            token.api_server, provider.cluster_id, token.provider_cluster_id
        ))
        .into());
    }
    check_compatible(&token.provider_cluster_name, &provider.version)?;
    Ok(())
}

/// Creates the claim of the first tenant of the token not yet claimed;
/// returns it and the claim's UID.
async fn claim(
    bootstrap: &ClusterClient,
    token: &PeeringToken,
    consumer: &ClusterIdentity,
) -> anyhow::Result<(TokenTenant, String)> {
    let secrets: Api<Secret> = Api::namespaced(bootstrap.client.clone(), names::NAMESPACE);
    for t in &token.tenants {
        let owner = token::owner("Tenant", &Tenant::api_version(&()), t.id.as_str(), &t.uid);
        let mut claim = token::claim(&token.id, &t.id, consumer);
        claim.metadata.owner_references = Some(vec![owner]);
        match secrets.create(&PostParams::default(), &claim).await {
            Ok(created) => return Ok((t.clone(), created.metadata.uid.unwrap_or_default())),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => {
                return Err(spent_or(bootstrap.explain(e, "claiming a tenant"), token));
            }
        }
    }
    Err(UserError::Refused(format!(
        "the peering token {} is used up: {} of {} tenant(s) claimed; ask the administrator of \
         cluster {} for a new one",
        token.id,
        token.tenants.len(),
        token.tenants.len(),
        token.provider_cluster_name
    ))
    .into())
}

/// The provider's identity, read as the tenant, after checking the
/// credential acts as that tenant.
async fn check_tenant(
    provider: &ClusterClient,
    tenant: &ClusterId,
    token: &PeeringToken,
) -> anyhow::Result<ClusterIdentity> {
    let reviews: Api<SelfSubjectReview> = Api::all(provider.client.clone());
    let review = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 401 => UserError::Refused(format!(
                "cluster {} no longer accepts this peering's credential (its tenant {tenant} was \
                 ended there); remove it with `liqoctl unpeer --force --cluster-id {}`",
                provider.name, token.provider_cluster_id
            ))
            .into(),
            other => provider.explain(other, "checking the tenant's credential"),
        })?;
    let user = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default();
    if user != peer_user(tenant) {
        return Err(UserError::Refused(format!(
            "cluster {} knows this peering's credential as {user:?}, not as tenant {tenant}",
            provider.name
        ))
        .into());
    }
    let id = installed(provider).await?;
    check_provider(&id, token)?;
    Ok(id)
}

/// Ends the tenancy as the tenant: deletes its twin namespaces and its
/// Tenant record on the provider (the provider's garbage collector
/// removes everything the record owns: namespace, RBAC, quota, account,
/// claim), then the consumer's identity Secret.
pub(super) async fn remove(
    ends: &Ends<'_>,
    consumer: &ClusterClient,
) -> anyhow::Result<Vec<String>> {
    let mut notes = Vec::new();
    if let Some(provider) = ends.provider {
        let provider_id = &ends.provider_id;
        let namespaces: Api<Namespace> = Api::all(provider.client.clone());
        for twin in twins_on(consumer, provider_id).await? {
            match namespaces.delete(&twin, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => notes.push(format!(
                    "twin namespace {twin} on cluster {provider_id}: {e}"
                )),
            }
        }
        let tenants: Api<Tenant> = Api::all(provider.client.clone());
        match tenants
            .delete(ends.tenant.as_str(), &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            // The provider ended the tenancy already: nothing left to delete.
            Err(kube::Error::Api(s)) if s.code == 401 => notes.push(format!(
                "cluster {provider_id} no longer accepts this peering's credential: its \
                 administrator ended the tenancy already"
            )),
            Err(e) => {
                return Err(provider.explain(e, &format!("ending the tenancy {}", ends.tenant)));
            }
        }
    }
    notes.extend(super::certificate::remove(ends, consumer).await?);
    Ok(notes)
}

/// The twin namespaces on `provider` the local offloadings report.
async fn twins_on(consumer: &ClusterClient, provider: &ClusterId) -> anyhow::Result<Vec<String>> {
    let api: Api<NamespaceOffloading> = Api::all(consumer.client.clone());
    let list = match api.list(&Default::default()).await {
        Ok(list) => list,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Vec::new()),
        Err(e) => return Err(consumer.explain(e, "listing offloaded namespaces")),
    };
    Ok(list
        .items
        .into_iter()
        .filter_map(|o| o.status)
        .flat_map(|s| s.clusters)
        .filter(|c| &c.cluster_id == provider)
        .map(|c| c.remote_namespace)
        .collect())
}
