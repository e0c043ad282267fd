//! Pure translation of the Events of remote pods (on the provider, in the
//! twin) into Events of the local pods they run for: reason, message,
//! type, count and times are copied; the local Event is named after the
//! remote Event's UID, so that it is written once whatever restarts, and
//! labelled as ours, so that the virtual kubelet follows only its own.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::sync::Arc;

use kube::core::ObjectMeta;
use liqo_agent_runtime::compact::{Uid, Version, identity, shared};
use liqo_agent_runtime::follow::Key;
use liqo_api::names::labels;

/// The local pod a remote pod runs for, from the remote pod's name: a
/// ReplicaSet names its pods `<its name>-<5 characters>`, and the remote
/// ReplicaSet is named as the local pod.
pub fn local_pod_name(remote_pod: &str) -> Option<&str> {
    let (rs, suffix) = remote_pod.rsplit_once('-')?;
    (suffix.len() == 5 && !rs.is_empty()).then_some(rs)
}

/// The local Event's name for the remote Event with UID `remote_uid`.
pub fn local_name(local_pod: &str, remote_uid: &str) -> String {
    format!("{local_pod}.{remote_uid}")
}

/// The count, first and last time of `e`, whichever API wrote it (the
/// events.k8s.io API fills `eventTime` and `series` instead).
fn occurrences(
    e: &Event,
) -> (
    i32,
    Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
) {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    // A core/v1 Event's timestamps are whole seconds in the API: a copy
    // keeping the microseconds of an events.k8s.io eventTime would never
    // read back as written, and be patched again at every pass.
    let whole_seconds = |t: &k8s_openapi::jiff::Timestamp| {
        Time(k8s_openapi::jiff::Timestamp::from_second(t.as_second()).unwrap_or(*t))
    };
    let event_time = e.event_time.as_ref().map(|t| whole_seconds(&t.0));
    let count = e
        .count
        .or_else(|| e.series.as_ref().and_then(|s| s.count))
        .unwrap_or(1);
    let first = e.first_timestamp.clone().or_else(|| event_time.clone());
    let last = e
        .last_timestamp
        .clone()
        .or_else(|| {
            e.series
                .as_ref()
                .and_then(|s| s.last_observed_time.as_ref())
                .map(|t| whole_seconds(&t.0))
        })
        .or(event_time);
    (count, first, last)
}

/// A remote Event as the agent stores it: what the keys and the
/// fingerprints read (its name, UID and version, the pod it is about) and
/// a digest of what its local copy shows, made when it is read from the
/// API; and what it says ([`Said`]) until its copy shows it, when the
/// reflection settles it ([`RemoteEvent::settled`]). Not the Event itself:
/// a k8s-openapi `Event` is a kilobyte before any string, and a cluster
/// keeps its Events for an hour (at 10,000 pods, tens of thousands of
/// them, nearly all copied long ago).
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteEvent {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub uid: Option<Uid>,
    pub version: Option<Version>,
    about: About,
    /// [`LocalCopy`]'s digest of the copy that shows it.
    shown: u64,
    said: Option<Box<Said>>,
}

/// The pod an Event is about, by name.
#[derive(Clone, Debug, PartialEq)]
enum About {
    NotAPod,
    /// The Event's own name starts with the pod's name and a dot, as the
    /// names the kubelet and the scheduler give do: its length.
    NamePrefix(u16),
    /// Any other name, behind a thin pointer: the variant is rare, and a
    /// `Box<str>` here would make every stored Event 8 bytes larger (and
    /// its allocation a size class larger).
    Named(Box<Box<str>>),
}

/// What a remote Event says, copied onto its local copy.
#[derive(Clone, Debug, PartialEq)]
struct Said {
    // What a small set of values repeats for thousands of Events is
    // shared ([`shared`]).
    field_path: Option<Arc<str>>,
    reason: Option<Arc<str>>,
    message: Option<Box<str>>,
    type_: Option<Arc<str>>,
    /// Who reported it (`source.component`, or the events.k8s.io
    /// `reportingController`).
    component: Option<Arc<str>>,
    count: i32,
    first: Option<Time>,
    last: Option<Time>,
}

impl From<Event> for RemoteEvent {
    fn from(e: Event) -> Self {
        let key = key_of(&e.metadata);
        Self::new(e, &key)
    }
}

/// Where the object of `meta` is stored (for objects not read by a store).
fn key_of(meta: &ObjectMeta) -> Key {
    Key {
        namespace: meta.namespace.as_deref().unwrap_or_default().into(),
        name: meta.name.as_deref().unwrap_or_default().into(),
    }
}

impl RemoteEvent {
    pub fn new(e: Event, key: &Key) -> Self {
        let (count, first, last) = occurrences(&e);
        let component = e
            .source
            .and_then(|s| s.component)
            .or(e.reporting_component)
            .filter(|c| !c.is_empty());
        let about = match e.involved_object.name {
            _ if e.involved_object.kind.as_deref() != Some("Pod") => About::NotAPod,
            None => About::NotAPod,
            Some(pod) => match key.name.strip_prefix(pod.as_str()) {
                Some(rest) if rest.starts_with('.') => u16::try_from(pod.len())
                    .map_or_else(|_| About::Named(Box::new(pod.into())), About::NamePrefix),
                _ => About::Named(Box::new(pod.into())),
            },
        };
        let (uid, version) = identity(&e.metadata);
        let said = Said {
            field_path: e.involved_object.field_path.as_deref().map(shared),
            reason: e.reason.as_deref().map(shared),
            message: e.message.map(Into::into),
            type_: e.type_.as_deref().map(shared),
            component: component.as_deref().map(shared),
            count,
            first,
            last,
        };
        Self {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            uid,
            version,
            about,
            shown: shown(
                Some(said.count),
                said.last.as_ref(),
                said.message.as_deref(),
                said.reason.as_deref(),
                said.type_.as_deref(),
            ),
            said: Some(Box::new(said)),
        }
    }

    /// The name of the remote pod it is about; `None` when it is not
    /// about a pod.
    pub fn pod(&self) -> Option<&str> {
        match &self.about {
            About::NotAPod => None,
            About::NamePrefix(len) => self.name.get(..usize::from(*len)),
            About::Named(pod) => Some(pod),
        }
    }

    /// Whether the local copy `copy` shows what it says.
    pub fn shown_by(&self, copy: &LocalCopy) -> bool {
        copy.shown == self.shown
    }

    /// Whether it still holds what it says ([`local_event`] can copy it).
    pub fn says(&self) -> bool {
        self.said.is_some()
    }

    /// The same Event without what it says, once a copy shows it (`None`:
    /// it is settled already). Its digest stays, so a copy that changes
    /// or goes away is still noticed; copying it again takes a read.
    pub fn settled(&self) -> Option<Self> {
        self.said.as_ref()?;
        Some(Self {
            said: None,
            ..self.clone()
        })
    }
}

/// The local Event for the remote Event `remote` about a pod of
/// `local_pod`, or `None` when the remote Event is not about a pod or is
/// settled ([`RemoteEvent::settled`]: read it again).
pub fn local_event(remote: &RemoteEvent, local_pod: &ObjectMeta, node_name: &str) -> Option<Event> {
    remote.pod()?;
    let said = remote.said.as_deref()?;
    let pod_name = local_pod.name.clone()?;
    let uid = remote.uid.as_ref()?.to_string();
    Some(Event {
        metadata: ObjectMeta {
            name: Some(local_name(&pod_name, &uid)),
            namespace: local_pod.namespace.clone(),
            labels: Some(BTreeMap::from([(
                labels::MANAGED_BY.to_owned(),
                labels::MANAGED_BY_VALUE.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            name: Some(pod_name),
            namespace: local_pod.namespace.clone(),
            uid: local_pod.uid.clone(),
            field_path: text(&said.field_path),
            ..ObjectReference::default()
        },
        reason: text(&said.reason),
        message: text(&said.message),
        type_: text(&said.type_),
        count: Some(said.count),
        first_timestamp: said.first.clone(),
        last_timestamp: said.last.clone(),
        source: Some(EventSource {
            component: text(&said.component),
            host: Some(node_name.to_owned()),
        }),
        ..Event::default()
    })
}

/// A stored text as the API's objects have it.
fn text(stored: &Option<impl AsRef<str>>) -> Option<String> {
    stored.as_ref().map(|s| s.as_ref().to_owned())
}

/// A Warning Event of the virtual kubelet's own about a local pod, once,
/// at `now`. `name` is the Event's name when it must be written at most
/// once (a create of it again gets 409), `None` for a generated one.
pub fn warning(
    pod: &Pod,
    name: Option<String>,
    reason: &str,
    message: &str,
    component: &str,
    node_name: &str,
    now: Time,
) -> Event {
    let generate_name = name
        .is_none()
        .then(|| format!("{}.", pod.metadata.name.clone().unwrap_or_default()));
    Event {
        metadata: ObjectMeta {
            name,
            generate_name,
            namespace: pod.metadata.namespace.clone(),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            uid: pod.metadata.uid.clone(),
            ..ObjectReference::default()
        },
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        type_: Some("Warning".to_owned()),
        source: Some(EventSource {
            component: Some(component.to_owned()),
            host: Some(node_name.to_owned()),
        }),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Event::default()
    }
}

/// A local copy as the agent stores it: its version, and a digest of
/// what [`shows`] compares, made when it is read from the API (its name
/// is the store's key).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LocalCopy {
    pub version: Option<Version>,
    shown: u64,
}

impl LocalCopy {
    pub fn new(e: Event, _: &Key) -> Self {
        Self::from(e)
    }
}

impl From<Event> for LocalCopy {
    fn from(e: Event) -> Self {
        Self {
            shown: shown_by_event(&e),
            version: e.metadata.resource_version.as_deref().map(Version::new),
        }
    }
}

/// What a copy says that is kept up to date, hashed.
fn shown(
    count: Option<i32>,
    last: Option<&Time>,
    message: Option<&str>,
    reason: Option<&str>,
    type_: Option<&str>,
) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    count.hash(&mut h);
    last.map(|t| t.0.as_second()).hash(&mut h);
    message.hash(&mut h);
    reason.hash(&mut h);
    type_.hash(&mut h);
    h.finish()
}

fn shown_by_event(e: &Event) -> u64 {
    shown(
        e.count,
        e.last_timestamp.as_ref(),
        e.message.as_deref(),
        e.reason.as_deref(),
        e.type_.as_deref(),
    )
}

/// Whether the local copy `have` already says what `want` says (the
/// reflection compares with [`RemoteEvent::shown_by`]).
#[cfg(test)]
pub fn shows(have: &LocalCopy, want: &Event) -> bool {
    have.shown == shown_by_event(want)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_about_the_pod_and_named_once_when_asked() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "web-1", "namespace": "shop", "uid": "u-1" },
        }))
        .expect("pod");
        let now = Time(Timestamp::now());
        for (name, want_name, want_generate) in [
            (
                Some("web-1.u-1.failedmount".to_owned()),
                Some("web-1.u-1.failedmount"),
                None,
            ),
            (None, None, Some("web-1.")),
        ] {
            let e = warning(&pod, name, "R", "m", "vk", "node", now.clone());
            assert_eq!(e.metadata.name.as_deref(), want_name);
            assert_eq!(e.metadata.generate_name.as_deref(), want_generate);
            assert_eq!(e.metadata.namespace.as_deref(), Some("shop"));
            assert_eq!(e.involved_object.uid.as_deref(), Some("u-1"));
            assert_eq!(e.involved_object.name.as_deref(), Some("web-1"));
            assert_eq!(
                (e.reason.as_deref(), e.type_.as_deref()),
                (Some("R"), Some("Warning"))
            );
            assert_eq!(e.source.and_then(|s| s.host).as_deref(), Some("node"));
        }
    }
    use k8s_openapi::api::core::v1::EventSeries;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;

    fn t(s: &str) -> Timestamp {
        s.parse().expect("time")
    }

    fn local_pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-1".to_owned()),
                namespace: Some("shop".to_owned()),
                uid: Some("local-uid".to_owned()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn remote(kind: &str) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some("web-1-abcde.1234".to_owned()),
                namespace: Some("shop-c".to_owned()),
                uid: Some("ev-uid".to_owned()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                kind: Some(kind.to_owned()),
                name: Some("web-1-abcde".to_owned()),
                namespace: Some("shop-c".to_owned()),
                uid: Some("remote-uid".to_owned()),
                field_path: Some("spec.containers{app}".to_owned()),
                ..ObjectReference::default()
            },
            reason: Some("BackOff".to_owned()),
            message: Some("Back-off restarting".to_owned()),
            type_: Some("Warning".to_owned()),
            count: Some(4),
            first_timestamp: Some(Time(t("2026-01-01T00:00:00Z"))),
            last_timestamp: Some(Time(t("2026-01-01T00:05:00Z"))),
            source: Some(EventSource {
                component: Some("kubelet".to_owned()),
                host: Some("provider-node-1".to_owned()),
            }),
            ..Event::default()
        }
    }

    #[test]
    fn stored_forms_forge_and_compare_as_whole_events() {
        let whole = remote("Pod");
        // Read from the API as the stores read it.
        let read: Event =
            serde_json::from_value(serde_json::to_value(&whole).expect("json")).expect("event");
        let stored = RemoteEvent::from(read);
        assert_eq!(stored, RemoteEvent::from(whole.clone()));
        assert_eq!(stored.pod(), Some("web-1-abcde"));
        assert_eq!(stored.uid, Some(Uid::new("ev-uid")), "the UID kept");
        let want = local_event(&stored, &local_pod().metadata, "liqo-prov").expect("an event");
        assert_eq!(want.metadata.name.as_deref(), Some("web-1.ev-uid"));
        let read: Event =
            serde_json::from_value(serde_json::to_value(&want).expect("json")).expect("copy");
        let copy = LocalCopy::from(read);
        assert!(
            shows(&copy, &want),
            "a copy read back shows what was written"
        );
        assert!(stored.shown_by(&copy), "and the remote Event sees it so");
        // Settled, it keeps what the keys and the comparison read, not
        // what it says.
        let settled = stored.settled().expect("it says something");
        assert!(!settled.says() && stored.says());
        assert!(settled.shown_by(&copy));
        assert_eq!(
            (settled.pod(), &settled.uid, &settled.version),
            (stored.pod(), &stored.uid, &stored.version)
        );
        assert!(local_event(&settled, &local_pod().metadata, "liqo-prov").is_none());
        assert_eq!(settled.settled(), None, "settled once");
        // An Event named otherwise keeps its pod's name apart.
        let mut other = whole.clone();
        other.metadata.name = Some("elsewhere.1234".to_owned());
        assert_eq!(RemoteEvent::from(other).pod(), Some("web-1-abcde"));
        let mut not_a_prefix = whole.clone();
        not_a_prefix.metadata.name = Some("web-1-abcdef.1234".to_owned());
        assert_eq!(RemoteEvent::from(not_a_prefix).pod(), Some("web-1-abcde"));
        type Change = (&'static str, fn(&mut Event));
        let changes: [Change; 5] = [
            ("count", |e| e.count = Some(9)),
            ("message", |e| e.message = Some("other".to_owned())),
            ("reason", |e| e.reason = Some("Other".to_owned())),
            ("type", |e| e.type_ = Some("Normal".to_owned())),
            ("last time", |e| {
                e.last_timestamp = Some(Time(t("2026-01-01T00:09:00Z")));
            }),
        ];
        for (what, change) in changes {
            let mut other = want.clone();
            change(&mut other);
            assert!(!shows(&copy, &other), "a changed {what} is seen");
        }
    }

    #[test]
    fn copied_onto_the_local_pod() {
        let local = local_event(&remote("Pod").into(), &local_pod().metadata, "liqo-prov")
            .expect("an event");
        assert_eq!(local.metadata.name.as_deref(), Some("web-1.ev-uid"));
        assert_eq!(local.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(
            local
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::MANAGED_BY))
                .map(String::as_str),
            Some(labels::MANAGED_BY_VALUE)
        );
        let o = &local.involved_object;
        assert_eq!(
            (
                o.name.as_deref(),
                o.namespace.as_deref(),
                o.uid.as_deref(),
                o.field_path.as_deref()
            ),
            (
                Some("web-1"),
                Some("shop"),
                Some("local-uid"),
                Some("spec.containers{app}")
            )
        );
        assert_eq!(local.reason.as_deref(), Some("BackOff"));
        assert_eq!(local.type_.as_deref(), Some("Warning"));
        assert_eq!(local.count, Some(4));
        assert_eq!(local.first_timestamp, Some(Time(t("2026-01-01T00:00:00Z"))));
        assert_eq!(local.last_timestamp, Some(Time(t("2026-01-01T00:05:00Z"))));
        let source = local.source.clone().expect("source");
        assert_eq!(source.component.as_deref(), Some("kubelet"));
        assert_eq!(
            source.host.as_deref(),
            Some("liqo-prov"),
            "the provider's nodes stay hidden"
        );
        let copy = LocalCopy::from(local.clone());
        assert!(shows(&copy, &local));
        assert!(RemoteEvent::from(remote("Pod")).shown_by(&copy));
        let mut later = remote("Pod");
        later.count = Some(5);
        assert!(!RemoteEvent::from(later.clone()).shown_by(&copy));
        let later =
            local_event(&later.into(), &local_pod().metadata, "liqo-prov").expect("an event");
        assert!(!shows(&copy, &later));
        assert_eq!(
            later.metadata.name, local.metadata.name,
            "one local Event per remote one"
        );
        assert!(
            local_event(
                &remote("ReplicaSet").into(),
                &local_pod().metadata,
                "liqo-prov"
            )
            .is_none()
        );
    }

    #[test]
    fn events_api_series_are_read() {
        let mut e = remote("Pod");
        e.count = None;
        e.first_timestamp = None;
        e.last_timestamp = None;
        e.source = None;
        e.reporting_component = Some("default-scheduler".to_owned());
        e.event_time = Some(MicroTime(t("2026-01-01T00:00:00.250001Z")));
        e.series = Some(EventSeries {
            count: Some(3),
            last_observed_time: Some(MicroTime(t("2026-01-01T00:02:00.999999Z"))),
        });
        let local =
            local_event(&e.clone().into(), &local_pod().metadata, "liqo-prov").expect("an event");
        assert_eq!(local.count, Some(3));
        // In whole seconds, as a core/v1 Event keeps them.
        assert_eq!(local.first_timestamp, Some(Time(t("2026-01-01T00:00:00Z"))));
        assert_eq!(local.last_timestamp, Some(Time(t("2026-01-01T00:02:00Z"))));
        // What the API gives back is what was written: no patch follows.
        let read_back = LocalCopy::from(
            serde_json::from_value::<Event>(serde_json::to_value(&local).expect("json"))
                .expect("event"),
        );
        assert!(shows(&read_back, &local));
        assert_eq!(
            local.source.and_then(|s| s.component).as_deref(),
            Some("default-scheduler")
        );
        e.series = None;
        let local = local_event(&e.into(), &local_pod().metadata, "liqo-prov").expect("an event");
        assert_eq!(local.count, Some(1));
        assert_eq!(local.last_timestamp, Some(Time(t("2026-01-01T00:00:00Z"))));
    }
}
