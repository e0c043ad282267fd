//! A provider's free allocatable capacity: what its ready, schedulable,
//! non-virtual nodes can allocate, less what the pods bound to them
//! request. Shares in a sharing policy are shares of this; `liqoctl peer`
//! reads it once and the provider's gateway follows it
//! ([`crate::following`]). Pure: the caller lists the nodes and pods.

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, Pod};

use crate::names::labels;
use crate::pod_security::{self, Level};
use crate::sharing::{Amounts, parse_bytes, parse_cpu_millis};

/// Whether a node counts: Ready and schedulable.
pub fn ready(node: &Node) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    !unschedulable
        && conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The free capacity of `nodes` given the `pods` bound to them (pods that
/// ended are the caller's to leave out).
pub fn free_of<'a>(nodes: &[Node], pods: impl IntoIterator<Item = &'a Pod>) -> Amounts {
    let mut total = Amounts::default();
    let ready_nodes: Vec<&str> = nodes
        .iter()
        .filter(|n| ready(n))
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    for node in nodes.iter().filter(|n| ready(n)) {
        let alloc = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let get = |k: &str| alloc.and_then(|a| a.get(k)).map(|q| q.0.as_str());
        total.cpu_millis += get("cpu").and_then(parse_cpu_millis).unwrap_or(0);
        total.memory_bytes += get("memory").and_then(parse_bytes).unwrap_or(0);
        // A quantity: the API server writes 1000 pods as "1k".
        total.pods += get("pods").and_then(parse_bytes).unwrap_or(0);
        total.storage_bytes += get("ephemeral-storage").and_then(parse_bytes).unwrap_or(0);
    }
    let bound: Vec<&Pod> = pods
        .into_iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| ready_nodes.contains(&n))
        })
        .collect();
    let used = used_by(bound.iter().copied());
    let disk: u64 = bound.iter().map(|p| disk_of(p)).sum();
    total.cpu_millis = total.cpu_millis.saturating_sub(used.cpu_millis);
    total.memory_bytes = total.memory_bytes.saturating_sub(used.memory_bytes);
    total.pods = total.pods.saturating_sub(used.pods);
    // The nodes' free local disk: what node-local provisioners put volumes
    // on, and what a policy's storage share is a share of.
    total.storage_bytes = total.storage_bytes.saturating_sub(disk);
    // A claim is mounted by a pod: as many as there are free pod slots.
    total.claims = total.pods;
    total
}

/// Whether a peer's pods may land on `node` under `terms`: it carries the
/// labels the terms make them select, and every taint that keeps pods
/// off it (`NoSchedule`, `NoExecute`) is one the terms let them tolerate.
pub fn open_to(node: &Node, terms: &crate::admission::Admission) -> bool {
    let labels = node.metadata.labels.as_ref();
    let selected = terms
        .node_selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v));
    let tolerated = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| terms.tolerations.contains(&t.key));
    selected && tolerated
}

/// The provider's largest free node, resource by resource: the most CPU
/// and the most memory free on any one ready node (allocatable less what
/// the pods bound there request), and the most free pod slots. A pod that
/// asks more than this fits no node (one within it may still fit none,
/// when no node has both). The caller gives the nodes a peer's pods may
/// land on ([`open_to`]).
pub fn largest_free<'a>(nodes: impl IntoIterator<Item = &'a Node>, pods: &[&Pod]) -> Amounts {
    // What the pods of each node request, in one pass over the pods.
    let mut bound: std::collections::HashMap<&str, Vec<&Pod>> = std::collections::HashMap::new();
    for pod in pods {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            bound.entry(node).or_default().push(pod);
        }
    }
    let mut largest = Amounts::default();
    for node in nodes.into_iter().filter(|n| ready(n)) {
        let on_it = node
            .metadata
            .name
            .as_deref()
            .and_then(|n| bound.get(n))
            .map_or(&[][..], Vec::as_slice);
        let free = free_of(std::slice::from_ref(node), on_it.iter().copied());
        largest.cpu_millis = largest.cpu_millis.max(free.cpu_millis);
        largest.memory_bytes = largest.memory_bytes.max(free.memory_bytes);
        largest.pods = largest.pods.max(free.pods);
    }
    largest
}

/// Why `pod` fits no node of a provider whose largest free node is
/// `largest` (`provider` names it), if it does not.
pub fn unplaceable(pod: &Pod, largest: Amounts, provider: &str) -> Option<String> {
    unplaceable_asking(requests_of(pod), largest, provider)
}

/// [`unplaceable`], for a pod that requests `asked`.
pub fn unplaceable_asking(asked: Amounts, largest: Amounts, provider: &str) -> Option<String> {
    let over = |asked: u64, free: u64| asked > free;
    if !over(asked.cpu_millis, largest.cpu_millis)
        && !over(asked.memory_bytes, largest.memory_bytes)
    {
        return None;
    }
    let shown = |a: Amounts| {
        let r = a.to_resources();
        let q = |q: Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
            q.map_or("0".to_owned(), |q| q.0)
        };
        (q(r.cpu), q(r.memory))
    };
    let (cpu, memory) = shown(asked);
    let (free_cpu, free_memory) = shown(largest);
    Some(format!(
        "no node of cluster {provider} has room for it: it requests cpu {cpu} and memory {memory}, \
         and the most free on one node is cpu {free_cpu} and memory {free_memory}"
    ))
}

/// The labels by which a virtual node says how much one pod may ask of
/// its provider: its largest free node's CPU and memory, or while the
/// provider has not said it, the grant's (no pod can ask more of the
/// node anyway). With neither, none: the requirements of [`room`] then
/// keep every pod off the node until they are known.
pub fn room_labels(largest: Option<Amounts>, grant: Option<Amounts>) -> Vec<(String, String)> {
    let Some(bound) = largest.or(grant) else {
        return Vec::new();
    };
    vec![
        (
            labels::LARGEST_FREE_CPU.to_owned(),
            bound.cpu_millis.to_string(),
        ),
        (
            labels::LARGEST_FREE_MEMORY.to_owned(),
            bound.memory_bytes.to_string(),
        ),
    ]
}

/// The requirement of a virtual node that does not say its largest free
/// node (an agent of a version before the labels): the placement policy
/// lets pods onto it as before, beside the nodes that have room
/// ([`room`]).
pub fn room_unsaid() -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: labels::LARGEST_FREE_CPU.to_owned(),
        operator: "DoesNotExist".to_owned(),
        values: None,
    }
}

/// The node affinity requirements that keep `pod` off every virtual node
/// whose provider has no node with room for it (by the labels of
/// [`room_labels`]): at least its CPU and its memory free on one node;
/// and off every virtual node whose provider's Pod Security level it does
/// not meet (`labels::POD_SECURITY`, one of [`levels_met`]). Nodes
/// without those labels (the cluster's own) never satisfy them.
pub fn room(pod: &Pod) -> Vec<NodeSelectorRequirement> {
    let asked = requests_of(pod);
    let mut out: Vec<NodeSelectorRequirement> = [
        (labels::LARGEST_FREE_CPU, asked.cpu_millis),
        (labels::LARGEST_FREE_MEMORY, asked.memory_bytes),
    ]
    .into_iter()
    .map(|(key, asked)| match asked {
        // Any value (label values cannot be negative).
        0 => NodeSelectorRequirement {
            key: key.to_owned(),
            operator: "Exists".to_owned(),
            values: None,
        },
        // At least `asked`: more than one less.
        _ => NodeSelectorRequirement {
            key: key.to_owned(),
            operator: "Gt".to_owned(),
            values: Some(vec![(asked - 1).to_string()]),
        },
    })
    .collect();
    out.push(NodeSelectorRequirement {
        key: labels::POD_SECURITY.to_owned(),
        operator: "In".to_owned(),
        values: Some(
            levels_met(pod)
                .into_iter()
                .map(|l| l.as_str().to_owned())
                .collect(),
        ),
    });
    out
}

/// The Pod Security levels `pod` meets, from the most permissive.
pub fn levels_met(pod: &Pod) -> Vec<Level> {
    let meta = &pod.metadata;
    let Some(spec) = pod.spec.as_ref() else {
        return Level::ALL.to_vec();
    };
    Level::ALL
        .into_iter()
        .filter(|l| pod_security::check(*l, meta, spec).is_empty())
        .collect()
}

/// The free capacity as one tenant sees it, its own pods (`mine`)
/// counted free so that they do not shrink its share, and what those pods
/// request.
pub fn for_tenant(
    nodes: &[Node],
    pods: &[&Pod],
    mine: impl Fn(&Pod) -> bool,
) -> (Amounts, Amounts) {
    let free = free_of(nodes, pods.iter().copied().filter(|p| !mine(p)));
    let used = used_by(pods.iter().copied().filter(|p| mine(p)));
    (free, used)
}

/// What `pods` request together, as a ResourceQuota counts it: each
/// pod's containers' requests, or its init containers' largest where that
/// is more, and one pod each.
pub fn used_by<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Amounts {
    let mut total = Amounts::default();
    for pod in pods {
        let one = requests_of(pod);
        total.cpu_millis += one.cpu_millis;
        total.memory_bytes += one.memory_bytes;
        total.pods += 1;
    }
    total
}

/// One pod's effective requests (no pod count).
pub fn requests_of(pod: &Pod) -> Amounts {
    let Some(spec) = pod.spec.as_ref() else {
        return Amounts::default();
    };
    let of = |c: &k8s_openapi::api::core::v1::Container| {
        let req = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        let get = |k: &str| req.and_then(|r| r.get(k)).map(|q| q.0.as_str());
        (
            get("cpu").and_then(parse_cpu_millis).unwrap_or(0),
            get("memory").and_then(parse_bytes).unwrap_or(0),
        )
    };
    let (mut cpu, mut memory) = (0, 0);
    for c in &spec.containers {
        let (c, m) = of(c);
        cpu += c;
        memory += m;
    }
    for c in spec.init_containers.iter().flatten() {
        let (c, m) = of(c);
        cpu = cpu.max(c);
        memory = memory.max(m);
    }
    Amounts {
        cpu_millis: cpu,
        memory_bytes: memory,
        ..Amounts::default()
    }
}

/// The local disk (`ephemeral-storage`) a pod's containers request of its
/// node, which node-local volumes share.
fn disk_of(pod: &Pod) -> u64 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    spec.containers
        .iter()
        .filter_map(|c| {
            c.resources
                .as_ref()?
                .requests
                .as_ref()?
                .get("ephemeral-storage")
        })
        .filter_map(|q| parse_bytes(&q.0))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, Pod};
    use serde_json::json;

    #[test]
    fn free_is_ready_allocatable_less_bound_requests() {
        let node = |name: &str, ready: &str| -> Node {
            serde_json::from_value(json!({
                "metadata": { "name": name },
                "status": {
                    "allocatable": { "cpu": "4", "memory": "8Gi", "pods": "110" },
                    "conditions": [{ "type": "Ready", "status": ready }],
                },
            }))
            .expect("node")
        };
        let pod = |node: &str, cpu: &str| -> Pod {
            serde_json::from_value(json!({
                "spec": { "nodeName": node, "containers": [
                    { "name": "c", "resources": { "requests": { "cpu": cpu, "memory": "1Gi" } } },
                ]},
            }))
            .expect("pod")
        };
        let nodes = [node("a", "True"), node("b", "True"), node("down", "False")];
        let pods = [pod("a", "500m"), pod("b", "1"), pod("down", "2")];
        assert_eq!(
            free_of(&nodes, &pods),
            Amounts {
                cpu_millis: 6500,
                memory_bytes: 14 << 30,
                pods: 218,
                // No ephemeral storage allocatable; a claim per free pod.
                storage_bytes: 0,
                claims: 218,
            }
        );
    }

    #[test]
    fn pod_counts_are_quantities() {
        // Regression: a node of 1000 pods ("1k" as the API server writes
        // it) counted as none, and the grant was the host node's half.
        let node: Node = serde_json::from_value(json!({
            "metadata": { "name": "big" },
            "status": {
                "allocatable": { "cpu": "64", "memory": "256Gi", "pods": "1k" },
                "conditions": [{ "type": "Ready", "status": "True" }],
            },
        }))
        .expect("node");
        assert_eq!(free_of(&[node], []).pods, 1000);
    }

    #[test]
    fn a_tenants_own_pods_count_free_for_it_and_init_containers_as_a_quota_does() {
        let node: Node = serde_json::from_value(json!({
            "metadata": { "name": "a" },
            "status": {
                "allocatable": { "cpu": "4", "memory": "8Gi", "pods": "10" },
                "conditions": [{ "type": "Ready", "status": "True" }],
            },
        }))
        .expect("node");
        let pod = |ns: &str, cpu: &str, init_cpu: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": { "namespace": ns },
                "spec": {
                    "nodeName": "a",
                    "containers": [{ "name": "c", "resources": { "requests": { "cpu": cpu } } }],
                    "initContainers": [{ "name": "i", "resources": { "requests": { "cpu": init_cpu } } }],
                },
            }))
            .expect("pod")
        };
        let (theirs, own) = (pod("shop", "1", "0"), pod("tenant", "500m", "2"));
        let (free, used) = for_tenant(&[node], &[&theirs, &own], |p| {
            p.metadata.namespace.as_deref() == Some("tenant")
        });
        assert_eq!((free.cpu_millis, free.pods), (3000, 9));
        assert_eq!(
            used,
            Amounts {
                cpu_millis: 2000,
                memory_bytes: 0,
                pods: 1,
                ..Amounts::default()
            }
        );
    }

    #[test]
    fn the_largest_free_node_bounds_what_one_pod_may_ask() {
        let node = |name: &str, cpu: &str| -> Node {
            serde_json::from_value(json!({
                "metadata": { "name": name },
                "status": {
                    "allocatable": { "cpu": cpu, "memory": "8Gi", "pods": "110" },
                    "conditions": [{ "type": "Ready", "status": "True" }],
                },
            }))
            .expect("node")
        };
        let pod = |node: Option<&str>, cpu: &str| -> Pod {
            serde_json::from_value(json!({
                "spec": { "nodeName": node, "containers": [
                    { "name": "c", "resources": { "requests": { "cpu": cpu, "memory": "1Gi" } } },
                ]},
            }))
            .expect("pod")
        };
        let nodes = [node("small", "2"), node("big", "4")];
        let on_big = pod(Some("big"), "3");
        let largest = largest_free(&nodes, &[&on_big]);
        let mut tainted = node("tainted", "64");
        tainted.spec = Some(
            serde_json::from_value(json!({
                "taints": [{ "key": "dedicated", "effect": "NoSchedule" }],
            }))
            .expect("spec"),
        );
        let terms = crate::admission::Admission::default();
        assert!(!open_to(&tainted, &terms) && open_to(&nodes[0], &terms));
        // 2 free on small, 1 on big: 2 CPUs, and 8Gi on small.
        assert_eq!((largest.cpu_millis, largest.memory_bytes), (2000, 8 << 30));
        assert_eq!(unplaceable(&pod(None, "2"), largest, "p"), None);
        let why = unplaceable(&pod(None, "2500m"), largest, "p").expect("refused");
        assert!(why.contains("cpu 2500m") && why.contains("cpu 2 "), "{why}");
    }

    #[test]
    fn a_virtual_node_is_labelled_with_the_room_a_pod_needs() {
        let pod = |cpu: Option<&str>| -> Pod {
            let requests = cpu.map_or(json!({}), |c| json!({ "cpu": c, "memory": "1Gi" }));
            serde_json::from_value(json!({
                "spec": { "containers": [{ "name": "c", "resources": { "requests": requests } }] },
            }))
            .expect("pod")
        };
        let gt = |key: &str, value: &str| NodeSelectorRequirement {
            key: key.to_owned(),
            operator: "Gt".to_owned(),
            values: Some(vec![value.to_owned()]),
        };
        // A bare container meets baseline, not restricted.
        let meets = |levels: &[&str]| NodeSelectorRequirement {
            key: labels::POD_SECURITY.to_owned(),
            operator: "In".to_owned(),
            values: Some(levels.iter().map(|l| (*l).to_owned()).collect()),
        };
        assert_eq!(
            room(&pod(Some("2500m"))),
            [
                gt(labels::LARGEST_FREE_CPU, "2499"),
                gt(labels::LARGEST_FREE_MEMORY, "1073741823"),
                meets(&["privileged", "baseline"]),
            ]
        );
        // Asking nothing fits a full node, as the scheduler has it.
        let exists = |key: &str| NodeSelectorRequirement {
            key: key.to_owned(),
            operator: "Exists".to_owned(),
            values: None,
        };
        assert_eq!(
            room(&pod(None)),
            [
                exists(labels::LARGEST_FREE_CPU),
                exists(labels::LARGEST_FREE_MEMORY),
                meets(&["privileged", "baseline"]),
            ]
        );
        let on_the_host: Pod = serde_json::from_value(json!({
            "spec": { "hostNetwork": true, "containers": [{ "name": "c" }] },
        }))
        .expect("pod");
        assert_eq!(levels_met(&on_the_host), [Level::Privileged]);
        let amounts = |cpu_millis, memory_bytes| Amounts {
            cpu_millis,
            memory_bytes,
            ..Amounts::default()
        };
        let labelled = |largest, grant| room_labels(largest, grant);
        assert_eq!(
            labelled(Some(amounts(2000, 8)), Some(amounts(9000, 9))),
            [
                (labels::LARGEST_FREE_CPU.to_owned(), "2000".to_owned()),
                (labels::LARGEST_FREE_MEMORY.to_owned(), "8".to_owned()),
            ]
        );
        assert_eq!(
            labelled(None, Some(amounts(9000, 9)))[0].1,
            "9000",
            "the grant while the largest free node is not known"
        );
        assert!(labelled(None, None).is_empty());
    }
}
