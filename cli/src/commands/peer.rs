//! `liqoctl peer`: the local cluster (the consumer) peers with a provider
//! whose kubeconfig it is given. Checks everything it can before it writes
//! (both installed, not the same cluster, versions, the provider's policy
//! and the grant), then runs its steps; a failed step rolls back what the
//! run created on both clusters, and a re-run resumes. The steps are
//! [`crate::peering::plan`]'s; `peer --token` and `peer request|accept|complete`
//! are verbs of their own.

use std::time::Duration;

use liqo_api::names::peering;
use liqo_api::sharing::Amounts;

use crate::cli::{GlobalArgs, PeerArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::flags::parse_request;
use crate::kube::cluster::installed;
use crate::peering::consumer::wait_for_virtual_node;
use crate::peering::plan::Plan;
use crate::peering::report::{Report, print_reports};
use crate::peering::{Journal, compatible};
use crate::printer::Printer;
use crate::show::show_resources;

pub async fn run(args: &PeerArgs, global: &GlobalArgs, printer: Printer) -> anyhow::Result<()> {
    let request = parse_request(&args.request)?;
    let Some(remote) = args.remote.remote_kubeconfig.as_deref() else {
        return Err(UserError::Usage(
            "pass the provider's kubeconfig with --remote-kubeconfig, or a peering token from its \
             administrator with --token-file"
                .to_owned(),
        )
        .into());
    };
    let local = ClusterClient::local(global).await?;
    let remote =
        ClusterClient::connect(Some(remote), args.remote.remote_context.as_deref()).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);

    let mut reports =
        vec![peer_one(&local, &remote, request.as_ref(), args, &printer, deadline).await?];
    if args.bidirectional {
        reports.push(peer_one(&remote, &local, request.as_ref(), args, &printer, deadline).await?);
    }
    print_reports(&reports, args.output.output, &printer)
}

/// One direction: `consumer` peers with `provider`.
async fn peer_one(
    consumer: &ClusterClient,
    provider: &ClusterClient,
    request: Option<&Amounts>,
    args: &PeerArgs,
    printer: &Printer,
    deadline: tokio::time::Instant,
) -> anyhow::Result<Report> {
    let step = printer.step(format!(
        "Checking clusters {} and {}",
        consumer.name, provider.name
    ));
    let plan = match make_plan(consumer, provider, request, args).await {
        Ok(plan) => plan,
        Err(e) => {
            step.fail("");
            return Err(e);
        }
    };
    step.done(format!("grant {}", show_resources(&plan.grant)));

    let mut journal = Journal::default();
    let outcome = plan
        .carry_out(consumer, provider, &mut journal, printer, !args.no_network)
        .await;
    let (expiry, network) = match outcome {
        Ok(done) => done,
        Err(e) => {
            let step = printer.step("Rolling back what this run created");
            let left = journal.roll_back(consumer, provider).await;
            if left.is_empty() {
                step.done("");
            } else {
                step.fail(format!("could not remove {}", left.join(", ")));
            }
            return Err(e);
        }
    };

    // Past this point everything is in place: a slow node is waited for,
    // not rolled back; the same command picks up from here.
    let node_name = wait_for_virtual_node(
        consumer,
        &plan.provider_id.cluster_id,
        deadline,
        args.timeout,
        printer,
    )
    .await?;

    Ok(Report {
        consumer: consumer.name.clone(),
        provider: provider.name.clone(),
        provider_cluster_id: plan.provider_id.cluster_id.to_string(),
        grant: plan.grant.clone(),
        cost: plan.policy.cost.clone(),
        certificate_expiry: expiry,
        tenant_namespace: peering::tenant_namespace(&plan.consumer_id.cluster_id),
        virtual_node: node_name,
        network,
    })
}

/// Checks the consumer (installed, of a compatible version), then what
/// the provider grants it.
async fn make_plan(
    consumer: &ClusterClient,
    provider: &ClusterClient,
    request: Option<&Amounts>,
    args: &PeerArgs,
) -> anyhow::Result<Plan> {
    let consumer_id = installed(consumer).await?;
    if !compatible(&consumer_id.version) {
        return Err(UserError::Refused(format!(
            "cluster {} runs liqo-rs {}, which liqoctl {} cannot peer; upgrade it with `liqoctl install`",
            consumer.name,
            consumer_id.version,
            liqo_api::VERSION
        ))
        .into());
    }
    Plan::for_consumer(
        consumer_id,
        &consumer.name,
        provider,
        request,
        args.request.require_request,
        args.certificate_lifetime,
    )
    .await
    .map(|plan| Plan {
        renew: args.renew,
        ..plan
    })
}
