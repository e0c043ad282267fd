//! The peering tokens a provider holds, read from their Secrets: each
//! token's anchor (its expiry and tenants) and the claims made with it;
//! and the credentials a token's objects mint.

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::names::{self, labels};
use liqo_api::token::{self as tokens, objects};
use serde::Serialize;

use crate::factory::ClusterClient;
use crate::kube::ownership;
use crate::manifests::peering_token as token;

/// A peering token of this cluster, as `liqoctl info` shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TokenView {
    pub id: String,
    pub expires: String,
    pub expired: bool,
    /// Each tenant of the token and the consumer that claimed it, if any.
    pub tenants: Vec<TenantView>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TenantView {
    pub tenant: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claimed_by: Option<String>,
}

/// The peering tokens of `provider` not revoked yet, with who claimed what.
pub(crate) async fn tokens_of(provider: &ClusterClient) -> anyhow::Result<Vec<TokenView>> {
    let secrets = token_secrets(provider).await?;
    let claimed_by = |id: &str, tenant: &ClusterId| {
        claimed(&secrets, id, tenant)?
            .metadata
            .labels?
            .get(labels::PEER_CLUSTER_ID)
            .cloned()
    };
    let now = Timestamp::now();
    Ok(held(&secrets)
        .into_iter()
        .map(|t| TokenView {
            expires: t.expires.map(|e| e.to_string()).unwrap_or_default(),
            expired: t.expires.is_none_or(|e| e <= now),
            tenants: t
                .tenants
                .iter()
                .map(|tenant| TenantView {
                    tenant: tenant.to_string(),
                    claimed_by: claimed_by(&t.id, tenant),
                })
                .collect(),
            id: t.id,
        })
        .collect())
}

/// One token as its anchor on the provider says.
#[derive(Debug)]
pub(crate) struct Held {
    pub id: String,
    pub expires: Option<Timestamp>,
    pub tenants: Vec<ClusterId>,
}

/// Every Secret of the peering tokens of `provider`: their anchors and
/// their claims.
pub(crate) async fn token_secrets(provider: &ClusterClient) -> anyhow::Result<Vec<Secret>> {
    let secrets: Api<Secret> = Api::namespaced(provider.client.clone(), names::NAMESPACE);
    Ok(secrets
        .list(&ListParams::default().labels(token::TOKEN_LABEL))
        .await
        .map_err(|e| provider.explain(e, "listing the peering tokens"))?
        .items)
}

/// Whether `secrets` hold the claim of `tenant` of token `id`.
pub(crate) fn claimed(secrets: &[Secret], id: &str, tenant: &ClusterId) -> Option<Secret> {
    let name = objects::claim(id, tenant);
    secrets
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(name.as_str()))
        .cloned()
}

/// The tokens among `secrets`, from their anchors.
pub(crate) fn held(secrets: &[Secret]) -> Vec<Held> {
    secrets
        .iter()
        .filter(|s| s.type_.as_deref() == Some(tokens::TOKEN_SECRET_TYPE))
        .filter(|s| ownership::is_ours(&s.metadata))
        .filter_map(|s| {
            let id = s.metadata.labels.as_ref()?.get(token::TOKEN_LABEL)?.clone();
            let annotations = s.metadata.annotations.clone().unwrap_or_default();
            Some(Held {
                id,
                expires: annotations
                    .get(token::EXPIRES_ANNOTATION)
                    .and_then(|e| e.parse().ok()),
                tenants: annotations
                    .get(token::TENANTS_ANNOTATION)
                    .map(|t| {
                        t.split(',')
                            .filter_map(|t| ClusterId::new(t.to_owned()).ok())
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// A credential of ServiceAccount `account` (in `liqo`), bound to Secret
/// `bound` (`uid`): it stops working when that Secret is deleted. Returns
/// the credential and when it expires.
pub(crate) async fn mint(
    cluster: &ClusterClient,
    account: &str,
    bound: &str,
    uid: &str,
    seconds: u64,
) -> Result<(String, Timestamp), kube::Error> {
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client.clone(), names::NAMESPACE);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: i64::try_from(seconds).ok(),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Secret".to_owned()),
                name: Some(bound.to_owned()),
                uid: Some(uid.to_owned()),
            }),
        },
        ..Default::default()
    };
    let issued = accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await?;
    match issued.status {
        Some(status) => Ok((status.token, status.expiration_timestamp.0)),
        None => Err(kube::Error::Api(
            kube::core::Status::failure("the API server returned no token", "NoToken")
                .with_code(500)
                .boxed(),
        )),
    }
}
