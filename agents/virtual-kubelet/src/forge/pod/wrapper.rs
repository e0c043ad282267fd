//! What runs a local pod on the provider ([`wrapper`]): a ReplicaSet of
//! one ([`replica_set`], whose pod the agent makes first,
//! [`first_pod`]) or a Job of one ([`job`]), named as the local pod and
//! labelled with its UID, and whether someone else changed one
//! ([`changed_by_others`]).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::ObjectMeta;
use liqo_api::admission::Admission;
use liqo_api::names::labels;

use super::LOCAL_POD_UID;
use super::spec::remote_spec_of;

/// The remote ReplicaSet of one that runs `local` in `remote_namespace`,
/// named as the local pod and labelled with its UID.
pub fn replica_set(local: &Pod, remote_namespace: &str, terms: Option<&Admission>) -> ReplicaSet {
    let uid = local.metadata.uid.clone().unwrap_or_default();
    let mut pod_labels = local.metadata.labels.clone().unwrap_or_default();
    pod_labels.insert(LOCAL_POD_UID.to_owned(), uid.clone());
    let rs_labels = wrapper_labels(&uid);
    ReplicaSet {
        metadata: ObjectMeta {
            name: local.metadata.name.clone(),
            namespace: Some(remote_namespace.to_owned()),
            labels: Some(rs_labels),
            ..ObjectMeta::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(1),
            min_ready_seconds: None,
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([(LOCAL_POD_UID.to_owned(), uid)])),
                match_expressions: None,
            },
            template: Some(PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: local.metadata.annotations.clone(),
                    ..ObjectMeta::default()
                }),
                spec: remote_spec_of(local, terms),
            }),
        }),
        status: None,
    }
}

/// The pod of the ReplicaSet `rs` (from [`replica_set`]) as the virtual
/// kubelet creates it itself, before the ReplicaSet, which then adopts it
/// (its labels match the selector, it has no owner): a pod started this
/// way does not wait for the provider's ReplicaSet controller, whose
/// client is rate-limited (20 requests a second by default) and which
/// would spend three of them per pod. Named as the ReplicaSet names its
/// pods, `<its name>-<5 characters>`, the characters drawn from the
/// local pod's UID, so that creating it again is refused (409) rather
/// than done twice, and that the local pod's name is read from it as
/// from any remote pod ([`crate::forge::event::local_pod_name`]).
pub fn first_pod(rs: &ReplicaSet) -> Option<Pod> {
    let template = rs.spec.as_ref()?.template.clone()?;
    let metadata = template.metadata.unwrap_or_default();
    let uid = metadata.labels.as_ref()?.get(LOCAL_POD_UID)?;
    Some(Pod {
        metadata: ObjectMeta {
            name: Some(format!("{}-{}", rs.metadata.name.as_deref()?, suffix(uid))),
            namespace: rs.metadata.namespace.clone(),
            ..metadata
        },
        spec: template.spec,
        status: None,
    })
}

/// Five characters from the alphabet of generated names (no vowels, no
/// look-alikes), drawn from `seed` by FNV-1a: the same in every build,
/// so that an upgraded agent names a pod as the one before it did.
fn suffix(seed: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = seed.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (0..5)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize];
            n /= ALPHABET.len() as u64;
            char::from(c)
        })
        .collect()
}

/// The annotation on a remote ReplicaSet or Job that holds the generation of its
/// spec as the virtual kubelet last wrote it (none: as it created it,
/// generation 1).
pub const WRAPPER_GENERATION: &str = "liqo.io/wrapper-generation";

/// Whether someone else changed a remote wrapper's spec since the virtual
/// kubelet wrote it: its generation (which the API server increments on
/// every change of the spec, and only then) is past the one recorded.
pub fn changed_by_others(meta: &ObjectMeta) -> bool {
    let ours = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(WRAPPER_GENERATION))
        .and_then(|g| g.parse::<i64>().ok())
        .unwrap_or(1);
    meta.generation.is_some_and(|g| g > ours)
}

/// What runs a local pod on the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wrapper {
    /// A ReplicaSet of one: the pod runs for ever, recreated if it goes.
    ReplicaSet,
    /// A Job of one: the pod runs to its end, which the consumer sees.
    Job,
}

/// The wrapper of a pod: a ReplicaSet would start a pod that ended again,
/// so a pod meant to end (restartPolicy OnFailure or Never) runs in a Job.
pub fn wrapper(spec: &PodSpec) -> Wrapper {
    match spec.restart_policy.as_deref() {
        Some("OnFailure" | "Never") => Wrapper::Job,
        _ => Wrapper::ReplicaSet,
    }
}

/// Labels a Job sets on its pods (and checks against its selector): the
/// local Job's must not reach the remote template.
const JOB_POD_LABELS: [&str; 5] = [
    "controller-uid",
    "job-name",
    "batch.kubernetes.io/controller-uid",
    "batch.kubernetes.io/job-name",
    "batch.kubernetes.io/job-completion-index",
];

/// The remote Job of one that runs `local` (restartPolicy OnFailure or
/// Never) in `remote_namespace`, named as the local pod and labelled with
/// its UID, so that it behaves as the one pod it stands for:
///
/// - one completion, one pod at a time, no deadline, never deleted by a
///   TTL (the consumer reads its end whenever it comes back; the Job goes
///   with the local pod);
/// - `Never`: `backoffLimit: 0`, the first failed pod fails the Job and no
///   other pod runs: a pod that failed stays failed, as a local one;
/// - `OnFailure`: the provider's kubelet restarts the containers in
///   place, as a local kubelet would, and a Job counts those restarts
///   against its backoff limit, so the limit is the largest there is: the
///   pod is restarted until it succeeds, and a pod lost with its node is
///   replaced, as the ReplicaSet of one does for other pods.
pub fn job(local: &Pod, remote_namespace: &str, terms: Option<&Admission>) -> Job {
    let uid = local.metadata.uid.clone().unwrap_or_default();
    let mut pod_labels = local.metadata.labels.clone().unwrap_or_default();
    pod_labels.retain(|k, _| !JOB_POD_LABELS.contains(&k.as_str()));
    pod_labels.insert(LOCAL_POD_UID.to_owned(), uid.clone());
    let spec = remote_spec_of(local, terms);
    let never = spec
        .as_ref()
        .is_some_and(|s| s.restart_policy.as_deref() == Some("Never"));
    Job {
        metadata: ObjectMeta {
            name: local.metadata.name.clone(),
            namespace: Some(remote_namespace.to_owned()),
            labels: Some(wrapper_labels(&uid)),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            completions: Some(1),
            parallelism: Some(1),
            backoff_limit: Some(if never { 0 } else { i32::MAX }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: local.metadata.annotations.clone(),
                    ..ObjectMeta::default()
                }),
                spec,
            },
            ..JobSpec::default()
        }),
        status: None,
    }
}

/// The labels of a remote wrapper: the local pod's UID, and ours.
fn wrapper_labels(uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LOCAL_POD_UID.to_owned(), uid.to_owned()),
        (
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge::pod::fixtures::*;
    use crate::forge::pod::spec::refusal;

    #[test]
    fn a_wrapper_changed_by_someone_else_is_told_by_its_generation() {
        let meta = |generation: Option<i64>, recorded: Option<&str>| ObjectMeta {
            generation,
            annotations: recorded
                .map(|g| BTreeMap::from([(WRAPPER_GENERATION.to_owned(), g.to_owned())])),
            ..ObjectMeta::default()
        };
        for (generation, recorded, changed) in [
            (Some(1), None, false),
            (Some(2), None, true),
            (Some(3), Some("3"), false),
            (Some(4), Some("3"), true),
            (None, None, false),
            (Some(2), Some("garbage"), true),
        ] {
            assert_eq!(
                changed_by_others(&meta(generation, recorded)),
                changed,
                "{generation:?} {recorded:?}"
            );
        }
    }

    #[test]
    fn replica_set_of_one_labelled_with_the_uid() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("web-1".to_owned()),
                namespace: Some("shop".to_owned()),
                uid: Some("u-1".to_owned()),
                labels: Some(BTreeMap::from([("app".to_owned(), "web".to_owned())])),
                ..ObjectMeta::default()
            },
            spec: Some(local_spec()),
            status: None,
        };
        let rs = replica_set(&pod, "shop-consumer", None);
        // Its first pod, made before it: what the ReplicaSet would make,
        // named as it names pods, the same for the same local pod.
        let first = first_pod(&rs).expect("a pod");
        let template = rs.spec.as_ref().and_then(|s| s.template.clone());
        let template = template.expect("template");
        assert_eq!(first.spec, template.spec);
        assert_eq!(
            first.metadata.labels,
            template.metadata.and_then(|m| m.labels)
        );
        assert_eq!(first.metadata.namespace.as_deref(), Some("shop-consumer"));
        assert_eq!(first.metadata.owner_references, None, "adopted later");
        let name = first.metadata.name.clone().expect("name");
        assert_eq!(crate::forge::event::local_pod_name(&name), Some("web-1"));
        assert_eq!(
            first_pod(&rs).and_then(|p| p.metadata.name),
            Some(name.clone())
        );
        let mut other = pod.clone();
        other.metadata.uid = Some("u-2".to_owned());
        let other = first_pod(&replica_set(&other, "shop-consumer", None)).expect("a pod");
        assert_ne!(other.metadata.name, Some(name), "another UID, another name");
        assert_eq!(rs.metadata.name.as_deref(), Some("web-1"));
        assert_eq!(rs.metadata.namespace.as_deref(), Some("shop-consumer"));
        let spec = rs.spec.expect("spec");
        assert_eq!(spec.replicas, Some(1));
        let uid = BTreeMap::from([(LOCAL_POD_UID.to_owned(), "u-1".to_owned())]);
        assert_eq!(spec.selector.match_labels, Some(uid));
        let template = spec.template.expect("template");
        let tl = template.metadata.and_then(|m| m.labels).expect("labels");
        assert_eq!(tl.get("app").map(String::as_str), Some("web"));
        assert_eq!(tl.get(LOCAL_POD_UID).map(String::as_str), Some("u-1"));
        assert_eq!(template.spec.and_then(|s| s.node_name), None);
    }

    #[test]
    fn wrapper_table() {
        let table = [
            (None, Wrapper::ReplicaSet),
            (Some("Always"), Wrapper::ReplicaSet),
            (Some("OnFailure"), Wrapper::Job),
            (Some("Never"), Wrapper::Job),
        ];
        for (restart, want) in table {
            let pod = job_pod(restart, None);
            let spec = pod.spec.as_ref().expect("spec");
            assert_eq!(wrapper(spec), want, "{restart:?}");
            assert_eq!(refusal(spec), None, "{restart:?} is offloaded");
        }
        let odd = PodSpec {
            restart_policy: Some("Sometimes".to_owned()),
            ..local_spec()
        };
        assert!(refusal(&odd).is_some_and(|r| r.contains("Sometimes")));
    }

    #[test]
    fn job_of_one_table() {
        // (restart policy, backoff limit): a Never pod fails once and for
        // all, an OnFailure pod is restarted until it succeeds.
        let table = [(Some("Never"), 0), (Some("OnFailure"), i32::MAX)];
        for (restart, backoff) in table {
            let job = job(&job_pod(restart, None), "batch-consumer", None);
            assert_eq!(job.metadata.name.as_deref(), Some("batch-x1"));
            assert_eq!(job.metadata.namespace.as_deref(), Some("batch-consumer"));
            let labels = job.metadata.labels.clone().expect("labels");
            assert_eq!(labels.get(LOCAL_POD_UID).map(String::as_str), Some("u-2"));
            assert_eq!(
                labels.get(labels::MANAGED_BY).map(String::as_str),
                Some(labels::MANAGED_BY_VALUE)
            );
            let spec = job.spec.expect("spec");
            assert_eq!(spec.completions, Some(1), "{restart:?}");
            assert_eq!(spec.parallelism, Some(1), "{restart:?}");
            assert_eq!(spec.backoff_limit, Some(backoff), "{restart:?}");
            assert_eq!(
                spec.ttl_seconds_after_finished, None,
                "kept until the pod goes"
            );
            assert_eq!(spec.active_deadline_seconds, None);
            assert_eq!(spec.selector, None, "the provider makes its own");
            let tl = spec
                .template
                .metadata
                .and_then(|m| m.labels)
                .expect("labels");
            assert_eq!(tl.get("app").map(String::as_str), Some("batch"));
            assert_eq!(tl.get(LOCAL_POD_UID).map(String::as_str), Some("u-2"));
            for key in JOB_POD_LABELS {
                assert!(!tl.contains_key(key), "the local Job's {key} is dropped");
            }
            let pod_spec = spec.template.spec.expect("pod spec");
            assert_eq!(pod_spec.restart_policy.as_deref(), restart);
            assert_eq!(pod_spec.node_name, None);
        }
    }
}
