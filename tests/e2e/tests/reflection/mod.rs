//! Reflection end to end, on two real clusters (set up as in
//! `offloading.rs`): the ConfigMaps and Secrets of an offloaded namespace
//! appear in its twin on the provider with our labels, and follow their
//! local updates and deletion; a copy changed or deleted by the provider's
//! admin is put back; what is opted out, the provider's own
//! `kube-root-ca.crt`, service account token Secrets and an object of the
//! same name that the admin made are left alone. Pods that reference a
//! missing ConfigMap wait as on a kubelet (`CreateContainerConfigError`
//! for env, `ContainerCreating` and a `FailedMount` Event for a volume,
//! nothing on the provider), an optional reference does not hold a pod
//! back, and waiting pods run once the ConfigMap exists. A Service gets
//! its remote copy (ClusterIP), the endpoint on the consumer's own node
//! appears on the provider in an EndpointSlice of ours, the provider's
//! own controller lists the offloaded pod, and the local EndpointSlice
//! lists the offloaded pod's IP. A pod that mounts its service account
//! token gets a Secret in the twin whose token authenticates on the
//! consumer's API as that account (at the address its env says, with the
//! CA it mounts), and that goes with the pod. Events of the remote pod
//! come back onto the local pod, counts included, and a restarted
//! virtual kubelet duplicates none.

mod copies;
mod events;
mod references;
mod services;
mod tokens;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Namespace, Pod, ResourceQuota, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::names::{self, labels, peering};
use liqo_api::shares::SHARE_QUOTA;
use liqo_e2e::fixture::pod::{ip, running, waiting_reason};
use liqo_e2e::fixture::{PROVIDER_ID, Pair, Stage, WAIT};
use liqo_e2e::wait_for;
use serde_json::{Value, json};

pub(super) const NS: &str = "shop";
/// DefaultName: `<namespace>-<consumer cluster name>`.
pub(super) const TWIN: &str = "shop-consumer";
pub(super) fn config_map(name: &str, data: Value, annotations: Value) -> Result<ConfigMap> {
    Ok(serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": NS, "labels": { "app": "web" }, "annotations": annotations },
        "data": data,
    }))?)
}

/// A pod placed on the virtual node by hand (as in `offloading.rs`) whose
/// container reads `env_from` and mounts `volumes`.
pub(super) fn pod(name: &str, env_from: Value, volumes: Value) -> Result<Pod> {
    let mounts: Vec<Value> = volumes
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| json!({ "name": v["name"], "mountPath": format!("/etc/{}", v["name"].as_str().unwrap_or("x")) }))
        .collect();
    Ok(serde_json::from_value(liqo_e2e::restricted(json!({
        "metadata": { "name": name, "namespace": NS, "labels": { "test": "refs" } },
        "spec": {
            "nodeSelector": liqo_e2e::virtual_node_selector(),
            "tolerations": liqo_e2e::virtual_node_tolerations(),
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": "nginx",
                "envFrom": env_from,
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        },
    })))?)
}

pub(super) fn label<'a>(meta: &'a kube::core::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// Whether an object carries our managed-by label.
pub(super) fn is_ours(meta: &kube::core::ObjectMeta) -> bool {
    label(meta, labels::MANAGED_BY) == Some(labels::MANAGED_BY_VALUE)
}

/// A ConfigMap's value under `key`.
pub(super) fn value<'a>(config_map: &'a ConfigMap, key: &str) -> Option<&'a str> {
    config_map.data.as_ref()?.get(key).map(String::as_str)
}

/// The namespace `NS` on the consumer and its twin on the provider, as
/// the tests read and write them.
pub(super) struct Shop {
    pub(super) pair: Pair,
    pub(super) pods: Api<Pod>,
    pub(super) cms: Api<ConfigMap>,
    pub(super) secrets: Api<Secret>,
    pub(super) events: Api<Event>,
    pub(super) remote_cms: Api<ConfigMap>,
    pub(super) remote_secrets: Api<Secret>,
    pub(super) remote_rs: Api<ReplicaSet>,
}

impl Shop {
    pub(super) async fn at(stage: Stage<'_>) -> Result<Self> {
        let pair = Pair::at(stage).await?;
        let local = pair.consumer_client.clone();
        let prov = pair.provider_client.clone();
        Ok(Self {
            pods: Api::namespaced(local.clone(), NS),
            cms: Api::namespaced(local.clone(), NS),
            secrets: Api::namespaced(local.clone(), NS),
            events: Api::namespaced(local, NS),
            remote_cms: Api::namespaced(prov.clone(), TWIN),
            remote_secrets: Api::namespaced(prov.clone(), TWIN),
            remote_rs: Api::namespaced(prov, TWIN),
            pair,
        })
    }

    pub(super) fn local(&self) -> kube::Client {
        self.pair.consumer_client.clone()
    }

    pub(super) fn provider(&self) -> kube::Client {
        self.pair.provider_client.clone()
    }
}
