//! The remote pod's status brought back to the local pod: written only
//! when the local pod does not show it yet, and the remote pod then
//! settled in its store (its status dropped, a hash of what was shown
//! kept).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, Patch, PatchParams};
use kube::core::ObjectMeta;
use serde_json::json;

use super::Pods;
use super::remote::TwinStores;
use super::stored::{LocalPod, RemotePod, RemotePodRead, RemoteStatus, shown_as};
use crate::forge::pod as forge_pod;
use crate::reflection::Error;

impl Pods {
    /// Writes the status of the current remote pod of `remote_pods` into
    /// the local pod `stored` (as the store keeps it), unless it shows it
    /// already; the remote pod is then settled in `side`'s store.
    pub(super) async fn bring_back_status(
        &self,
        stored: &LocalPod,
        twin_stores: &TwinStores,
        provider: &kube::Client,
        remote_pods: &[Arc<RemotePod>],
    ) -> Result<(), Error> {
        let Some(current) = forge_pod::current_remote_pod(remote_pods.iter().map(AsRef::as_ref))
        else {
            return Ok(());
        };
        let Some(remote) = remote_pods.iter().find(|p| std::ptr::eq(&***p, current)) else {
            return Ok(());
        };
        let remap = self.peering.remap();
        let status = match &remote.status {
            RemoteStatus::None => return Ok(()),
            RemoteStatus::Deflated(_) => remote.status(),
            RemoteStatus::Shown(shown) => {
                if *shown == shown_as(stored.status_digest, remap.as_ref()) {
                    return Ok(());
                }
                // The local pod's status changed since, or the remap:
                // what the remote pod says now.
                let api: Api<RemotePodRead> =
                    Api::namespaced(provider.clone(), &remote.id.namespace);
                api.get_opt(&remote.id.name)
                    .await
                    .map_err(|source| Error::ReadRemotePod {
                        twin: remote.id.namespace.to_string(),
                        name: remote.id.name.to_string(),
                        source,
                    })?
                    .and_then(|read| read.status)
            }
        };
        let Some(remote_status) = status else {
            return Ok(());
        };
        let want = forge_pod::local_status(&remote_status, remap.as_ref());
        // The local status that shows the remote one, once written.
        let shown = if stored.says_nothing && forge_pod::says_nothing(&want) {
            // Nothing to tell: the remote pod waits, which the local one
            // says already.
            stored.status_digest
        } else {
            if !forge_pod::digest_shows(stored.status_digest, &want) {
                self.patch_local_status(&stored.metadata(), &want).await?;
            }
            Some(forge_pod::status_digest(&want))
        };
        twin_stores.pods.store.settle(
            &remote.id.namespace,
            &remote.id.name,
            remote,
            remote.settled(shown_as(shown, remap.as_ref())),
        );
        Ok(())
    }

    pub(super) async fn patch_local_status(
        &self,
        pod: &ObjectMeta,
        status: &PodStatus,
    ) -> Result<(), Error> {
        let api: Api<Pod> = Api::namespaced(
            self.peering.local.clone(),
            pod.namespace.as_deref().unwrap_or_default(),
        );
        // The UID guards against writing another pod of the same name.
        let patch = json!({ "metadata": { "uid": pod.uid }, "status": status });
        api.patch_status(
            pod.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(Error::UpdateLocalPodStatus)?;
        Ok(())
    }
}
