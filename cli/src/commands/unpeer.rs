//! `liqoctl unpeer`: removes everything a peering made, on both clusters,
//! and waits until it is gone. With `--force` and no provider kubeconfig,
//! cleans the consumer's side alone (the provider is gone for good).

use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, DeleteParams};
use kube::runtime::wait::conditions;
use liqo_api::ClusterId;
use liqo_api::core::ForeignCluster;
use liqo_api::names::peering;
use liqo_api::offloading::NamespaceOffloading;
use liqo_api::sharing::Resources;

use crate::cli::{GlobalArgs, UnpeerArgs};
use crate::commands::install::read_identity;
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::k8s::apply::{self, Deletion};
use crate::k8s::wait::{self, Waited};
use crate::manifests::Manifest;
use crate::peering::{tenant, virtual_kubelet};
use crate::printer::Printer;

pub async fn run(args: &UnpeerArgs, global: &GlobalArgs, printer: Printer) -> anyhow::Result<()> {
    let consumer = ClusterClient::local(global).await?;
    let provider = match &args.remote.remote_kubeconfig {
        Some(path) => {
            Some(ClusterClient::connect(Some(path), args.remote.remote_context.as_deref()).await?)
        }
        None if args.force => None,
        None => {
            return Err(UserError::Usage(
                "pass the provider's kubeconfig with --remote-kubeconfig, or --force --cluster-id ID \
                 to clean this side alone when the provider is gone for good"
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
    let offloaded = offloaded_to(&consumer, &provider_cluster_id).await?;
    if !offloaded.is_empty() && !args.force {
        step.fail("in use");
        return Err(UserError::Refused(format!(
            "namespaces {} are offloaded to cluster {provider_cluster_id}; unoffload them first, or pass --force",
            offloaded.join(", ")
        ))
        .into());
    }
    step.done("");

    // The consumer's side: the virtual kubelet, its node, the identity and
    // the record.
    let step = printer.step(format!(
        "Removing the peering from cluster {}",
        consumer.name
    ));
    let mut consumer_side =
        virtual_kubelet::manifests(&provider_cluster_id, None, &Default::default(), &[]);
    consumer_side.push(Manifest::Secret(crate::manifests::from_json(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": peering::identity_secret(&provider_cluster_id), "namespace": liqo_api::names::NAMESPACE },
    }))));
    let mut left = delete_all(&consumer, &consumer_side).await?;
    let fcs: Api<ForeignCluster> = Api::all(consumer.client.clone());
    let fc_uid = fcs
        .get_opt(provider_cluster_id.as_str())
        .await
        .map_err(|e| consumer.explain(e, "reading the ForeignCluster"))?
        .and_then(|fc| fc.metadata.uid);
    if fc_uid.is_some() {
        let _ = fcs
            .delete(provider_cluster_id.as_str(), &DeleteParams::foreground())
            .await;
    }
    let node_name = peering::virtual_node(&provider_cluster_id);
    let nodes: Api<Node> = Api::all(consumer.client.clone());
    let node_uid = nodes
        .get_opt(&node_name)
        .await
        .map_err(|e| consumer.explain(e, "reading the virtual node"))?
        .filter(|n| crate::k8s::ownership::is_ours(&n.metadata))
        .and_then(|n| n.metadata.uid);
    if let Some(uid) = &node_uid {
        let _ = nodes.delete(&node_name, &DeleteParams::default()).await;
        gone(&consumer, nodes, &node_name, uid, deadline, args.timeout).await?;
    }
    if let Some(uid) = &fc_uid {
        gone(
            &consumer,
            fcs,
            provider_cluster_id.as_str(),
            uid,
            deadline,
            args.timeout,
        )
        .await?;
    }
    step.done("");

    // The provider's side: the tenant, its RBAC, quota and namespace.
    if let Some(provider) = &provider {
        let step = printer.step(format!(
            "Removing the tenant from cluster {}",
            provider.name
        ));
        let record = tenant::manifests(&consumer_id, None, &Resources::default(), None);
        left.extend(delete_all(provider, &record).await?);
        let csrs: Api<CertificateSigningRequest> = Api::all(provider.client.clone());
        let _ = csrs
            .delete(
                &format!("liqo-peer-{}", consumer_id.cluster_id),
                &DeleteParams::default(),
            )
            .await;
        let namespaces: Api<Namespace> = Api::all(provider.client.clone());
        let ns = peering::tenant_namespace(&consumer_id.cluster_id);
        if let Some(uid) = namespaces
            .get_opt(&ns)
            .await
            .map_err(|e| provider.explain(e, "reading the tenant namespace"))?
            .and_then(|n| n.metadata.uid)
        {
            gone(provider, namespaces, &ns, &uid, deadline, args.timeout).await?;
        }
        step.done("");
    }
    for object in &left {
        printer.info(format!("  left {object}: liqoctl did not create it"));
    }
    printer.result(format!(
        "cluster {} no longer peers with {provider_cluster_id}{}",
        consumer.name,
        if provider.is_none() {
            " (its side was not touched)"
        } else {
            ""
        }
    ));
    Ok(())
}

/// Deletes what is ours among `objects`; returns those left as foreign.
async fn delete_all(cluster: &ClusterClient, objects: &[Manifest]) -> anyhow::Result<Vec<String>> {
    let mut left = Vec::new();
    for m in objects.iter().rev() {
        if apply::delete(cluster, m).await? == Deletion::Foreign {
            left.push(format!("{} on cluster {}", m.describe(), cluster.name));
        }
    }
    Ok(left)
}

async fn gone<K>(
    cluster: &ClusterClient,
    api: Api<K>,
    name: &str,
    uid: &str,
    deadline: tokio::time::Instant,
    timeout: u64,
) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + Send + serde::de::DeserializeOwned + 'static,
{
    let waited = wait::until(
        cluster,
        api,
        name,
        conditions::is_deleted(uid),
        wait::left(deadline),
        &format!("waiting for {name} to be deleted"),
    )
    .await?;
    if let Waited::TimedOut = waited {
        return Err(UserError::Timeout(format!(
            "{name} is still being deleted on cluster {} after {timeout}s; run unpeer again",
            cluster.name
        ))
        .into());
    }
    Ok(())
}

/// The namespaces whose offloading selects the provider (all of them do
/// when they name no cluster).
async fn offloaded_to(
    cluster: &ClusterClient,
    provider: &ClusterId,
) -> anyhow::Result<Vec<String>> {
    let api: Api<NamespaceOffloading> = Api::all(cluster.client.clone());
    let list = match api.list(&Default::default()).await {
        Ok(list) => list,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Vec::new()),
        Err(e) => return Err(cluster.explain(e, "listing offloaded namespaces")),
    };
    Ok(list
        .items
        .into_iter()
        .filter(|o| o.spec.cluster_ids.is_empty() || o.spec.cluster_ids.contains(provider))
        .filter_map(|o| o.metadata.namespace)
        .collect())
}
