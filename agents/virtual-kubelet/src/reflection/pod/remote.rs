//! The pods' remote stores: per twin namespace, the provider's
//! ReplicaSets, Jobs and pods that carry our UID label, followed with the
//! consumer's identity (which may watch inside its twins only), started
//! and stopped as twins come and go.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::batch::v1::Job;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use liqo_agent_runtime::compact::{Version, same_version};
use liqo_agent_runtime::follow::{Changes, Followed, Options, follow_with};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::stored::{RemotePod, RemotePodRead, StoredWrapper};
use crate::forge::pod::{self as forge_pod, Wrapper};
use crate::reflection::{ObjectKey, wake_on};

/// The followed stores of one twin namespace on the provider.
pub(super) struct TwinStores {
    /// Their metadata only: a ReplicaSet or a Job is read for its name,
    /// UID, labels, deletion and generation, and a whole one (its spec and
    /// status inline, empty or not) is six times the size in memory.
    pub(super) replica_sets: Followed<StoredWrapper>,
    pub(super) jobs: Followed<StoredWrapper>,
    pub(super) pods: Followed<RemotePod>,
    task: JoinHandle<()>,
}

impl Drop for TwinStores {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TwinStores {
    /// Its stores record into `journal` the twin and the local pod's name
    /// of every object that changes.
    pub(super) fn start(
        client: kube::Client,
        namespace: &str,
        wake: &Arc<Notify>,
        journal: &Changes<ObjectKey>,
    ) -> Self {
        // Only what we created: the twin may hold other objects.
        let config = watcher::Config::default().labels(forge_pod::LOCAL_POD_UID);
        let (replica_sets, follow_rs) = follow_with(
            Api::<PartialObjectMeta<ReplicaSet>>::namespaced(client.clone(), namespace),
            config.clone(),
            "remote replica sets",
            Self::wrapper_options(),
        );
        let (jobs, follow_jobs) = follow_with(
            Api::<PartialObjectMeta<Job>>::namespaced(client.clone(), namespace),
            config.clone(),
            "remote jobs",
            Self::wrapper_options(),
        );
        let (pods, follow_pods) = follow_with(
            Api::<RemotePodRead>::namespaced(client, namespace),
            config,
            "remote pods",
            Self::pod_options(),
        );
        // A wrapper is named after its local pod; a remote pod after its
        // wrapper.
        let wrapper = |w: &StoredWrapper| Some((w.id.namespace.clone(), w.id.name.clone()));
        replica_sets.record_into(journal, wrapper);
        jobs.record_into(journal, wrapper);
        pods.record_into(journal, |pod| {
            let local = crate::forge::event::local_pod_name(&pod.id.name)?;
            Some((pod.id.namespace.clone(), Arc::from(local)))
        });
        let wake_rs = wake_on(replica_sets.clone(), wake.clone());
        let wake_jobs = wake_on(jobs.clone(), wake.clone());
        let wake_pods = wake_on(pods.clone(), wake.clone());
        let task = tokio::spawn(async move {
            tokio::join!(
                follow_rs,
                follow_jobs,
                follow_pods,
                wake_rs,
                wake_jobs,
                wake_pods
            );
        });
        Self {
            replica_sets,
            jobs,
            pods,
            task,
        }
    }

    pub(super) fn wrapper_options<K>() -> Options<PartialObjectMeta<K>, StoredWrapper> {
        Options::converted(StoredWrapper::new)
    }

    pub(super) fn pod_options() -> Options<RemotePodRead, RemotePod> {
        Options::converted(RemotePod::new).kept_when(|stored, listed| {
            same_version(
                (&stored.id.uid, &stored.id.version),
                (&listed.id.uid, &listed.id.version),
            )
        })
    }

    pub(super) fn is_current(&self) -> bool {
        self.replica_sets.is_current() && self.jobs.is_current() && self.pods.is_current()
    }

    /// The remote pods of `twin` named for the local pod `name`: as their
    /// wrapper, named after the local pod, names them
    /// (`<name>-<5 characters>`), found in the store's name order.
    pub(super) fn pods_named_for(&self, twin: &str, name: &str) -> Vec<Arc<RemotePod>> {
        let mut pods = self.pods.store.named_after(twin, &format!("{name}-"));
        pods.retain(|p| crate::forge::event::local_pod_name(&p.id.name) == Some(name));
        pods
    }

    /// The remote wrappers named `name` in `twin` (normally one at most).
    pub(super) fn wrappers(&self, twin: &str, name: &str) -> Vec<Found> {
        let found = |w: Arc<StoredWrapper>, kind| Found {
            kind,
            uid: w.id.uid(),
            resource_version: w.id.version.as_ref().map(Version::to_string),
            for_pod: w.id.for_pod(),
            deleting: w.id.deleting,
            changed: w.changed,
        };
        let rs = self
            .replica_sets
            .store
            .get(twin, name)
            .map(|rs| found(rs, Wrapper::ReplicaSet));
        let job = self
            .jobs
            .store
            .get(twin, name)
            .map(|job| found(job, Wrapper::Job));
        rs.into_iter().chain(job).collect()
    }
}

/// A remote wrapper, as the stores have it.
#[derive(Debug, Hash)]
pub(super) struct Found {
    pub(super) kind: Wrapper,
    pub(super) uid: Option<String>,
    pub(super) resource_version: Option<String>,
    /// Its `liqo.io/local-pod-uid`.
    pub(super) for_pod: Option<String>,
    pub(super) deleting: bool,
    /// Its spec was changed by someone else (a ReplicaSet scaled or
    /// edited, a Job suspended or its parallelism changed on the
    /// provider), to be put back.
    pub(super) changed: bool,
}

/// The provider's stores, per twin namespace, for one provider client.
#[derive(Default)]
pub(super) struct ProviderStores {
    /// Which client they were started with (its place in the channel's
    /// history): a renewed kubeconfig restarts them all.
    pub(super) client_version: Option<u64>,
    pub(super) by_twin: BTreeMap<String, Arc<TwinStores>>,
}
