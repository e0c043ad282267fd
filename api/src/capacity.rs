//! A provider's free allocatable capacity: what its ready, schedulable,
//! non-virtual nodes can allocate, less what the pods bound to them
//! request. Shares in a sharing policy are shares of this; `liqoctl peer`
//! reads it once and the provider's gateway follows it
//! ([`crate::following`]). Pure: the caller lists the nodes and pods.

use k8s_openapi::api::core::v1::{Node, Pod};

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
    }
    let used = used_by(pods.into_iter().filter(|p| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| ready_nodes.contains(&n))
    }));
    total.cpu_millis = total.cpu_millis.saturating_sub(used.cpu_millis);
    total.memory_bytes = total.memory_bytes.saturating_sub(used.memory_bytes);
    total.pods = total.pods.saturating_sub(used.pods);
    total
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
        pods: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, Pod};
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
                pods: 218
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
                pods: 1
            }
        );
    }
}
