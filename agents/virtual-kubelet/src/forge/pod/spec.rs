//! A local pod's spec translated for the provider: what is dropped or
//! changed ([`remote_pod_spec`]), what the provider's terms allow
//! (`Admission::within_terms`), what cannot be offloaded at all ([`refusal`],
//! [`terms_refusal`]), and what the pod requests ([`requests`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use liqo_api::admission::Admission;
use liqo_api::names;
use liqo_api::sharing::Resources;

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
/// (`kube-api-access-*`): dropped here, [`crate::forge::token::mount`] puts the
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
    // of the pod's own account comes from `crate::forge::token::mount`.
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

/// Why the provider would refuse the remote twin of `local` under
/// `terms` and `grant`, as said on the local pod; `None` when it would
/// admit it.
pub fn terms_refusal(local: &Pod, terms: &Admission, grant: &Resources) -> Option<String> {
    let spec = terms.within_terms(remote_pod_spec(local.spec.as_ref()?));
    let why = terms.refusals(grant, &local.metadata, &spec);
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
pub(super) fn remote_spec_of(local: &Pod, terms: Option<&Admission>) -> Option<PodSpec> {
    let spec = remote_pod_spec(local.spec.as_ref()?);
    Some(match terms {
        Some(terms) => terms.within_terms(spec),
        None => spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge::pod::fixtures::*;
    use liqo_api::tether;

    use k8s_openapi::api::core::v1::{
        Affinity, HostPathVolumeSource, NodeAffinity, SecurityContext, Volume,
    };

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
        let remote = terms.within_terms(remote_pod_spec(&spec));
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
    fn pods_sent_to_a_tethered_provider_tolerate_its_taint() {
        let terms = Admission {
            tolerations: vec![names::TETHERED_TAINT.to_owned()],
            ..Admission::default()
        };
        let remote = terms.within_terms(remote_pod_spec(&local_spec()));
        assert_eq!(remote.tolerations, Some(vec![tether::toleration()]));
        let again = terms.within_terms(remote.clone());
        assert_eq!(again.tolerations, remote.tolerations, "added once");
        let untethered = Admission::default().within_terms(remote_pod_spec(&local_spec()));
        assert_eq!(untethered.tolerations, None);
    }

    #[test]
    fn a_pod_the_provider_would_refuse_is_refused_here_with_its_reason() {
        let pod = |spec: PodSpec| Pod {
            spec: Some(spec),
            ..Pod::default()
        };
        let bare = pod(local_spec());
        let grant = Resources::default();
        let restricted = Admission {
            pod_security: liqo_api::pod_security::Level::Restricted,
            ..Admission::default()
        };
        let why = terms_refusal(&bare, &restricted, &grant).expect("refused at restricted");
        assert!(
            why.starts_with(
                "the provider would refuse it: violates PodSecurity \"restricted:latest\""
            ),
            "{why}"
        );
        // The default terms (baseline) admit it: its disk limit is stated
        // for it.
        let baseline = Admission::default();
        assert_eq!(terms_refusal(&bare, &baseline, &grant), None);
        let mut privileged = local_spec();
        privileged.containers[0].security_context = Some(SecurityContext {
            privileged: Some(true),
            ..SecurityContext::default()
        });
        let why = terms_refusal(&pod(privileged), &baseline, &grant).expect("refused at baseline");
        assert!(why.contains("privileged"), "{why}");
        // A limit above the whole grant.
        let mut greedy = local_spec();
        greedy.containers[0].resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "cpu".to_owned(),
                Quantity("1000".to_owned()),
            )])),
            ..Default::default()
        });
        let small = Resources {
            cpu: Some(Quantity("4".to_owned())),
            ..Resources::default()
        };
        let why = terms_refusal(&pod(greedy), &baseline, &small).expect("refused");
        assert!(why.contains("cpu limit above the whole grant"), "{why}");
    }

    #[test]
    fn containers_get_the_terms_disk_limit_where_they_state_none() {
        let mut spec = local_spec();
        spec.containers[0].resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "ephemeral-storage".to_owned(),
                Quantity("1Gi".to_owned()),
            )])),
            ..Default::default()
        });
        spec.containers.push(local_spec().containers[0].clone());
        spec.containers[1].name = "second".to_owned();
        let remote = Admission::default().within_terms(remote_pod_spec(&spec));
        let limit = |i: usize| {
            remote.containers[i]
                .resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get("ephemeral-storage"))
                .map(|q| q.0.clone())
        };
        assert_eq!(limit(0).as_deref(), Some("1Gi"), "its own kept");
        assert_eq!(limit(1).as_deref(), Some("4Gi"), "the terms' where none");
        let request = remote.containers[1]
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|l| l.get("ephemeral-storage"))
            .map(|q| q.0.clone());
        assert_eq!(request.as_deref(), Some("0"));
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
}
