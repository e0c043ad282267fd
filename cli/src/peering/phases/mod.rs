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
//! The ways of peering differ in the phases that give the consumer its
//! identity on the provider:
//!
//! | flow | phases |
//! | --- | --- |
//! | `peer --remote-kubeconfig` | [`BY_KUBECONFIGS`]: virtual-kubelet, tenant, certificate, network |
//! | `peer --token` | [`BY_TOKEN`]: claim, virtual-kubelet, network |
//! | `peer accept` (provider) | [`ACCEPT`]: tenant, sign |
//! | `peer complete` (consumer) | [`BY_RESPONSE`]: virtual-kubelet, response, network |
//!
//! The virtual kubelet comes first where the provider is known before the
//! consumer's identity on it is made: its agent waits for the identity,
//! and its pod starts meanwhile. A token names its provider only once it
//! is claimed.
//!
//! The credentials ([`Credentials`]) say which of those phases run, and
//! those hand the later ones the provider as the peering's own identity
//! reaches it ([`Reached`]): each phase takes what it works with as
//! arguments. `unpeer` removes by the lists, whose order the runs check
//! in debug builds.
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
    Phase::VirtualKubelet,
    Phase::Tenant,
    Phase::Certificate,
    Phase::Network,
];
/// `peer --token`: the consumer's credentials and a token.
pub(crate) const BY_TOKEN: &[Phase] = &[Phase::Claim, Phase::VirtualKubelet, Phase::Network];
/// `peer accept`: the provider's half of peering through files.
pub(crate) const ACCEPT: &[Phase] = &[Phase::Tenant, Phase::Sign];
/// `peer complete`: the consumer's half of peering through files.
pub(crate) const BY_RESPONSE: &[Phase] = &[Phase::VirtualKubelet, Phase::Response, Phase::Network];

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

    /// Removes what the phase makes, by name; returns what it has to say
    /// of what it could not remove (objects liqoctl did not make, a
    /// provider that ended the tenancy already).
    /// `cluster` is the one of the phase's side ([`Self::removed_on`]).
    async fn remove(self, ends: &Ends<'_>, cluster: &ClusterClient) -> anyhow::Result<Vec<String>> {
        match self {
            Self::Tenant => tenant::remove(ends, cluster).await,
            Self::Sign => Ok(Vec::new()),
            Self::Certificate | Self::Response => certificate::remove(ends, cluster).await,
            Self::Claim => claim::remove(ends, cluster).await,
            Self::VirtualKubelet => virtual_kubelet::remove(ends, cluster).await,
            Self::Network => network::remove(ends, cluster).await,
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

/// The provider as its administrator reaches it: what the tenant,
/// certificate and sign phases work with.
pub(crate) struct Administrator<'a> {
    pub provider: &'a ClusterClient,
    pub provider_id: &'a ClusterIdentity,
    /// The provider's sharing policy for the consumer.
    pub policy: &'a SharingPolicySpec,
    /// The certificate's lifetime, in seconds; the signer's default
    /// unless given.
    pub certificate_lifetime: Option<u64>,
}

/// A peering token, its CA checked already and shown as `fingerprint`:
/// what the claim phase works with.
pub(crate) struct WithToken<'a> {
    pub token: &'a PeeringToken,
    pub ca_pem: &'a str,
    pub fingerprint: &'a str,
    /// The tenant's credential's lifetime, in seconds.
    pub credential_lifetime: Option<u64>,
}

/// A peering response, checked already: the provider as its certificate
/// reaches it, the certificate as a kubeconfig, and when it expires.
pub(crate) struct WithResponse<'a> {
    pub provider: &'a ClusterClient,
    pub provider_id: &'a ClusterIdentity,
    pub kubeconfig: &'a str,
    pub expiry: &'a str,
}

/// How the consumer gets its identity on the provider: what the first
/// phases of a peering work from, and so which they are.
pub(crate) enum Credentials<'a> {
    /// The provider's administrator's: the provider signs the consumer's
    /// certificate (or the one it holds is still good; with `renew`, a
    /// new one whatever its state).
    Administrator {
        admin: Administrator<'a>,
        renew: bool,
    },
    Token(WithToken<'a>),
    Response(WithResponse<'a>),
}

impl Credentials<'_> {
    /// The provider, when it is known before the consumer's identity on it
    /// is made: not with a token, whose provider is read when it is
    /// claimed.
    fn provider(&self) -> Option<&ClusterIdentity> {
        match self {
            Self::Administrator { admin, .. } => Some(admin.provider_id),
            Self::Response(response) => Some(response.provider_id),
            Self::Token(_) => None,
        }
    }

    /// The phases a peering with these credentials runs, in order
    /// ([`BY_KUBECONFIGS`], [`BY_TOKEN`] or [`BY_RESPONSE`]), without the
    /// network phase unless `network`.
    pub(crate) fn phases(&self, network: bool) -> Vec<Phase> {
        let all = match self {
            Self::Administrator { .. } => BY_KUBECONFIGS,
            Self::Token(_) => BY_TOKEN,
            Self::Response(_) => BY_RESPONSE,
        };
        all.iter()
            .copied()
            .filter(|p| network || *p != Phase::Network)
            .collect()
    }
}

/// The provider as the peering's own identity reaches it: what the first
/// phases hand to the later ones.
pub(crate) struct Reached {
    /// With the administrator's credentials (by kubeconfigs), or with the
    /// peering's identity (a token's tenant, a response's certificate).
    pub provider: ClusterClient,
    pub provider_id: ClusterIdentity,
    /// The consumer's name on the provider: its cluster ID, or a token's
    /// tenant.
    pub tenant: ClusterId,
    /// When the consumer's identity expires.
    pub expiry: String,
}

/// A peering whose phases are done.
pub(crate) struct Made {
    pub reached: Reached,
    /// The tunnel, unless peered without network.
    pub linked: Option<Linked>,
}

/// One peering being made: who the consumer is, and on what terms.
pub(crate) struct Peering<'a> {
    pub consumer_id: ClusterIdentity,
    pub granted: Granted,
    pub printer: &'a Printer,
}

impl Peering<'_> {
    /// Runs the phases of `credentials` in order on `consumer` (and the
    /// network phase if `network`); when one fails, undoes what this run
    /// made and returns the phase's error.
    pub(crate) async fn run(
        &self,
        consumer: &ClusterClient,
        credentials: &Credentials<'_>,
        network: bool,
    ) -> anyhow::Result<Made> {
        let mut journal = Journal::default();
        let mut ran = Vec::new();
        let made = self
            .forward(consumer, credentials, network, &mut journal, &mut ran)
            .await;
        if made.is_err() {
            journal.undo(self.printer).await;
        } else {
            debug_assert_eq!(ran, credentials.phases(network), "the phases as listed");
        }
        made
    }

    async fn forward(
        &self,
        consumer: &ClusterClient,
        credentials: &Credentials<'_>,
        network: bool,
        journal: &mut Journal,
        ran: &mut Vec<Phase>,
    ) -> anyhow::Result<Made> {
        // Where the provider is known before the consumer's identity on it
        // is made, the virtual kubelet starts first: its pod starts while
        // the identity is made, and the agent waits for its identity
        // Secret (docs/peering.md, "How long it takes").
        let known = credentials.provider();
        if let Some(provider) = known {
            begin(ran, Phase::VirtualKubelet);
            virtual_kubelet::start(self, consumer, provider, journal).await?;
        }
        let reached = match credentials {
            Credentials::Administrator { admin, renew } => {
                begin(ran, Phase::Tenant);
                tenant::apply(self, admin, journal).await?;
                begin(ran, Phase::Certificate);
                certificate::apply(self, consumer, admin, *renew, journal).await?
            }
            Credentials::Token(token) => {
                begin(ran, Phase::Claim);
                claim::apply(self, consumer, token).await?
            }
            Credentials::Response(response) => {
                begin(ran, Phase::Response);
                response::apply(self, consumer, response, journal).await?
            }
        };
        if known.is_none() {
            begin(ran, Phase::VirtualKubelet);
            virtual_kubelet::start(self, consumer, &reached.provider_id, journal).await?;
        }
        virtual_kubelet::record(self, consumer, &reached).await?;
        let linked = if network {
            begin(ran, Phase::Network);
            Some(network::apply(self, consumer, &reached, journal).await?)
        } else {
            None
        };
        Ok(Made { reached, linked })
    }

    /// The provider's half of peering through files ([`ACCEPT`]): the
    /// tenant, then the consumer's request `csr` signed; returns the
    /// certificate. When a phase fails, undoes what this run made.
    pub(crate) async fn accept(
        &self,
        admin: &Administrator<'_>,
        csr: &str,
    ) -> anyhow::Result<String> {
        let mut journal = Journal::default();
        let mut ran = Vec::new();
        let signed = async {
            begin(&mut ran, Phase::Tenant);
            tenant::apply(self, admin, &mut journal).await?;
            begin(&mut ran, Phase::Sign);
            certificate::sign(self, admin, csr).await
        }
        .await;
        if signed.is_err() {
            journal.undo(self.printer).await;
        } else {
            debug_assert_eq!(ran, ACCEPT, "the phases as listed");
        }
        signed
    }
}

/// Says that `phase` begins, and records it in `ran` (which the runs
/// check against their lists in debug builds: the lists are what
/// `unpeer` removes).
fn begin(ran: &mut Vec<Phase>, phase: Phase) {
    tracing::debug!(phase = phase.name(), "peering phase");
    ran.push(phase);
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
            let cluster = match side {
                Side::Consumer => self.consumer,
                Side::Provider => self.provider,
            };
            let Some(cluster) = cluster else {
                return Ok(left);
            };
            for phase in phases.iter().rev().filter(|p| p.removed_on() == side) {
                tracing::debug!(phase = phase.name(), "removing peering phase");
                left.extend(phase.remove(self, cluster).await?);
            }
            anyhow::Ok(left)
        };
        let (consumer, provider) = tokio::join!(lane(Side::Consumer), lane(Side::Provider));
        let mut left = consumer?;
        left.extend(provider?);
        left.dedup();
        Ok(left)
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
