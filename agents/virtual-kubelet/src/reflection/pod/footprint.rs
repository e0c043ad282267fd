//! The pods' stores filled as the agent fills them, for
//! [`crate::reflection::footprint`].

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use liqo_agent_runtime::follow::Followed;

use super::remote::TwinStores;
use super::stored::{LocalPod, RemotePod, RemotePodRead, StoredWrapper, shown_as};
use crate::forge::pod as forge_pod;

pub fn local_pods(pods: impl Iterator<Item = Pod>) -> Followed<LocalPod> {
    liqo_agent_runtime::follow::filled(pods, LocalPod::options())
}

pub fn remote_pods(pods: impl Iterator<Item = Pod>) -> Followed<RemotePod> {
    let read = |p: Pod| RemotePodRead {
        metadata: p.metadata,
        status: p.status,
    };
    liqo_agent_runtime::follow::filled(pods.map(read), TwinStores::pod_options())
}

/// The remote pods settled, as the reflection leaves them once the
/// local pods show their status.
pub fn remote_pods_settled(pods: impl Iterator<Item = Pod>) -> Followed<RemotePod> {
    let followed = remote_pods(pods);
    for pod in followed.store.state() {
        let status = pod.status().expect("a status");
        let digest = forge_pod::status_digest(&status);
        let settled = pod.settled(shown_as(Some(digest), None));
        assert!(
            followed
                .store
                .settle(&pod.id.namespace, &pod.id.name, &pod, settled)
        );
    }
    followed
}

pub fn wrappers(
    wrappers: impl Iterator<Item = PartialObjectMeta<ReplicaSet>>,
) -> Followed<StoredWrapper> {
    liqo_agent_runtime::follow::filled(wrappers, TwinStores::wrapper_options())
}
