//! `liqoctl unpeer`: removes everything a peering made, on both clusters,
//! and waits until it is gone. With `--force` and no provider kubeconfig,
//! cleans the consumer's side alone (the provider is gone for good).

use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::wait::conditions;
use liqo_api::ClusterId;
use liqo_api::core::ForeignCluster;
use liqo_api::names::{labels, peering};
use liqo_api::offloading::NamespaceOffloading;

use crate::cli::{GlobalArgs, UnpeerArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::apply::{self, Deletion};
use crate::kube::cluster::read_identity;
use crate::kube::wait::{self, Waited};
use crate::manifests::Manifest;
use crate::peering::outgoing::{Identity, identity_of};
use crate::peering::{tenant, virtual_kubelet};
use crate::printer::Printer;

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
    step.done("");

    // Both sides at once: the provider's tenant namespace takes the
    // namespace controller's time, the consumer's side much less.
    let what = match &provider {
        Some(p) => format!(
            "Removing the peering from clusters {} and {}",
            consumer.name, p.name
        ),
        None => format!("Removing the peering from cluster {}", consumer.name),
    };
    let step = printer.step(what);
    let consumer_side =
        remove_consumer_side(&consumer, &provider_cluster_id, deadline, args.timeout);
    let provider_side = async {
        match &provider {
            Some(p) => remove_tenant(p, &tenant, deadline, args.timeout).await,
            None => Ok(Vec::new()),
        }
    };
    let (consumer_left, provider_left) = tokio::join!(consumer_side, provider_side);
    let mut left = match (consumer_left, provider_left) {
        (Ok(mut a), Ok(b)) => {
            a.extend(b);
            a
        }
        (Err(e), _) | (_, Err(e)) => {
            step.fail("");
            return Err(e);
        }
    };
    left.dedup();
    step.done("");
    for object in &left {
        printer.info(format!("  left {object}: liqoctl did not create it"));
    }
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
    let twins = twins_on(consumer, provider_id).await?;
    step.done("");
    let step = printer.step(format!(
        "Removing the peering from cluster {} and, as tenant {tenant}, from cluster {provider_id}",
        consumer.name
    ));
    let provider = ClusterClient::from_kubeconfig_yaml(provider_id.as_str(), kubeconfig).await?;
    let mut notes = Vec::new();
    let namespaces: Api<Namespace> = Api::all(provider.client.clone());
    for twin in &twins {
        match namespaces.delete(twin, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => notes.push(format!(
                "twin namespace {twin} on cluster {provider_id}: {e}"
            )),
        }
    }
    let tenants: Api<liqo_api::authentication::Tenant> = Api::all(provider.client.clone());
    match tenants
        .delete(tenant.as_str(), &DeleteParams::background())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        // The provider ended the tenancy already: nothing left to delete.
        Err(kube::Error::Api(s)) if s.code == 401 => notes.push(format!(
            "cluster {provider_id} no longer accepts this peering's credential: its administrator \
             ended the tenancy already"
        )),
        Err(e) => {
            step.fail("");
            return Err(provider.explain(e, &format!("ending the tenancy {tenant}")));
        }
    }
    let left = remove_consumer_side(consumer, provider_id, deadline, args.timeout).await?;
    step.done("");
    for note in notes.iter().chain(&left) {
        printer.info(format!("  {note}"));
    }
    printer.result(format!(
        "cluster {} no longer peers with {provider_id}; the provider removes the tenant {tenant}",
        consumer.name
    ));
    Ok(())
}

/// The twin namespaces on `provider` the local offloadings report.
async fn twins_on(consumer: &ClusterClient, provider: &ClusterId) -> anyhow::Result<Vec<String>> {
    let api: Api<NamespaceOffloading> = Api::all(consumer.client.clone());
    let list = match api.list(&Default::default()).await {
        Ok(list) => list,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Vec::new()),
        Err(e) => return Err(consumer.explain(e, "listing offloaded namespaces")),
    };
    Ok(list
        .items
        .into_iter()
        .filter_map(|o| o.status)
        .flat_map(|s| s.clusters)
        .filter(|c| &c.cluster_id == provider)
        .map(|c| c.remote_namespace)
        .collect())
}

/// On the consumer: the virtual kubelet, the identity, the ForeignCluster
/// and the virtual node; waits until the node and the record are gone.
async fn remove_consumer_side(
    consumer: &ClusterClient,
    provider: &ClusterId,
    deadline: tokio::time::Instant,
    timeout: u64,
) -> anyhow::Result<Vec<String>> {
    let mut objects = virtual_kubelet::manifests(
        provider,
        None,
        &Default::default(),
        &[],
        &Default::default(),
    );
    objects.push(Manifest::Secret(crate::manifests::from_json(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": peering::identity_secret(provider), "namespace": liqo_api::names::NAMESPACE },
    }))));
    // The tunnel's end here; the provider's goes with the tenant namespace.
    objects.push(crate::peering::network::consumer_end(provider));
    // Its rights in offloaded namespaces (those of namespaces still
    // offloaded would otherwise stay, owned by their offloadings).
    objects.extend(offloaded_namespace_bindings(consumer, provider).await?);
    let left = delete_all(consumer, &objects).await?;
    release_offloadings(consumer, provider).await?;
    let fcs: Api<ForeignCluster> = Api::all(consumer.client.clone());
    let fc_uid = fcs
        .get_opt(provider.as_str())
        .await
        .map_err(|e| consumer.explain(e, "reading the ForeignCluster"))?
        .filter(|fc| crate::kube::ownership::is_ours(&fc.metadata))
        .and_then(|fc| fc.metadata.uid);
    if fc_uid.is_some() {
        // In the background: what it owns was deleted just above, and the
        // garbage collector takes the rest (the agent's pods).
        let _ = fcs
            .delete(provider.as_str(), &DeleteParams::background())
            .await;
    }
    let node_name = peering::virtual_node(provider);
    let nodes: Api<Node> = Api::all(consumer.client.clone());
    let node_uid = nodes
        .get_opt(&node_name)
        .await
        .map_err(|e| consumer.explain(e, "reading the virtual node"))?
        .filter(|n| crate::kube::ownership::is_ours(&n.metadata))
        .and_then(|n| n.metadata.uid);
    if let Some(uid) = &node_uid {
        let _ = nodes.delete(&node_name, &DeleteParams::default()).await;
        gone(consumer, nodes, &node_name, uid, deadline, timeout).await?;
    }
    if let Some(uid) = &fc_uid {
        gone(consumer, fcs, provider.as_str(), uid, deadline, timeout).await?;
    }
    Ok(left)
}

/// The RoleBindings of the virtual kubelet of `provider` in offloaded
/// namespaces, wherever they are: found by their labels, which its other
/// bindings (in `kube-node-lease` and `kube-system`) share, and told
/// apart by the role they bind.
async fn offloaded_namespace_bindings(
    consumer: &ClusterClient,
    provider: &ClusterId,
) -> anyhow::Result<Vec<Manifest>> {
    let bindings: Api<RoleBinding> = Api::all(consumer.client.clone());
    let selector = format!(
        "{},{}={provider}",
        virtual_kubelet::agents_selector(),
        labels::PEER_CLUSTER_ID
    );
    let list = bindings
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| consumer.explain(e, "listing the virtual kubelet's RoleBindings"))?;
    Ok(list
        .items
        .iter()
        .filter(|b| b.role_ref.name == peering::virtual_kubelet_offloaded_role(provider))
        .filter_map(|b| b.metadata.namespace.as_deref())
        .map(|ns| virtual_kubelet::offloaded_namespace_binding(provider, ns, None))
        .collect())
}

/// Takes the provider's finalizer off every NamespaceOffloading: its
/// virtual kubelet, which would have removed it once the twin namespace
/// was gone, is gone itself (only reached with `--force` while namespaces
/// are offloaded; the twin namespaces go with the tenant).
async fn release_offloadings(consumer: &ClusterClient, provider: &ClusterId) -> anyhow::Result<()> {
    let finalizer = peering::twin_finalizer(provider);
    let api: Api<NamespaceOffloading> = Api::all(consumer.client.clone());
    let list = match api.list(&Default::default()).await {
        Ok(list) => list,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(consumer.explain(e, "listing offloaded namespaces")),
    };
    for off in list
        .items
        .into_iter()
        .filter(|o| o.finalizers().contains(&finalizer))
    {
        let (Some(ns), Some(name)) = (off.metadata.namespace.clone(), off.metadata.name.clone())
        else {
            continue;
        };
        let kept: Vec<&String> = off
            .finalizers()
            .iter()
            .filter(|f| **f != finalizer)
            .collect();
        // With the resourceVersion read: a concurrent change makes this fail
        // rather than drop someone else's finalizer.
        let patch = serde_json::json!({ "metadata": {
            "finalizers": kept,
            "resourceVersion": off.metadata.resource_version,
        }});
        Api::<NamespaceOffloading>::namespaced(consumer.client.clone(), &ns)
            .patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map_err(|e| {
                consumer.explain(e, &format!("releasing the offloading of namespace {ns}"))
            })?;
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
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        ))
        .into());
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
    let left = remove_tenant(&provider, &consumer, deadline, args.timeout).await?;
    step.done("");
    for object in &left {
        printer.info(format!("  left {object}: liqoctl did not create it"));
    }
    printer.result(format!(
        "cluster {} no longer provides for {consumer}; run `liqoctl unpeer --force --cluster-id <this cluster's ID>` \
         on {consumer} to remove its virtual node",
        provider.name
    ));
    Ok(())
}

/// Deletes a tenant's record, RBAC, quota and namespace on its provider,
/// and any CSR of it left over; waits until the namespace is gone.
async fn remove_tenant(
    provider: &ClusterClient,
    consumer: &ClusterId,
    deadline: tokio::time::Instant,
    timeout: u64,
) -> anyhow::Result<Vec<String>> {
    let left = delete_all(provider, &tenant::names_of(consumer)).await?;
    let csrs: Api<CertificateSigningRequest> = Api::all(provider.client.clone());
    let _ = csrs
        .delete(&format!("liqo-peer-{consumer}"), &DeleteParams::default())
        .await;
    let namespaces: Api<Namespace> = Api::all(provider.client.clone());
    // Twin namespaces the consumer's virtual kubelets left (a forced
    // unpeer, an agent that never cleaned up): nobody could manage them any
    // more. Deleted, not awaited: their pods may take their grace period.
    // The consumer's agent may still be stopping meanwhile (both sides go
    // at once) and make one again before its rights are gone everywhere:
    // so they are looked for until none that is not already going is seen
    // twice in a row, a second apart (at most 10 s).
    let selector = ListParams::default().labels(&format!("{}={consumer}", labels::TENANT));
    let mut quiet = 0;
    for _ in 0..10 {
        let twins = namespaces
            .list(&selector)
            .await
            .map_err(|e| provider.explain(e, "listing the tenant's twin namespaces"))?;
        let live: Vec<String> = twins
            .items
            .into_iter()
            .filter(|n| n.metadata.deletion_timestamp.is_none())
            .filter_map(|n| n.metadata.name)
            .collect();
        quiet = if live.is_empty() { quiet + 1 } else { 0 };
        if quiet == 2 {
            break;
        }
        for name in live {
            match namespaces.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    return Err(provider.explain(e, &format!("deleting twin namespace {name}")));
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    let ns = peering::tenant_namespace(consumer);
    if let Some(uid) = namespaces
        .get_opt(&ns)
        .await
        .map_err(|e| provider.explain(e, "reading the tenant namespace"))?
        .and_then(|n| n.metadata.uid)
    {
        gone(provider, namespaces, &ns, &uid, deadline, timeout).await?;
    }
    Ok(left)
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
