//! The provider's free allocatable capacity: what its ready, non-virtual
//! nodes can allocate, less what the pods bound to them request. Shares in
//! a sharing policy are shares of this.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use liqo_api::names::labels;
use liqo_api::sharing::{Amounts, parse_bytes, parse_cpu_millis};

use crate::factory::ClusterClient;

pub async fn free(cluster: &ClusterClient) -> anyhow::Result<Amounts> {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let nodes = nodes
        .list(&ListParams::default().labels(&format!("!{}", labels::VIRTUAL_NODE)))
        .await
        .map_err(|e| cluster.explain(e, "listing nodes"))?;
    let pods: Api<Pod> = Api::all(cluster.client.clone());
    let pods = pods
        .list(&ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed"))
        .await
        .map_err(|e| cluster.explain(e, "listing pods"))?;
    Ok(free_of(&nodes.items, &pods.items))
}

fn ready(node: &Node) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    !unschedulable
        && conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Pure: the free capacity of `nodes` given the `pods` bound to them.
pub fn free_of(nodes: &[Node], pods: &[Pod]) -> Amounts {
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
    for pod in pods {
        let on_ready_node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| ready_nodes.contains(&n));
        if !on_ready_node {
            continue;
        }
        total.pods = total.pods.saturating_sub(1);
        let containers = pod.spec.iter().flat_map(|s| &s.containers);
        for c in containers {
            let req = c.resources.as_ref().and_then(|r| r.requests.as_ref());
            let get = |k: &str| req.and_then(|r| r.get(k)).map(|q| q.0.as_str());
            total.cpu_millis = total
                .cpu_millis
                .saturating_sub(get("cpu").and_then(parse_cpu_millis).unwrap_or(0));
            total.memory_bytes = total
                .memory_bytes
                .saturating_sub(get("memory").and_then(parse_bytes).unwrap_or(0));
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert_eq!(free_of(&[node], &[]).pods, 1000);
    }
}
