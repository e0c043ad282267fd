//! Pure translation of the Events of remote pods (on the provider, in the
//! twin) into Events of the local pods they run for: reason, message,
//! type, count and times are copied; the local Event is named after the
//! remote Event's UID, so that it is written once whatever restarts, and
//! labelled as ours, so that the virtual kubelet follows only its own.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::ObjectMeta;
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

/// The local Event for the remote Event `remote` about a pod of
/// `local_pod`, or `None` when the remote Event is not about a pod.
pub fn local_event(remote: &Event, local_pod: &Pod, node_name: &str) -> Option<Event> {
    if remote.involved_object.kind.as_deref() != Some("Pod") {
        return None;
    }
    let pod_name = local_pod.metadata.name.clone()?;
    let uid = remote.metadata.uid.as_deref()?;
    let (count, first, last) = occurrences(remote);
    let component = remote
        .source
        .as_ref()
        .and_then(|s| s.component.clone())
        .or_else(|| remote.reporting_component.clone())
        .filter(|c| !c.is_empty());
    Some(Event {
        metadata: ObjectMeta {
            name: Some(local_name(&pod_name, uid)),
            namespace: local_pod.metadata.namespace.clone(),
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
            namespace: local_pod.metadata.namespace.clone(),
            uid: local_pod.metadata.uid.clone(),
            field_path: remote.involved_object.field_path.clone(),
            ..ObjectReference::default()
        },
        reason: remote.reason.clone(),
        message: remote.message.clone(),
        type_: remote.type_.clone(),
        count: Some(count),
        first_timestamp: first,
        last_timestamp: last,
        source: Some(EventSource {
            component,
            host: Some(node_name.to_owned()),
        }),
        ..Event::default()
    })
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

/// A remote Event as the agent stores it: what [`local_event`], the keys
/// and the fingerprints read (its name, UID and version, the pod it is
/// about, what it says and when), not the rest of its metadata nor who
/// reported it from where.
pub fn trim_remote(e: &mut Event) {
    e.metadata = ObjectMeta {
        name: e.metadata.name.take(),
        namespace: e.metadata.namespace.take(),
        uid: e.metadata.uid.take(),
        resource_version: e.metadata.resource_version.take(),
        ..ObjectMeta::default()
    };
    e.involved_object = ObjectReference {
        kind: e.involved_object.kind.take(),
        name: e.involved_object.name.take(),
        field_path: e.involved_object.field_path.take(),
        ..ObjectReference::default()
    };
    e.related = None;
    e.action = None;
    e.reporting_instance = None;
    if let Some(source) = e.source.as_mut() {
        source.host = None;
    }
}

/// A local copy as the agent stores it: its name and version, and what
/// [`shows`] compares.
pub fn trim_local(e: &mut Event) {
    *e = Event {
        metadata: ObjectMeta {
            name: e.metadata.name.take(),
            namespace: e.metadata.namespace.take(),
            resource_version: e.metadata.resource_version.take(),
            ..ObjectMeta::default()
        },
        count: e.count,
        last_timestamp: e.last_timestamp.take(),
        message: e.message.take(),
        reason: e.reason.take(),
        type_: e.type_.take(),
        ..Event::default()
    };
}

/// Whether the local Event `have` already says what `want` says.
pub fn shows(have: &Event, want: &Event) -> bool {
    have.count == want.count
        && have.last_timestamp == want.last_timestamp
        && have.message == want.message
        && have.reason == want.reason
        && have.type_ == want.type_
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
    fn trimmed_copies_forge_and_compare_as_whole_ones() {
        let whole = remote("Pod");
        let mut trimmed = whole.clone();
        trim_remote(&mut trimmed);
        assert_eq!(trimmed.involved_object.uid, None);
        let want = local_event(&whole, &local_pod(), "liqo-prov");
        assert_eq!(local_event(&trimmed, &local_pod(), "liqo-prov"), want);
        let want = want.expect("an event");
        let mut stored = want.clone();
        trim_local(&mut stored);
        assert_eq!(stored.source, None);
        assert!(shows(&stored, &want));
        let mut later = want;
        later.count = Some(5);
        assert!(!shows(&stored, &later));
    }

    #[test]
    fn local_pod_name_table() {
        let cases = [
            ("web-1-abcde", Some("web-1")),
            ("web-7d9f8-x2k4p-abcde", Some("web-7d9f8-x2k4p")),
            ("web", None),
            ("-abcde", None),
            ("web-1-abc", None),
        ];
        for (remote, want) in cases {
            assert_eq!(local_pod_name(remote), want, "{remote}");
        }
    }

    #[test]
    fn copied_onto_the_local_pod() {
        let local = local_event(&remote("Pod"), &local_pod(), "liqo-prov").expect("an event");
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
        assert!(shows(&local, &local.clone()));
        let mut later = remote("Pod");
        later.count = Some(5);
        let later = local_event(&later, &local_pod(), "liqo-prov").expect("an event");
        assert!(!shows(&local, &later));
        assert_eq!(
            later.metadata.name, local.metadata.name,
            "one local Event per remote one"
        );
        assert!(local_event(&remote("ReplicaSet"), &local_pod(), "liqo-prov").is_none());
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
        let local = local_event(&e, &local_pod(), "liqo-prov").expect("an event");
        assert_eq!(local.count, Some(3));
        // In whole seconds, as a core/v1 Event keeps them.
        assert_eq!(local.first_timestamp, Some(Time(t("2026-01-01T00:00:00Z"))));
        assert_eq!(local.last_timestamp, Some(Time(t("2026-01-01T00:02:00Z"))));
        // What the API gives back is what was written: no patch follows.
        let read_back: Event =
            serde_json::from_value(serde_json::to_value(&local).expect("json")).expect("event");
        assert!(shows(&read_back, &local));
        assert_eq!(
            local.source.and_then(|s| s.component).as_deref(),
            Some("default-scheduler")
        );
        e.series = None;
        let local = local_event(&e, &local_pod(), "liqo-prov").expect("an event");
        assert_eq!(local.count, Some(1));
        assert_eq!(local.last_timestamp, Some(Time(t("2026-01-01T00:00:00Z"))));
    }
}
