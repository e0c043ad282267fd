//! The network of a peering: the two ends of its tunnel, written as
//! Connections (docs/network.md), in three steps:
//! 1. the consumer's gateway key, read from the ConfigMap its gateway
//!    publishes it in;
//! 2. the provider's end, in the consumer's tenant namespace on the
//!    provider, with the consumer's key and pod CIDR; the provider's
//!    gateway answers in its status with its own key and the endpoint it
//!    listens on for this consumer;
//! 3. the consumer's end, in `liqo` on the consumer, with the provider's
//!    key, endpoint and pod CIDR; the consumer's gateway dials, and the
//!    step ends when the handshake is done.
//!
//! The provider's end is written with whatever credentials reach the
//! provider: its administrator's, or the consumer's own identity there
//! (peering with a token), which may write Connections in its tenant
//! namespace only. Each end is recorded in the journal, so a failure
//! removes what this run made.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use liqo_api::ClusterIdentity;
use liqo_api::names::{self, labels};
use liqo_api::networking::{Connection, ConnectionSpec, conditions};

use super::journal::Journal;
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::wait::{self, Waited};
use crate::manifests::{Manifest, common_labels};
use crate::printer::Printer;

/// How long the provider's gateway has to answer, and the tunnel to come
/// up (each). Not the command's `--timeout`, which bounds the wait for the
/// virtual node: a gateway answers in about a second, or not at all.
pub const WAIT: Duration = Duration::from_secs(60);

/// What a connected peering's network is, as `peer` and `network
/// connect` report it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Linked {
    /// Where the consumer's gateway dials.
    pub endpoint: String,
    /// Where the consumer sees the provider's pods.
    pub provider_pods_seen_as: String,
    /// Where the provider sees the consumer's pods.
    pub consumer_pods_seen_as: String,
}

/// Both ends of the tunnel between `consumer` and `provider`, as a step
/// of the command's output; returns once the consumer's gateway has
/// completed a handshake.
pub async fn connect(
    consumer: &ClusterClient,
    consumer_id: &ClusterIdentity,
    provider: &ClusterClient,
    provider_id: &ClusterIdentity,
    tenant_namespace: &str,
    journal: &mut Journal,
    printer: &Printer,
) -> anyhow::Result<Linked> {
    let step = printer.step(format!(
        "Linking the networks of clusters {} and {}",
        consumer.name, provider.name
    ));
    let linked = link(
        consumer,
        consumer_id,
        provider,
        provider_id,
        tenant_namespace,
        journal,
    )
    .await;
    match &linked {
        Ok(linked) => step.done(format!("tunnel up to {}", linked.endpoint)),
        Err(_) => step.fail(""),
    }
    linked
}

async fn link(
    consumer: &ClusterClient,
    consumer_id: &ClusterIdentity,
    provider: &ClusterClient,
    provider_id: &ClusterIdentity,
    tenant_namespace: &str,
    journal: &mut Journal,
) -> anyhow::Result<Linked> {
    let consumer_key = gateway_key(consumer).await?;

    let provider_end = connection(
        tenant_namespace,
        consumer_id,
        consumer_key,
        None,
        "tunnel-provider",
    );
    // A tenant's namespace holds one tunnel: its gateway takes the oldest
    // Connection there and refuses the others (they get no port).
    journal
        .apply(provider, Manifest::Connection(Box::new(provider_end)))
        .await?;
    let api: Api<Connection> = Api::namespaced(provider.client.clone(), tenant_namespace);
    let name = consumer_id.cluster_id.as_str();
    let answered = |c: Option<&Connection>| {
        c.is_some_and(|c| c.failing().is_some())
            || c.and_then(|c| c.status.as_ref()).is_some_and(|s| {
                s.public_key.is_some() && (s.endpoint.is_some() || refused(&s.conditions).is_some())
            })
    };
    let answer = match wait::until(
        provider,
        api,
        name,
        answered,
        WAIT,
        "waiting for the provider's gateway",
    )
    .await?
    {
        Waited::Done(Some(c)) if c.failing().is_some() => {
            return Err(cannot_run(provider, c.failing().unwrap_or_default()));
        }
        Waited::Done(Some(c)) => c.status.unwrap_or_default(),
        Waited::Done(None) => {
            return Err(UserError::Refused(format!(
                "the Connection {tenant_namespace}/{name} on cluster {} was deleted meanwhile",
                provider.name
            ))
            .into());
        }
        Waited::TimedOut => {
            return Err(UserError::Timeout(format!(
                "the gateway of cluster {} did not take the tunnel within {}s: is it running? \
                 (`kubectl -n {} get pods` on it); or peer with --no-network",
                provider.name,
                WAIT.as_secs(),
                names::NAMESPACE
            ))
            .into());
        }
    };
    if let Some(why) = refused(&answer.conditions) {
        return Err(UserError::Refused(format!(
            "the gateway of cluster {} refused the tunnel: {why}",
            provider.name
        ))
        .into());
    }
    let (Some(provider_key), Some(endpoint)) = (answer.public_key, answer.endpoint) else {
        return Err(UserError::Refused(format!(
            "the gateway of cluster {} has no address for peers to dial: install it with \
             --gateway-address",
            provider.name
        ))
        .into());
    };

    let consumer_end = connection(
        names::NAMESPACE,
        provider_id,
        provider_key,
        Some(endpoint.clone()),
        "tunnel-consumer",
    );
    journal
        .apply(consumer, Manifest::Connection(Box::new(consumer_end)))
        .await?;
    let api: Api<Connection> = Api::namespaced(consumer.client.clone(), names::NAMESPACE);
    let name = provider_id.cluster_id.as_str();
    let up = |c: Option<&Connection>| c.is_some_and(Connection::is_established);
    // Either end's gateway may fail to run its tunnel (a port taken, no
    // TUN device): told at once, not after the wait.
    let ends = [
        (consumer, names::NAMESPACE, provider_id.cluster_id.as_str()),
        (provider, tenant_namespace, consumer_id.cluster_id.as_str()),
    ];
    let waited = tokio::select! {
        waited = wait::until(consumer, api, name, up, WAIT, "waiting for the tunnel") => waited?,
        (cluster, why) = failing_end(&ends) => return Err(cannot_run(cluster, &why)),
    };
    let established = match waited {
        Waited::Done(Some(c)) => c,
        _ => {
            return Err(UserError::Timeout(format!(
                "no handshake between the gateways of clusters {} and {} within {}s: the \
                 gateway of {} must reach UDP {endpoint} (see `liqoctl info` and the gateways' \
                 logs); or peer with --no-network and connect later with `liqoctl network connect`",
                consumer.name,
                provider.name,
                WAIT.as_secs(),
                consumer.name
            ))
            .into());
        }
    };
    let provider_view = Api::<Connection>::namespaced(provider.client.clone(), tenant_namespace)
        .get(consumer_id.cluster_id.as_str())
        .await
        .map_err(|e| provider.explain(e, "reading the provider's end of the tunnel"))?;
    Ok(Linked {
        endpoint,
        provider_pods_seen_as: seen_as(&established),
        consumer_pods_seen_as: seen_as(&provider_view),
    })
}

/// Deletes both ends, if they are there and ours; a missing end is no
/// error (a re-run, or a peering without a network).
pub async fn disconnect(
    consumer: &ClusterClient,
    provider_id: &liqo_api::ClusterId,
    provider: Option<(&ClusterClient, &str, &liqo_api::ClusterId)>,
) -> anyhow::Result<bool> {
    let mut removed = false;
    removed |= delete_ours(consumer, consumer_end(provider_id)).await?;
    if let Some((provider, tenant_namespace, consumer_id)) = provider {
        removed |= delete_ours(provider, stub(tenant_namespace, consumer_id)).await?;
    }
    Ok(removed)
}

async fn delete_ours(cluster: &ClusterClient, manifest: Manifest) -> anyhow::Result<bool> {
    use crate::kube::apply::Deletion;
    Ok(matches!(
        crate::kube::apply::delete(cluster, &manifest).await?,
        Deletion::Deleted { .. }
    ))
}

/// The consumer's end of the tunnel to `provider`, to delete it.
pub fn consumer_end(provider: &liqo_api::ClusterId) -> Manifest {
    stub(names::NAMESPACE, provider)
}

fn stub(namespace: &str, peer: &liqo_api::ClusterId) -> Manifest {
    let mut c = Connection::new(
        peer.as_str(),
        ConnectionSpec {
            cluster_id: peer.clone(),
            cluster_name: String::new(),
            public_key: String::new(),
            endpoint: None,
            pod_cidr: String::new(),
            exports: None,
        },
    );
    c.metadata.namespace = Some(namespace.to_owned());
    Manifest::Connection(Box::new(c))
}

/// The consumer gateway's public key, as its gateway published it.
async fn gateway_key(cluster: &ClusterClient) -> anyhow::Result<String> {
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), names::NAMESPACE);
    let map = maps
        .get_opt(names::GATEWAY_CONFIGMAP)
        .await
        .map_err(|e| cluster.explain(e, "reading the gateway's public key"))?;
    map.and_then(|m| m.data?.remove(names::GATEWAY_PUBLIC_KEY))
        .ok_or_else(|| {
            UserError::Refused(format!(
                "the gateway of cluster {} has not published its key yet: is it running? \
                 (`kubectl -n {} get pods`; `liqoctl install` starts it)",
                cluster.name,
                names::NAMESPACE
            ))
            .into()
        })
}

/// One end of the tunnel: in `namespace`, standing for `peer`.
fn connection(
    namespace: &str,
    peer: &ClusterIdentity,
    public_key: String,
    endpoint: Option<String>,
    component: &str,
) -> Connection {
    let mut l = common_labels(component);
    l.insert(
        labels::PEER_CLUSTER_ID.to_owned(),
        peer.cluster_id.to_string(),
    );
    let mut c = Connection::new(
        peer.cluster_id.as_str(),
        ConnectionSpec {
            cluster_id: peer.cluster_id.clone(),
            cluster_name: peer.cluster_name.clone(),
            public_key,
            endpoint,
            pod_cidr: peer.pod_cidr.to_string(),
            exports: None,
        },
    );
    c.metadata.namespace = Some(namespace.to_owned());
    c.metadata.labels = Some(l);
    c
}

/// The first of `ends` (a cluster, the namespace and name of its end of
/// the tunnel) whose gateway cannot keep the tunnel running, and why;
/// never returns while none fails.
async fn failing_end<'a>(ends: &[(&'a ClusterClient, &str, &str)]) -> (&'a ClusterClient, String) {
    loop {
        for (cluster, namespace, name) in ends {
            let api: Api<Connection> = Api::namespaced(cluster.client.clone(), namespace);
            if let Ok(Some(c)) = api.get_opt(name).await
                && let Some(why) = c.failing()
            {
                return (cluster, why.to_owned());
            }
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// The error for a gateway of `cluster` that cannot run its tunnel.
fn cannot_run(cluster: &ClusterClient, why: &str) -> anyhow::Error {
    UserError::Refused(format!(
        "the gateway of cluster {} cannot run the tunnel: {why} (see `liqoctl info` and the \
         gateway's log there); fix it and run the same command again, or peer with --no-network",
        cluster.name
    ))
    .into()
}

/// Why the gateway refused a connection, if it did.
fn refused(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Option<String> {
    conditions
        .iter()
        .find(|c| c.type_ == conditions::CONFIGURED && c.status == "False" && c.reason == "Refused")
        .map(|c| c.message.clone())
}

fn seen_as(c: &Connection) -> String {
    c.status
        .as_ref()
        .and_then(|s| s.peer_seen_as.clone())
        .unwrap_or_else(|| c.spec.pod_cidr.clone())
}
