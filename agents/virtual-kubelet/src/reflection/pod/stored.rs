//! The pods' stored types: what the reflection keeps of a local pod
//! ([`LocalPod`]), of a remote wrapper ([`StoredWrapper`]) and of a remote
//! pod ([`RemotePod`]), each only the fields it reads, so that 10,000
//! pods fit in tens of megabytes. Made as the stores apply the watch's
//! events; nothing here talks to an API.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::core::{ObjectMeta, PartialObjectMeta};
use liqo_agent_runtime::compact::{Uid, Version, identity, same_version, shared};
use liqo_agent_runtime::follow::{Key, Options};

use super::whole::Whole;
use crate::forge::pod as forge_pod;
use crate::reflection::deflated::{Dictionary, deflate, inflate};

/// What the reflection reads of every object it made on the provider for
/// a local pod (a wrapper, or a pod): where it is, its UID and version,
/// the local pod's UID of our label, and whether it is being deleted.
#[derive(Clone, Debug, PartialEq)]
pub struct Remote {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub(super) uid: Option<Uid>,
    pub(super) version: Option<Version>,
    pub(super) for_pod: Option<Uid>,
    pub(super) deleting: bool,
}

impl Remote {
    pub(super) fn new(m: &ObjectMeta, key: &Key) -> Self {
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

    pub(super) fn uid(&self) -> Option<String> {
        self.uid.as_ref().map(Uid::to_string)
    }

    /// The local pod's UID it carries.
    pub(super) fn for_pod(&self) -> Option<String> {
        self.for_pod.as_ref().map(Uid::to_string)
    }
}

/// A remote wrapper (a ReplicaSet or a Job) as the reflection stores it:
/// what [`Remote`] says, and whether its spec was changed by someone else
/// ([`forge_pod::changed_by_others`]). Its spec and status are not read
/// (a Job's end is read from its pod).
#[derive(Debug, PartialEq)]
pub struct StoredWrapper {
    pub(super) id: Remote,
    pub(super) changed: bool,
}

impl StoredWrapper {
    pub(super) fn new<K>(wrapper: PartialObjectMeta<K>, key: &Key) -> Self {
        Self {
            id: Remote::new(&wrapper.metadata, key),
            changed: forge_pod::changed_by_others(&wrapper.metadata),
        }
    }
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
    pub(super) uid: Option<Uid>,
    pub(super) version: Option<Version>,
    pub(super) created: Option<Time>,
    /// When its deletion was asked and with what grace: boxed, as few
    /// pods are being deleted at a time and every stored pod would carry
    /// the room.
    pub(super) deleted: Option<Box<(Time, Option<i64>)>>,
    /// Phase and reason, from the few texts the API gives them, are
    /// shared copies ([`shared`]).
    pub phase: Option<Arc<str>>,
    pub reason: Option<Arc<str>>,
    pub start_time: Option<Time>,
    /// [`forge_pod::status_digest`] of its status.
    pub status_digest: Option<u64>,
    /// Its status says no more than that it waits
    /// ([`forge_pod::says_nothing`]).
    pub says_nothing: bool,
    /// The service account whose token it mounts, when it mounts one
    /// ([`crate::forge::token::token_volume`]).
    /// Shared too: a namespace's pods mount the tokens of a few accounts.
    pub token_account: Option<Arc<str>>,
    /// What it requests ([`forge_pod::requests`]): its part of the
    /// demand its twin states to the provider ([`super::demand`]).
    pub requests: forge_pod::Requests,
    /// The pod as the API has it, while it is pending, as deflated JSON
    /// (a few hundred bytes where the `Pod` value is about 10 KiB): it is
    /// about to be made on the provider, from its spec, labels and
    /// annotations, and keeping it until then (until its wrapper is made,
    /// when the reflection settles it, or its status says it runs) makes
    /// that cost no read. Within a budget ([`super::whole`]): past it, a
    /// pending pod is read when it is made.
    pub(super) pending: Option<Whole>,
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
            .map(|spec| shared(crate::forge::token::service_account(spec)));
        let m = &pod.metadata;
        let (uid, version) = identity(m);
        Self {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            uid,
            version,
            created: m.creation_timestamp.clone(),
            deleted: m
                .deletion_timestamp
                .clone()
                .map(|at| Box::new((at, m.deletion_grace_period_seconds))),
            status_digest: pod.status.as_ref().map(forge_pod::status_digest),
            says_nothing: forge_pod::says_nothing(&status),
            phase: status.phase.as_deref().map(shared),
            reason: status.reason.as_deref().map(shared),
            start_time: status.start_time,
            token_account,
            requests: pod
                .spec
                .as_ref()
                .map(forge_pod::requests)
                .unwrap_or_default(),
            pending: pending.then(|| Whole::kept(&pod)).flatten(),
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
            deletion_timestamp: self.deleted.as_ref().map(|d| d.0.clone()),
            deletion_grace_period_seconds: self.grace(),
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
        self.deleted.as_ref().and_then(|d| d.1)
    }

    /// Whether it has ended (Succeeded or Failed).
    pub fn ended(&self) -> bool {
        forge_pod::ended(self.phase.as_deref())
    }

    /// The pod as the API has it, while it is pending; `None` after.
    pub(super) fn kept_whole(&self) -> Option<Pod> {
        self.pending.as_ref()?.pod()
    }

    /// The same without the pod kept whole, when it keeps it: what the
    /// store settles for once its wrapper is made.
    pub(super) fn without_whole(&self) -> Option<Self> {
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
    pub(super) created: Option<Timestamp>,
    pub(super) status: RemoteStatus,
    /// Since when, and why, the provider's scheduler cannot place it
    /// (its `PodScheduled: False` condition, reason `Unschedulable`);
    /// kept when the status is settled. Boxed: few pods wait so, and
    /// every stored pod would carry its room.
    pub(super) unschedulable: Option<Box<(Timestamp, Box<str>)>>,
}

/// What a remote pod's store keeps of its status.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum RemoteStatus {
    None,
    /// What the local pod is to show, deflated JSON.
    Deflated(Box<[u8]>),
    /// Settled: the local pod showed it, with this status digest and
    /// remap ([`shown_as`]); what it was is read again if that changes.
    Shown(u64),
}

/// A local pod's status digest and the remap it was written under,
/// hashed: what a settled remote pod keeps.
pub(super) fn shown_as(
    status_digest: Option<u64>,
    remap: Option<&liqo_api::networking::Remap>,
) -> u64 {
    let mut h = DefaultHasher::new();
    (status_digest, remap).hash(&mut h);
    h.finish()
}

/// A remote pod as the API gives it, less its spec.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct RemotePodRead {
    pub(super) metadata: ObjectMeta,
    pub(super) status: Option<k8s_openapi::api::core::v1::PodStatus>,
}

crate::forge::compact_resource!(RemotePodRead, Pod);

impl RemotePod {
    pub(super) fn new(read: RemotePodRead, key: &Key) -> Self {
        let unschedulable = read
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter().find(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
            })
            .and_then(|c| {
                let since = c.last_transition_time.as_ref()?.0;
                Some(Box::new((
                    since,
                    c.message.as_deref().unwrap_or_default().into(),
                )))
            });
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
            unschedulable,
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
    pub(super) fn settled(&self, shown: u64) -> Self {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::apps::v1::ReplicaSet;
    use k8s_openapi::api::batch::v1::Job;
    use serde_json::json;

    use super::*;

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
