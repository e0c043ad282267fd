//! Pods whose ConfigMaps or Secrets are missing wait as on a kubelet
//! ([`crate::forge::references`] decides): the remote ReplicaSet is not
//! created, the local pod shows the kubelet's waiting reason (and, for a
//! volume, a `FailedMount` Event), and the pod starts once the object
//! exists, which the local stores of [`super::mirror`] say.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::stores::PerNamespace;
use super::{Error, Next, NotYet};
use crate::forge::references::{self as forge_refs, Source, Wait};
use crate::node::FIELD_MANAGER;

/// How often a pod held back for a missing ConfigMap or Secret is looked
/// at again.
const HELD_POLL: std::time::Duration = std::time::Duration::from_secs(5);

/// The local ConfigMaps and Secrets of the offloaded namespaces.
#[allow(missing_debug_implementations)]
pub struct References {
    pub local: kube::Client,
    pub node_name: String,
    pub config_maps: Arc<PerNamespace<ConfigMap>>,
    pub secrets: Arc<PerNamespace<Secret>>,
}

impl References {
    /// `Some` when `pod` must wait (its status and Event are written),
    /// `None` when it may be created on the provider.
    pub async fn hold(&self, pod: &Pod) -> Result<Option<Next>, Error> {
        let ns = pod.namespace().unwrap_or_default();
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(None);
        };
        let not_yet = || NotYet::References(ns.clone());
        let cms = self.config_maps.current(&ns).ok_or_else(not_yet)?;
        let secrets = self.secrets.current(&ns).ok_or_else(not_yet)?;
        let lookup = |source: Source, name: &str| -> Option<BTreeSet<String>> {
            let key = |k: &String| k.clone();
            match source {
                Source::ConfigMap => cms.store.get(&ns, name).map(|c| {
                    c.data
                        .iter()
                        .flat_map(|d| d.keys())
                        .chain(c.binary_data.iter().flat_map(|d| d.keys()))
                        .map(key)
                        .collect()
                }),
                Source::Secret => secrets
                    .store
                    .get(&ns, name)
                    .map(|s| s.data.iter().flat_map(|d| d.keys()).map(key).collect()),
            }
        };
        let Some(why) = forge_refs::wait(spec, &lookup) else {
            return Ok(None);
        };
        let want = forge_refs::waiting_status(spec, &why);
        if !forge_refs::shows_waiting(pod.status.as_ref(), &want) {
            if let Wait::Mount { message } = &why {
                self.failed_mount(pod, message).await?;
            }
            let api: Api<Pod> = Api::namespaced(self.local.clone(), &ns);
            let patch = json!({ "metadata": { "uid": pod.uid() }, "status": want });
            api.patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(Error::UpdateLocalPodStatus)?;
            tracing::info!(pod = %pod.name_any(), namespace = %ns, ?why, "pod waits for its ConfigMaps or Secrets");
        }
        // No store of this kind says when the ConfigMap or Secret
        // comes: the pod is looked at again after a while.
        Ok(Some(Next::After(HELD_POLL)))
    }

    /// The `FailedMount` Event, named after the pod's UID so that it is
    /// written once per pod, whatever restarts.
    async fn failed_mount(&self, pod: &Pod, message: &str) -> Result<(), Error> {
        let ns = pod.namespace().unwrap_or_default();
        let uid = pod.uid().unwrap_or_default();
        let event = crate::forge::event::warning(
            pod,
            Some(format!("{}.{}.failedmount", pod.name_any(), uid)),
            forge_refs::FAILED_MOUNT,
            message,
            FIELD_MANAGER,
            &self.node_name,
            Time(Timestamp::now()),
        );
        let events: Api<Event> = Api::namespaced(self.local.clone(), &ns);
        match events.create(&PostParams::default(), &event).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(Error::RecordFailedMount(e)),
        }
    }
}
