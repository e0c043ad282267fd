//! The remote pod's status translated back for the local pod: which
//! remote pod it comes from ([`current_remote_pod`]), what of it the
//! local pod shows ([`local_status`]) and whether it shows it already
//! ([`status_digest`], [`says_nothing`]); a pod that ended
//! ([`ended`]) and one given up on ([`given_up_status`]).

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use liqo_api::networking::Remap;

/// Whether a pod in `phase` has ended (Succeeded or Failed): it never
/// runs again, so no wrapper is made for it.
pub fn ended(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// How a remote pod ranks among those of one local pod
/// ([`current_remote_pod`]): not being deleted first, then the newest,
/// then by name.
pub trait Ranked {
    fn rank(&self) -> (bool, Option<k8s_openapi::jiff::Timestamp>, &str);
}

impl Ranked for Pod {
    fn rank(&self) -> (bool, Option<k8s_openapi::jiff::Timestamp>, &str) {
        let m = &self.metadata;
        (
            m.deletion_timestamp.is_none(),
            m.creation_timestamp.as_ref().map(|t| t.0),
            m.name.as_deref().unwrap_or_default(),
        )
    }
}

/// Of the remote pods of one local pod, the one whose status the local
/// pod shows: one not being deleted before one that is (the ReplicaSet
/// replaced it), then the newest.
pub fn current_remote_pod<'a, P: Ranked + 'a>(
    pods: impl IntoIterator<Item = &'a P>,
) -> Option<&'a P> {
    pods.into_iter().max_by(|a, b| a.rank().cmp(&b.rank()))
}

/// The fields of the local pod's status that come from the remote pod:
/// phase, conditions, container states (with restarts), IPs, start time.
/// The QoS class stays the local API server's. Pod IPs are given where
/// this cluster reaches them (`remap`, when the provider's pods are seen
/// under a remapped CIDR).
pub fn local_status(remote: &PodStatus, remap: Option<&Remap>) -> PodStatus {
    let address = |a: &String| remap.map_or_else(|| a.clone(), |r| r.address(a));
    PodStatus {
        phase: remote.phase.clone(),
        conditions: remote.conditions.clone(),
        container_statuses: remote.container_statuses.clone(),
        init_container_statuses: remote.init_container_statuses.clone(),
        pod_ip: remote.pod_ip.as_ref().map(address),
        pod_ips: remote.pod_ips.as_ref().map(|ips| {
            ips.iter()
                .map(|ip| k8s_openapi::api::core::v1::PodIP {
                    ip: address(&ip.ip),
                })
                .collect()
        }),
        host_ip: remote.host_ip.clone(),
        host_ips: remote.host_ips.clone(),
        start_time: remote.start_time.clone(),
        message: remote.message.clone(),
        reason: remote.reason.clone(),
        ..PodStatus::default()
    }
}

/// A digest of what [`local_status`] keeps of `status`: two statuses with
/// the same digest show the same thing. The store of local pods keeps
/// this digest instead of the whole status (memory at 10,000 pods).
pub fn status_digest(status: &PodStatus) -> u64 {
    // Serialising a struct is deterministic (fields in order, maps
    // sorted): equal projections give equal bytes.
    crate::forge::digest(&serde_json::to_vec(&local_status(status, None)).unwrap_or_default())
}

/// Whether a local status of digest `have` (from [`status_digest`])
/// already shows `want`.
pub fn digest_shows(have: Option<u64>, want: &PodStatus) -> bool {
    have == Some(status_digest(want))
}

/// Whether `status` says no more than that the pod waits: Pending (or no
/// phase), no container started or waiting with a reason, no address,
/// no start time, reason nor message, and no condition that is not True
/// (a pod scheduled says so; one the provider cannot schedule says
/// `PodScheduled: False`, which is news). A local pod that says nothing
/// more is not told a remote status that says nothing more: the write
/// would change a condition's times and nothing a user reads, and it was
/// most of a second status write per offloaded pod.
pub fn says_nothing(status: &PodStatus) -> bool {
    fn empty<T>(list: &Option<Vec<T>>) -> bool {
        list.as_ref().is_none_or(Vec::is_empty)
    }
    status.phase.as_deref().is_none_or(|p| p == "Pending")
        && empty(&status.container_statuses)
        && empty(&status.init_container_statuses)
        && empty(&status.ephemeral_container_statuses)
        && status.pod_ip.is_none()
        && empty(&status.pod_ips)
        && status.start_time.is_none()
        && status.reason.is_none()
        && status.message.is_none()
        && status
            .conditions
            .iter()
            .flatten()
            .all(|c| c.status == "True")
}

/// The reason on the status of a pod refused for offloading, so that the
/// refusal is said once (the Event) and recognised after a restart.
pub const REFUSED_REASON: &str = "OffloadingRefused";

/// The reason on the status of a pod the provider could not place for
/// longer than the agent waits (`--unschedulable-timeout`): failed here,
/// removed there.
pub const UNSCHEDULABLE_REASON: &str = "ProviderUnschedulable";

/// Whether a local status reason says the pod was given up on here: it is
/// never sent (again), and what was sent goes.
pub fn given_up(reason: Option<&str>) -> bool {
    reason == Some(REFUSED_REASON) || reason == Some(UNSCHEDULABLE_REASON)
}

/// The status of a pod given up on with `reason`. A pod the provider
/// could not place for too long is Failed (as a kubelet's admission
/// refusal), so that its controller makes a new one, which may go
/// elsewhere. A pod refused for offloading stays Pending with the reason:
/// a new one made from the same template would be refused the same way,
/// and a Failed pod is replaced at once, with no back-off (a Deployment
/// would fill the cluster with refused pods). `kubectl get pods` shows
/// the reason as the pod's status.
pub fn given_up_status(reason: &str, message: &str) -> PodStatus {
    let phase = if reason == REFUSED_REASON {
        "Pending"
    } else {
        "Failed"
    };
    PodStatus {
        phase: Some(phase.to_owned()),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        ..PodStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge::pod::fixtures::*;

    use k8s_openapi::api::core::v1::{ContainerStatus, PodCondition};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use kube::core::ObjectMeta;

    #[test]
    fn a_status_that_says_only_that_the_pod_waits_says_nothing() {
        let condition = |type_: &str, status: &str| PodCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            ..PodCondition::default()
        };
        let scheduled = PodStatus {
            phase: Some("Pending".to_owned()),
            conditions: Some(vec![condition("PodScheduled", "True")]),
            qos_class: Some("Burstable".to_owned()),
            ..PodStatus::default()
        };
        let cases: Vec<(&str, PodStatus, bool)> = vec![
            ("no status yet", PodStatus::default(), true),
            (
                "pending",
                PodStatus {
                    phase: Some("Pending".to_owned()),
                    ..PodStatus::default()
                },
                true,
            ),
            ("pending and scheduled", scheduled.clone(), true),
            (
                "not schedulable on the provider",
                PodStatus {
                    conditions: Some(vec![PodCondition {
                        reason: Some("Unschedulable".to_owned()),
                        ..condition("PodScheduled", "False")
                    }]),
                    ..scheduled.clone()
                },
                false,
            ),
            (
                "containers waiting",
                PodStatus {
                    container_statuses: Some(vec![ContainerStatus {
                        name: "app".to_owned(),
                        ..ContainerStatus::default()
                    }]),
                    ..scheduled.clone()
                },
                false,
            ),
            (
                "an address",
                PodStatus {
                    pod_ip: Some("10.0.0.1".to_owned()),
                    ..scheduled.clone()
                },
                false,
            ),
            (
                "started",
                PodStatus {
                    start_time: Some(Time(Timestamp::from_second(1).expect("time"))),
                    ..scheduled.clone()
                },
                false,
            ),
            (
                "a reason",
                PodStatus {
                    reason: Some("Evicted".to_owned()),
                    ..scheduled.clone()
                },
                false,
            ),
            (
                "running",
                PodStatus {
                    phase: Some("Running".to_owned()),
                    ..scheduled.clone()
                },
                false,
            ),
        ];
        for (what, status, nothing) in cases {
            assert_eq!(says_nothing(&status), nothing, "{what}");
        }
    }

    #[test]
    fn ended_table() {
        let table = [
            (None, false),
            (Some("Pending"), false),
            (Some("Running"), false),
            (Some("Succeeded"), true),
            (Some("Failed"), true),
        ];
        for (phase, want) in table {
            let pod = job_pod(Some("Never"), phase);
            let phase_of = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            assert_eq!(ended(phase_of), want, "{phase:?}");
        }
    }

    fn remote_pod(name: &str, created: i64, deleting: bool) -> Pod {
        let at = |s: i64| Time(Timestamp::from_second(s).expect("time"));
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                creation_timestamp: Some(at(created)),
                deletion_timestamp: deleting.then(|| at(created + 10)),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    #[test]
    fn current_remote_pod_table() {
        let old = remote_pod("a", 100, false);
        let new = remote_pod("b", 200, false);
        let dying = remote_pod("c", 300, true);
        let table: [(&str, Vec<&Pod>, Option<&str>); 4] = [
            ("none", vec![], None),
            ("one", vec![&old], Some("a")),
            ("newest", vec![&old, &new], Some("b")),
            ("not the dying one", vec![&dying, &old], Some("a")),
        ];
        for (what, pods, want) in table {
            let got = current_remote_pod(pods).and_then(|p| p.metadata.name.as_deref());
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn status_comes_back_and_is_compared() {
        let remote: PodStatus = serde_json::from_value(serde_json::json!({
            "phase": "Running",
            "podIP": "10.0.0.7",
            "podIPs": [{ "ip": "10.0.0.7" }],
            "hostIP": "172.18.0.3",
            "qosClass": "BestEffort",
            "startTime": "2026-01-01T00:00:00Z",
            "conditions": [{ "type": "Ready", "status": "True" }],
            "containerStatuses": [{
                "name": "app", "image": "nginx", "imageID": "", "ready": true,
                "restartCount": 2, "state": { "running": {} },
            }],
        }))
        .expect("status");
        // Where the consumer sees the provider's pods: the remapped CIDR,
        // host part kept; the provider's node address is left alone.
        let remap = Remap {
            real: "10.0.0.0/16".parse().expect("cidr"),
            seen_as: "100.64.0.0/16".parse().expect("cidr"),
        };
        let seen = local_status(&remote, Some(&remap));
        assert_eq!(seen.pod_ip.as_deref(), Some("100.64.0.7"));
        assert_eq!(
            seen.pod_ips.as_ref().map(|ips| ips[0].ip.as_str()),
            Some("100.64.0.7")
        );
        assert_eq!(seen.host_ip.as_deref(), Some("172.18.0.3"));
        assert!(!digest_shows(
            Some(status_digest(&local_status(&remote, None))),
            &seen
        ));

        let want = local_status(&remote, None);
        assert_eq!(want.phase.as_deref(), Some("Running"));
        assert_eq!(want.pod_ip.as_deref(), Some("10.0.0.7"));
        assert_eq!(want.qos_class, None, "the QoS class stays local");
        let restarts = want.container_statuses.as_ref().map(|c| c[0].restart_count);
        assert_eq!(restarts, Some(2));
        assert!(!digest_shows(None, &want));
        let mut local = want.clone();
        local.qos_class = Some("Burstable".to_owned());
        assert!(digest_shows(Some(status_digest(&local)), &want));
        local.phase = Some("Pending".to_owned());
        assert!(!digest_shows(Some(status_digest(&local)), &want));
    }

    #[test]
    fn status_digest_table() {
        let base: PodStatus = serde_json::from_value(serde_json::json!({
            "phase": "Running",
            "podIP": "10.0.0.7",
            "conditions": [{ "type": "Ready", "status": "True" }],
            "containerStatuses": [{
                "name": "app", "image": "nginx", "imageID": "", "ready": true,
                "restartCount": 0, "state": { "running": {} },
            }],
        }))
        .expect("status");
        let want = local_status(&base, None);
        let changed = |f: fn(&mut PodStatus)| {
            let mut s = base.clone();
            f(&mut s);
            s
        };
        let table: [(&str, PodStatus, bool); 5] = [
            ("the same", base.clone(), true),
            (
                "another QoS class: not reflected",
                changed(|s| s.qos_class = Some("Burstable".to_owned())),
                true,
            ),
            (
                "another phase",
                changed(|s| s.phase = Some("Succeeded".to_owned())),
                false,
            ),
            (
                "another IP",
                changed(|s| s.pod_ip = Some("10.0.0.8".to_owned())),
                false,
            ),
            (
                "a restart",
                changed(|s| {
                    if let Some(c) = s.container_statuses.as_mut() {
                        c[0].restart_count = 1;
                    }
                }),
                false,
            ),
        ];
        for (what, have, shows) in table {
            let digest = status_digest(&have);
            assert_eq!(digest_shows(Some(digest), &want), shows, "{what}");
        }
        assert!(!digest_shows(None, &want));
    }
}
