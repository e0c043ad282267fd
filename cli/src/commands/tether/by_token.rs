//! `liqoctl tether --token-file` and the `untether` of such a tether:
//! this cluster's side of the tether, with its own kubeconfig and a
//! peering token of the anchor's (docs/tethering.md, "With a token"). The
//! anchor's side (its peering with this cluster, so that its pods can run
//! here) is its administrator's: `tether` says how.

use std::time::Duration;

use liqo_api::tether::Role;
use liqo_api::{ClusterId, ClusterIdentity};

use super::{Made, RolledBack, check_tethered_side, confirm, finish, peered};
use crate::cli::{GlobalArgs, TetherArgs, UntetherArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::cluster::installed;
use crate::peering::by_token::{self, Checked};
use crate::peering::check_compatible;
use crate::peering::outgoing::{Identity, identity_of};
use crate::peering::phases::{BY_TOKEN, Ends};
use crate::peering::tether::{self, HandedOver, State};
use crate::printer::Printer;

/// This cluster, and the anchor as the token (or the tether) names it.
struct OurSide {
    tethered: ClusterClient,
    tethered_id: ClusterIdentity,
    anchor_cluster: ClusterId,
    anchor_name: String,
}

pub(super) async fn tether(
    args: &TetherArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let step = printer.step("Checking the cluster and the token");
    let checked = match check(args, global).await {
        Ok(checked) => checked,
        Err(e) => {
            step.fail("");
            return Err(e);
        }
    };
    let (ends, token, made) = checked;
    step.done(format!(
        "{} tethers to {} ({})",
        ends.tethered.name, ends.anchor_name, ends.anchor_cluster
    ));
    confirm(
        &printer,
        Role::Tethered,
        &ends.tethered.name,
        &ends.anchor_name,
        global,
    )?;
    let mut run = Run {
        ends: &ends,
        made,
        printer: &printer,
        deadline,
        timeout: args.timeout,
    };
    let outcome = match run.forward(args, &token).await {
        Ok(outcome) => outcome,
        Err(e) => {
            run.roll_back().await;
            return Err(e);
        }
    };
    finish(
        &ends.tethered,
        (&ends.anchor_name, &ends.anchor_cluster),
        outcome,
        run.made.tainted,
        args,
        &printer,
    )
    .await?;
    if args.output.output.is_none() {
        printer.info(format!(
            "so that {anchor}'s own pods can run here too, its administrator peers with this \
             cluster: run here `liqoctl generate peering-token --for {id}`, and there `liqoctl \
             peer --token-file FILE`",
            anchor = ends.anchor_name,
            id = ends.anchor_cluster
        ));
    }
    Ok(())
}

/// Checks the token and this cluster; refuses a tether that cannot be
/// made, before anything is written.
async fn check(args: &TetherArgs, global: &GlobalArgs) -> anyhow::Result<(OurSide, Checked, Made)> {
    let text = by_token::read(args.token.as_deref(), args.token_file.as_deref())?;
    let checked = Checked::new(&text)?;
    let tethered = ClusterClient::local(global).await?;
    let tethered_id = installed(&tethered).await?;
    check_compatible(&tethered.name, &tethered_id.version)?;
    checked.usable_by(&tethered, &tethered_id)?;
    let anchor_cluster = checked.token.provider_cluster_id.clone();
    let here = check_tethered_side(&tethered, &anchor_cluster).await?;
    let made = Made {
        policy: here.begun_with.is_none(),
        anchor_peering: false,
        tethered_peering: !peered(&tethered, &anchor_cluster).await?,
        tainted: 0,
        handed_over: false,
    };
    let ends = OurSide {
        tethered,
        tethered_id,
        anchor_name: checked.token.provider_cluster_name.clone(),
        anchor_cluster,
    };
    Ok((ends, checked, made))
}

/// One run of `tether --token-file`.
struct Run<'a> {
    ends: &'a OurSide,
    made: Made,
    printer: &'a Printer,
    deadline: tokio::time::Instant,
    timeout: u64,
}

impl Run<'_> {
    /// The steps, in order; each records in [`Made`] what it made.
    async fn forward(&mut self, args: &TetherArgs, token: &Checked) -> anyhow::Result<HandedOver> {
        let OurSide {
            tethered,
            tethered_id,
            anchor_cluster,
            anchor_name,
        } = self.ends;
        let step = self.printer.step(format!(
            "Offering {anchor_name} all that {} has",
            tethered.name
        ));
        tether::give_everything(tethered, anchor_cluster).await?;
        step.done("");
        if self.made.tethered_peering {
            by_token::peer(
                tethered,
                tethered_id.clone(),
                token,
                &by_token::Asked {
                    credential_lifetime: None,
                    network: !args.no_network,
                    timeout: self.timeout,
                },
                self.printer,
                self.deadline,
            )
            .await?;
        }
        let step = self
            .printer
            .step(format!("Tainting the nodes of {}", tethered.name));
        self.made.tainted = tether::taint_nodes(tethered, anchor_name).await?;
        step.done(format!("{} nodes", self.made.tainted));
        let step = self.printer.step(format!(
            "Offloading the namespaces of {} to {anchor_name}",
            tethered.name
        ));
        self.made.handed_over = true;
        let handed = tether::hand_over(tethered, anchor_cluster).await?;
        step.done(handed.namespaces.join(", "));
        tether::mark(tethered, anchor_cluster, Role::Tethered).await?;
        Ok(handed)
    }

    /// Removes what this run made, newest first.
    async fn roll_back(&self) {
        let peering = async {
            if !self.made.tethered_peering {
                return Vec::new();
            }
            match end_peering(self.ends, self.deadline, self.timeout).await {
                Ok(_) => Vec::new(),
                Err(e) => vec![format!("the peering ({e:#})")],
            }
        };
        let run = RolledBack {
            tethered: &self.ends.tethered,
            anchor_cluster: &self.ends.anchor_cluster,
            made: &self.made,
            deadline: self.deadline,
            timeout: self.timeout,
        };
        run.roll_back(self.printer, peering).await;
    }
}

/// Ends this cluster's peering with the anchor with the peering's own
/// credential, as `unpeer --cluster-id` does for a token's peering.
/// Nothing to do when there is none (any more). Returns what could not be
/// removed.
async fn end_peering(
    ends: &OurSide,
    deadline: tokio::time::Instant,
    timeout: u64,
) -> anyhow::Result<Vec<String>> {
    let Identity::Token {
        tenant, kubeconfig, ..
    } = identity_of(&ends.tethered, &ends.anchor_cluster).await?
    else {
        return Ok(Vec::new());
    };
    let anchor =
        ClusterClient::from_kubeconfig_yaml(ends.anchor_cluster.as_str(), &kubeconfig).await?;
    Ends {
        consumer: Some(&ends.tethered),
        provider: Some(&anchor),
        provider_id: ends.anchor_cluster.clone(),
        consumer_id: ends.tethered_id.cluster_id.clone(),
        tenant,
        deadline,
        timeout,
        keep_claims: false,
    }
    .remove(BY_TOKEN)
    .await
}

/// `untether` without the anchor's kubeconfig: for a tether made with a
/// token, this cluster's side, in the order of the other `untether`.
pub(super) async fn untether(
    args: &UntetherArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let step = printer.step("Checking the cluster");
    let ends = match check_untether(global).await {
        Ok(ends) => ends,
        Err(e) => {
            step.fail("");
            return Err(e);
        }
    };
    step.done(format!(
        "{} is tethered to {}",
        ends.tethered.name, ends.anchor_cluster
    ));
    let anchor = ends.anchor_cluster.to_string();
    confirm(&printer, Role::Anchor, &ends.tethered.name, &anchor, global)?;
    let tethered = &ends.tethered;
    let step = printer.step(format!("Untainting the nodes of {}", tethered.name));
    let untainted = tether::untaint_nodes(tethered).await?;
    step.done(format!("{untainted} nodes"));
    let step = printer.step(format!(
        "Taking the namespaces of {} back from {}",
        tethered.name, ends.anchor_cluster
    ));
    let (namespaces, moved) =
        tether::take_back(tethered, &ends.anchor_cluster, deadline, args.timeout).await?;
    step.done(format!(
        "{}; {moved} pods restarted here",
        namespaces.join(", ")
    ));
    let step = printer.step(format!(
        "Removing the peering of {} with {}",
        tethered.name, ends.anchor_cluster
    ));
    let notes = end_peering(&ends, deadline, args.timeout).await?;
    step.done("");
    for note in &notes {
        printer.info(format!("  {note}"));
    }
    tether::take_back_everything(tethered, &ends.anchor_cluster).await?;
    if peered_back(tethered, &ends.anchor_cluster).await? {
        printer.info(format!(
            "cluster {anchor} still peers with this cluster, as an ordinary consumer: its \
             administrator ends that with `liqoctl unpeer` there, or `liqoctl unpeer --tenant \
             {anchor}` here",
            anchor = ends.anchor_cluster
        ));
    }
    printer.result(format!(
        "cluster {} schedules its own workloads again: {} namespaces taken back from {}",
        tethered.name,
        namespaces.len(),
        ends.anchor_cluster
    ));
    Ok(())
}

/// Checks that the local cluster is tethered (or was being tethered)
/// with a token.
async fn check_untether(global: &GlobalArgs) -> anyhow::Result<OurSide> {
    let tethered = ClusterClient::local(global).await?;
    let tethered_id = installed(&tethered).await?;
    let state = State::read(&tethered).await?;
    let Some(anchor_cluster) = state.begun_with.or(state.tethered_to) else {
        return Err(UserError::Refused(format!(
            "cluster {} is not tethered; nothing to untether",
            tethered.name
        ))
        .into());
    };
    if !matches!(
        identity_of(&tethered, &anchor_cluster).await?,
        Identity::Token { .. } | Identity::Absent
    ) {
        return Err(UserError::Usage(format!(
            "cluster {} was tethered to {anchor_cluster} with its kubeconfig; pass it with \
             --remote-kubeconfig",
            tethered.name
        ))
        .into());
    }
    Ok(OurSide {
        anchor_name: anchor_cluster.to_string(),
        tethered,
        tethered_id,
        anchor_cluster,
    })
}

/// Whether `anchor` peers with `cluster` (is its tenant).
async fn peered_back(cluster: &ClusterClient, anchor: &ClusterId) -> anyhow::Result<bool> {
    let tenants: kube::Api<liqo_api::authentication::Tenant> =
        kube::Api::all(cluster.client.clone());
    Ok(tenants
        .get_opt(anchor.as_str())
        .await
        .map_err(|e| cluster.explain(e, "reading the tenants"))?
        .is_some())
}
