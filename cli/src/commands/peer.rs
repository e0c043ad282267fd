//! `liqoctl peer`: the local cluster (the consumer) peers with a provider
//! whose kubeconfig it is given. Checks everything it can before it writes
//! (both installed, not the same cluster, versions, the provider's policy
//! and the grant), then runs the peering's phases; a failed phase rolls
//! back what the run did on both clusters, and a re-run resumes. The
//! phases are [`crate::peering::phases`]'; `peer --token` and `peer
//! request|accept|complete` are verbs of their own.

use std::time::Duration;

use crate::cli::{GlobalArgs, PeerArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::flags::parse_request;
use crate::peering::by_kubeconfigs::{self, Asked};
use crate::peering::report::print_reports;
use crate::printer::Printer;

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

    let asked = Asked {
        request: request.as_ref(),
        require_request: args.request.require_request,
        renew: args.renew,
        certificate_lifetime: args.certificate_lifetime,
        network: !args.no_network,
        timeout: args.timeout,
    };
    let mut reports =
        vec![by_kubeconfigs::peer(&local, &remote, &asked, &printer, deadline).await?];
    if args.bidirectional {
        reports.push(by_kubeconfigs::peer(&remote, &local, &asked, &printer, deadline).await?);
    }
    print_reports(&reports, args.output.output, &printer)
}
