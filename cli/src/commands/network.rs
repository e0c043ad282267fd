//! `liqoctl network connect|disconnect`: the tunnel of an existing
//! outgoing peering, written or removed on both clusters with the local
//! kubeconfig and the peering's own identity on the provider (which may
//! write Connections in its tenant namespace), however it was peered.

use liqo_api::ClusterId;

use crate::cli::{GlobalArgs, NetworkArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::cluster::installed;
use crate::peering::journal::Journal;
use crate::peering::network;
use crate::peering::outgoing::Outgoing;
use crate::printer::Printer;

pub async fn connect(
    args: &NetworkArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let peering = open(args, global).await?;
    let consumer_id = installed(&peering.consumer).await?;
    let provider_id = installed(&peering.provider).await?;
    if provider_id.cluster_id != peering.provider_id {
        return Err(UserError::Refused(format!(
            "the peering's credential for {} reaches cluster {} instead: unpeer and peer again",
            peering.provider_id, provider_id.cluster_id
        ))
        .into());
    }
    let mut journal = Journal::default();
    let linked = network::connect(
        &peering.consumer,
        &consumer_id,
        &peering.provider,
        &provider_id,
        &peering.tenant_namespace,
        &mut journal,
        &printer,
    )
    .await;
    let linked = match linked {
        Ok(linked) => linked,
        Err(e) => {
            journal.undo(&printer).await;
            return Err(e);
        }
    };
    if let Some(format) = args.output.output {
        return printer.structured(&linked, format);
    }
    printer.result(format!(
        "the pod networks of clusters {} and {} are linked: tunnel to {}; its pods are seen here \
         as {}, ours there as {}",
        peering.consumer.name,
        provider_id.cluster_name,
        linked.endpoint,
        linked.provider_pods_seen_as,
        linked.consumer_pods_seen_as
    ));
    Ok(())
}

pub async fn disconnect(
    args: &NetworkArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let peering = open(args, global).await?;
    let consumer_id = installed(&peering.consumer).await?;
    let step = printer.step(format!(
        "Removing the tunnel between clusters {} and {}",
        peering.consumer.name, peering.provider_id
    ));
    let removed = network::disconnect(
        &peering.consumer,
        &peering.provider_id,
        Some((
            &peering.provider,
            &peering.tenant_namespace,
            &consumer_id.cluster_id,
        )),
    )
    .await;
    match removed {
        Ok(removed) => {
            step.done(if removed { "" } else { "there was none" });
            printer.result(format!(
                "the pod networks of clusters {} and {} are not linked",
                peering.consumer.name, peering.provider_id
            ));
            Ok(())
        }
        Err(e) => {
            step.fail("");
            Err(e)
        }
    }
}

/// The outgoing peering `--cluster-id` names, of the local cluster.
async fn open(args: &NetworkArgs, global: &GlobalArgs) -> anyhow::Result<Outgoing> {
    let provider_id = ClusterId::new(args.cluster_id.clone())
        .map_err(|e| UserError::Usage(format!("--cluster-id: {e}")))?;
    let consumer = ClusterClient::local(global).await?;
    Outgoing::reach(consumer, provider_id).await
}
