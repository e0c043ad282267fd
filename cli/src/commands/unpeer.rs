//! `liqoctl unpeer`: runs the peering's phases backwards, removing
//! everything the peering made on both clusters, and waits until it is
//! gone. With `--force` and no provider kubeconfig,
//! cleans the consumer's side alone (the provider is gone for good).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use liqo_api::ClusterId;
use liqo_api::names::peering;
use liqo_api::offloading::NamespaceOffloading;

use crate::cli::{GlobalArgs, UnpeerArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::cluster::{installed, read_identity};
use crate::peering::kept_claims::{self, RemoteData};
use crate::peering::offloading;
use crate::peering::outgoing::{Identity, identity_of};
use crate::peering::phases::{BY_KUBECONFIGS, BY_TOKEN, Ends, Phase};
use crate::printer::{Printer, Step};

pub async fn run(args: &UnpeerArgs, global: &GlobalArgs, printer: Printer) -> anyhow::Result<()> {
    if let Some(consumer) = &args.tenant {
        return end_tenancy(consumer, args, global, printer).await;
    }
    let consumer = ClusterClient::local(global).await?;
    // A peering made with a token ends with its own credential.
    if args.remote.remote_kubeconfig.is_none()
        && let Some(id) = &args.cluster_id
    {
        let provider = ClusterId::new(id.clone())
            .map_err(|e| UserError::Usage(format!("--cluster-id: {e}")))?;
        if let Identity::Token {
            tenant, kubeconfig, ..
        } = identity_of(&consumer, &provider).await?
        {
            return end_token_peering(&consumer, &provider, &tenant, &kubeconfig, args, printer)
                .await;
        }
    }
    let provider = match &args.remote.remote_kubeconfig {
        Some(path) => {
            Some(ClusterClient::connect(Some(path), args.remote.remote_context.as_deref()).await?)
        }
        None if args.force => None,
        None => {
            return Err(UserError::Usage(
                "pass the provider's kubeconfig with --remote-kubeconfig (a peering made with a token \
                 needs only --cluster-id), or --force --cluster-id ID to clean this side alone when \
                 the provider is gone for good"
                    .to_owned(),
            )
            .into());
        }
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);

    let step = printer.step("Checking the peering");
    let consumer_id = read_identity(&consumer).await?.ok_or_else(|| {
        UserError::NotFound(format!(
            "liqo-rs is not installed on cluster {}",
            consumer.name
        ))
    })?;
    let provider_cluster_id = match (&provider, &args.cluster_id) {
        (Some(p), _) => {
            read_identity(p)
                .await?
                .ok_or_else(|| {
                    UserError::NotFound(format!("liqo-rs is not installed on cluster {}", p.name))
                })?
                .cluster_id
        }
        (None, Some(id)) => ClusterId::new(id.clone())
            .map_err(|e| UserError::Usage(format!("--cluster-id: {e}")))?,
        (None, None) => {
            return Err(UserError::Usage(
                "with --force and no --remote-kubeconfig, name the provider with --cluster-id"
                    .to_owned(),
            )
            .into());
        }
    };
    // The provider knows a peering made with a token by the token's
    // tenant, not by the consumer's cluster ID.
    let tenant = match identity_of(&consumer, &provider_cluster_id).await? {
        Identity::Token { tenant, .. } => tenant,
        _ => consumer_id.cluster_id.clone(),
    };
    let offloaded = offloaded_to(&consumer, &provider_cluster_id).await?;
    if !offloaded.is_empty() && !args.force {
        step.fail("in use");
        return Err(UserError::Refused(format!(
            "namespaces {} are offloaded to cluster {provider_cluster_id}; unoffload them first, or pass --force",
            offloaded.join(", ")
        ))
        .into());
    }
    let data = remote_data(&consumer, &provider_cluster_id, &offloaded, args).await;
    let data = match data {
        Ok(data) => data,
        Err(e) => {
            step.fail("holds data");
            return Err(e);
        }
    };
    step.done("");

    let step = printer.step(match &provider {
        Some(p) => format!(
            "Removing the peering from clusters {} and {}",
            consumer.name, p.name
        ),
        None => format!("Removing the peering from cluster {}", consumer.name),
    });
    let ends = Ends {
        consumer: Some(&consumer),
        provider: provider.as_ref(),
        provider_id: provider_cluster_id.clone(),
        consumer_id: consumer_id.cluster_id.clone(),
        tenant,
        deadline,
        timeout: args.timeout,
        keep_claims: data == RemoteData::Keep,
    };
    remove(&ends, BY_KUBECONFIGS, step, &printer).await?;
    said_of_data(&consumer, &provider_cluster_id, data, &printer).await?;
    printer.result(format!(
        "cluster {} no longer peers with {provider_cluster_id}{}",
        consumer.name,
        if provider.is_none() {
            " (the provider's side was not touched)"
        } else {
            ""
        }
    ));
    Ok(())
}

/// Ends a peering made with a token from the consumer alone: as the
/// tenant, deletes its twin namespaces and its Tenant record on the
/// provider (the provider's garbage collector removes everything the
/// record owns: namespace, RBAC, quota, account, claim), then the
/// consumer's side.
async fn end_token_peering(
    consumer: &ClusterClient,
    provider_id: &ClusterId,
    tenant: &ClusterId,
    kubeconfig: &str,
    args: &UnpeerArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let step = printer.step("Checking the peering");
    let offloaded = offloaded_to(consumer, provider_id).await?;
    if !offloaded.is_empty() && !args.force {
        step.fail("in use");
        return Err(UserError::Refused(format!(
            "namespaces {} are offloaded to cluster {provider_id}; unoffload them first, or pass --force",
            offloaded.join(", ")
        ))
        .into());
    }
    let data = match remote_data(consumer, provider_id, &offloaded, args).await {
        Ok(data) => data,
        Err(e) => {
            step.fail("holds data");
            return Err(e);
        }
    };
    let consumer_id = installed(consumer).await?;
    step.done("");
    let step = printer.step(format!(
        "Removing the peering from cluster {} and, as tenant {tenant}, from cluster {provider_id}",
        consumer.name
    ));
    let provider = ClusterClient::from_kubeconfig_yaml(provider_id.as_str(), kubeconfig).await?;
    let ends = Ends {
        consumer: Some(consumer),
        provider: Some(&provider),
        provider_id: provider_id.clone(),
        consumer_id: consumer_id.cluster_id,
        tenant: tenant.clone(),
        deadline,
        timeout: args.timeout,
        keep_claims: data == RemoteData::Keep,
    };
    remove(&ends, BY_TOKEN, step, &printer).await?;
    said_of_data(consumer, provider_id, data, &printer).await?;
    printer.result(format!(
        "cluster {} no longer peers with {provider_id}; the provider removes the tenant {tenant}",
        consumer.name
    ));
    Ok(())
}

/// What to do with the claims the consumer keeps on `provider`: refused
/// while there are any and nothing was said; keeping them needs their
/// namespaces unoffloaded first (with --keep-remote-data), so that their
/// twin namespaces hold nothing else.
async fn remote_data(
    consumer: &ClusterClient,
    provider: &ClusterId,
    offloaded: &[String],
    args: &UnpeerArgs,
) -> anyhow::Result<RemoteData> {
    let data = RemoteData::of(args.keep_remote_data, args.delete_remote_data);
    let kept = kept_claims::on_consumer(consumer, None, Some(provider)).await?;
    if kept.is_empty() {
        return Ok(data);
    }
    match data {
        RemoteData::Unsaid => {
            Err(kept_claims::refusal(&format!("unpeering from cluster {provider}"), &kept).into())
        }
        RemoteData::Keep if !offloaded.is_empty() => Err(UserError::Refused(format!(
            "to keep the claims of namespaces {} on cluster {provider}, unoffload them with \
             --keep-remote-data first",
            offloaded.join(", ")
        ))
        .into()),
        data => Ok(data),
    }
}

/// Says what became of the claims kept on `provider`, and forgets the
/// volumes of those whose data was deleted.
async fn said_of_data(
    consumer: &ClusterClient,
    provider: &ClusterId,
    data: RemoteData,
    printer: &Printer,
) -> anyhow::Result<()> {
    match data {
        RemoteData::Delete => {
            let forgotten = kept_claims::forget_volumes(consumer, None, Some(provider)).await?;
            if forgotten > 0 {
                printer.info(format!(
                    "  the data of {forgotten} claims kept on {provider} is deleted; delete the \
                     claims (their volumes here go with them; a StatefulSet makes new ones)"
                ));
            }
        }
        RemoteData::Keep => {
            let kept = kept_claims::on_consumer(consumer, None, Some(provider)).await?;
            if !kept.is_empty() {
                printer.info(format!(
                    "  {} claims stay on {provider} in their twin namespaces; peer and offload \
                     their namespaces again to use them",
                    kept.len()
                ));
            }
        }
        RemoteData::Unsaid => {}
    }
    Ok(())
}

/// On the provider alone: ends the tenancy of `consumer`.
async fn end_tenancy(
    consumer: &str,
    args: &UnpeerArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let consumer = ClusterId::new(consumer.to_owned())
        .map_err(|e| UserError::Usage(format!("--tenant: {e}")))?;
    let provider = ClusterClient::local(global).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let tenants: Api<liqo_api::authentication::Tenant> = Api::all(provider.client.clone());
    if tenants
        .get_opt(consumer.as_str())
        .await
        .map_err(|e| provider.explain(e, "reading the tenants"))?
        .is_none()
    {
        let known = tenants
            .list(&Default::default())
            .await
            .map_err(|e| provider.explain(e, "listing the tenants"))?
            .items
            .into_iter()
            .filter_map(|t| t.metadata.name)
            .collect::<Vec<_>>();
        return Err(UserError::NotFound(format!(
            "cluster {} has no tenant {consumer}; its tenants: {}",
            provider.name,
            crate::show::list_or_none(&known)
        ))
        .into());
    }
    // Nothing is deleted by surprise: the data of the consumer's claims
    // goes only when told, as on the consumer's side.
    let kept = kept_claims::on_provider(&provider, &consumer).await?;
    let data = RemoteData::of(args.keep_remote_data, args.delete_remote_data);
    if !kept.is_empty() && data == RemoteData::Unsaid {
        return Err(
            kept_claims::refusal(&format!("ending the tenancy of {consumer}"), &kept).into(),
        );
    }
    if !printer.confirm(
        &format!(
            "End the tenancy of {consumer} on cluster {}?",
            provider.name
        ),
        global.yes,
    )? {
        return Err(UserError::Refused("cancelled; nothing was changed".to_owned()).into());
    }
    let step = printer.step(format!(
        "Removing the tenant {consumer} from cluster {}",
        provider.name
    ));
    let provider_id = installed(&provider).await?.cluster_id;
    let ends = Ends {
        consumer: None,
        provider: Some(&provider),
        provider_id,
        consumer_id: consumer.clone(),
        tenant: consumer.clone(),
        deadline,
        timeout: args.timeout,
        keep_claims: data == RemoteData::Keep,
    };
    remove(&ends, &[Phase::Tenant], step, &printer).await?;
    if data == RemoteData::Keep && !kept.is_empty() {
        printer.info(format!(
            "  {} claims of {consumer} are kept in their twin namespaces here (docs/storage.md)",
            kept.len()
        ));
    }
    printer.result(format!(
        "cluster {} no longer provides for {consumer}; run `liqoctl unpeer --force --cluster-id <this cluster's ID>` \
         on {consumer} to remove its virtual node",
        provider.name
    ));
    Ok(())
}

/// Removes `phases` of the peering `ends` name, as `step`; then prints
/// what the phases had to say of what they could not remove.
async fn remove(
    ends: &Ends<'_>,
    phases: &[Phase],
    step: Step,
    printer: &Printer,
) -> anyhow::Result<()> {
    let notes = match ends.remove(phases).await {
        Ok(notes) => notes,
        Err(e) => {
            step.fail("");
            return Err(e);
        }
    };
    step.done("");
    for note in &notes {
        printer.info(format!("  {note}"));
    }
    // The namespaces offloaded to it (unpeered with --force) are held to
    // the level of the providers they still have.
    if let Some(consumer) = ends.consumer {
        offloading::follow_levels(consumer, &BTreeMap::new()).await?;
    }
    Ok(())
}

/// The namespaces whose offloading selects the provider (all of them do
/// when they have no selector) or still has a twin namespace there.
async fn offloaded_to(
    cluster: &ClusterClient,
    provider: &ClusterId,
) -> anyhow::Result<Vec<String>> {
    // The provider's virtual node carries the labels selectors are over; a
    // node already gone matches only the offloadings that select all peers.
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let node_labels = match nodes.get_opt(&peering::virtual_node(provider)).await {
        Ok(node) => node.and_then(|n| n.metadata.labels).unwrap_or_default(),
        Err(e) => return Err(cluster.explain(e, "reading the virtual node")),
    };
    let api: Api<NamespaceOffloading> = Api::all(cluster.client.clone());
    let list = match api.list(&Default::default()).await {
        Ok(list) => list,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Vec::new()),
        Err(e) => return Err(cluster.explain(e, "listing offloaded namespaces")),
    };
    Ok(list
        .items
        .into_iter()
        .filter(|o| {
            liqo_api::offloading::selects(&o.spec, &node_labels)
                || o.status
                    .as_ref()
                    .is_some_and(|s| s.clusters.iter().any(|c| &c.cluster_id == provider))
        })
        .filter_map(|o| o.metadata.namespace)
        .collect())
}
