//! Pods: every local pod bound to the virtual node in a namespace with a
//! ready twin runs on the provider as a ReplicaSet of one in the twin, or
//! a Job of one for a pod meant to end ([`crate::forge::pod`] translates
//! it), so that the provider's controllers keep it running while the
//! consumer is away. The ReplicaSet's pod is made first, by this agent
//! ([`forge_pod::first_pod`]), and the ReplicaSet once the pod is seen,
//! which adopts it: the pod does not wait for the provider's ReplicaSet
//! controller and its rate-limited client. The remote pod's status comes back to the local
//! pod. Deleting the local pod deletes the wrapper and the remote pod
//! with the same grace period,
//! and once the remote pod is gone the local one is removed as a kubelet
//! does (grace 0, UID precondition). A ReplicaSet whose local pod is gone
//! is removed. The key is the local pod's namespace and name, so both
//! sides of one pod converge together and nothing is created twice.
//!
//! The provider's side is followed with one set of stores (ReplicaSets,
//! Jobs, pods, carrying our UID label) per twin namespace: the consumer's
//! identity may watch inside its twins only. They are started and stopped
//! as twins come and go, and restarted with a renewed provider client.
//!
//! Scale (see "Scale and restart safety" in docs/virtual-kubelet.md): the
//! remote pods are indexed by their local pod's name, so one pod
//! converges without a scan of its twin; the stores keep only what this
//! module reads, in types of its own ([`StoredWrapper`]: a wrapper's
//! identity, our label and whether someone changed its spec;
//! [`RemotePod`]: a remote pod's identity and the status the local pod
//! shows, deflated; [`LocalPod`]: a local pod's identity, phase, reason,
//! status digest and requests, and the whole pod, deflated, only while
//! it is pending and its wrapper not made yet, the remote objects being
//! made from it); and each key has a
//! fingerprint (resource versions of its objects) so that a pass looks
//! only at the pods that changed.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use kube::core::{ObjectMeta, PartialObjectMeta};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use liqo_agent_runtime::compact::{Uid, Version, identity, same_version};
use liqo_agent_runtime::follow::{Followed, Journal, Key, Options, follow_with};
use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::deflated::{Dictionary, deflate, inflate};
use super::namespace::{Peering, Twins};
use super::references::References;
use super::{Context, Error, Kind, Next, ObjectKey, in_local_namespaces, wake_on};
use crate::forge::pod::{self as forge_pod, Wrapper};
use crate::node::FIELD_MANAGER;
use crate::provider::ProviderClient;

/// How soon a pod that waits for the twins to be known is looked at again.
const NOT_SYNCED_POLL: Duration = Duration::from_millis(500);

/// The followed stores of one twin namespace on the provider.
struct Side {
    /// Their metadata only: a ReplicaSet or a Job is read for its name,
    /// UID, labels, deletion and generation, and a whole one (its spec and
    /// status inline, empty or not) is six times the size in memory.
    replica_sets: Followed<StoredWrapper>,
    jobs: Followed<StoredWrapper>,
    pods: Followed<RemotePod>,
    task: JoinHandle<()>,
}

impl Drop for Side {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Side {
    /// Its stores record into `journal` the twin and the local pod's name
    /// of every object that changes.
    fn start(
        client: kube::Client,
        namespace: &str,
        wake: &Arc<Notify>,
        journal: &Journal<ObjectKey>,
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

    fn wrapper_options<K>() -> Options<PartialObjectMeta<K>, StoredWrapper> {
        Options::converted(StoredWrapper::new)
    }

    /// Remote pods are indexed by their local pod's name.
    fn pod_options() -> Options<RemotePodRead, RemotePod> {
        Options::converted(RemotePod::new)
            .indexed(|pod| crate::forge::event::local_pod_name(&pod.id.name).map(str::to_owned))
            .kept_when(|stored, listed| {
                same_version(
                    (&stored.id.uid, &stored.id.version),
                    (&listed.id.uid, &listed.id.version),
                )
            })
    }

    fn is_current(&self) -> bool {
        self.replica_sets.is_current() && self.jobs.is_current() && self.pods.is_current()
    }

    /// The remote wrappers named `name` in `twin` (normally one at most).
    fn wrappers(&self, twin: &str, name: &str) -> Vec<Found> {
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

/// What the reflection reads of every object it made on the provider for
/// a local pod (a wrapper, or a pod): where it is, its UID and version,
/// the local pod's UID of our label, and whether it is being deleted.
#[derive(Clone, Debug, PartialEq)]
pub struct Remote {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    uid: Option<Uid>,
    version: Option<Version>,
    for_pod: Option<Uid>,
    deleting: bool,
}

impl Remote {
    fn new(m: &ObjectMeta, key: &Key) -> Self {
        let (uid, version) = identity(m);
        Self {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            uid,
            version,
            for_pod: m
                .labels
                .as_ref()
                .and_then(|l| l.get(forge_pod::LOCAL_POD_UID))
                .map(|u| Uid::new(u)),
            deleting: m.deletion_timestamp.is_some(),
        }
    }

    fn uid(&self) -> Option<String> {
        self.uid.as_ref().map(Uid::to_string)
    }

    /// The local pod's UID it carries.
    fn for_pod(&self) -> Option<String> {
        self.for_pod.as_ref().map(Uid::to_string)
    }
}

/// A remote wrapper (a ReplicaSet or a Job) as the reflection stores it:
/// what [`Remote`] says, and whether its spec was changed by someone else
/// ([`forge_pod::changed_by_others`]). Its spec and status are not read
/// (a Job's end is read from its pod).
#[derive(Debug, PartialEq)]
pub struct StoredWrapper {
    id: Remote,
    changed: bool,
}

impl StoredWrapper {
    fn new<K>(wrapper: PartialObjectMeta<K>, key: &Key) -> Self {
        Self {
            id: Remote::new(&wrapper.metadata, key),
            changed: forge_pod::changed_by_others(&wrapper.metadata),
        }
    }
}

/// A remote wrapper, as the stores have it.
#[derive(Debug, Hash)]
struct Found {
    kind: Wrapper,
    uid: Option<String>,
    resource_version: Option<String>,
    /// Its `liqo.io/local-pod-uid`.
    for_pod: Option<String>,
    deleting: bool,
    /// Its spec was changed by someone else (a ReplicaSet scaled or
    /// edited, a Job suspended or its parallelism changed on the
    /// provider), to be put back.
    changed: bool,
}

/// What the agent keeps of a local pod bound to its node: its identity,
/// version and deletion, the phase, reason and start time of its status,
/// the digest of the status (so that whether it shows the remote one is
/// a comparison of two strings), the service account whose token it
/// mounts, and, while it is pending and its wrapper not made yet, the
/// pod whole. Not its spec,
/// labels, annotations nor owners once it runs: the wrapper is made while
/// it is pending, from the pod kept whole until then, and put back from
/// the pod read again from the API; the kubelet API reads the pods it
/// serves from the API too. Made when the pod is read from the API: a
/// k8s-openapi `Pod` is 2,248 bytes inline even without its spec, a whole
/// one about 10 KiB in memory, this a few hundred bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalPod {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    uid: Option<Uid>,
    version: Option<Version>,
    created: Option<Time>,
    deleted: Option<Time>,
    grace: Option<i64>,
    pub phase: Option<String>,
    pub reason: Option<String>,
    pub start_time: Option<Time>,
    /// [`forge_pod::status_digest`] of its status.
    pub status_digest: Option<String>,
    /// Its status says no more than that it waits
    /// ([`forge_pod::says_nothing`]).
    pub says_nothing: bool,
    /// The service account whose token it mounts, when it mounts one
    /// ([`crate::forge::token::token_volume`]).
    pub token_account: Option<String>,
    /// What it requests ([`forge_pod::requests`]): its part of the
    /// demand its twin states to the provider ([`super::demand`]).
    pub requests: forge_pod::Requests,
    /// The pod as the API has it, while it is pending, as deflated JSON
    /// (about 1.5 KiB where the `Pod` value is about 10 KiB: a scale-up
    /// holds thousands of pending pods at once): it is about to be made
    /// on the provider, from its spec, labels and annotations, and keeping
    /// it until then (until its wrapper is made, when the reflection
    /// settles it, or its status says it runs) makes that cost no read.
    pending: Option<Box<[u8]>>,
}

impl From<Pod> for LocalPod {
    fn from(pod: Pod) -> Self {
        let key = Key {
            namespace: pod.metadata.namespace.as_deref().unwrap_or_default().into(),
            name: pod.metadata.name.as_deref().unwrap_or_default().into(),
        };
        Self::new(pod, &key)
    }
}

impl LocalPod {
    /// How local pods are stored: as [`LocalPod::new`] makes them, and a
    /// list keeps one settled ([`LocalPod::without_whole`]) while its pod
    /// is unchanged.
    pub fn options() -> Options<Pod, Self> {
        Options::converted(Self::new).kept_when(|stored, listed| {
            same_version(
                (&stored.uid, &stored.version),
                (&listed.uid, &listed.version),
            )
        })
    }

    /// What the store keeps of `pod`, stored at `key`.
    pub fn new(mut pod: Pod, key: &Key) -> Self {
        pod.metadata.managed_fields = None;
        let status = pod.status.clone().unwrap_or_default();
        let pending = pod.metadata.deletion_timestamp.is_none()
            && status.phase.as_deref().is_none_or(|p| p == "Pending");
        let token_account = pod
            .spec
            .as_ref()
            .filter(|spec| crate::forge::token::token_volume(spec).is_some())
            .map(|spec| crate::forge::token::service_account(spec).to_owned());
        let m = &pod.metadata;
        let (uid, version) = identity(m);
        Self {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            uid,
            version,
            created: m.creation_timestamp.clone(),
            deleted: m.deletion_timestamp.clone(),
            grace: m.deletion_grace_period_seconds,
            status_digest: pod.status.as_ref().map(forge_pod::status_digest),
            says_nothing: forge_pod::says_nothing(&status),
            phase: status.phase,
            reason: status.reason,
            start_time: status.start_time,
            token_account,
            requests: pod
                .spec
                .as_ref()
                .map(forge_pod::requests)
                .unwrap_or_default(),
            pending: pending
                .then(|| deflate(&serde_json::to_vec(&pod).ok()?, Dictionary::PendingPod))
                .flatten(),
        }
    }

    /// Its metadata as the store has it: name, namespace, UID, version,
    /// creation and deletion (made anew at each call).
    pub fn metadata(&self) -> ObjectMeta {
        ObjectMeta {
            name: Some(self.name.to_string()),
            namespace: Some(self.namespace.to_string()),
            uid: self.uid(),
            resource_version: self.version.as_ref().map(Version::to_string),
            creation_timestamp: self.created.clone(),
            deletion_timestamp: self.deleted.clone(),
            deletion_grace_period_seconds: self.grace,
            ..ObjectMeta::default()
        }
    }

    pub fn uid(&self) -> Option<String> {
        self.uid.as_ref().map(Uid::to_string)
    }

    pub fn name_any(&self) -> String {
        self.name.to_string()
    }

    pub fn namespace(&self) -> Option<String> {
        Some(self.namespace.to_string())
    }

    /// Its UID and version: what a fingerprint reads of it.
    pub fn identity(&self) -> (Option<Uid>, Option<Version>) {
        (self.uid.clone(), self.version.clone())
    }

    /// Whether it is being deleted.
    pub fn deleting(&self) -> bool {
        self.deleted.is_some()
    }

    pub fn grace(&self) -> Option<i64> {
        self.grace
    }

    /// Whether it has ended (Succeeded or Failed).
    pub fn ended(&self) -> bool {
        forge_pod::ended(self.phase.as_deref())
    }

    /// The pod as the API has it, while it is pending; `None` after.
    fn kept_whole(&self) -> Option<Pod> {
        serde_json::from_slice(&inflate(self.pending.as_deref()?, Dictionary::PendingPod)?).ok()
    }

    /// The same without the pod kept whole, when it keeps it: what the
    /// store settles for once its wrapper is made.
    fn without_whole(&self) -> Option<Self> {
        self.pending.as_ref()?;
        Some(Self {
            pending: None,
            ..self.clone()
        })
    }
}

/// A remote pod as the reflection stores it: its name, UID, version,
/// the local pod it is for, its creation and deletion, and of its status
/// what the local pod shows ([`forge_pod::local_status`]), kept as JSON
/// text, deflated, until the local pod shows it. Not a [`Pod`]: one holds
/// room for a spec inline (about 1.4 KiB) even when it has none, and a
/// `PodStatus` with its conditions and container statuses is about 2 KiB
/// of mostly empty fields where their JSON is about a kilobyte, and
/// deflated about 400 bytes (its timestamps, condition types and image
/// digests repeat). It is inflated only when a local pod's status is
/// compared or written.
#[derive(Clone, Debug, PartialEq)]
pub struct RemotePod {
    pub id: Remote,
    created: Option<Timestamp>,
    status: RemoteStatus,
}

/// What a remote pod's store keeps of its status.
#[derive(Clone, Debug, PartialEq)]
enum RemoteStatus {
    None,
    /// What the local pod is to show, deflated JSON.
    Deflated(Box<[u8]>),
    /// Settled: the local pod showed it, with this status digest and
    /// remap ([`shown_as`]); what it was is read again if that changes.
    Shown(u64),
}

/// A local pod's status digest and the remap it was written under,
/// hashed: what a settled remote pod keeps.
fn shown_as(status_digest: Option<&str>, remap: Option<&liqo_api::networking::Remap>) -> u64 {
    let mut h = DefaultHasher::new();
    (status_digest, remap).hash(&mut h);
    h.finish()
}

/// A remote pod as the API gives it, less its spec.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct RemotePodRead {
    metadata: ObjectMeta,
    status: Option<k8s_openapi::api::core::v1::PodStatus>,
}

crate::forge::compact_resource!(RemotePodRead, Pod);

impl RemotePod {
    fn new(read: RemotePodRead, key: &Key) -> Self {
        let status = read
            .status
            .and_then(|s| {
                let shown = forge_pod::local_status(&s, None);
                deflate(&serde_json::to_vec(&shown).ok()?, Dictionary::Status)
            })
            .map_or(RemoteStatus::None, RemoteStatus::Deflated);
        Self {
            id: Remote::new(&read.metadata, key),
            created: read.metadata.creation_timestamp.as_ref().map(|t| t.0),
            status,
        }
    }

    /// What of its status a local pod shows (its addresses as the
    /// provider has them); `None` when it has none or is settled.
    pub fn status(&self) -> Option<k8s_openapi::api::core::v1::PodStatus> {
        match &self.status {
            RemoteStatus::Deflated(bytes) => {
                serde_json::from_slice(&inflate(bytes, Dictionary::Status)?).ok()
            }
            RemoteStatus::None | RemoteStatus::Shown(_) => None,
        }
    }

    /// The same pod without its status, once the local pod shows it with
    /// the digest and remap `shown` ([`shown_as`]).
    fn settled(&self, shown: u64) -> Self {
        Self {
            status: RemoteStatus::Shown(shown),
            ..self.clone()
        }
    }
}

impl forge_pod::Ranked for RemotePod {
    fn rank(&self) -> (bool, Option<Timestamp>, &str) {
        (!self.id.deleting, self.created, &self.id.name)
    }
}

/// The provider's stores, per twin namespace, for one provider client.
#[derive(Default)]
struct Sides {
    /// Which client they were started with (its place in the channel's
    /// history): a renewed kubeconfig restarts them all.
    client_version: Option<u64>,
    by_twin: BTreeMap<String, Arc<Side>>,
}

/// How long a wrapper this agent made may take to show in its store
/// before a pass makes it again.
const MADE_WAIT: Duration = Duration::from_secs(10);

/// The wrappers this agent made that its store does not show yet, by
/// local pod (and its UID), with when. A pass that runs meanwhile (the
/// remote pod changed: scheduled, started) waits for the store rather than
/// making the wrapper again, which the provider refused (409) after its
/// admission's work: a quarter of the ReplicaSets made in a 1,000-pod
/// burst were made twice. Memory only, as a hint: after a restart the
/// stores are listed before anything is made, and a wrapper made twice is
/// refused as before.
struct Made {
    /// How long a wrapper made may take to show ([`MADE_WAIT`]).
    wait: Duration,
    made: Mutex<HashMap<ObjectKey, (Option<String>, Instant)>>,
}

impl Default for Made {
    fn default() -> Self {
        Self::waiting_at_most(MADE_WAIT)
    }
}

impl Made {
    fn waiting_at_most(wait: Duration) -> Self {
        Self {
            wait,
            made: Mutex::default(),
        }
    }

    fn made(&self, key: &ObjectKey, uid: Option<String>) {
        if let Ok(mut made) = self.made.lock() {
            made.retain(|_, (_, at)| at.elapsed() < self.wait);
            made.insert(key.clone(), (uid, Instant::now()));
        }
    }

    /// How long still to wait for the wrapper made for pod `uid` at `key`.
    fn waiting(&self, key: &ObjectKey, uid: &Option<String>) -> Option<Duration> {
        let made = self.made.lock().ok()?;
        let (made_for, at) = made.get(key)?;
        (made_for == uid)
            .then(|| self.wait.checked_sub(at.elapsed()))
            .flatten()
            .filter(|left| !left.is_zero())
    }

    /// The store shows it, or the pod is gone.
    fn seen(&self, key: &ObjectKey) {
        if let Ok(mut made) = self.made.lock() {
            made.remove(key);
        }
    }
}

#[allow(missing_debug_implementations)]
pub struct Pods {
    pub peering: Peering,
    /// Local pods bound to the virtual node.
    pub local: Followed<LocalPod>,
    pub twins: watch::Receiver<Twins>,
    /// Whether [`super::namespace`] has looked at every offloading.
    pub synced: watch::Receiver<bool>,
    pub wake: Arc<Notify>,
    sides: Mutex<Sides>,
    clients: Mutex<(watch::Receiver<ProviderClient>, u64)>,
    /// Holds back pods whose ConfigMaps or Secrets are missing.
    references: Option<References>,
    /// Where remote pods reach the consumer's API with their token.
    token_api: Option<crate::forge::token::ApiAddress>,
    /// The local pods that changed, by namespace and name.
    changed_local: Journal<ObjectKey>,
    /// The remote objects that changed, by twin and local pod name.
    changed_remote: Journal<ObjectKey>,
    made: Made,
    context: Context,
}

impl Pods {
    pub fn new(
        peering: Peering,
        local: Followed<LocalPod>,
        twins: watch::Receiver<Twins>,
        synced: watch::Receiver<bool>,
        wake: Arc<Notify>,
    ) -> Self {
        let clients = Mutex::new((peering.provider.clone(), 0));
        let changed_local = Journal::new();
        local.record_into(&changed_local, |p| {
            Some((p.namespace.clone(), p.name.clone()))
        });
        Self {
            peering,
            local,
            twins,
            synced,
            wake,
            sides: Mutex::new(Sides::default()),
            clients,
            references: None,
            token_api: None,
            changed_local,
            changed_remote: Journal::new(),
            made: Made::default(),
            context: Context::default(),
        }
    }

    /// Remote pods mount their token ([`super::token`]) and reach the
    /// consumer's API at `api`.
    pub fn with_token_api(mut self, api: crate::forge::token::ApiAddress) -> Self {
        self.token_api = Some(api);
        self
    }

    /// Pods wait for their ConfigMaps and Secrets as `references` says.
    pub fn with_references(mut self, references: References) -> Self {
        self.references = Some(references);
        self
    }

    fn side(&self, twin: &str) -> Option<Arc<Side>> {
        self.sides.lock().ok()?.by_twin.get(twin).cloned()
    }

    fn twin_of(&self, local_ns: &str) -> Option<String> {
        self.twins.borrow().get(local_ns).cloned()
    }

    /// The local pod `stored` whole, as the API has it: from the store
    /// while it is pending (kept whole then, without what is kept in
    /// memory only), else read from the API; `None` when it is gone, or
    /// another pod of that name now (the store will say so, and the key be
    /// looked at again).
    async fn whole(&self, stored: &LocalPod) -> Result<Option<Pod>, Error> {
        if let Some(pod) = stored.kept_whole() {
            return Ok(Some(pod));
        }
        let api: Api<Pod> = Api::namespaced(
            self.peering.local.clone(),
            &stored.namespace().unwrap_or_default(),
        );
        let pod = api
            .get_opt(&stored.name_any())
            .await
            .map_err(Error::api(format!(
                "reading the local pod {}",
                stored.name_any()
            )))?;
        Ok(pod.filter(|p| p.metadata.uid == stored.uid()))
    }

    async fn delete_local(&self, pod: &LocalPod) -> Result<Next, Error> {
        let api: Api<Pod> = Api::namespaced(
            self.peering.local.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&pod.name_any(), &params).await {
            Ok(_) => {
                tracing::info!(pod = %pod.name_any(), namespace = ?pod.namespace(), "remote pod gone; local pod removed");
                Ok(Next::Done)
            }
            // Gone already, or another pod of that name now.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Next::Done),
            Err(e) => Err(Error::Api {
                what: "removing the local pod".to_owned(),
                source: e,
            }),
        }
    }

    async fn refuse(&self, pod: &Pod, why: &str) -> Result<Next, Error> {
        let ns = pod.namespace().unwrap_or_default();
        let event = crate::forge::event::warning(
            pod,
            None,
            forge_pod::REFUSED_REASON,
            why,
            FIELD_MANAGER,
            &self.peering.node_name,
            Time(Timestamp::now()),
        );
        let events: Api<Event> = Api::namespaced(self.peering.local.clone(), &ns);
        events
            .create(&PostParams::default(), &event)
            .await
            .map_err(Error::api("recording the refusal"))?;
        tracing::warn!(pod = %pod.name_any(), namespace = %ns, %why, "pod refused");
        self.patch_local_status(&pod.metadata, &forge_pod::refused_status(why))
            .await?;
        Ok(Next::Done)
    }

    /// Its service account token, where the pod mounts one.
    fn mount_token(&self, pod: &Pod, name: &str, remote: Option<&mut PodSpec>) {
        if let (Some(api), Some(local), Some(remote)) = (&self.token_api, pod.spec.as_ref(), remote)
        {
            crate::forge::token::mount_in(remote, local, name, api);
        }
    }

    /// Puts back a remote wrapper of kind `K` someone else changed, with
    /// the spec `set` writes into it from the local pod, then records the
    /// generation that leaves, so that only a later change is someone
    /// else's. A conflict (it changed again meanwhile) is retried.
    async fn put_back<K>(
        &self,
        provider: &kube::Client,
        twin: &str,
        pod: &LocalPod,
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
        let api_error = |source| Error::Api {
            what: format!("putting back the {kind} {twin}/{name} on the provider"),
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
    fn replica_set_as_made(&self, pod: &Pod, rs: &mut ReplicaSet) {
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
        if let Some(spec) = rs.spec.as_mut() {
            spec.replicas = want.replicas;
            spec.min_ready_seconds = want.min_ready_seconds;
            spec.template = want.template;
        }
    }

    /// A remote Job put back: of its spec only parallelism, suspension,
    /// the deadline and the backoff can change (the rest is immutable),
    /// set back to what the agent made (one pod at a time, not suspended).
    fn job_as_made(&self, pod: &Pod, job: &mut Job) {
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

    async fn patch_local_status(
        &self,
        pod: &ObjectMeta,
        status: &k8s_openapi::api::core::v1::PodStatus,
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
        .map_err(Error::api("updating the local pod's status"))?;
        Ok(())
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

/// Deletes a remote wrapper unless it is gone already.
async fn delete_wrapper(
    provider: &kube::Client,
    twin: &str,
    kind: Wrapper,
    name: &str,
    params: &DeleteParams,
) -> Result<(), Error> {
    match kind {
        Wrapper::ReplicaSet => {
            let api: Api<ReplicaSet> = Api::namespaced(provider.clone(), twin);
            delete_remote(&api, "replica set", name, params).await
        }
        Wrapper::Job => {
            let api: Api<Job> = Api::namespaced(provider.clone(), twin);
            delete_remote(&api, "job", name, params).await
        }
    }
}

/// Deletes a remote object unless it is gone already.
async fn delete_remote<K>(
    api: &Api<K>,
    what: &str,
    name: &str,
    params: &DeleteParams,
) -> Result<(), Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::Api {
            what: format!("deleting {what} {name} on the provider"),
            source: e,
        }),
    }
}

impl Kind for Pods {
    /// The local pod's namespace and name.
    type Key = ObjectKey;
    const NAME: &'static str = "pod";

    fn prepare(&self) {
        let (client, version) = {
            let Ok(mut clients) = self.clients.lock() else {
                return;
            };
            let (rx, version) = &mut *clients;
            if rx.has_changed().unwrap_or(false) {
                *version += 1;
            }
            (rx.borrow_and_update().clone(), *version)
        };
        let Ok(mut sides) = self.sides.lock() else {
            return;
        };
        // Stopped stores leave keys that no journal will name.
        let Ok(client) = client else {
            sides.by_twin.clear();
            sides.client_version = None;
            self.changed_remote.anything();
            return;
        };
        if sides.client_version != Some(version) {
            sides.by_twin.clear();
            sides.client_version = Some(version);
            self.changed_remote.anything();
        }
        let twins: Vec<String> = self.twins.borrow().values().cloned().collect();
        if sides.by_twin.keys().any(|t| !twins.contains(t)) {
            sides.by_twin.retain(|t, _| twins.contains(t));
            self.changed_remote.anything();
        }
        for twin in twins {
            if let std::collections::btree_map::Entry::Vacant(e) = sides.by_twin.entry(twin) {
                let side = Side::start(client.clone(), e.key(), &self.wake, &self.changed_remote);
                e.insert(Arc::new(side));
            }
        }
    }

    fn keys(&self) -> Vec<Self::Key> {
        let mut keys: Vec<Self::Key> = self
            .local
            .store
            .state()
            .iter()
            .map(|p| (p.namespace.clone(), p.name.clone()))
            .collect();
        let twins = self.twins.borrow().clone();
        if let Ok(sides) = self.sides.lock() {
            for (local_ns, twin) in &twins {
                if let Some(side) = sides.by_twin.get(twin) {
                    let local_ns: Arc<str> = Arc::from(local_ns.as_str());
                    keys.extend(
                        side.replica_sets
                            .store
                            .state()
                            .iter()
                            .map(|rs| (local_ns.clone(), rs.id.name.clone())),
                    );
                    keys.extend(
                        side.jobs
                            .store
                            .state()
                            .iter()
                            .map(|job| (local_ns.clone(), job.id.name.clone())),
                    );
                    // A pod made before its wrapper may be all there is.
                    keys.extend(side.pods.store.state().iter().filter_map(|p| {
                        let local = crate::forge::event::local_pod_name(&p.id.name)?;
                        Some((local_ns.clone(), Arc::from(local)))
                    }));
                }
            }
        }
        keys.sort();
        keys.dedup();
        keys
    }

    /// The local pods that changed, and the local pods of the remote
    /// objects that did; any pod when the twins, the remap, the provider's
    /// client or whether the stores are current changed.
    fn changed(&self) -> Option<Vec<Self::Key>> {
        let local = self.changed_local.take();
        let remote = self.changed_remote.take();
        let twins = self.twins.borrow().clone();
        let mut h = DefaultHasher::new();
        twins.hash(&mut h);
        self.synced.borrow().hash(&mut h);
        self.peering.remap().hash(&mut h);
        if let Ok(sides) = self.sides.lock() {
            sides.client_version.hash(&mut h);
            for (twin, side) in &sides.by_twin {
                (twin, side.is_current()).hash(&mut h);
            }
        }
        self.local.is_current().hash(&mut h);
        if self.context.changed(h.finish()) {
            return None;
        }
        let mut keys = local?;
        keys.extend(in_local_namespaces(&twins, remote?));
        Some(keys)
    }

    fn fingerprint(&self, (ns, name): &Self::Key) -> Option<u64> {
        let mut h = DefaultHasher::new();
        let local = self.local.store.get(ns, name);
        local.as_ref().map(|p| p.identity()).hash(&mut h);
        let twin = self.twin_of(ns);
        twin.hash(&mut h);
        self.synced.borrow().hash(&mut h);
        // The local status carries pod IPs where this cluster sees them: a
        // remap decided (or changed) after a pod's status was written
        // changes what it should say.
        self.peering.remap().hash(&mut h);
        if let Some(twin) = twin {
            let (client_version, side) = {
                let sides = self.sides.lock().ok()?;
                (sides.client_version, sides.by_twin.get(&twin).cloned())
            };
            client_version.hash(&mut h);
            if let Some(side) = side {
                side.is_current().hash(&mut h);
                side.wrappers(&twin, name).hash(&mut h);
                let mut remote: Vec<_> = side
                    .pods
                    .by_index(name)
                    .iter()
                    .map(|p| (p.id.uid.clone(), p.id.version.clone(), p.id.for_pod.clone()))
                    .collect();
                remote.sort();
                remote.hash(&mut h);
            }
        }
        Some(h.finish())
    }

    async fn converge(&self, key: &Self::Key) -> Result<Next, Error> {
        let (ns, name) = key;
        // A local pod missing from a store still being listed (after a
        // start, or a failed watch) is not a pod that is gone: its wrapper
        // would be taken for an orphan and deleted.
        if !self.local.is_current() {
            return Err(Error::NotYet(
                "the local pods are not in sync yet".to_owned(),
            ));
        }
        let local = self.local.store.get(ns, name);
        let Some(twin) = self.twin_of(ns) else {
            // No ready twin: nothing of this pod can exist remotely that
            // the twin's deletion does not take. A local pod being
            // deleted has nothing to wait for.
            if let Some(pod) = local.filter(|p| p.deleting()) {
                // Unless the twins are not known yet (a restart): the pod
                // may still run remotely, and its grace is to be honoured.
                if !*self.synced.borrow() {
                    return Ok(Next::After(NOT_SYNCED_POLL));
                }
                return self.delete_local(&pod).await;
            }
            return Ok(Next::Done);
        };
        let side = self.side(&twin).filter(|s| s.is_current()).ok_or_else(|| {
            Error::NotYet(format!(
                "the provider's namespace {twin} is not in sync yet"
            ))
        })?;
        let provider = self.peering.provider_client()?;
        let pod_api: Api<Pod> = Api::namespaced(provider.clone(), &twin);
        let wrappers = side.wrappers(&twin, name);
        let local_uid = local.as_ref().and_then(|p| p.uid());

        // The remote pods named for a local pod of this name: of this one,
        // or of one that is gone (or an older one of the same name).
        let (remote_pods, stale): (Vec<Arc<RemotePod>>, Vec<Arc<RemotePod>>) = side
            .pods
            .by_index(name)
            .into_iter()
            .partition(|p| local_uid.is_some() && p.id.for_pod() == local_uid);

        // A wrapper of a pod that is gone (or of an older pod of that
        // name) goes, its pod with it; so does a pod made before its
        // wrapper ([`forge_pod::first_pod`]) whose local pod went first.
        let orphans: Vec<&Found> = wrappers.iter().filter(|w| w.for_pod != local_uid).collect();
        if !orphans.is_empty() || !stale.is_empty() {
            for w in orphans.into_iter().filter(|w| !w.deleting) {
                let params = DeleteParams {
                    propagation_policy: Some(PropagationPolicy::Background),
                    preconditions: Some(Preconditions {
                        uid: w.uid.clone(),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                delete_wrapper(&provider, &twin, w.kind, name, &params).await?;
                tracing::info!(pod = %name, namespace = %ns, kind = ?w.kind, "orphan remote wrapper deleted");
            }
            for p in stale.iter().filter(|p| !p.id.deleting) {
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: p.id.uid(),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match pod_api.delete(&p.id.name, &params).await {
                    Ok(_) => {
                        tracing::info!(pod = %name, namespace = %ns, remote = %p.id.name, "orphan remote pod deleted");
                    }
                    // Gone already, or taken by its wrapper's deletion.
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(e) => {
                        return Err(Error::Api {
                            what: format!("deleting the pod {twin}/{} on the provider", p.id.name),
                            source: e,
                        });
                    }
                }
            }
            return Ok(Next::Done);
        }
        let Some(pod) = local else {
            self.made.seen(key);
            return Ok(Next::Done);
        };

        if pod.deleting() {
            let grace = pod.grace();
            let params = DeleteParams {
                grace_period_seconds: grace.and_then(|g| u32::try_from(g).ok()),
                propagation_policy: Some(PropagationPolicy::Background),
                ..DeleteParams::default()
            };
            for w in wrappers.iter().filter(|w| !w.deleting) {
                delete_wrapper(&provider, &twin, w.kind, name, &params).await?;
            }
            // The pods directly too, so that they get the local grace
            // period rather than their spec's.
            for p in remote_pods.iter().filter(|p| !p.id.deleting) {
                delete_remote(&pod_api, "pod", &p.id.name, &params).await?;
            }
            if wrappers.is_empty() && remote_pods.is_empty() {
                return self.delete_local(&pod).await;
            }
            return Ok(Next::Done);
        }

        if pod.reason.as_deref() == Some(forge_pod::REFUSED_REASON) {
            return Ok(Next::Done);
        }
        if wrappers.is_empty() {
            // A pod that ended never runs again, even if its Job was
            // deleted by someone else.
            if pod.ended() {
                return Ok(Next::Done);
            }
            // A pod made before its ReplicaSet: what it says first (the
            // user waits for it), then the ReplicaSet (below).
            self.bring_back_status(&pod, &side, &provider, &remote_pods)
                .await?;
            if let Some(left) = self.made.waiting(key, &local_uid) {
                return Ok(Next::After(left));
            }
            // The wrapper is made from the pod as the API has it (the
            // store keeps it whole only while it is pending).
            let Some(pod) = self.whole(&pod).await? else {
                return Ok(Next::Done);
            };
            if let Some(why) = pod.spec.as_ref().and_then(forge_pod::refusal) {
                return self.refuse(&pod, &why).await;
            }
            // What the provider would refuse is refused here, with its
            // reason on the pod, rather than sent to fail there.
            let terms = self.peering.admission()?;
            if let Some(why) = terms
                .as_ref()
                .and_then(|t| forge_pod::terms_refusal(&pod, t))
            {
                return self.refuse(&pod, &why).await;
            }
            // A missing ConfigMap or Secret it needs: it waits, as on a
            // kubelet.
            if let Some(references) = &self.references
                && let Some(next) = references.hold(&pod).await?
            {
                return Ok(next);
            }
            let kind = pod
                .spec
                .as_ref()
                .map_or(Wrapper::ReplicaSet, forge_pod::wrapper);
            let token = |remote: Option<&mut PodSpec>| self.mount_token(&pod, name, remote);
            // Whether what is made is the wrapper (not the pod made first).
            let mut wrapper_made = true;
            let created = match kind {
                Wrapper::ReplicaSet => {
                    let mut want = forge_pod::replica_set(&pod, &twin, terms.as_ref());
                    token(
                        want.spec
                            .as_mut()
                            .and_then(|s| s.template.as_mut())
                            .and_then(|t| t.spec.as_mut()),
                    );
                    // Its pod first, then the ReplicaSet once the pod is
                    // seen: the ReplicaSet adopts the pod it finds.
                    if remote_pods.is_empty()
                        && let Some(first) = forge_pod::first_pod(&want)
                    {
                        wrapper_made = false;
                        pod_api
                            .create(&PostParams::default(), &first)
                            .await
                            .map(|_| ())
                    } else {
                        let api: Api<ReplicaSet> = Api::namespaced(provider.clone(), &twin);
                        api.create(&PostParams::default(), &want).await.map(|_| ())
                    }
                }
                Wrapper::Job => {
                    let mut want = forge_pod::job(&pod, &twin, terms.as_ref());
                    token(want.spec.as_mut().and_then(|s| s.template.spec.as_mut()));
                    let api: Api<Job> = Api::namespaced(provider.clone(), &twin);
                    api.create(&PostParams::default(), &want).await.map(|_| ())
                }
            };
            match created {
                Ok(()) if wrapper_made => {
                    self.made.made(key, local_uid);
                    tracing::debug!(pod = %name, namespace = %ns, ?kind, "remote wrapper created");
                }
                Ok(()) => tracing::debug!(pod = %name, namespace = %ns, "remote pod created"),
                // Created by our previous pass, not yet in the store.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    return Err(Error::Api {
                        what: format!("creating the {kind:?} {twin}/{name} on the provider"),
                        source: e,
                    });
                }
            }
            return Ok(Next::Done);
        }
        self.made.seen(key);
        // Its wrapper is made: nothing more is made from the pod whole
        // (what is put back is read from the API), so the store keeps it
        // no longer, though the pod may wait on the provider for a while
        // (a scale-up of 10,000 pods held thousands of them).
        if let Some(settled) = pod.without_whole() {
            self.local.store.settle(ns, name, &pod, settled);
        }
        // A pod that ended is left as it is: its Job is over.
        let changed = wrappers
            .iter()
            .find(|w| w.changed && !w.deleting && w.for_pod == local_uid);
        match changed.map(|w| w.kind) {
            Some(Wrapper::ReplicaSet) => {
                self.put_back(&provider, &twin, &pod, Self::replica_set_as_made)
                    .await?
            }
            Some(Wrapper::Job) if !pod.ended() => {
                self.put_back(&provider, &twin, &pod, Self::job_as_made)
                    .await?
            }
            _ => {}
        }
        self.bring_back_status(&pod, &side, &provider, &remote_pods)
            .await?;
        Ok(Next::Done)
    }
}

impl Pods {
    /// Writes the status of the current remote pod of `remote_pods` into
    /// the local pod `stored` (as the store keeps it), unless it shows it
    /// already; the remote pod is then settled in `side`'s store.
    async fn bring_back_status(
        &self,
        stored: &LocalPod,
        side: &Side,
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
                if *shown == shown_as(stored.status_digest.as_deref(), remap.as_ref()) {
                    return Ok(());
                }
                // The local pod's status changed since, or the remap:
                // what the remote pod says now.
                let api: Api<RemotePodRead> =
                    Api::namespaced(provider.clone(), &remote.id.namespace);
                api.get_opt(&remote.id.name)
                    .await
                    .map_err(Error::api(format!(
                        "reading the pod {}/{}",
                        remote.id.namespace, remote.id.name
                    )))?
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
            stored.status_digest.clone()
        } else {
            if !forge_pod::digest_shows(stored.status_digest.as_deref(), &want) {
                self.patch_local_status(&stored.metadata(), &want).await?;
            }
            Some(forge_pod::status_digest(&want))
        };
        side.pods.store.settle(
            &remote.id.namespace,
            &remote.id.name,
            remote,
            remote.settled(shown_as(shown.as_deref(), remap.as_ref())),
        );
        Ok(())
    }
}

/// The pods' stores filled as the agent fills them, for
/// [`super::footprint`].
#[cfg(test)]
pub mod footprint {
    use super::*;

    pub fn local_pods(pods: impl Iterator<Item = Pod>) -> Followed<LocalPod> {
        liqo_agent_runtime::follow::filled(pods, LocalPod::options())
    }

    pub fn remote_pods(pods: impl Iterator<Item = Pod>) -> Followed<RemotePod> {
        let read = |p: Pod| RemotePodRead {
            metadata: p.metadata,
            status: p.status,
        };
        liqo_agent_runtime::follow::filled(pods.map(read), Side::pod_options())
    }

    /// The remote pods settled, as the reflection leaves them once the
    /// local pods show their status.
    pub fn remote_pods_settled(pods: impl Iterator<Item = Pod>) -> Followed<RemotePod> {
        let followed = remote_pods(pods);
        for pod in followed.store.state() {
            let status = pod.status().expect("a status");
            let digest = forge_pod::status_digest(&status);
            let settled = pod.settled(shown_as(Some(&digest), None));
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
        liqo_agent_runtime::follow::filled(wrappers, Side::wrapper_options())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapper_made_is_waited_for_until_seen_or_too_long() {
        let wait = Duration::from_millis(300);
        let made = Made::waiting_at_most(wait);
        let key: ObjectKey = ("shop".into(), "web-1".into());
        let uid = Some("u-1".to_owned());
        assert_eq!(made.waiting(&key, &uid), None, "nothing made");
        made.made(&key, uid.clone());
        assert!(made.waiting(&key, &uid).is_some_and(|left| left <= wait));
        assert_eq!(
            made.waiting(&key, &Some("u-2".to_owned())),
            None,
            "another pod of that name waits for nothing"
        );
        made.seen(&key);
        assert_eq!(made.waiting(&key, &uid), None, "seen in the store");
        made.made(&key, uid.clone());
        std::thread::sleep(wait);
        assert_eq!(
            made.waiting(&key, &uid),
            None,
            "not seen in time: made again"
        );
    }

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "web-1", "namespace": "shop", "uid": "u-1",
                "resourceVersion": "7",
                "deletionTimestamp": "2026-01-01T00:00:00Z",
                "deletionGracePeriodSeconds": 5,
                "labels": { "app": "web", forge_pod::LOCAL_POD_UID: "u-0" },
                "annotations": { "note": "x" },
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "r",
                }],
                "managedFields": [{ "manager": "kubectl" }],
            },
            "spec": { "containers": [{ "name": "app", "image": "nginx" }] },
            "status": {
                "phase": "Running", "reason": "R", "podIP": "10.0.0.7",
                "conditions": [{ "type": "Ready", "status": "True" }],
            },
        }))
        .expect("pod")
    }

    #[test]
    fn stored_objects_keep_what_is_read() {
        let full = pod();
        // Both read as the agent follows them, from a whole pod of the API.
        let read_local = |p: &Pod| -> LocalPod {
            let read: Pod =
                serde_json::from_value(serde_json::to_value(p).expect("json")).expect("pod");
            LocalPod::from(read)
        };
        let local = read_local(&full);
        let key = |ns: &str, name: &str| Key {
            namespace: ns.into(),
            name: name.into(),
        };
        let read: RemotePodRead =
            serde_json::from_value(serde_json::to_value(&full).expect("json")).expect("pod");
        let remote = RemotePod::new(read, &key("shop-c", "web-1"));
        type Check = (&'static str, fn(&LocalPod, &RemotePod) -> bool);
        let table: [Check; 8] = [
            ("local: identity and deletion kept", |l, _| {
                let m = l.metadata();
                m.name.as_deref() == Some("web-1")
                    && m.uid.as_deref() == Some("u-1")
                    && m.resource_version.as_deref() == Some("7")
                    && m.deletion_timestamp.is_some()
                    && m.deletion_grace_period_seconds == Some(5)
                    && l.deleting()
            }),
            (
                "local: no labels, annotations, owners; phase and reason",
                |l, _| {
                    let m = l.metadata();
                    m.labels.is_none()
                        && m.annotations.is_none()
                        && m.owner_references.is_none()
                        && m.managed_fields.is_none()
                        && l.phase.as_deref() == Some("Running")
                        && l.reason.as_deref() == Some("R")
                },
            ),
            ("local: running, so not kept whole", |l, _| {
                l.kept_whole().is_none()
            }),
            (
                "local: mounts no token; the digest is the full status's",
                |l, _| {
                    l.token_account.is_none()
                        && l.status_digest == pod().status.map(|s| forge_pod::status_digest(&s))
                },
            ),
            ("remote: where it is stored", |_, r| {
                &*r.id.namespace == "shop-c" && &*r.id.name == "web-1"
            }),
            ("remote: the local pod of our label", |_, r| {
                r.id.for_pod().as_deref() == Some("u-0")
            }),
            ("remote: what the local pod shows of its status", |_, r| {
                r.status() == pod().status.map(|s| forge_pod::local_status(&s, None))
            }),
            ("remote: identity and deletion kept", |_, r| {
                r.id.uid().as_deref() == Some("u-1")
                    && r.id.version == Some(Version::new("7"))
                    && r.id.deleting
            }),
        ];
        for (what, check) in table {
            assert!(check(&local, &remote), "{what}: {local:?} / {remote:?}");
        }
        // A pending pod is kept whole, and given back as the API has it
        // (less its managedFields, which no one reads).
        let mut api_pod = full.clone();
        api_pod.metadata.deletion_timestamp = None;
        api_pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Pending".to_owned()),
            ..Default::default()
        });
        let mut want = api_pod.clone();
        want.metadata.managed_fields = None;
        assert_eq!(read_local(&api_pod).kept_whole(), Some(want));
        // Once it runs, or is being deleted, it is not.
        let mut running = api_pod.clone();
        running.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Running".to_owned()),
            ..Default::default()
        });
        assert_eq!(read_local(&running).kept_whole(), None);
        assert_eq!(read_local(&full).kept_whole(), None, "being deleted");
        // A pod that mounts its token keeps the name of its account.
        let with_token: Pod = serde_json::from_value(json!({
            "metadata": { "name": "web-2", "namespace": "shop", "uid": "u-2" },
            "spec": {
                "serviceAccountName": "builder",
                "containers": [{ "name": "app", "image": "nginx" }],
                "volumes": [{ "name": "kube-api-access-x1y2z", "projected": { "sources": [] } }],
            },
        }))
        .expect("pod");
        assert_eq!(
            read_local(&with_token).token_account.as_deref(),
            Some("builder")
        );
        // Wrappers, read as the agent follows them (metadata alone) from a
        // whole object of the API: changed by others when their generation
        // is past the one we recorded.
        let whole_rs = |generation: i64, recorded: Option<&str>| {
            let mut metadata = full.metadata.clone();
            metadata.generation = Some(generation);
            metadata.annotations = recorded.map(|g| {
                BTreeMap::from([
                    ("note".to_owned(), "x".to_owned()),
                    (forge_pod::WRAPPER_GENERATION.to_owned(), g.to_owned()),
                ])
            });
            ReplicaSet {
                metadata,
                spec: Some(Default::default()),
                ..ReplicaSet::default()
            }
        };
        for (generation, recorded, changed) in [
            (1, None, false),
            (2, None, true),
            (3, Some("3"), false),
            (4, Some("3"), true),
        ] {
            let rs: PartialObjectMeta<ReplicaSet> = serde_json::from_value(
                serde_json::to_value(whole_rs(generation, recorded)).expect("json"),
            )
            .expect("rs");
            let stored = StoredWrapper::new(rs, &key("shop-c", "web-1"));
            assert_eq!(stored.changed, changed, "{generation} {recorded:?}");
            assert_eq!(
                stored.id.for_pod,
                Some(Uid::new("u-0")),
                "the UID label is read"
            );
            assert_eq!(stored.id.uid, Some(Uid::new("u-1")));
            assert!(stored.id.deleting);
        }
        let whole_job = Job {
            metadata: full.metadata.clone(),
            spec: Some(Default::default()),
            ..Job::default()
        };
        let job: PartialObjectMeta<Job> =
            serde_json::from_value(serde_json::to_value(&whole_job).expect("json")).expect("job");
        let stored = StoredWrapper::new(job, &key("shop-c", "web-1"));
        assert_eq!(
            stored.id.for_pod,
            Some(Uid::new("u-0")),
            "the UID label is read"
        );
    }
}
