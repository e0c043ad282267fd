//! `liqoctl peer`: the local cluster (the consumer) peers with a provider
//! whose kubeconfig it is given. Checks everything it can before it writes
//! (both installed, not the same cluster, versions, the provider's policy
//! and the grant), then runs the peering's phases; a failed phase rolls
//! back what the run did on both clusters, and a re-run resumes. The
//! phases are [`crate::peering::phases`]'; `peer --token` and `peer
//! request|accept|complete` are verbs of their own.

use std::time::Duration;

use liqo_api::sharing::Amounts;

use crate::cli::{GlobalArgs, PeerArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::flags::parse_request;
use crate::kube::cluster::installed;
use crate::peering::agreement::Agreement;
use crate::peering::check_compatible;
use crate::peering::phases::{self, BY_KUBECONFIGS, Credentials, Peering};
use crate::peering::report::{Report, print_reports};
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
    let agreement = match agree(consumer, provider, request, args).await {
        Ok(agreement) => agreement,
        Err(e) => {
            step.fail("");
            return Err(e);
        }
    };
    step.done(format!("grant {}", show_resources(&agreement.grant)));

    let mut run = Peering::new(
        Some(consumer),
        agreement.consumer_id.clone(),
        Credentials::Administrator {
            policy: &agreement.policy,
            renew: args.renew,
            certificate_lifetime: args.certificate_lifetime,
            csr: None,
        },
        agreement.granted(),
        printer,
    );
    run.provider = Some(provider.clone());
    run.provider_id = Some(agreement.provider_id.clone());
    run.run(&phases::with_network(BY_KUBECONFIGS, !args.no_network))
        .await?;

    run.finish(deadline, args.timeout).await
}

/// Checks the consumer (installed, of a compatible version), then what
/// the provider grants it.
async fn agree(
    consumer: &ClusterClient,
    provider: &ClusterClient,
    request: Option<&Amounts>,
    args: &PeerArgs,
) -> anyhow::Result<Agreement> {
    let consumer_id = installed(consumer).await?;
    check_compatible(&consumer.name, &consumer_id.version)?;
    Agreement::for_consumer(
        consumer_id,
        &consumer.name,
        provider,
        request,
        args.request.require_request,
    )
    .await
}
