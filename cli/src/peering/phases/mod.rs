//! A peering as one list of named phases, each of which knows how to make
//! its part of the peering and how to remove it.
//!
//! `liqoctl peer` runs a list forward: each phase applies its objects
//! through the run's [`Journal`], which records what it created or
//! changed and the state before; when a phase fails, the journal undoes
//! the run, newest first, so that a failed peer leaves nothing new
//! behind, and a re-run resumes from what earlier runs left. `unpeer`
//! runs the same list backwards, each phase removing its part by name, on
//! both clusters at once (the provider's tenant namespace takes the
//! namespace controller's time, the consumer's side much less).
//!
//! The ways of peering differ only in their first phases, those that give
//! the consumer its identity on the provider:
//!
//! | flow | phases |
//! | --- | --- |
//! | `peer --remote-kubeconfig` | [`BY_KUBECONFIGS`]: tenant, certificate, virtual-kubelet, network |
//! | `peer --token` | [`BY_TOKEN`]: claim, virtual-kubelet, network |
//! | `peer accept` (provider) | [`ACCEPT`]: tenant, sign |
//! | `peer complete` (consumer) | [`BY_RESPONSE`]: response, virtual-kubelet, network |
//!
//! `network connect` and `disconnect` use the network phase's pieces
//! ([`super::network`]) on a peering made already.

mod certificate;
mod claim;
mod network;
mod response;
mod tenant;
mod virtual_kubelet;

use kube::api::Api;
use kube::runtime::wait::conditions;
use liqo_api::sharing::{Cost, Resources, SharingPolicySpec};
use liqo_api::token::PeeringToken;
use liqo_api::{ClusterId, ClusterIdentity};

use super::journal::Journal;
use super::network::Linked;
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::apply::{self, Deletion};
use crate::kube::wait::{self, Waited};
use crate::manifests::Manifest;
use crate::printer::Printer;

/// One part of a peering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// On the provider, with its administrator's credentials: the
    /// consumer's tenant (its namespace, rights, quota and record).
    Tenant,
    /// The consumer's certificate, signed on the provider and kept in the
    /// consumer's identity Secret.
    Certificate,
    /// On the provider: the consumer's certificate request signed (`peer
    /// accept`, which hands the certificate back in a file).
    Sign,
    /// With a peering token: a tenant the provider made claimed, and its
    /// credential kept in the consumer's identity Secret.
    Claim,
    /// The certificate of a peering response kept in the consumer's
    /// identity Secret.
    Response,
    /// On the consumer: the ForeignCluster that records the peering, and
    /// the virtual kubelet it owns, with its rights in offloaded
    /// namespaces.
    VirtualKubelet,
    /// Both ends of the tunnel between the two gateways.
    Network,
}

/// `peer --remote-kubeconfig`: both administrators' credentials.
pub(crate) const BY_KUBECONFIGS: &[Phase] = &[
    Phase::Tenant,
    Phase::Certificate,
    Phase::VirtualKubelet,
    Phase::Network,
];
/// `peer --token`: the consumer's credentials and a token.
pub(crate) const BY_TOKEN: &[Phase] = &[Phase::Claim, Phase::VirtualKubelet, Phase::Network];
/// `peer accept`: the provider's half of peering through files.
pub(crate) const ACCEPT: &[Phase] = &[Phase::Tenant, Phase::Sign];
/// `peer complete`: the consumer's half of peering through files.
pub(crate) const BY_RESPONSE: &[Phase] = &[Phase::Response, Phase::VirtualKubelet, Phase::Network];

/// `phases` without the network phase unless `network` (`peer
/// --no-network`).
pub(crate) fn with_network(phases: &[Phase], network: bool) -> Vec<Phase> {
    phases
        .iter()
        .copied()
        .filter(|p| network || *p != Phase::Network)
        .collect()
}

/// Which cluster a phase's removal works on, and so which of the two
/// lanes `unpeer` runs it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Consumer,
    Provider,
}

impl Phase {
    /// Its name, as the docs and errors call it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Tenant => "tenant",
            Self::Certificate => "certificate",
            Self::Sign => "sign",
            Self::Claim => "claim",
            Self::Response => "response",
            Self::VirtualKubelet => "virtual-kubelet",
            Self::Network => "network",
        }
    }

    fn removed_on(self) -> Side {
        match self {
            Self::Tenant | Self::Sign => Side::Provider,
            // A token's tenant is ended as the tenant, from the consumer,
            // after the consumer's side is gone.
            Self::Certificate
            | Self::Claim
            | Self::Response
            | Self::VirtualKubelet
            | Self::Network => Side::Consumer,
        }
    }

    async fn apply(self, peering: &mut Peering<'_>, journal: &mut Journal) -> anyhow::Result<()> {
        match self {
            Self::Tenant => tenant::apply(peering, journal).await,
            Self::Certificate => certificate::apply(peering, journal).await,
            Self::Sign => certificate::sign(peering).await,
            Self::Claim => claim::apply(peering).await,
            Self::Response => response::apply(peering, journal).await,
            Self::VirtualKubelet => virtual_kubelet::apply(peering, journal).await,
            Self::Network => network::apply(peering, journal).await,
        }
    }

    /// Removes what the phase makes, by name; returns what it has to say
    /// of what it could not remove (objects liqoctl did not make, a
    /// provider that ended the tenancy already).
    async fn remove(self, ends: &Ends<'_>) -> anyhow::Result<Vec<String>> {
        match self {
            Self::Tenant => tenant::remove(ends).await,
            Self::Sign => Ok(Vec::new()),
            Self::Certificate | Self::Response => certificate::remove(ends).await,
            Self::Claim => claim::remove(ends).await,
            Self::VirtualKubelet => virtual_kubelet::remove(ends).await,
            Self::Network => network::remove(ends).await,
        }
    }
}

/// What the provider grants the consumer, as the peering records it.
#[derive(Debug, Clone)]
pub(crate) struct Granted {
    pub request: Option<Resources>,
    pub grant: Resources,
    pub cost: Option<Cost>,
}

/// How the consumer gets its identity on the provider: what the first
/// phases work from.
pub(crate) enum Credentials<'a> {
    /// The provider's administrator's: the provider signs the consumer's
    /// certificate (or the one it holds is still good).
    Administrator {
        /// The provider's sharing policy for the consumer.
        policy: &'a SharingPolicySpec,
        /// Issue a new certificate whatever the current one's state.
        renew: bool,
        certificate_lifetime: Option<u64>,
        /// With `Sign`: the consumer's request (PEM); the signed
        /// certificate is put in [`Peering::certificate`].
        csr: Option<&'a str>,
    },
    /// A peering token (its CA checked already, and shown as
    /// `fingerprint`).
    Token {
        token: &'a PeeringToken,
        ca_pem: &'a str,
        fingerprint: &'a str,
        credential_lifetime: Option<u64>,
    },
    /// A peering response's, as a kubeconfig, and when it expires.
    Response {
        kubeconfig: &'a str,
        expiry: &'a str,
    },
}

/// One peering being made: who peers, on what terms, and what each phase
/// hands to the next.
pub(crate) struct Peering<'a> {
    /// The consumer; `None` on the provider's side of peering through
    /// files (`peer accept`).
    pub consumer: Option<&'a ClusterClient>,
    pub consumer_id: ClusterIdentity,
    /// The provider as this run reaches it: with its administrator's
    /// credentials from the start, or with the peering's own identity once
    /// a phase has made it (a token's claim, a response).
    pub provider: Option<ClusterClient>,
    /// The provider, once known: given, or read with the peering's
    /// identity.
    pub provider_id: Option<ClusterIdentity>,
    pub credentials: Credentials<'a>,
    pub granted: Granted,
    pub printer: &'a Printer,
    /// When the consumer's identity expires (certificate, claim, response).
    pub expiry: Option<String>,
    /// The consumer's name on the provider (its cluster ID, or a token's
    /// tenant), once known.
    pub tenant: Option<ClusterId>,
    /// The consumer's certificate (sign).
    pub certificate: Option<String>,
    /// The tunnel (network).
    pub linked: Option<Linked>,
}

impl<'a> Peering<'a> {
    /// A peering of `consumer` to be made with `credentials` on `granted`
    /// terms; the phases find out the rest.
    pub(crate) fn new(
        consumer: Option<&'a ClusterClient>,
        consumer_id: ClusterIdentity,
        credentials: Credentials<'a>,
        granted: Granted,
        printer: &'a Printer,
    ) -> Self {
        Self {
            consumer,
            consumer_id,
            provider: None,
            provider_id: None,
            credentials,
            granted,
            printer,
            expiry: None,
            tenant: None,
            certificate: None,
            linked: None,
        }
    }

    /// Runs `phases` in order; when one fails, undoes what this run made
    /// and returns the phase's error.
    pub(crate) async fn run(&mut self, phases: &[Phase]) -> anyhow::Result<()> {
        let mut journal = Journal::default();
        for phase in phases {
            tracing::debug!(phase = phase.name(), "peering phase");
            if let Err(e) = phase.apply(self, &mut journal).await {
                journal.undo(self.printer).await;
                return Err(e);
            }
        }
        Ok(())
    }

    /// The consumer, for the phases that work on it.
    pub(crate) fn consumer(&self) -> anyhow::Result<&'a ClusterClient> {
        self.consumer
            .ok_or_else(|| anyhow::anyhow!("invariant: a phase on the consumer runs with one"))
    }

    /// The provider, as a phase that needs it reaches it.
    pub(crate) fn provider(&self) -> anyhow::Result<&ClusterClient> {
        self.provider.as_ref().ok_or_else(|| {
            anyhow::anyhow!("invariant: a phase before this one reaches the provider")
        })
    }

    pub(crate) fn provider_id(&self) -> anyhow::Result<&ClusterIdentity> {
        self.provider_id
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("invariant: a phase before this one reads the provider"))
    }

    pub(crate) fn tenant(&self) -> anyhow::Result<&ClusterId> {
        self.tenant
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("invariant: a phase before this one names the tenant"))
    }
}

/// The two ends of an existing peering, as `unpeer` removes it: enough to
/// name every object of the peering.
pub(crate) struct Ends<'a> {
    /// The consumer; `None` when only the provider's side is removed
    /// (`unpeer --tenant`).
    pub consumer: Option<&'a ClusterClient>,
    /// The provider, with its administrator's credentials or the
    /// peering's own; `None` when only the consumer's side is removed
    /// (`unpeer --force`, the provider gone for good).
    pub provider: Option<&'a ClusterClient>,
    pub provider_id: ClusterId,
    pub consumer_id: ClusterId,
    /// The consumer's name on the provider: its cluster ID, or a token's
    /// tenant.
    pub tenant: ClusterId,
    /// The deadline of the waits, and the command's timeout (seconds) to
    /// say so.
    pub deadline: tokio::time::Instant,
    pub timeout: u64,
    /// The twin namespaces holding claims of the consumer's are left on
    /// the provider with them (`--keep-remote-data`).
    pub keep_claims: bool,
}

impl Ends<'_> {
    /// Runs `phases` backwards, the consumer's and the provider's in two
    /// lanes at once, each skipped when its cluster is not given. Returns
    /// what the phases had to say of what they could not remove.
    pub(crate) async fn remove(&self, phases: &[Phase]) -> anyhow::Result<Vec<String>> {
        let lane = |side: Side| async move {
            let mut left = Vec::new();
            let reached = match side {
                Side::Consumer => self.consumer.is_some(),
                Side::Provider => self.provider.is_some(),
            };
            if !reached {
                return Ok(left);
            }
            for phase in phases.iter().rev().filter(|p| p.removed_on() == side) {
                tracing::debug!(phase = phase.name(), "removing peering phase");
                left.extend(phase.remove(self).await?);
            }
            anyhow::Ok(left)
        };
        let (consumer, provider) = tokio::join!(lane(Side::Consumer), lane(Side::Provider));
        let mut left = consumer?;
        left.extend(provider?);
        left.dedup();
        Ok(left)
    }

    fn consumer(&self) -> anyhow::Result<&ClusterClient> {
        self.consumer
            .ok_or_else(|| anyhow::anyhow!("invariant: the consumer's lane runs with a consumer"))
    }

    fn provider(&self) -> anyhow::Result<&ClusterClient> {
        self.provider
            .ok_or_else(|| anyhow::anyhow!("invariant: the provider's lane runs with a provider"))
    }
}

/// Deletes what is ours among `objects`, newest first; says which were
/// left as someone else's.
async fn delete_all(cluster: &ClusterClient, objects: &[Manifest]) -> anyhow::Result<Vec<String>> {
    let mut left = Vec::new();
    for m in objects.iter().rev() {
        if apply::delete(cluster, m).await? == Deletion::Foreign {
            left.push(format!(
                "left {} on cluster {}: liqoctl did not create it",
                m.describe(),
                cluster.name
            ));
        }
    }
    Ok(left)
}

/// Waits, within the removal's deadline, until the object `name` of UID
/// `uid` is gone.
async fn gone<K>(
    ends: &Ends<'_>,
    cluster: &ClusterClient,
    api: Api<K>,
    name: &str,
    uid: &str,
) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + Send + serde::de::DeserializeOwned + 'static,
{
    let waited = wait::until(
        cluster,
        api,
        name,
        conditions::is_deleted(uid),
        wait::left(ends.deadline),
        &format!("waiting for {name} to be deleted"),
    )
    .await?;
    if let Waited::TimedOut = waited {
        return Err(UserError::Timeout(format!(
            "{name} is still being deleted on cluster {} after {}s; run unpeer again",
            cluster.name, ends.timeout
        ))
        .into());
    }
    Ok(())
}
