//! An outgoing peering as the consumer holds it: the identity it keeps
//! for its provider (a certificate, or a token's credential), and the
//! provider reached with that identity.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use liqo_api::ClusterId;
use liqo_api::core::ForeignCluster;
use liqo_api::names::{self, peering};

use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::ownership;
use crate::manifests::peering_token as token;

/// An outgoing peering, and the provider reached with its identity.
pub(crate) struct Outgoing {
    pub consumer: ClusterClient,
    pub provider: ClusterClient,
    pub provider_id: ClusterId,
    /// The provider's cluster name, for people to read.
    pub provider_name: String,
    pub tenant_namespace: String,
}

impl Outgoing {
    /// The peering of `consumer` with `provider_id`, its provider reached
    /// with the peering's own identity (kept in the consumer's `liqo`).
    pub(crate) async fn reach(
        consumer: ClusterClient,
        provider_id: ClusterId,
    ) -> anyhow::Result<Self> {
        let not_peered = || {
            UserError::NotFound(format!(
                "cluster {} has no outgoing peering with {provider_id}; `liqoctl info` lists them",
                consumer.name
            ))
        };
        let fc = Api::<ForeignCluster>::all(consumer.client.clone())
            .get_opt(provider_id.as_str())
            .await
            .map_err(|e| consumer.explain(e, "reading the ForeignCluster"))?
            .filter(|fc| fc.spec.outgoing)
            .ok_or_else(not_peered)?;
        let provider_name = fc.spec.cluster_name.clone();
        let tenant_namespace = fc
            .status
            .and_then(|s| s.tenant_namespace)
            .ok_or_else(not_peered)?;
        let secret = peering::identity_secret(&provider_id);
        let kubeconfig = Api::<Secret>::namespaced(consumer.client.clone(), names::NAMESPACE)
            .get_opt(&secret)
            .await
            .map_err(|e| consumer.explain(e, &format!("reading Secret {secret}")))?
            .and_then(|s| s.data?.remove("kubeconfig"))
            .and_then(|k| String::from_utf8(k.0).ok())
            .ok_or_else(not_peered)?;
        let provider =
            ClusterClient::from_kubeconfig_yaml(provider_id.as_str(), &kubeconfig).await?;
        Ok(Self {
            consumer,
            provider,
            provider_id,
            provider_name,
            tenant_namespace,
        })
    }
}

/// What identity the consumer holds for its peering with a provider.
#[derive(Debug)]
pub(crate) enum Identity {
    Absent,
    /// A certificate (`peer --remote-kubeconfig`, `peer complete`).
    Certificate,
    /// A token peering's credential, as its Secret says.
    Token {
        tenant: ClusterId,
        kubeconfig: String,
        expiry: String,
    },
}

/// The identity Secret of ours for the peering with `provider`, read.
pub(crate) async fn identity_of(
    consumer: &ClusterClient,
    provider: &ClusterId,
) -> anyhow::Result<Identity> {
    let name = peering::identity_secret(provider);
    let secrets: Api<Secret> = Api::namespaced(consumer.client.clone(), names::NAMESPACE);
    let Some(secret) = secrets
        .get_opt(&name)
        .await
        .map_err(|e| consumer.explain(e, &format!("reading Secret {name}")))?
        .filter(|s| ownership::is_ours(&s.metadata))
    else {
        return Ok(Identity::Absent);
    };
    let annotations = secret.metadata.annotations.unwrap_or_default();
    let tenant = annotations
        .get(token::TENANT_ANNOTATION)
        .and_then(|t| ClusterId::new(t.clone()).ok());
    let kubeconfig = secret
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig"))
        .and_then(|k| String::from_utf8(k.0.clone()).ok());
    Ok(match (tenant, kubeconfig) {
        (Some(tenant), Some(kubeconfig)) => Identity::Token {
            tenant,
            kubeconfig,
            expiry: annotations
                .get(token::EXPIRES_ANNOTATION)
                .cloned()
                .unwrap_or_default(),
        },
        // A token identity without its kubeconfig: made anew.
        (Some(_), None) => Identity::Absent,
        (None, _) => Identity::Certificate,
    })
}
