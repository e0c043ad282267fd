//! What commands read of a cluster's installation: its liqo identity,
//! where and from which images its agents run, how its gateway is set up,
//! and which optional APIs it serves. Reads only: nothing here writes.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Toleration};
use kube::api::Api;
use liqo_api::ClusterIdentity;
use liqo_api::images::{self, ImageSource};
use liqo_api::names;

use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::manifests;

/// The cluster's liqo identity; a user error if liqo-rs is not installed.
pub async fn installed(cluster: &ClusterClient) -> anyhow::Result<ClusterIdentity> {
    read_identity(cluster).await?.ok_or_else(|| {
        UserError::NotFound(format!(
            "liqo-rs is not installed on cluster {}; run `liqoctl install` there first",
            cluster.name
        ))
        .into()
    })
}

/// The cluster's liqo identity, if liqo-rs is installed.
pub async fn read_identity(cluster: &ClusterClient) -> anyhow::Result<Option<ClusterIdentity>> {
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), names::NAMESPACE);
    let Some(map) = maps
        .get_opt(names::IDENTITY_CONFIGMAP)
        .await
        .map_err(|e| cluster.explain(e, "reading the cluster's liqo identity"))?
    else {
        return Ok(None);
    };
    let identity = ClusterIdentity::from_data(&map.data.unwrap_or_default()).map_err(|e| {
        UserError::Refused(format!(
            "the ConfigMap {}/{} on cluster {} is damaged ({e}); fix or delete it, then install again",
            names::NAMESPACE,
            names::IDENTITY_CONFIGMAP,
            cluster.name
        ))
    })?;
    Ok(Some(identity))
}

/// Where the installed agents may run, and from which images.
#[derive(Debug, Default)]
pub struct Placement {
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    pub images: ImageSource,
}

/// The installed gateway's Deployment, if any: what a run without the
/// flags that shape it keeps.
pub async fn installed_gateway(cluster: &ClusterClient) -> anyhow::Result<Option<Deployment>> {
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), names::NAMESPACE);
    deployments
        .get_opt(names::GATEWAY)
        .await
        .map_err(|e| cluster.explain(e, "reading the installed gateway"))
}

/// The node selector, tolerations and images of the installed gateway, so
/// that a run without `--node-selector`, `--toleration` or the image flags
/// keeps them, as it keeps the identity, and so that the virtual kubelets
/// run where and as the gateway does.
pub async fn installed_pod_placement(cluster: &ClusterClient) -> anyhow::Result<Placement> {
    Ok(installed_gateway(cluster)
        .await?
        .map(|d| placement_of(&d))
        .unwrap_or_default())
}

/// Where and from which images a gateway's Deployment runs it.
pub fn placement_of(gateway: &Deployment) -> Placement {
    let Some(spec) = gateway.spec.as_ref().and_then(|s| s.template.spec.as_ref()) else {
        return Placement::default();
    };
    let container = spec.containers.iter().find(|c| c.name == "gateway");
    let mut images = ImageSource::default();
    if let Some((registry, tag)) = container
        .and_then(|c| c.image.as_deref())
        .and_then(|i| ImageSource::parse(i, images::GATEWAY))
    {
        images.registry = registry;
        images.tag = tag;
    }
    if let Some(policy) = container
        .and_then(|c| c.image_pull_policy.as_deref())
        .and_then(|p| p.parse().ok())
    {
        images.pull_policy = policy;
    }
    Placement {
        node_selector: spec.node_selector.clone().unwrap_or_default(),
        tolerations: spec.tolerations.clone().unwrap_or_default(),
        images,
    }
}

/// How the installed gateway announces and runs tunnels, so that a run
/// without those flags keeps them, as it keeps placement.
pub async fn installed_gateway_args(
    cluster: &ClusterClient,
) -> anyhow::Result<manifests::agents::GatewayArgs> {
    Ok(installed_gateway(cluster)
        .await?
        .map(|d| manifests::agents::gateway_args_of(&d))
        .unwrap_or_default())
}

/// Whether the cluster serves MutatingAdmissionPolicy (beta in 1.34, off
/// unless enabled), which places the pods of offloaded namespaces. Any
/// failure to tell counts as no: install then goes on without placement.
pub async fn serves_mutating_admission_policy(cluster: &ClusterClient) -> bool {
    cluster
        .client
        .list_api_group_resources("admissionregistration.k8s.io/v1beta1")
        .await
        .is_ok_and(|list| {
            list.resources
                .iter()
                .any(|r| r.name == "mutatingadmissionpolicies")
        })
}
