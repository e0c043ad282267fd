//! Remote wrappers someone else changed (a ReplicaSet scaled or edited, a
//! Job suspended) put back as the local pod says, and the generation that
//! leaves recorded so that only a later change is someone else's.

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Pods;
use super::stored::LocalPod;
use crate::forge::pod::{self as forge_pod, Wrapper};
use crate::reflection::Error;

impl Pods {
    /// Puts back a remote wrapper of kind `K` someone else changed, with
    /// the spec `set` writes into it from the local pod, then records the
    /// generation that leaves, so that only a later change is someone
    /// else's. A conflict (it changed again meanwhile) is retried.
    pub(super) async fn put_back<K>(
        &self,
        provider: &kube::Client,
        twin: &str,
        pod: &LocalPod,
        wrapper_kind: Wrapper,
        set: impl FnOnce(&Self, &Pod, &mut K),
    ) -> Result<(), Error>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let name = pod.name_any();
        let kind = K::kind(&());
        let api: Api<K> = Api::namespaced(provider.clone(), twin);
        let api_error = |source| Error::PutBackWrapper {
            kind: wrapper_kind,
            twin: twin.to_owned(),
            name: name.clone(),
            source,
        };
        let Some(mut wrapper) = api.get_opt(&name).await.map_err(api_error)? else {
            return Ok(());
        };
        let Some(whole) = self.whole(pod).await? else {
            return Ok(());
        };
        set(self, &whole, &mut wrapper);
        let generation = replace_recorded(&api, &name, &wrapper)
            .await
            .map_err(api_error)?;
        tracing::info!(pod = %name, twin, %kind, generation, "remote wrapper changed on the provider: put back");
        Ok(())
    }

    /// A remote ReplicaSet put back: one pod, as the local pod says (the
    /// selector cannot change, and is ours already).
    pub(super) fn replica_set_as_made(&self, pod: &Pod, rs: &mut ReplicaSet) {
        let twin = rs.metadata.namespace.clone().unwrap_or_default();
        let terms = self.peering.admission().ok().flatten();
        let mut want = forge_pod::replica_set(pod, &twin, terms.as_ref())
            .spec
            .unwrap_or_default();
        self.mount_token(
            pod,
            &pod.name_any(),
            want.template.as_mut().and_then(|t| t.spec.as_mut()),
        );
        // Not decided (an agent just started): the template as it is.
        if self
            .resolve_names(pod, want.template.as_mut().and_then(|t| t.spec.as_mut()))
            .is_err()
            && let Some(have) = rs.spec.as_ref().and_then(|s| s.template.clone())
        {
            want.template = Some(have);
        }
        if let Some(spec) = rs.spec.as_mut() {
            spec.replicas = want.replicas;
            spec.min_ready_seconds = want.min_ready_seconds;
            spec.template = want.template;
        }
    }

    /// A remote Job put back: of its spec only parallelism, suspension,
    /// the deadline and the backoff can change (the rest is immutable),
    /// set back to what the agent made (one pod at a time, not suspended).
    pub(super) fn job_as_made(&self, pod: &Pod, job: &mut Job) {
        let twin = job.metadata.namespace.clone().unwrap_or_default();
        let terms = self.peering.admission().ok().flatten();
        let want = forge_pod::job(pod, &twin, terms.as_ref())
            .spec
            .unwrap_or_default();
        if let Some(spec) = job.spec.as_mut() {
            spec.parallelism = want.parallelism;
            spec.suspend = want.suspend;
            spec.active_deadline_seconds = want.active_deadline_seconds;
            spec.backoff_limit = want.backoff_limit;
        }
    }
}

/// Replaces a remote wrapper with `object` (as read, with the spec the
/// virtual kubelet wants: a conflict, when it changed again meanwhile,
/// fails and is retried), then records the generation that leaves in
/// [`forge_pod::WRAPPER_GENERATION`], so that only a later change is
/// someone else's. Returns that generation.
async fn replace_recorded<K>(api: &Api<K>, name: &str, object: &K) -> Result<i64, kube::Error>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let replaced = api.replace(name, &PostParams::default(), object).await?;
    let generation = replaced.meta().generation.unwrap_or(1);
    let record = json!({ "metadata": { "annotations": {
        forge_pod::WRAPPER_GENERATION: generation.to_string(),
    } } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&record))
        .await?;
    Ok(generation)
}
