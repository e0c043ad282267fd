//! `liqoctl tether` and `untether`: the tethered working mode
//! (docs/tethering.md). Run on the cluster that hands its scheduling over
//! (the tethered one), with the kubeconfig of the one that takes it (the
//! anchor), or with a peering token of the anchor's for this cluster's
//! side alone ("With a token"). Both check everything before they write,
//! then run the tether's phases ([`crate::peering::tether::Tether`]):
//! forward, rolled back on failure, or backwards.

use std::path::Path;
use std::time::Duration;

use kube::api::Api;
use liqo_api::authentication::Tenant;
use liqo_api::tether::Role;
use liqo_api::{ClusterId, ClusterIdentity};
use serde::Serialize;

use crate::cli::{GlobalArgs, TetherArgs, UntetherArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::cluster::installed;
use crate::peering::by_token::{self, Checked};
use crate::peering::check_compatible;
use crate::peering::outgoing::{Identity, identity_of};
use crate::peering::tether::{Anchor, Outcome, State, Tether};
use crate::printer::Printer;

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

/// This cluster, as checked.
struct Here {
    client: ClusterClient,
    id: ClusterIdentity,
}

impl Here {
    async fn connect(global: &GlobalArgs) -> anyhow::Result<Self> {
        let client = ClusterClient::local(global).await?;
        let id = installed(&client).await?;
        check_compatible(&client.name, &id.version)?;
        Ok(Self { client, id })
    }
}

/// The anchor, as its kubeconfig reaches it: checked, and not this
/// cluster itself.
async fn connect_anchor(
    here: &Here,
    kubeconfig: &Path,
    context: Option<&str>,
) -> anyhow::Result<(ClusterClient, ClusterIdentity)> {
    let anchor = ClusterClient::connect(Some(kubeconfig), context).await?;
    let anchor_id = installed(&anchor).await?;
    check_compatible(&anchor.name, &anchor_id.version)?;
    if here.id.cluster_id == anchor_id.cluster_id {
        return Err(UserError::Usage(format!(
            "--remote-kubeconfig reaches cluster {} itself; pass the anchor's kubeconfig",
            here.client.name
        ))
        .into());
    }
    Ok((anchor, anchor_id))
}

pub async fn tether(
    args: &TetherArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let by_token = args.remote_kubeconfig.is_none();
    let step = printer.step(if by_token {
        "Checking the cluster and the token"
    } else {
        "Checking the clusters"
    });
    let checked = async {
        let here = Here::connect(global).await?;
        let reached = match &args.remote_kubeconfig {
            Some(kubeconfig) => Reached::Kubeconfig(
                connect_anchor(&here, kubeconfig, args.remote_context.as_deref()).await?,
            ),
            None => {
                let text = by_token::read(args.token.as_deref(), args.token_file.as_deref())?;
                let checked = Checked::new(&text)?;
                checked.usable_by(&here.client, &here.id)?;
                Reached::Token(checked)
            }
        };
        check_tether(&here.client, &reached.anchor()).await?;
        anyhow::Ok((here, reached))
    }
    .await;
    let (here, reached) = step.ended_saying(checked, |(here, reached)| {
        let anchor = reached.anchor();
        format!(
            "{} tethers to {} ({})",
            here.client.name,
            anchor.name(),
            anchor.cluster_id()
        )
    })?;
    let tether = Tether {
        tethered: &here.client,
        tethered_id: &here.id,
        anchor: reached.anchor(),
        printer: &printer,
        deadline,
        timeout: args.timeout,
    };
    confirm(&printer, Role::Tethered, &tether, global)?;

    let outcome = tether.run(!args.no_network).await?;
    let report = Tethered::of(&tether, outcome);
    report.print(args, &printer)?;
    if let (Anchor::Token(_), None) = (&tether.anchor, args.output.output) {
        printer.info(format!(
            "so that {anchor}'s own pods can run here too, its administrator peers with this \
             cluster: run here `liqoctl generate peering-token --for {id}`, and there `liqoctl \
             peer --token-file FILE`",
            anchor = tether.anchor.name(),
            id = tether.anchor.cluster_id()
        ));
    }
    Ok(())
}

/// How `tether` reached its anchor, held while the tether borrows it.
enum Reached {
    Kubeconfig((ClusterClient, ClusterIdentity)),
    Token(Checked),
}

impl Reached {
    fn anchor(&self) -> Anchor<'_> {
        match self {
            Self::Kubeconfig((client, id)) => Anchor::Reached { client, id },
            Self::Token(checked) => Anchor::Token(checked),
        }
    }
}

/// Asks before a tether (`to` is [`Role::Tethered`]) or an untether
/// ([`Role::Anchor`]: the scheduling goes back from the anchor).
fn confirm(
    printer: &Printer,
    to: Role,
    tether: &Tether<'_>,
    global: &GlobalArgs,
) -> anyhow::Result<()> {
    let (tethered, anchor) = (&tether.tethered.name, tether.anchor.name());
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

impl Tethered {
    fn of(tether: &Tether<'_>, outcome: Outcome) -> Self {
        Self {
            cluster: tether.tethered.name.clone(),
            anchor: tether.anchor.name().to_owned(),
            anchor_cluster_id: tether.anchor.cluster_id().to_string(),
            namespaces: outcome.handed_over.namespaces,
            kept_offloaded: outcome.handed_over.kept,
            nodes_tainted: outcome.tainted,
            pods_restarted: outcome.restarted,
        }
    }

    /// Says what the tether made, as `-o` asks.
    fn print(&self, args: &TetherArgs, printer: &Printer) -> anyhow::Result<()> {
        if let Some(format) = args.output.output {
            return printer.structured(self, format);
        }
        for ns in &self.kept_offloaded {
            printer.info(format!(
                "note: namespace {ns} was offloaded already and is left as it was"
            ));
        }
        printer.result(format!(
            "cluster {} is tethered to {}: {} namespaces go through it, {} pods restarted; \
             `liqoctl untether` takes it back",
            self.cluster,
            self.anchor,
            self.namespaces.len(),
            self.pods_restarted
        ));
        Ok(())
    }
}

/// Refuses a tether of `tethered` to `anchor` that either's state
/// forbids: tethered already, a tether to another cluster not finished,
/// an anchor itself, or a provider for another peer; an anchor (as far as
/// it is reached) tethered itself.
async fn check_tether(tethered: &ClusterClient, anchor: &Anchor<'_>) -> anyhow::Result<()> {
    if let Anchor::Reached { client, .. } = anchor {
        let there = State::read(client).await?;
        if let Some(to) = there.tethered_to.as_ref().or(there.begun_with.as_ref()) {
            return Err(UserError::Refused(format!(
                "cluster {} is itself tethered to {to}; a tethered cluster cannot be an anchor",
                client.name
            ))
            .into());
        }
    }
    let anchor_cluster = anchor.cluster_id();
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
    Ok(())
}

fn ids(ids: &[ClusterId]) -> String {
    ids.iter()
        .map(ClusterId::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

pub async fn untether(
    args: &UntetherArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let step = printer.step(if args.remote_kubeconfig.is_some() {
        "Checking the clusters"
    } else {
        "Checking the cluster"
    });
    let checked = async {
        let here = Here::connect(global).await?;
        let anchor = match &args.remote_kubeconfig {
            Some(kubeconfig) => {
                Some(connect_anchor(&here, kubeconfig, args.remote_context.as_deref()).await?)
            }
            None => None,
        };
        let tethered_to = check_untether(&here, anchor.as_ref()).await?;
        anyhow::Ok((here, anchor, tethered_to))
    }
    .await;
    let (here, reached, tethered_to) = step.ended_saying(checked, |(here, _, to)| {
        format!("{} is tethered to {to}", here.client.name)
    })?;
    let anchor = match &reached {
        Some((client, id)) => Anchor::Reached { client, id },
        None => Anchor::Named(tethered_to),
    };
    let tether = Tether {
        tethered: &here.client,
        tethered_id: &here.id,
        anchor,
        printer: &printer,
        deadline,
        timeout: args.timeout,
    };
    confirm(&printer, Role::Anchor, &tether, global)?;

    let taken = tether.remove().await?;
    for note in &taken.notes {
        printer.info(format!("  {note}"));
    }
    if let Anchor::Named(anchor) = &tether.anchor
        && peered_back(&here.client, anchor).await?
    {
        printer.info(format!(
            "cluster {anchor} still peers with this cluster, as an ordinary consumer: its \
             administrator ends that with `liqoctl unpeer` there, or `liqoctl unpeer --tenant \
             {anchor}` here"
        ));
    }
    printer.result(format!(
        "cluster {} schedules its own workloads again: {} namespaces taken back from {}",
        here.client.name,
        taken.namespaces.len(),
        tether.anchor.name()
    ));
    Ok(())
}

/// Checks that this cluster is tethered (or was being tethered) to the
/// cluster of the kubeconfig, when given; without it, that the tether was
/// made with a token. Returns the anchor's cluster ID.
async fn check_untether(
    here: &Here,
    anchor: Option<&(ClusterClient, ClusterIdentity)>,
) -> anyhow::Result<ClusterId> {
    let tethered = &here.client;
    let state = State::read(tethered).await?;
    let Some(to) = state.begun_with.or(state.tethered_to) else {
        return Err(UserError::Refused(format!(
            "cluster {} is not tethered; nothing to untether",
            tethered.name
        ))
        .into());
    };
    match anchor {
        Some((client, id)) if to != id.cluster_id => Err(UserError::Refused(format!(
            "cluster {} is tethered to {to}, not to {} ({}); pass the kubeconfig of {to}",
            tethered.name, id.cluster_id, client.name
        ))
        .into()),
        Some(_) => Ok(to),
        None => match identity_of(tethered, &to).await? {
            Identity::Token { .. } | Identity::Absent => Ok(to),
            Identity::Certificate => Err(UserError::Usage(format!(
                "cluster {} was tethered to {to} with its kubeconfig; pass it with \
                 --remote-kubeconfig",
                tethered.name
            ))
            .into()),
        },
    }
}

/// Whether `anchor` peers with `cluster` (is its tenant).
async fn peered_back(cluster: &ClusterClient, anchor: &ClusterId) -> anyhow::Result<bool> {
    let tenants: Api<Tenant> = Api::all(cluster.client.clone());
    Ok(tenants
        .get_opt(anchor.as_str())
        .await
        .map_err(|e| cluster.explain(e, "reading the tenants"))?
        .is_some())
}
