//! Pure translation of a local pod bound to the virtual node into its
//! remote twin (a ReplicaSet of one in the twin namespace, so that the
//! provider's own controllers keep the pod running while the consumer is
//! unreachable, or a Job of one for a pod meant to end: [`wrapper`]), and
//! of the remote pod's status back into the local one. What cannot run on
//! a provider is refused here with a reason.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::ObjectMeta;
use liqo_api::admission::Admission;
use liqo_api::names::{self, labels};
use liqo_api::networking::Remap;

/// The label that ties a remote ReplicaSet (and its pod) to the local pod,
/// by UID: a pod deleted and created again under the same name is another
/// pod, and its old twin must not be taken for it.
pub const LOCAL_POD_UID: &str = "liqo.io/local-pod-uid";

/// Why a pod cannot be offloaded, as said in the Event on the local pod.
pub fn refusal(spec: &PodSpec) -> Option<String> {
    // The provider's host is not the consumer's: host namespaces and paths
    // would reach into another cluster's machine.
    let host = [
        (spec.host_network, "hostNetwork"),
        (spec.host_pid, "hostPID"),
        (spec.host_ipc, "hostIPC"),
    ];
    if let Some((_, what)) = host.iter().find(|(on, _)| *on == Some(true)) {
        return Some(format!("{what} pods cannot be offloaded to a provider"));
    }
    if let Some(policy) = spec
        .restart_policy
        .as_deref()
        .filter(|p| !["Always", "OnFailure", "Never"].contains(p))
    {
        return Some(format!("restartPolicy {policy} is not known"));
    }
    let host_path = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.host_path.is_some());
    host_path.map(|v| {
        format!(
            "volume {} is a hostPath: it cannot be offloaded to a provider",
            v.name
        )
    })
}

/// The service account token volume the local API server injects
/// (`kube-api-access-*`): dropped here, [`super::token::mount`] puts the
/// consumer's token in its place.
fn is_local_token_volume(name: &str) -> bool {
    name.starts_with("kube-api-access-")
}

/// The remote pod's spec: the local one without what tied it to the
/// virtual node (node name, the virtual node's toleration, node selector
/// and node affinity: they chose the virtual node, not a provider's node)
/// nor what only the consumer's API knows (its service account and its
/// token, its priority classes, its scheduler). Containers, env,
/// resources, volumes and pod (anti-)affinity are kept.
pub fn remote_pod_spec(local: &PodSpec) -> PodSpec {
    let mut spec = local.clone();
    spec.node_name = None;
    spec.node_selector = None;
    if let Some(affinity) = spec.affinity.as_mut() {
        affinity.node_affinity = None;
        if affinity.pod_affinity.is_none() && affinity.pod_anti_affinity.is_none() {
            spec.affinity = None;
        }
    }
    spec.tolerations = spec.tolerations.take().and_then(|t| {
        let kept: Vec<_> = t
            .into_iter()
            .filter(|t| t.key.as_deref() != Some(names::VIRTUAL_NODE_TAINT))
            .collect();
        (!kept.is_empty()).then_some(kept)
    });
    // Never the provider's account nor its token: the consumer's token
    // of the pod's own account comes from `super::token::mount`.
    spec.service_account_name = None;
    #[allow(deprecated)]
    {
        spec.service_account = None;
    }
    spec.automount_service_account_token = Some(false);
    spec.volumes = spec.volumes.take().and_then(|v| {
        let kept: Vec<_> = v
            .into_iter()
            .filter(|v| !is_local_token_volume(&v.name))
            .collect();
        (!kept.is_empty()).then_some(kept)
    });
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        if let Some(mounts) = c.volume_mounts.as_mut() {
            mounts.retain(|m| !is_local_token_volume(&m.name));
        }
        if c.volume_mounts.as_ref().is_some_and(Vec::is_empty) {
            c.volume_mounts = None;
        }
        // The provider bounds the tenant's requests with a quota, which
        // refuses containers that state none: none is zero (the QoS
        // class stays the same; a kubelet reads zero as not set).
        let requests = c
            .resources
            .get_or_insert_default()
            .requests
            .get_or_insert_default();
        for resource in ["cpu", "memory"] {
            requests
                .entry(resource.to_owned())
                .or_insert_with(|| Quantity("0".to_owned()));
        }
    }
    // Set by the consumer's admission from its own classes, which the
    // provider may not have; the provider's admission sets its own.
    spec.priority = None;
    spec.priority_class_name = None;
    spec.preemption_policy = None;
    spec.scheduler_name = None;
    spec.runtime_class_name = None;
    spec.overhead = None;
    spec
}

/// The remote pod's spec within what the provider admits from this
/// cluster (`liqo_api::admission`): the runtime class and node labels it
/// requires, and only the tolerations it allows (a toleration of the
/// consumer's own taints means nothing on the provider, and one the
/// provider does not allow would be refused).
pub fn within_terms(mut spec: PodSpec, terms: &Admission) -> PodSpec {
    if let Some(class) = &terms.runtime_class_name {
        spec.runtime_class_name = Some(class.clone());
    }
    if !terms.node_selector.is_empty() {
        spec.node_selector
            .get_or_insert_default()
            .extend(terms.node_selector.clone());
    }
    spec.tolerations = spec.tolerations.take().and_then(|t| {
        let kept: Vec<_> = t.into_iter().filter(|t| terms.tolerates(t)).collect();
        (!kept.is_empty()).then_some(kept)
    });
    spec
}

/// Why the provider would refuse the remote twin of `local` under
/// `terms`, as said on the local pod; `None` when it would admit it.
pub fn terms_refusal(local: &Pod, terms: &Admission) -> Option<String> {
    let spec = within_terms(remote_pod_spec(local.spec.as_ref()?), terms);
    let why = terms.refusals(&local.metadata, &spec);
    (!why.is_empty()).then(|| format!("the provider would refuse it: {}", why.join("; ")))
}

/// What a pod requests, as the scheduler and the provider's quota count
/// it: the larger of its containers' sum (with sidecars) and its largest
/// init container (with the sidecars started before it), plus its
/// overhead; or its pod-level requests where it states them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Requests {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

pub fn requests(spec: &PodSpec) -> Requests {
    use liqo_api::sharing::{parse_bytes, parse_cpu_millis};
    let of = |list: Option<&BTreeMap<String, Quantity>>| Requests {
        cpu_millis: list
            .and_then(|l| l.get("cpu"))
            .and_then(|q| parse_cpu_millis(&q.0))
            .unwrap_or(0),
        memory_bytes: list
            .and_then(|l| l.get("memory"))
            .and_then(|q| parse_bytes(&q.0))
            .unwrap_or(0),
    };
    let add = |a: Requests, b: Requests| Requests {
        cpu_millis: a.cpu_millis.saturating_add(b.cpu_millis),
        memory_bytes: a.memory_bytes.saturating_add(b.memory_bytes),
    };
    let max = |a: Requests, b: Requests| Requests {
        cpu_millis: a.cpu_millis.max(b.cpu_millis),
        memory_bytes: a.memory_bytes.max(b.memory_bytes),
    };
    let container = |c: &k8s_openapi::api::core::v1::Container| {
        of(c.resources.as_ref().and_then(|r| r.requests.as_ref()))
    };
    let overhead = of(spec.overhead.as_ref());
    if let Some(pod_level) = spec.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        return add(of(Some(pod_level)), overhead);
    }
    let mut total = spec
        .containers
        .iter()
        .map(container)
        .fold(Requests::default(), add);
    let mut sidecars = Requests::default();
    let mut init = Requests::default();
    for c in spec.init_containers.iter().flatten() {
        let own = container(c);
        if c.restart_policy.as_deref() == Some("Always") {
            total = add(total, own);
            sidecars = add(sidecars, own);
            init = max(init, sidecars);
        } else {
            init = max(init, add(own, sidecars));
        }
    }
    add(max(total, init), overhead)
}

/// The remote pod spec of `local`, within the provider's terms where it
/// states them.
fn remote_spec_of(local: &Pod, terms: Option<&Admission>) -> Option<PodSpec> {
    let spec = remote_pod_spec(local.spec.as_ref()?);
    Some(match terms {
        Some(terms) => within_terms(spec, terms),
        None => spec,
    })
}

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
/// from any remote pod ([`super::event::local_pod_name`]).
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
pub fn status_digest(status: &PodStatus) -> String {
    // Serialising a struct is deterministic (fields in order, maps
    // sorted): equal projections give equal bytes.
    super::digest(&serde_json::to_vec(&local_status(status, None)).unwrap_or_default())
}

/// Whether a local status of digest `have` (from [`status_digest`])
/// already shows `want`.
pub fn digest_shows(have: Option<&str>, want: &PodStatus) -> bool {
    have == Some(status_digest(want).as_str())
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

/// The status of a refused pod: Failed, as a kubelet's admission refusal.
pub fn refused_status(message: &str) -> PodStatus {
    PodStatus {
        phase: Some("Failed".to_owned()),
        reason: Some(REFUSED_REASON.to_owned()),
        message: Some(message.to_owned()),
        ..PodStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    use k8s_openapi::api::core::v1::{
        Affinity, Container, ContainerStatus, HostPathVolumeSource, NodeAffinity, PodAntiAffinity,
        PodCondition, SecurityContext, Toleration, Volume, VolumeMount,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn container() -> Container {
        Container {
            name: "app".to_owned(),
            image: Some("nginx".to_owned()),
            volume_mounts: Some(vec![
                VolumeMount {
                    name: "kube-api-access-abcde".to_owned(),
                    mount_path: "/var/run/secrets/kubernetes.io/serviceaccount".to_owned(),
                    ..VolumeMount::default()
                },
                VolumeMount {
                    name: "config".to_owned(),
                    mount_path: "/etc/app".to_owned(),
                    ..VolumeMount::default()
                },
            ]),
            ..Container::default()
        }
    }

    fn toleration(key: &str) -> Toleration {
        Toleration {
            key: Some(key.to_owned()),
            operator: Some("Exists".to_owned()),
            ..Toleration::default()
        }
    }

    fn volume(name: &str) -> Volume {
        Volume {
            name: name.to_owned(),
            ..Volume::default()
        }
    }

    fn local_spec() -> PodSpec {
        PodSpec {
            node_name: Some("liqo-prov".to_owned()),
            node_selector: Some(BTreeMap::from([(
                labels::VIRTUAL_NODE.to_owned(),
                "true".to_owned(),
            )])),
            tolerations: Some(vec![
                toleration(names::VIRTUAL_NODE_TAINT),
                toleration("node.kubernetes.io/not-ready"),
            ]),
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity::default()),
                pod_anti_affinity: Some(PodAntiAffinity::default()),
                ..Affinity::default()
            }),
            service_account_name: Some("builder".to_owned()),
            priority: Some(1000),
            priority_class_name: Some("high".to_owned()),
            scheduler_name: Some("default-scheduler".to_owned()),
            containers: vec![container()],
            volumes: Some(vec![volume("kube-api-access-abcde"), volume("config")]),
            ..PodSpec::default()
        }
    }

    #[test]
    fn remote_spec_table() {
        let remote = remote_pod_spec(&local_spec());
        type Check = (&'static str, fn(&PodSpec) -> bool);
        let table: [Check; 11] = [
            ("node name dropped", |s| s.node_name.is_none()),
            ("node selector dropped", |s| s.node_selector.is_none()),
            ("virtual node toleration dropped, others kept", |s| {
                s.tolerations.as_ref().is_some_and(|t| {
                    t.len() == 1 && t[0].key.as_deref() == Some("node.kubernetes.io/not-ready")
                })
            }),
            ("node affinity dropped, pod anti-affinity kept", |s| {
                s.affinity
                    .as_ref()
                    .is_some_and(|a| a.node_affinity.is_none() && a.pod_anti_affinity.is_some())
            }),
            ("service account dropped", |s| {
                s.service_account_name.is_none()
            }),
            ("no token automounted", |s| {
                s.automount_service_account_token == Some(false)
            }),
            ("local token volume dropped, others kept", |s| {
                s.volumes
                    .as_ref()
                    .is_some_and(|v| v.len() == 1 && v[0].name == "config")
            }),
            ("token mount dropped, others kept", |s| {
                s.containers[0]
                    .volume_mounts
                    .as_ref()
                    .is_some_and(|m| m.len() == 1 && m[0].name == "config")
            }),
            ("priority dropped", |s| {
                s.priority.is_none() && s.priority_class_name.is_none()
            }),
            ("scheduler dropped", |s| s.scheduler_name.is_none()),
            ("containers kept", |s| {
                s.containers.len() == 1 && s.containers[0].image.as_deref() == Some("nginx")
            }),
        ];
        for (what, check) in table {
            assert!(check(&remote), "{what}: {remote:?}");
        }
    }

    #[test]
    fn resources_and_env_are_kept() {
        let mut spec = local_spec();
        let json = serde_json::json!({
            "name": "app",
            "image": "nginx",
            "env": [{ "name": "A", "value": "1" }],
            "resources": { "requests": { "cpu": "100m" }, "limits": { "memory": "64Mi" } },
        });
        spec.containers = vec![serde_json::from_value(json).expect("container")];
        let remote = remote_pod_spec(&spec);
        assert_eq!(remote.containers[0].env, spec.containers[0].env);
        // What is stated is kept; a request not stated is zero (the
        // provider's quota refuses containers without one).
        let resources = serde_json::to_value(&remote.containers[0].resources).expect("json");
        assert_eq!(
            resources,
            serde_json::json!({
                "requests": { "cpu": "100m", "memory": "0" },
                "limits": { "memory": "64Mi" },
            })
        );
    }

    #[test]
    fn requests_are_counted_as_the_scheduler_counts_them() {
        let container = |name: &str, cpu: &str, memory: &str, sidecar: bool| {
            let mut c = serde_json::json!({
                "name": name,
                "resources": { "requests": { "cpu": cpu, "memory": memory } },
            });
            if sidecar {
                c["restartPolicy"] = "Always".into();
            }
            c
        };
        // (containers, init containers, overhead, pod-level, expected
        // (millicores, MiB))
        type Case = (
            Vec<serde_json::Value>,
            Vec<serde_json::Value>,
            Option<serde_json::Value>,
            Option<serde_json::Value>,
            (u64, u64),
        );
        let cases: Vec<Case> = vec![
            // Containers add up.
            (
                vec![
                    container("a", "100m", "64Mi", false),
                    container("b", "1", "1Gi", false),
                ],
                vec![],
                None,
                None,
                (1100, 1088),
            ),
            // Nothing stated: nothing.
            (
                vec![serde_json::json!({ "name": "a" })],
                vec![],
                None,
                None,
                (0, 0),
            ),
            // A larger init container decides.
            (
                vec![container("a", "100m", "64Mi", false)],
                vec![container("i", "2", "32Mi", false)],
                None,
                None,
                (2000, 64),
            ),
            // A sidecar runs beside the containers and the init
            // containers after it.
            (
                vec![container("a", "100m", "64Mi", false)],
                vec![
                    container("s", "50m", "16Mi", true),
                    container("i", "200m", "8Mi", false),
                ],
                None,
                None,
                (250, 80),
            ),
            // The overhead is added.
            (
                vec![container("a", "100m", "64Mi", false)],
                vec![],
                Some(serde_json::json!({ "cpu": "10m", "memory": "1Mi" })),
                None,
                (110, 65),
            ),
            // Pod-level requests win.
            (
                vec![container("a", "100m", "64Mi", false)],
                vec![],
                None,
                Some(serde_json::json!({ "requests": { "cpu": "3", "memory": "2Gi" } })),
                (3000, 2048),
            ),
        ];
        for (containers, init, overhead, pod_level, (cpu, mib)) in cases {
            let spec: PodSpec = serde_json::from_value(serde_json::json!({
                "containers": containers,
                "initContainers": init,
                "overhead": overhead,
                "resources": pod_level,
            }))
            .expect("spec");
            assert_eq!(
                requests(&spec),
                Requests {
                    cpu_millis: cpu,
                    memory_bytes: mib << 20
                },
                "{containers:?} {init:?}"
            );
        }
    }

    #[test]
    fn only_the_virtual_node_toleration_goes() {
        let mut spec = local_spec();
        spec.tolerations = Some(vec![toleration(names::VIRTUAL_NODE_TAINT)]);
        spec.affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity::default()),
            ..Affinity::default()
        });
        let remote = remote_pod_spec(&spec);
        assert_eq!(remote.tolerations, None);
        assert_eq!(remote.affinity, None);
    }

    #[test]
    fn remote_pods_keep_within_the_providers_terms() {
        let terms = Admission {
            tolerations: vec!["dedicated".to_owned()],
            node_selector: BTreeMap::from([("pool".to_owned(), "peers".to_owned())]),
            runtime_class_name: Some("gvisor".to_owned()),
            ..Admission::default()
        };
        let mut spec = local_spec();
        spec.tolerations
            .get_or_insert_default()
            .extend([toleration("dedicated"), toleration("gpu")]);
        let remote = within_terms(remote_pod_spec(&spec), &terms);
        assert_eq!(remote.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(remote.node_selector, Some(terms.node_selector.clone()));
        let kept: Vec<_> = remote
            .tolerations
            .iter()
            .flatten()
            .filter_map(|t| t.key.as_deref())
            .collect();
        // The consumer's own taints (gpu) and one the terms do not name
        // are dropped; a not-ready toleration without NoExecute too.
        assert_eq!(kept, ["dedicated"]);
    }

    #[test]
    fn a_pod_the_provider_would_refuse_is_refused_here_with_its_reason() {
        let pod = |spec: PodSpec| Pod {
            spec: Some(spec),
            ..Pod::default()
        };
        let bare = pod(local_spec());
        let why = terms_refusal(&bare, &Admission::default()).expect("refused at restricted");
        assert!(
            why.starts_with(
                "the provider would refuse it: violates PodSecurity \"restricted:latest\""
            ),
            "{why}"
        );
        let baseline = Admission {
            pod_security: liqo_api::pod_security::Level::Baseline,
            ..Admission::default()
        };
        assert_eq!(terms_refusal(&bare, &baseline), None);
        let mut privileged = local_spec();
        privileged.containers[0].security_context = Some(SecurityContext {
            privileged: Some(true),
            ..SecurityContext::default()
        });
        let why = terms_refusal(&pod(privileged), &baseline).expect("refused at baseline");
        assert!(why.contains("privileged"), "{why}");
    }

    #[test]
    fn refusal_table() {
        let host_path = Volume {
            name: "root".to_owned(),
            host_path: Some(HostPathVolumeSource {
                path: "/".to_owned(),
                type_: None,
            }),
            ..Volume::default()
        };
        let table: [(&str, PodSpec, Option<&str>); 5] = [
            ("plain", local_spec(), None),
            (
                "hostNetwork",
                PodSpec {
                    host_network: Some(true),
                    ..local_spec()
                },
                Some("hostNetwork"),
            ),
            (
                "hostPID",
                PodSpec {
                    host_pid: Some(true),
                    ..local_spec()
                },
                Some("hostPID"),
            ),
            (
                "hostIPC",
                PodSpec {
                    host_ipc: Some(true),
                    ..local_spec()
                },
                Some("hostIPC"),
            ),
            (
                "hostPath",
                PodSpec {
                    volumes: Some(vec![volume("config"), host_path]),
                    ..local_spec()
                },
                Some("volume root is a hostPath"),
            ),
        ];
        for (what, spec, want) in table {
            let got = refusal(&spec);
            match want {
                None => assert_eq!(got, None, "{what}"),
                Some(w) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(w)),
                    "{what}: {got:?}"
                ),
            }
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
        assert_eq!(super::super::event::local_pod_name(&name), Some("web-1"));
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

    fn job_pod(restart: Option<&str>, phase: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("batch-x1".to_owned()),
                uid: Some("u-2".to_owned()),
                labels: Some(BTreeMap::from([
                    ("app".to_owned(), "batch".to_owned()),
                    ("job-name".to_owned(), "batch".to_owned()),
                    ("controller-uid".to_owned(), "local-job".to_owned()),
                    (
                        "batch.kubernetes.io/job-name".to_owned(),
                        "batch".to_owned(),
                    ),
                    (
                        "batch.kubernetes.io/controller-uid".to_owned(),
                        "local-job".to_owned(),
                    ),
                ])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                restart_policy: restart.map(str::to_owned),
                ..local_spec()
            }),
            status: phase.map(|p| PodStatus {
                phase: Some(p.to_owned()),
                ..PodStatus::default()
            }),
        }
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
            Some(&status_digest(&local_status(&remote, None))),
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
        assert!(digest_shows(Some(&status_digest(&local)), &want));
        local.phase = Some("Pending".to_owned());
        assert!(!digest_shows(Some(&status_digest(&local)), &want));
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
            assert_eq!(digest_shows(Some(&digest), &want), shows, "{what}");
        }
        assert!(!digest_shows(None, &want));
    }
}
