//! `liqoctl tether` and `untether`: the tethered working mode
//! (docs/tethering.md). Run on the cluster that hands its scheduling over
//! (the tethered one), with the kubeconfig of the one that takes it (the
//! anchor). `tether` runs its steps forward and, when one fails, removes
//! what this run made, newest first; `untether` removes every step by
//! name, so that it also finishes a tether that was stopped half-way.

use std::time::Duration;

use kube::api::Api;
use liqo_api::authentication::Tenant;
use liqo_api::core::ForeignCluster;
use liqo_api::names::peering;
use liqo_api::tether::Role;
use liqo_api::{ClusterId, ClusterIdentity};
use serde::Serialize;

use crate::cli::{GlobalArgs, TetherArgs, UntetherArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::cluster::installed;
use crate::peering::by_kubeconfigs::{self, Asked};
use crate::peering::check_compatible;
use crate::peering::phases::{BY_KUBECONFIGS, Ends};
use crate::peering::tether::{self, HandedOver, State};
use crate::printer::Printer;

mod by_token;

/// What `tether -o json|yaml` reports.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Tethered {
    cluster: String,
    anchor: String,
    anchor_cluster_id: String,
    /// The namespaces offloaded to the anchor.
    namespaces: Vec<String>,
    /// Namespaces offloaded before the tether, left as they were.
    kept_offloaded: Vec<String>,
    /// The nodes tainted by this run.
    nodes_tainted: usize,
    /// The pods deleted so that their controllers make them again through
    /// the anchor.
    pods_restarted: usize,
}

/// The two clusters of a tether, as checked.
struct Pair {
    tethered: ClusterClient,
    tethered_id: ClusterIdentity,
    anchor: ClusterClient,
    anchor_id: ClusterIdentity,
}

impl Pair {
    async fn connect(
        global: &GlobalArgs,
        kubeconfig: &std::path::Path,
        context: Option<&str>,
    ) -> anyhow::Result<Self> {
        let tethered = ClusterClient::local(global).await?;
        let anchor = ClusterClient::connect(Some(kubeconfig), context).await?;
        let tethered_id = installed(&tethered).await?;
        check_compatible(&tethered.name, &tethered_id.version)?;
        let anchor_id = installed(&anchor).await?;
        check_compatible(&anchor.name, &anchor_id.version)?;
        if tethered_id.cluster_id == anchor_id.cluster_id {
            return Err(UserError::Usage(format!(
                "--remote-kubeconfig reaches cluster {} itself; pass the anchor's kubeconfig",
                tethered.name
            ))
            .into());
        }
        Ok(Self {
            tethered,
            tethered_id,
            anchor,
            anchor_id,
        })
    }

    /// The peering in which `consumer` consumes the other cluster, for
    /// its removal.
    fn peering(&self, role: Role, deadline: tokio::time::Instant, timeout: u64) -> Ends<'_> {
        let (consumer, consumer_id, provider, provider_id) = match role {
            Role::Tethered => (
                &self.tethered,
                &self.tethered_id,
                &self.anchor,
                &self.anchor_id,
            ),
            Role::Anchor => (
                &self.anchor,
                &self.anchor_id,
                &self.tethered,
                &self.tethered_id,
            ),
        };
        Ends {
            consumer: Some(consumer),
            provider: Some(provider),
            provider_id: provider_id.cluster_id.clone(),
            consumer_id: consumer_id.cluster_id.clone(),
            tenant: consumer_id.cluster_id.clone(),
            deadline,
            timeout,
            keep_claims: false,
        }
    }
}

pub async fn tether(
    args: &TetherArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let Some(kubeconfig) = args.remote_kubeconfig.as_deref() else {
        return by_token::tether(args, global, printer).await;
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let step = printer.step("Checking the clusters");
    let (ends, made) = match check_tether(kubeconfig, args, global).await {
        Ok(checked) => checked,
        Err(e) => {
            step.fail("");
            return Err(e);
        }
    };
    step.done(format!(
        "{} tethers to {}",
        ends.tethered.name, ends.anchor.name
    ));
    confirm(
        &printer,
        Role::Tethered,
        &ends.tethered.name,
        &ends.anchor.name,
        global,
    )?;

    let mut run = Run {
        ends: &ends,
        made,
        printer: &printer,
        deadline,
        timeout: args.timeout,
    };
    let outcome = match run.forward(args).await {
        Ok(outcome) => outcome,
        Err(e) => {
            run.roll_back().await;
            return Err(e);
        }
    };

    // Finished: the tether is marked on both sides, then the workloads
    // that run here restart through the anchor.
    finish(
        &ends.tethered,
        (&ends.anchor.name, &ends.anchor_id.cluster_id),
        outcome,
        run.made.tainted,
        args,
        &printer,
    )
    .await
}

/// Asks before a tether (`to` is [`Role::Tethered`]) or an untether
/// ([`Role::Anchor`]: the scheduling goes back from the anchor).
fn confirm(
    printer: &Printer,
    to: Role,
    tethered: &str,
    anchor: &str,
    global: &GlobalArgs,
) -> anyhow::Result<()> {
    let question = match to {
        Role::Tethered => format!(
            "Hand the scheduling of cluster {tethered} to {anchor}? Its workloads' pods restart \
             through {anchor}."
        ),
        Role::Anchor => format!(
            "Take the scheduling of cluster {tethered} back from {anchor}? Its workloads' pods \
             restart here."
        ),
    };
    if !printer.confirm(&question, global.yes)? {
        return Err(UserError::Refused("cancelled; nothing was changed".to_owned()).into());
    }
    Ok(())
}

/// The last step of a tether once it is in place: the workloads' pods
/// that run on the tethered cluster restart through the anchor (`anchor`:
/// its name and ID); then what the tether made is said.
async fn finish(
    tethered: &ClusterClient,
    anchor: (&str, &ClusterId),
    outcome: HandedOver,
    tainted: usize,
    args: &TetherArgs,
    printer: &Printer,
) -> anyhow::Result<()> {
    let step = printer.step("Restarting the workloads' pods through the anchor");
    let restarted = tether::restart(tethered, &outcome.namespaces).await?;
    step.done(format!("{restarted} pods"));
    let report = Tethered {
        cluster: tethered.name.clone(),
        anchor: anchor.0.to_owned(),
        anchor_cluster_id: anchor.1.to_string(),
        namespaces: outcome.namespaces,
        kept_offloaded: outcome.kept,
        nodes_tainted: tainted,
        pods_restarted: restarted,
    };
    report.print(args, printer)
}

impl Tethered {
    /// Says what the tether made, as `-o` asks.
    fn print(&self, args: &TetherArgs, printer: &Printer) -> anyhow::Result<()> {
        if let Some(format) = args.output.output {
            return printer.structured(self, format);
        }
        let report = self;
        for ns in &report.kept_offloaded {
            printer.info(format!(
                "note: namespace {ns} was offloaded already and is left as it was"
            ));
        }
        printer.result(format!(
            "cluster {} is tethered to {}: {} namespaces go through it, {} pods restarted; \
             `liqoctl untether` takes it back",
            report.cluster,
            report.anchor,
            report.namespaces.len(),
            report.pods_restarted
        ));
        Ok(())
    }
}

/// What was there before this run, so that a rollback removes only what
/// the run made.
#[derive(Debug, Default)]
struct Made {
    policy: bool,
    anchor_peering: bool,
    tethered_peering: bool,
    tainted: usize,
    handed_over: bool,
}

/// Checks both clusters and what they hold; refuses a tether that cannot
/// be made, before anything is written.
async fn check_tether(
    kubeconfig: &std::path::Path,
    args: &TetherArgs,
    global: &GlobalArgs,
) -> anyhow::Result<(Pair, Made)> {
    let ends = Pair::connect(global, kubeconfig, args.remote_context.as_deref()).await?;
    let (tethered, anchor) = (&ends.tethered, &ends.anchor);
    let anchor_cluster = &ends.anchor_id.cluster_id;
    let here = check_tethered_side(tethered, anchor_cluster).await?;
    let there = State::read(anchor).await?;
    if let Some(to) = there.tethered_to.as_ref().or(there.begun_with.as_ref()) {
        return Err(UserError::Refused(format!(
            "cluster {} is itself tethered to {to}; a tethered cluster cannot be an anchor",
            anchor.name
        ))
        .into());
    }
    let made = Made {
        policy: here.begun_with.is_none(),
        anchor_peering: !peered(anchor, &ends.tethered_id.cluster_id).await?,
        tethered_peering: !peered(tethered, anchor_cluster).await?,
        tainted: 0,
        handed_over: false,
    };
    Ok((ends, made))
}

/// Refuses a tether of `tethered` to `anchor_cluster` that its own state
/// forbids: tethered already, a tether to another cluster not finished,
/// an anchor itself, or a provider for another peer. Returns its state.
async fn check_tethered_side(
    tethered: &ClusterClient,
    anchor_cluster: &ClusterId,
) -> anyhow::Result<State> {
    let here = State::read(tethered).await?;
    if let Some(to) = &here.tethered_to {
        return Err(UserError::Refused(format!(
            "cluster {} is already tethered to {to}; run `liqoctl untether` first",
            tethered.name
        ))
        .into());
    }
    if let Some(to) = here.begun_with.as_ref().filter(|to| *to != anchor_cluster) {
        return Err(UserError::Refused(format!(
            "a tether of cluster {} to {to} was not finished; run `liqoctl untether` first",
            tethered.name
        ))
        .into());
    }
    if !here.anchor_of.is_empty() {
        return Err(UserError::Refused(format!(
            "cluster {} is the anchor of {}; an anchor cannot be tethered",
            tethered.name,
            ids(&here.anchor_of)
        ))
        .into());
    }
    // Everything the tethered cluster has goes to its anchor: it may
    // provide for no one else.
    let tenants: Api<Tenant> = Api::all(tethered.client.clone());
    let others: Vec<ClusterId> = tenants
        .list(&Default::default())
        .await
        .map_err(|e| tethered.explain(e, "listing the tenants"))?
        .items
        .into_iter()
        .filter_map(|t| ClusterId::new(t.metadata.name?).ok())
        .filter(|id| id != anchor_cluster)
        .collect();
    if !others.is_empty() {
        return Err(UserError::Refused(format!(
            "cluster {} provides for {}; a tethered cluster gives all it has to its anchor alone: \
             end those peerings first (`liqoctl unpeer` on each consumer)",
            tethered.name,
            ids(&others)
        ))
        .into());
    }
    Ok(here)
}

fn ids(ids: &[ClusterId]) -> String {
    ids.iter()
        .map(ClusterId::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `consumer` has an outgoing peering with `provider`.
async fn peered(consumer: &ClusterClient, provider: &ClusterId) -> anyhow::Result<bool> {
    let fcs: Api<ForeignCluster> = Api::all(consumer.client.clone());
    Ok(fcs
        .get_opt(provider.as_str())
        .await
        .map_err(|e| consumer.explain(e, "reading the peerings"))?
        .is_some())
}

/// One run of `tether`.
struct Run<'a> {
    ends: &'a Pair,
    made: Made,
    printer: &'a Printer,
    deadline: tokio::time::Instant,
    timeout: u64,
}

impl Run<'_> {
    /// The steps, in order; each records in [`Made`] what it made.
    async fn forward(&mut self, args: &TetherArgs) -> anyhow::Result<HandedOver> {
        let Pair {
            tethered, anchor, ..
        } = self.ends;
        let anchor_cluster = &self.ends.anchor_id.cluster_id;
        let step = self.printer.step(format!(
            "Offering {} all that {} has",
            anchor.name, tethered.name
        ));
        tether::give_everything(tethered, anchor_cluster).await?;
        step.done("");

        let asked = Asked {
            request: None,
            require_request: false,
            renew: false,
            certificate_lifetime: None,
            network: !args.no_network,
            timeout: self.timeout,
        };
        by_kubeconfigs::peer(anchor, tethered, &asked, self.printer, self.deadline).await?;
        by_kubeconfigs::peer(tethered, anchor, &asked, self.printer, self.deadline).await?;

        let step = self
            .printer
            .step(format!("Tainting the nodes of {}", tethered.name));
        self.made.tainted =
            tether::taint_nodes(tethered, &self.ends.anchor_id.cluster_name).await?;
        step.done(format!("{} nodes", self.made.tainted));

        let step = self.printer.step(format!(
            "Offloading the namespaces of {} to {}",
            tethered.name, anchor.name
        ));
        self.made.handed_over = true;
        let handed = tether::hand_over(tethered, anchor_cluster).await?;
        step.done(handed.namespaces.join(", "));

        tether::mark(anchor, &self.ends.tethered_id.cluster_id, Role::Anchor).await?;
        tether::mark(tethered, anchor_cluster, Role::Tethered).await?;
        Ok(handed)
    }

    /// Removes what this run made, newest first.
    async fn roll_back(&self) {
        let ends = self.ends;
        let peerings = async {
            let mut left = Vec::new();
            for (made, role) in [
                (self.made.tethered_peering, Role::Tethered),
                (self.made.anchor_peering, Role::Anchor),
            ] {
                if made
                    && let Err(e) = ends
                        .peering(role, self.deadline, self.timeout)
                        .remove(BY_KUBECONFIGS)
                        .await
                {
                    left.push(format!("a peering ({e:#})"));
                }
            }
            left
        };
        let run = RolledBack {
            tethered: &ends.tethered,
            anchor_cluster: &ends.anchor_id.cluster_id,
            made: &self.made,
            deadline: self.deadline,
            timeout: self.timeout,
        };
        run.roll_back(self.printer, peerings).await;
    }
}

/// What a failed run of `tether` removes on the tethered cluster.
struct RolledBack<'a> {
    tethered: &'a ClusterClient,
    anchor_cluster: &'a ClusterId,
    made: &'a Made,
    deadline: tokio::time::Instant,
    timeout: u64,
}

impl RolledBack<'_> {
    /// Removes what the run made, newest first: the offloadings, the
    /// taints, then its peerings (`peerings` removes them and says what it
    /// could not), then the policy; says what is left.
    async fn roll_back(
        &self,
        printer: &Printer,
        peerings: impl std::future::Future<Output = Vec<String>>,
    ) {
        let step = printer.step("Rolling back what this run made");
        let (tethered, anchor_cluster) = (self.tethered, self.anchor_cluster);
        let mut left = Vec::new();
        if self.made.handed_over
            && let Err(e) =
                tether::take_back(tethered, anchor_cluster, self.deadline, self.timeout).await
        {
            left.push(format!("the offloadings ({e:#})"));
        }
        if self.made.tainted > 0
            && let Err(e) = tether::untaint_nodes(tethered).await
        {
            left.push(format!("the taints ({e:#})"));
        }
        left.extend(peerings.await);
        if self.made.policy
            && let Err(e) = tether::take_back_everything(tethered, anchor_cluster).await
        {
            left.push(format!("the sharing policy ({e:#})"));
        }
        if left.is_empty() {
            step.done("");
        } else {
            step.fail(format!(
                "could not remove {}; run `liqoctl untether`",
                left.join(", ")
            ));
        }
    }
}

pub async fn untether(
    args: &UntetherArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let Some(kubeconfig) = args.remote_kubeconfig.as_deref() else {
        return by_token::untether(args, global, printer).await;
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let step = printer.step("Checking the clusters");
    let ends = match check_untether(kubeconfig, args, global).await {
        Ok(ends) => ends,
        Err(e) => {
            step.fail("");
            return Err(e);
        }
    };
    step.done("");
    confirm(
        &printer,
        Role::Anchor,
        &ends.tethered.name,
        &ends.anchor.name,
        global,
    )?;
    let Pair {
        tethered, anchor, ..
    } = &ends;
    let anchor_cluster = &ends.anchor_id.cluster_id;

    // The nodes first, so that the pods made again find room at home.
    let step = printer.step(format!("Untainting the nodes of {}", tethered.name));
    let untainted = tether::untaint_nodes(tethered).await?;
    step.done(format!("{untainted} nodes"));

    let step = printer.step(format!(
        "Taking the namespaces of {} back from {}",
        tethered.name, anchor.name
    ));
    let (namespaces, moved) =
        tether::take_back(tethered, anchor_cluster, deadline, args.timeout).await?;
    step.done(format!(
        "{}; {moved} pods restarted here",
        namespaces.join(", ")
    ));

    let step = printer.step(format!(
        "Removing the peerings of {} and {}",
        tethered.name, anchor.name
    ));
    let mut notes = ends
        .peering(Role::Tethered, deadline, args.timeout)
        .remove(BY_KUBECONFIGS)
        .await?;
    notes.extend(
        ends.peering(Role::Anchor, deadline, args.timeout)
            .remove(BY_KUBECONFIGS)
            .await?,
    );
    // The anchor's pods that ran here: their node is gone; their
    // controllers make them again on the anchor's own nodes.
    let node = peering::virtual_node(&ends.tethered_id.cluster_id);
    let sent_back = tether::delete_pods_on(anchor, None, &node, true).await?;
    step.done(format!(
        "{sent_back} pods of {} rescheduled there",
        anchor.name
    ));
    for note in &notes {
        printer.info(format!("  {note}"));
    }

    tether::take_back_everything(tethered, anchor_cluster).await?;
    printer.result(format!(
        "cluster {} schedules its own workloads again: {} namespaces taken back from {}",
        tethered.name,
        namespaces.len(),
        anchor.name
    ));
    Ok(())
}

/// Checks that the local cluster is tethered (or was being tethered) to
/// the cluster of the kubeconfig.
async fn check_untether(
    kubeconfig: &std::path::Path,
    args: &UntetherArgs,
    global: &GlobalArgs,
) -> anyhow::Result<Pair> {
    let ends = Pair::connect(global, kubeconfig, args.remote_context.as_deref()).await?;
    let state = State::read(&ends.tethered).await?;
    let Some(to) = state.begun_with.or(state.tethered_to) else {
        return Err(UserError::Refused(format!(
            "cluster {} is not tethered; nothing to untether",
            ends.tethered.name
        ))
        .into());
    };
    if to != ends.anchor_id.cluster_id {
        return Err(UserError::Refused(format!(
            "cluster {} is tethered to {to}, not to {} ({}); pass the kubeconfig of {to}",
            ends.tethered.name, ends.anchor_id.cluster_id, ends.anchor.name
        ))
        .into());
    }
    Ok(ends)
}
