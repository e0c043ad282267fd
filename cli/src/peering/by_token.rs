//! A peering made with a provider's peering token, with the consumer's
//! kubeconfig alone (docs/tokens.md): `liqoctl peer --token-file` and
//! `liqoctl tether --token-file` run it. The token is read and checked
//! before anything is written ([`Checked`]); the consumer then claims a
//! tenant with it and runs the [`super::phases`] of
//! [`super::phases::BY_TOKEN`].

use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use liqo_api::ClusterIdentity;
use liqo_api::token::PeeringToken;

use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::peering::identity;
use crate::peering::phases::{Credentials, Granted, Peering, WithToken};
use crate::peering::report::Report;
use crate::printer::Printer;

/// The token's text, from `--token` or `--token-file` (`-`: standard
/// input).
pub(crate) fn read(token: Option<&str>, token_file: Option<&Path>) -> anyhow::Result<String> {
    if let Some(text) = token {
        return Ok(text.to_owned());
    }
    let Some(path) = token_file else {
        return Err(UserError::Usage("pass --token or --token-file".to_owned()).into());
    };
    Ok(crate::commands::read_input(path).map_err(|e| {
        UserError::Usage(format!(
            "--token-file {}: cannot read it: {e}",
            path.display()
        ))
    })?)
}

/// A token that can be used: read, not expired, pinning a usable CA.
pub(crate) struct Checked {
    pub token: PeeringToken,
    ca_pem: String,
    fingerprint: String,
}

impl Checked {
    pub(crate) fn new(text: &str) -> anyhow::Result<Self> {
        let token = PeeringToken::decode(text)
            .map_err(|e| UserError::Usage(format!("the peering token cannot be read: {e}")))?;
        let now = Timestamp::now();
        if token.expires <= now.as_second() {
            return Err(UserError::Refused(format!(
                "the peering token {} expired at {}; ask the administrator of cluster {} for a new one",
                token.id,
                Timestamp::from_second(token.expires).unwrap_or(now),
                token.provider_cluster_name
            ))
            .into());
        }
        let ca_der = token
            .ca_der()
            .map_err(|e| UserError::Usage(format!("the peering token cannot be read: {e}")))?;
        let fingerprint = identity::check_ca(&ca_der).map_err(|e| {
            UserError::Refused(format!("the CA the peering token pins cannot be used: {e}"))
        })?;
        Ok(Self {
            ca_pem: identity::pem(&ca_der),
            fingerprint,
            token,
        })
    }

    /// Refuses a token that `consumer` cannot use: its own, or one bound
    /// to another cluster.
    pub(crate) fn usable_by(
        &self,
        consumer: &ClusterClient,
        consumer_id: &ClusterIdentity,
    ) -> Result<(), UserError> {
        let token = &self.token;
        if token.provider_cluster_id == consumer_id.cluster_id {
            return Err(UserError::Refused(format!(
                "the peering token is cluster {}'s own; a cluster cannot peer with itself",
                consumer.name
            )));
        }
        if let Some(bound) = &token.consumer
            && bound != &consumer_id.cluster_id
        {
            return Err(UserError::Refused(format!(
                "the peering token {} is for cluster {bound}, and cluster {} is {}",
                token.id, consumer.name, consumer_id.cluster_id
            )));
        }
        Ok(())
    }
}

/// What the consumer asks of a peering made with a token.
pub(crate) struct Asked {
    /// The credential's lifetime, in seconds; the provider's cap unless
    /// given.
    pub credential_lifetime: Option<u64>,
    /// Link the pod networks.
    pub network: bool,
    /// The command's timeout, in seconds (to say so).
    pub timeout: u64,
}

/// `consumer` peers with the token's provider. The claim is not undone by
/// a failure of a later phase: the identity stays, and the same command
/// resumes from it.
pub(crate) async fn peer(
    consumer: &ClusterClient,
    consumer_id: ClusterIdentity,
    checked: &Checked,
    asked: &Asked,
    printer: &Printer,
    deadline: tokio::time::Instant,
) -> anyhow::Result<Report> {
    let Asked {
        credential_lifetime,
        network,
        timeout,
    } = *asked;
    let token = &checked.token;
    let run = Peering {
        consumer_id,
        granted: Granted {
            request: None,
            grant: token.grant.clone(),
            cost: token.cost.clone(),
        },
        printer,
    };
    let credentials = Credentials::Token(WithToken {
        token,
        ca_pem: &checked.ca_pem,
        fingerprint: &checked.fingerprint,
        credential_lifetime,
    });
    let made = run.run(consumer, &credentials, network).await?;
    made.finish(&run, consumer, deadline, timeout).await
}
