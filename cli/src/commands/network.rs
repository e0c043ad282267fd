//! `liqoctl network connect|disconnect`: the tunnel of an existing
//! outgoing peering, written or removed on both clusters with the local
//! kubeconfig and the peering's own identity on the provider (which may
//! write Connections in its tenant namespace), however it was peered.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use liqo_api::ClusterId;
use liqo_api::core::ForeignCluster;
use liqo_api::names::{self, peering};

use crate::cli::{GlobalArgs, NetworkArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::peering::{Journal, network};
use crate::printer::Printer;

pub async fn connect(
    args: &NetworkArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let peering = Peering::open(args, global).await?;
    let consumer_id = crate::commands::peer::installed(&peering.consumer).await?;
    let provider_id = crate::commands::peer::installed(&peering.provider).await?;
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
            for object in journal
                .roll_back(&peering.consumer, &peering.provider)
                .await
            {
                printer.info(format!("  could not remove {object}"));
            }
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
    let peering = Peering::open(args, global).await?;
    let consumer_id = crate::commands::peer::installed(&peering.consumer).await?;
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

/// An outgoing peering, and the provider reached with its identity.
pub(crate) struct Peering {
    pub consumer: ClusterClient,
    pub provider: ClusterClient,
    pub provider_id: ClusterId,
    /// The provider's cluster name, for people to read.
    pub provider_name: String,
    pub tenant_namespace: String,
}

impl Peering {
    async fn open(args: &NetworkArgs, global: &GlobalArgs) -> anyhow::Result<Self> {
        let provider_id = ClusterId::new(args.cluster_id.clone())
            .map_err(|e| UserError::Usage(format!("--cluster-id: {e}")))?;
        let consumer = ClusterClient::local(global).await?;
        Self::reach(consumer, provider_id).await
    }

    /// The peering of `consumer` with `provider_id`, its provider reached
    /// with the peering's own identity (kept in the consumer's `liqo`).
    pub(crate) async fn reach(
        consumer: ClusterClient,
        provider_id: ClusterId,
    ) -> anyhow::Result<Self> {
        let not_peered = || {
            UserError::NotFound(format!(
                "cluster {} has no outgoing peering with {provider_id}; `liqoctl info` lists them",
                consumer.name
            ))
        };
        let fc = Api::<ForeignCluster>::all(consumer.client.clone())
            .get_opt(provider_id.as_str())
            .await
            .map_err(|e| consumer.explain(e, "reading the ForeignCluster"))?
            .filter(|fc| fc.spec.outgoing)
            .ok_or_else(not_peered)?;
        let provider_name = fc.spec.cluster_name.clone();
        let tenant_namespace = fc
            .status
            .and_then(|s| s.tenant_namespace)
            .ok_or_else(not_peered)?;
        let secret = peering::identity_secret(&provider_id);
        let kubeconfig = Api::<Secret>::namespaced(consumer.client.clone(), names::NAMESPACE)
            .get_opt(&secret)
            .await
            .map_err(|e| consumer.explain(e, &format!("reading Secret {secret}")))?
            .and_then(|s| s.data?.remove("kubeconfig"))
            .and_then(|k| String::from_utf8(k.0).ok())
            .ok_or_else(not_peered)?;
        let provider =
            ClusterClient::from_kubeconfig_yaml(provider_id.as_str(), &kubeconfig).await?;
        Ok(Self {
            consumer,
            provider,
            provider_id,
            provider_name,
            tenant_namespace,
        })
    }
}
