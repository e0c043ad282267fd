//! A tether as one list of named phases, as a peering is
//! ([`crate::peering::phases`]): `liqoctl tether` runs the list forward
//! and, when a phase fails, removes what the phases of this run made,
//! newest first; `untether` removes every phase backwards, by name, so
//! that it also finishes a tether that was stopped half-way.
//!
//! | flow | phases |
//! | --- | --- |
//! | `tether --remote-kubeconfig` | [`BY_KUBECONFIGS`]: policy, from-anchor, to-anchor, hand-over, taint, mark, restart |
//! | `tether --token-file` | [`BY_TOKEN`]: policy, to-anchor, hand-over, taint, mark, restart |
//!
//! With a token, the anchor's side (its peering with this cluster, and
//! its mark) is its administrator's.

use std::fmt::Write as _;

use liqo_api::names::peering;
use liqo_api::tether::Role;
use liqo_api::{ClusterId, ClusterIdentity};

use super::HandedOver;
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::peering::by_kubeconfigs::{self, Asked};
use crate::peering::by_token::{self, Checked};
use crate::peering::outgoing::{Identity, identity_of};
use crate::peering::phases::{self as peering_phases, Ends};
use crate::printer::Printer;

/// One part of a tether.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The tethered cluster's SharingPolicy for the anchor offers it
    /// everything ([`super::give_everything`]).
    Policy,
    /// The anchor peers with the tethered cluster, so that its pods can
    /// run there (with the anchor's kubeconfig only).
    FromAnchor,
    /// The tethered cluster peers with the anchor.
    ToAnchor,
    /// The tethered cluster's namespaces offloaded to the anchor alone.
    HandOver,
    /// The tethered cluster's own nodes tainted.
    Taint,
    /// The ForeignClusters say which end of the tether each cluster is.
    Mark,
    /// The workloads' pods that run on the tethered cluster's nodes
    /// deleted, so that their controllers make them again through the
    /// anchor. Nothing to remove: `untether`'s hand-over brings them back.
    Restart,
}

/// `tether --remote-kubeconfig`: both administrators' credentials.
pub(crate) const BY_KUBECONFIGS: &[Phase] = &[
    Phase::Policy,
    Phase::FromAnchor,
    Phase::ToAnchor,
    Phase::HandOver,
    Phase::Taint,
    Phase::Mark,
    Phase::Restart,
];
/// `tether --token-file`: this cluster's credentials and an anchor's token.
pub(crate) const BY_TOKEN: &[Phase] = &[
    Phase::Policy,
    Phase::ToAnchor,
    Phase::HandOver,
    Phase::Taint,
    Phase::Mark,
    Phase::Restart,
];

/// The anchor, as a tether reaches it.
pub(crate) enum Anchor<'a> {
    /// With its administrator's kubeconfig.
    Reached {
        client: &'a ClusterClient,
        id: &'a ClusterIdentity,
    },
    /// With a peering token of its.
    Token(&'a Checked),
    /// By its cluster ID alone, as the tether recorded it (`untether`
    /// without its kubeconfig).
    Named(ClusterId),
}

impl Anchor<'_> {
    pub(crate) fn cluster_id(&self) -> &ClusterId {
        match self {
            Self::Reached { id, .. } => &id.cluster_id,
            Self::Token(checked) => &checked.token.provider_cluster_id,
            Self::Named(id) => id,
        }
    }

    /// Its name as the tether knows it: its kubeconfig's, its token's, or
    /// its cluster ID.
    pub(crate) fn name(&self) -> &str {
        match self {
            Self::Reached { client, .. } => &client.name,
            Self::Token(checked) => &checked.token.provider_cluster_name,
            Self::Named(id) => id.as_str(),
        }
    }
}

/// One tether: its two ends, and the command's deadline.
pub(crate) struct Tether<'a> {
    pub tethered: &'a ClusterClient,
    pub tethered_id: &'a ClusterIdentity,
    pub anchor: Anchor<'a>,
    pub printer: &'a Printer,
    pub deadline: tokio::time::Instant,
    /// The command's timeout, in seconds (to say so).
    pub timeout: u64,
}

/// What a tether's run did, as `tether` reports it.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub handed_over: HandedOver,
    /// The nodes tainted by this run.
    pub tainted: usize,
    /// The pods deleted so that their controllers make them again through
    /// the anchor.
    pub restarted: usize,
}

/// What `untether` did, beside its steps.
#[derive(Debug, Default)]
pub(crate) struct TakenBack {
    /// The namespaces offloaded to the anchor no more.
    pub namespaces: Vec<String>,
    /// What the peerings' removal had to say (objects left as someone
    /// else's, a provider that ended the tenancy already).
    pub notes: Vec<String>,
}

impl Phase {
    /// Its name, as errors call it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Policy => "policy",
            Self::FromAnchor => "from-anchor",
            Self::ToAnchor => "to-anchor",
            Self::HandOver => "hand-over",
            Self::Taint => "taint",
            Self::Mark => "mark",
            Self::Restart => "restart",
        }
    }

    /// Makes the phase's part; says whether this run made something that
    /// a rollback removes (not what an earlier run or the user made).
    async fn apply(
        self,
        tether: &Tether<'_>,
        network: bool,
        outcome: &mut Outcome,
    ) -> anyhow::Result<bool> {
        let Tether {
            tethered,
            tethered_id,
            anchor,
            printer,
            deadline,
            timeout,
        } = tether;
        let anchor_cluster = anchor.cluster_id();
        match self {
            Self::Policy => {
                let step = printer.step(format!(
                    "Offering {} all that {} has",
                    anchor.name(),
                    tethered.name
                ));
                let made = super::give_everything(tethered, anchor_cluster).await;
                step.ended(made)
            }
            Self::FromAnchor => {
                let Anchor::Reached { client, .. } = anchor else {
                    return Ok(false);
                };
                let made = !super::peered(client, &tethered_id.cluster_id).await?;
                tether.peer(client, tethered, network).await?;
                Ok(made)
            }
            Self::ToAnchor => {
                let made = !super::peered(tethered, anchor_cluster).await?;
                match anchor {
                    Anchor::Reached { client, .. } => {
                        tether.peer(tethered, client, network).await?
                    }
                    // A token's peering is resumed from its identity, not
                    // claimed again.
                    Anchor::Token(checked) if made => {
                        let asked = by_token::Asked {
                            credential_lifetime: None,
                            network,
                            timeout: *timeout,
                        };
                        by_token::peer(
                            tethered,
                            (*tethered_id).clone(),
                            checked,
                            &asked,
                            printer,
                            *deadline,
                        )
                        .await?;
                    }
                    Anchor::Token(_) => {}
                    Anchor::Named(id) => {
                        return Err(UserError::Usage(format!(
                            "cluster {} does not peer with {id}: pass the anchor's kubeconfig \
                             (--remote-kubeconfig) or a peering token of it",
                            tethered.name
                        ))
                        .into());
                    }
                }
                Ok(made)
            }
            Self::HandOver => {
                let step = printer.step(format!(
                    "Offloading the namespaces of {} to {}",
                    tethered.name,
                    anchor.name()
                ));
                // Whatever part of it is done is removed by a rollback.
                let handed = super::hand_over(tethered, anchor_cluster).await;
                let handed = step.ended_saying(handed, |h| h.namespaces.join(", "))?;
                outcome.handed_over = handed;
                Ok(true)
            }
            Self::Taint => {
                let step = printer.step(format!("Tainting the nodes of {}", tethered.name));
                let tainted = super::taint_nodes(tethered, anchor.name()).await;
                outcome.tainted = step.ended_saying(tainted, |n| format!("{n} nodes"))?;
                Ok(outcome.tainted > 0)
            }
            Self::Mark => {
                if let Anchor::Reached { client, .. } = anchor {
                    super::mark(client, &tethered_id.cluster_id, Some(Role::Anchor)).await?;
                }
                super::mark(tethered, anchor_cluster, Some(Role::Tethered)).await?;
                Ok(true)
            }
            Self::Restart => {
                let step = printer.step("Restarting the workloads' pods through the anchor");
                let restarted = super::restart(tethered, &outcome.handed_over.namespaces).await;
                outcome.restarted = step.ended_saying(restarted, |n| format!("{n} pods"))?;
                Ok(false)
            }
        }
    }

    /// What `untether` says as it removes the phase; `None`: nothing worth
    /// a line.
    fn removing(self, tether: &Tether<'_>) -> Option<String> {
        let (tethered, anchor) = (&tether.tethered.name, tether.anchor.name());
        match self {
            Self::Taint => Some(format!("Untainting the nodes of {tethered}")),
            Self::HandOver => Some(format!(
                "Taking the namespaces of {tethered} back from {anchor}"
            )),
            Self::ToAnchor => Some(format!("Removing the peering of {tethered} with {anchor}")),
            Self::FromAnchor => Some(format!("Removing the peering of {anchor} with {tethered}")),
            Self::Policy | Self::Mark | Self::Restart => None,
        }
    }

    /// Removes the phase's part, by name; returns what its step says.
    async fn remove(self, tether: &Tether<'_>, taken: &mut TakenBack) -> anyhow::Result<String> {
        let (tethered, tethered_id) = (tether.tethered, tether.tethered_id);
        let anchor = &tether.anchor;
        let anchor_cluster = anchor.cluster_id();
        match self {
            Self::Policy => {
                super::take_back_everything(tethered, anchor_cluster).await?;
                Ok(String::new())
            }
            Self::FromAnchor => {
                let Anchor::Reached { client, id } = anchor else {
                    return Ok(String::new());
                };
                let ends = kubeconfig_ends(client, id, tethered, tethered_id, tether);
                taken
                    .notes
                    .extend(ends.remove(peering_phases::BY_KUBECONFIGS).await?);
                // The anchor's pods that ran on the tethered cluster: their
                // node is gone; their controllers make them again on the
                // anchor's own nodes.
                let node = peering::virtual_node(&tethered_id.cluster_id);
                let sent_back = super::delete_pods_on(client, None, &node, true).await?;
                Ok(format!(
                    "{sent_back} pods of {} rescheduled there",
                    client.name
                ))
            }
            Self::ToAnchor => {
                taken.notes.extend(end_peering(tether).await?);
                Ok(String::new())
            }
            Self::HandOver => {
                let (namespaces, moved) =
                    super::take_back(tethered, anchor_cluster, tether.deadline, tether.timeout)
                        .await?;
                let said = format!("{}; {moved} pods restarted here", namespaces.join(", "));
                taken.namespaces = namespaces;
                Ok(said)
            }
            Self::Taint => {
                let untainted = super::untaint_nodes(tethered).await?;
                Ok(format!("{untainted} nodes"))
            }
            Self::Mark => {
                if let Anchor::Reached { client, .. } = anchor {
                    super::mark(client, &tethered_id.cluster_id, None).await?;
                }
                super::mark(tethered, anchor_cluster, None).await?;
                Ok(String::new())
            }
            Self::Restart => Ok(String::new()),
        }
    }
}

/// The peering in which `consumer` consumes `provider`, both reached with
/// their administrators' kubeconfigs, for its removal.
fn kubeconfig_ends<'a>(
    consumer: &'a ClusterClient,
    consumer_id: &ClusterIdentity,
    provider: &'a ClusterClient,
    provider_id: &ClusterIdentity,
    tether: &Tether<'_>,
) -> Ends<'a> {
    Ends {
        consumer: Some(consumer),
        provider: Some(provider),
        provider_id: provider_id.cluster_id.clone(),
        consumer_id: consumer_id.cluster_id.clone(),
        tenant: consumer_id.cluster_id.clone(),
        deadline: tether.deadline,
        timeout: tether.timeout,
        keep_claims: false,
    }
}

/// Ends the tethered cluster's peering with the anchor: with the anchor's
/// kubeconfig as `unpeer --remote-kubeconfig` does, else with the
/// peering's own credential as `unpeer --cluster-id` does for a token's
/// peering (nothing to do when there is none any more). Returns what
/// could not be removed.
async fn end_peering(tether: &Tether<'_>) -> anyhow::Result<Vec<String>> {
    let Tether {
        tethered,
        tethered_id,
        anchor,
        ..
    } = tether;
    if let Anchor::Reached { client, id } = anchor {
        return kubeconfig_ends(tethered, tethered_id, client, id, tether)
            .remove(peering_phases::BY_KUBECONFIGS)
            .await;
    }
    let anchor_cluster = anchor.cluster_id();
    let Identity::Token {
        tenant, kubeconfig, ..
    } = identity_of(tethered, anchor_cluster).await?
    else {
        return Ok(Vec::new());
    };
    let provider =
        ClusterClient::from_kubeconfig_yaml(anchor_cluster.as_str(), &kubeconfig).await?;
    Ends {
        consumer: Some(tethered),
        provider: Some(&provider),
        provider_id: anchor_cluster.clone(),
        consumer_id: tethered_id.cluster_id.clone(),
        tenant,
        deadline: tether.deadline,
        timeout: tether.timeout,
        keep_claims: false,
    }
    .remove(peering_phases::BY_TOKEN)
    .await
}

impl Tether<'_> {
    /// `consumer` peers with `provider`, both reached with their
    /// administrators' kubeconfigs, on what the provider's policy offers
    /// (with the network if `network`).
    async fn peer(
        &self,
        consumer: &ClusterClient,
        provider: &ClusterClient,
        network: bool,
    ) -> anyhow::Result<()> {
        let asked = Asked {
            request: None,
            require_request: false,
            renew: false,
            certificate_lifetime: None,
            network,
            timeout: self.timeout,
        };
        by_kubeconfigs::peer(consumer, provider, &asked, self.printer, self.deadline).await?;
        Ok(())
    }

    /// Its phases: both clusters' with the anchor's kubeconfig, this
    /// cluster's alone otherwise.
    fn phases(&self) -> &'static [Phase] {
        match self.anchor {
            Anchor::Reached { .. } => BY_KUBECONFIGS,
            Anchor::Token(_) | Anchor::Named(_) => BY_TOKEN,
        }
    }

    /// Runs the phases forward (peering with the network unless
    /// `network` is false); when one fails, removes what this run made,
    /// newest first, and returns the phase's error.
    pub(crate) async fn run(&self, network: bool) -> anyhow::Result<Outcome> {
        let mut outcome = Outcome::default();
        let mut made = Vec::new();
        for phase in self.phases() {
            tracing::debug!(phase = phase.name(), "tether phase");
            match phase.apply(self, network, &mut outcome).await {
                Ok(true) => made.push(*phase),
                Ok(false) => {}
                Err(e) => {
                    // What a phase of many objects did before it failed
                    // goes too (a peering undoes its own).
                    if matches!(phase, Phase::HandOver | Phase::Taint | Phase::Mark) {
                        made.push(*phase);
                    }
                    self.roll_back(&made).await;
                    return Err(e);
                }
            }
        }
        Ok(outcome)
    }

    /// Removes the phases `made`, newest first, as one step; says what it
    /// could not remove.
    async fn roll_back(&self, made: &[Phase]) {
        let step = self.printer.step("Rolling back what this run made");
        let mut left = String::new();
        let mut taken = TakenBack::default();
        for phase in made.iter().rev() {
            if let Err(e) = phase.remove(self, &mut taken).await {
                let sep = if left.is_empty() { "" } else { ", " };
                let _ = write!(left, "{sep}the {} phase ({e:#})", phase.name());
            }
        }
        if left.is_empty() {
            step.done("");
        } else {
            step.fail(format!("could not remove {left}; run `liqoctl untether`"));
        }
    }

    /// Removes every phase, newest first, each as a step of the output.
    pub(crate) async fn remove(&self) -> anyhow::Result<TakenBack> {
        let mut taken = TakenBack::default();
        for phase in self.phases().iter().rev() {
            tracing::debug!(phase = phase.name(), "removing tether phase");
            let removed = phase.remove(self, &mut taken);
            match phase.removing(self) {
                Some(title) => {
                    let step = self.printer.step(title);
                    step.ended_saying(removed.await, |said| said.clone())?;
                }
                None => {
                    removed.await?;
                }
            }
        }
        Ok(taken)
    }
}
