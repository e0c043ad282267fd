//! `/stats/summary` and `/metrics/resource` from what the provider says of
//! the remote pods: its `metrics.k8s.io/v1beta1` PodMetrics (usage rates
//! over a window), matched to the local pods through the remote pods'
//! `liqo.io/local-pod-uid` label. Pure: the handler fetches, these
//! translate. What is not known is left out, never reported as zero.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::reflection::pod::LocalPod;
use serde::{Deserialize, Serialize};

/// One PodMetrics as the metrics API serves it (the fields used).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct PodMetrics {
    pub metadata: MetricsMeta,
    #[serde(default)]
    pub timestamp: Option<String>,
    #[serde(default)]
    pub containers: Vec<ContainerMetrics>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct MetricsMeta {
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct ContainerMetrics {
    pub name: String,
    #[serde(default)]
    pub usage: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodMetricsList {
    #[serde(default)]
    pub items: Vec<PodMetrics>,
}

/// A quantity (`250m`, `1.5Gi`, `12345n`, `1e3`) as a number of units.
pub fn quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0_f64.powi(2),
        "Gi" => 1024.0_f64.powi(3),
        "Ti" => 1024.0_f64.powi(4),
        "Pi" => 1024.0_f64.powi(5),
        "Ei" => 1024.0_f64.powi(6),
        _ => return None,
    };
    let n: f64 = number.parse().ok()?;
    (n.is_finite() && n >= 0.0).then_some(n * factor)
}

/// A container's usage: CPU in nanocores and working set in bytes, each
/// when the provider gave it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub nano_cores: Option<u64>,
    pub working_set_bytes: Option<u64>,
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // Checked non-negative, rounded.
fn usage(c: &ContainerMetrics) -> Usage {
    Usage {
        nano_cores: c
            .usage
            .get("cpu")
            .and_then(|q| quantity(q))
            .map(|v| (v * 1e9).round() as u64),
        working_set_bytes: c
            .usage
            .get("memory")
            .and_then(|q| quantity(q))
            .map(|v| v.round() as u64),
    }
}

fn sum(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (x, None) | (None, x) => x,
    }
}

/// The figures of one local pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodFigures {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub start_time: Option<String>,
    /// When the provider measured them.
    pub timestamp: Option<String>,
    /// Per container, in the order the provider gave them.
    pub containers: Vec<(String, Usage)>,
}

impl PodFigures {
    pub fn total(&self) -> Usage {
        self.containers
            .iter()
            .fold(Usage::default(), |t, (_, u)| Usage {
                nano_cores: sum(t.nano_cores, u.nano_cores),
                working_set_bytes: sum(t.working_set_bytes, u.working_set_bytes),
            })
    }
}

/// The figures of the local pods that have a measured remote pod.
/// `remote_to_local` maps a remote pod's `namespace/name` to its local
/// pod's UID; `metrics` are `(twin namespace, PodMetrics)`.
pub fn figures(
    local: &[LocalPod],
    remote_to_local: &BTreeMap<(String, String), String>,
    metrics: &[(String, PodMetrics)],
) -> Vec<PodFigures> {
    let by_uid: BTreeMap<&str, &LocalPod> = local
        .iter()
        .filter_map(|p| Some((p.metadata.uid.as_deref()?, p)))
        .collect();
    let mut out: Vec<PodFigures> = metrics
        .iter()
        .filter_map(|(twin, m)| {
            let uid = remote_to_local.get(&(twin.clone(), m.metadata.name.clone()))?;
            let pod = by_uid.get(uid.as_str())?;
            Some(PodFigures {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                uid: uid.clone(),
                start_time: pod.start_time.as_ref().map(|t| t.0.to_string()),
                timestamp: m.timestamp.clone(),
                containers: m
                    .containers
                    .iter()
                    .map(|c| (c.name.clone(), usage(c)))
                    .collect(),
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodRef,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    pub containers: Vec<ContainerStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct PodRef {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: String,
    pub usage_nano_cores: u64,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: String,
    pub working_set_bytes: u64,
}

fn stats(u: Usage, time: &str) -> (Option<CpuStats>, Option<MemoryStats>) {
    (
        u.nano_cores.map(|n| CpuStats {
            time: time.to_owned(),
            usage_nano_cores: n,
        }),
        u.working_set_bytes.map(|b| MemoryStats {
            time: time.to_owned(),
            working_set_bytes: b,
        }),
    )
}

/// The summary: a pod entry per measured pod, and the node's figures as
/// their sum when the provider serves metrics at all (`measured`).
pub fn summary(
    node_name: &str,
    start_time: Option<&str>,
    now: &str,
    measured: bool,
    pods: &[PodFigures],
) -> Summary {
    let mut node_total = Usage::default();
    let pods = pods
        .iter()
        .map(|p| {
            let time = p.timestamp.as_deref().unwrap_or(now);
            let total = p.total();
            node_total.nano_cores = sum(node_total.nano_cores, total.nano_cores);
            node_total.working_set_bytes =
                sum(node_total.working_set_bytes, total.working_set_bytes);
            let (cpu, memory) = stats(total, time);
            PodStats {
                pod_ref: PodRef {
                    name: p.name.clone(),
                    namespace: p.namespace.clone(),
                    uid: p.uid.clone(),
                },
                start_time: p.start_time.clone(),
                containers: p
                    .containers
                    .iter()
                    .map(|(name, u)| {
                        let (cpu, memory) = stats(*u, time);
                        ContainerStats {
                            name: name.clone(),
                            cpu,
                            memory,
                        }
                    })
                    .collect(),
                cpu,
                memory,
            }
        })
        .collect();
    if measured {
        // An idle provider with no pod uses nothing of the grant.
        node_total.nano_cores.get_or_insert(0);
        node_total.working_set_bytes.get_or_insert(0);
    }
    let (cpu, memory) = stats(node_total, now);
    Summary {
        node: NodeStats {
            node_name: node_name.to_owned(),
            start_time: start_time.map(str::to_owned),
            cpu,
            memory,
        },
        pods,
    }
}

/// `/metrics/resource` in the Prometheus text format: memory working sets
/// (gauges) of the node, pods and containers, and `scrape_error` (1 when
/// the provider serves no metrics). CPU is left out: the metric names
/// metrics-server reads are cumulative counters, and the provider's
/// metrics API only gives rates; a counter made up from rates would lie.
pub fn resource_metrics(measured: bool, pods: &[PodFigures], now_ms: i64) -> String {
    let mut out = String::new();
    let mut node_memory = 0u64;
    let mut container_lines = String::new();
    let mut pod_lines = String::new();
    for p in pods {
        let labels = format!(
            "namespace=\"{}\",pod=\"{}\"",
            escape(&p.namespace),
            escape(&p.name)
        );
        for (name, u) in &p.containers {
            if let Some(b) = u.working_set_bytes {
                let _ = writeln!(
                    container_lines,
                    "container_memory_working_set_bytes{{container=\"{}\",{labels}}} {b} {now_ms}",
                    escape(name)
                );
            }
        }
        if let Some(b) = p.total().working_set_bytes {
            node_memory = node_memory.saturating_add(b);
            let _ = writeln!(
                pod_lines,
                "pod_memory_working_set_bytes{{{labels}}} {b} {now_ms}"
            );
        }
    }
    out.push_str("# HELP container_memory_working_set_bytes [STABLE] Current working set of the container in bytes\n# TYPE container_memory_working_set_bytes gauge\n");
    out.push_str(&container_lines);
    if measured {
        out.push_str("# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes\n# TYPE node_memory_working_set_bytes gauge\n");
        let _ = writeln!(out, "node_memory_working_set_bytes {node_memory} {now_ms}");
    }
    out.push_str("# HELP pod_memory_working_set_bytes [STABLE] Current working set of the pod in bytes\n# TYPE pod_memory_working_set_bytes gauge\n");
    out.push_str(&pod_lines);
    out.push_str("# HELP scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE scrape_error gauge\n");
    let _ = writeln!(out, "scrape_error {}", u8::from(!measured));
    out
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities() {
        for (q, want) in [
            ("250m", Some(0.25)),
            ("1", Some(1.0)),
            ("12345n", Some(12345e-9)),
            ("1Ki", Some(1024.0)),
            ("1.5Gi", Some(1.5 * 1024.0 * 1024.0 * 1024.0)),
            ("2M", Some(2e6)),
            ("1e3", Some(1000.0)),
            ("5u", Some(5e-6)),
            ("", None),
            ("x", None),
            ("1Zi", None),
            ("-1", None),
        ] {
            let got = quantity(q);
            let close = match (got, want) {
                (Some(g), Some(w)) => (g - w).abs() <= w.abs() * 1e-12,
                (g, w) => g == w,
            };
            assert!(close, "{q}: {got:?} != {want:?}");
        }
    }

    fn local(ns: &str, name: &str, uid: &str) -> LocalPod {
        serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": ns, "uid": uid },
            "status": { "startTime": "2026-01-01T00:00:00Z" },
        }))
        .expect("pod")
    }

    fn metrics(name: &str, containers: serde_json::Value) -> PodMetrics {
        serde_json::from_value(json!({
            "metadata": { "name": name },
            "timestamp": "2026-01-01T00:01:00Z",
            "containers": containers,
        }))
        .expect("metrics")
    }

    #[test]
    fn figures_follow_the_remote_pods_to_the_local_ones() {
        let locals = [local("shop", "web-1", "u1"), local("shop", "web-2", "u2")];
        let map = BTreeMap::from([
            (
                ("shop-c".to_owned(), "web-1-abc".to_owned()),
                "u1".to_owned(),
            ),
            (
                ("shop-c".to_owned(), "gone-xyz".to_owned()),
                "u9".to_owned(),
            ),
        ]);
        let ms = [
            (
                "shop-c".to_owned(),
                metrics(
                    "web-1-abc",
                    json!([
                        { "name": "web", "usage": { "cpu": "10m", "memory": "1Mi" } },
                        { "name": "side", "usage": { "cpu": "5m" } },
                    ]),
                ),
            ),
            // A remote pod whose local pod is gone, one not ours.
            ("shop-c".to_owned(), metrics("gone-xyz", json!([]))),
            ("shop-c".to_owned(), metrics("other", json!([]))),
        ];
        let got = figures(&locals, &map, &ms);
        assert_eq!(got.len(), 1);
        let p = &got[0];
        assert_eq!(
            (p.namespace.as_str(), p.name.as_str(), p.uid.as_str()),
            ("shop", "web-1", "u1")
        );
        assert_eq!(
            p.containers,
            [
                (
                    "web".to_owned(),
                    Usage {
                        nano_cores: Some(10_000_000),
                        working_set_bytes: Some(1_048_576)
                    }
                ),
                (
                    "side".to_owned(),
                    Usage {
                        nano_cores: Some(5_000_000),
                        working_set_bytes: None
                    }
                ),
            ]
        );
        assert_eq!(
            p.total(),
            Usage {
                nano_cores: Some(15_000_000),
                working_set_bytes: Some(1_048_576)
            }
        );
    }

    #[test]
    fn the_summary_omits_what_is_not_known() {
        let pods = figures(
            &[local("shop", "web-1", "u1")],
            &BTreeMap::from([(("t".to_owned(), "r".to_owned()), "u1".to_owned())]),
            &[(
                "t".to_owned(),
                metrics(
                    "r",
                    json!([{ "name": "web", "usage": { "cpu": "1m", "memory": "2Ki" } }]),
                ),
            )],
        );
        let now = "2026-01-01T00:02:00Z";
        let with = serde_json::to_value(summary("vn", Some("s"), now, true, &pods)).expect("json");
        assert_eq!(with["node"]["nodeName"], "vn");
        assert_eq!(with["node"]["cpu"]["usageNanoCores"], 1_000_000);
        assert_eq!(with["node"]["memory"]["workingSetBytes"], 2048);
        assert_eq!(with["pods"][0]["podRef"]["uid"], "u1");
        assert_eq!(
            with["pods"][0]["containers"][0]["cpu"]["time"],
            "2026-01-01T00:01:00Z"
        );
        assert_eq!(with["pods"][0]["memory"]["workingSetBytes"], 2048);
        // Measured but empty: the node uses nothing.
        let idle = serde_json::to_value(summary("vn", None, now, true, &[])).expect("json");
        assert_eq!(idle["node"]["cpu"]["usageNanoCores"], 0);
        // Not measured: no figure at all, rather than zeros.
        let none = serde_json::to_value(summary("vn", None, now, false, &[])).expect("json");
        assert!(none["node"].get("cpu").is_none(), "{none}");
        assert!(none["node"].get("memory").is_none(), "{none}");
        assert_eq!(none["pods"], json!([]));
    }

    #[test]
    fn resource_metrics_in_prometheus_text() {
        let pods = vec![PodFigures {
            namespace: "shop".into(),
            name: "web-1".into(),
            uid: "u1".into(),
            start_time: None,
            timestamp: None,
            containers: vec![(
                "web".into(),
                Usage {
                    nano_cores: Some(1),
                    working_set_bytes: Some(100),
                },
            )],
        }];
        let text = resource_metrics(true, &pods, 7);
        for line in [
            "container_memory_working_set_bytes{container=\"web\",namespace=\"shop\",pod=\"web-1\"} 100 7",
            "pod_memory_working_set_bytes{namespace=\"shop\",pod=\"web-1\"} 100 7",
            "node_memory_working_set_bytes 100 7",
            "scrape_error 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        let unmeasured = resource_metrics(false, &[], 7);
        assert!(
            unmeasured.lines().any(|l| l == "scrape_error 1"),
            "{unmeasured}"
        );
        assert!(
            !unmeasured.contains("node_memory_working_set_bytes "),
            "{unmeasured}"
        );
    }
}
