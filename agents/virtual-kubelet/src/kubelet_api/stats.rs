//! `/stats/summary` and `/metrics/resource` from what the provider says of
//! the remote pods: its `metrics.k8s.io/v1beta1` PodMetrics (usage rates
//! over a window), matched to the local pods through the remote pods'
//! `liqo.io/local-pod-uid` label. Pure: the handler fetches, these
//! translate. What is not known is left out, never reported as zero.
//!
//! A kubelet's CPU figures for metrics-server are cumulative counters
//! (CPU-seconds since the container started), which the provider's
//! metrics API does not give: [`CpuCounters`] makes them by adding up the
//! provider's rates over the times between its samples, so that the rate
//! a reader derives from two readings is the one the provider measured.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;

use crate::reflection::pod::LocalPod;
use serde::{Deserialize, Serialize};

/// One PodMetrics as the metrics API serves it (the fields used).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct PodMetrics {
    pub metadata: MetricsMeta,
    #[serde(default)]
    pub timestamp: Option<String>,
    /// How long the rates were measured over, ending at `timestamp`, as a
    /// Go duration (`15.004s`, `1m0s`).
    #[serde(default)]
    pub window: Option<String>,
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

/// A Go duration (`15.004s`, `1m0.5s`, `250ms`) in milliseconds.
pub fn go_duration_ms(d: &str) -> Option<i64> {
    let mut rest = d.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0_f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(digits);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let ms = match unit {
            "h" => 3_600_000.0,
            "m" => 60_000.0,
            "s" => 1_000.0,
            "ms" => 1.0,
            "us" | "\u{b5}s" => 1e-3,
            "ns" => 1e-6,
            _ => return None,
        };
        total += number.parse::<f64>().ok()? * ms;
        rest = tail;
    }
    #[allow(clippy::cast_possible_truncation)] // Rounded; durations are small.
    Some(total.round() as i64)
}

/// A container's usage: CPU in nanocores and working set in bytes, each
/// when the provider gave it; and the CPU-seconds counted for it so far
/// ([`CpuCounters`]), once counted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub nano_cores: Option<u64>,
    pub working_set_bytes: Option<u64>,
    pub cpu_seconds: Option<f64>,
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
        cpu_seconds: None,
    }
}

fn sum(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (x, None) | (None, x) => x,
    }
}

fn sum_f(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
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
    /// How long it measured the rates over, in milliseconds.
    pub window_ms: Option<i64>,
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
                cpu_seconds: sum_f(t.cpu_seconds, u.cpu_seconds),
            })
    }

    /// `timestamp` in milliseconds since the epoch.
    pub fn timestamp_ms(&self) -> Option<i64> {
        let t: k8s_openapi::jiff::Timestamp = self.timestamp.as_deref()?.parse().ok()?;
        Some(t.as_millisecond())
    }
}

/// One container's counter: CPU-seconds counted up to the provider's
/// sample of `at_ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Counter {
    at_ms: i64,
    seconds: f64,
}

/// Cumulative CPU counters of the local pods' containers, made from the
/// provider's rates: a container's first sample counts its rate over the
/// sample's window; each later sample (a later timestamp) adds its rate
/// times the time since the sample before. The rate a reader derives from
/// two readings (metrics-server: the difference over the time between
/// their timestamps) is then the rate the provider measured.
///
/// Held in memory: the counters start again from the first sample seen
/// when the agent restarts, as a process's counters do. A reader sees a
/// decrease once (metrics-server skips that reading) and rates again from
/// the next reading on. The node's counter is the sum of every
/// container's, those of pods gone included, so that it never goes back
/// while the agent runs.
#[derive(Debug, Default)]
pub struct CpuCounters {
    /// By local pod UID and container name.
    containers: HashMap<(String, String), Counter>,
    /// CPU-seconds of the containers forgotten since the agent started.
    retired: f64,
}

impl CpuCounters {
    /// Counts the samples of `pods` and writes each container's counter
    /// into its [`Usage::cpu_seconds`] (left `None` for a container whose
    /// provider gave no CPU rate or no timestamp). Containers of pods that
    /// `alive` no longer knows are forgotten, their CPU kept in the
    /// node's total.
    pub fn count(&mut self, pods: &mut [PodFigures], alive: impl Fn(&str) -> bool) {
        for pod in pods.iter_mut() {
            let Some(at_ms) = pod.timestamp_ms() else {
                continue;
            };
            let window_ms = pod.window_ms.unwrap_or(0).max(0);
            for (name, usage) in &mut pod.containers {
                let Some(nano_cores) = usage.nano_cores else {
                    continue;
                };
                #[allow(clippy::cast_precision_loss)] // Rates fit an f64.
                let cores = nano_cores as f64 * 1e-9;
                let key = (pod.uid.clone(), name.clone());
                let counter = self
                    .containers
                    .entry(key)
                    .and_modify(|c| {
                        if at_ms > c.at_ms {
                            #[allow(clippy::cast_precision_loss)]
                            let elapsed = (at_ms - c.at_ms) as f64 / 1e3;
                            c.seconds += cores * elapsed;
                            c.at_ms = at_ms;
                        }
                    })
                    .or_insert_with(|| Counter {
                        at_ms,
                        #[allow(clippy::cast_precision_loss)]
                        seconds: cores * window_ms as f64 / 1e3,
                    });
                usage.cpu_seconds = Some(counter.seconds);
            }
        }
        let retired = &mut self.retired;
        self.containers.retain(|(uid, _), c| {
            let keep = alive(uid);
            if !keep {
                *retired += c.seconds;
            }
            keep
        });
    }

    /// The node's counter: every container's CPU-seconds so far.
    pub fn node_seconds(&self) -> f64 {
        self.retired + self.containers.values().map(|c| c.seconds).sum::<f64>()
    }
}

/// The figures of the local pods that have a measured remote pod.
/// `remote_to_local` maps a remote pod's `namespace/name` to its local
/// pod's UID; `metrics` are `(twin namespace, PodMetrics)`.
pub fn figures(
    local: &[Arc<LocalPod>],
    remote_to_local: &BTreeMap<(String, String), String>,
    metrics: &[(String, PodMetrics)],
) -> Vec<PodFigures> {
    let by_uid: BTreeMap<String, &LocalPod> = local
        .iter()
        .filter_map(|p| Some((p.uid()?, p.as_ref())))
        .collect();
    let mut out: Vec<PodFigures> = metrics
        .iter()
        .filter_map(|(twin, m)| {
            let uid = remote_to_local.get(&(twin.clone(), m.metadata.name.clone()))?;
            let pod = by_uid.get(uid.as_str())?;
            Some(PodFigures {
                namespace: pod.namespace.to_string(),
                name: pod.name.to_string(),
                uid: uid.clone(),
                start_time: pod.start_time.as_ref().map(|t| t.0.to_string()),
                timestamp: m.timestamp.clone(),
                window_ms: m.window.as_deref().and_then(go_duration_ms),
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: String,
    pub working_set_bytes: u64,
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // Non-negative, rounded.
fn nano_seconds(seconds: f64) -> u64 {
    (seconds * 1e9).round() as u64
}

fn stats(u: Usage, time: &str) -> (Option<CpuStats>, Option<MemoryStats>) {
    (
        u.nano_cores.map(|n| CpuStats {
            time: time.to_owned(),
            usage_nano_cores: n,
            usage_core_nano_seconds: u.cpu_seconds.map(nano_seconds),
        }),
        u.working_set_bytes.map(|b| MemoryStats {
            time: time.to_owned(),
            working_set_bytes: b,
        }),
    )
}

/// The summary: a pod entry per measured pod, and the node's figures as
/// their sum when the provider serves metrics at all (`measured`);
/// `node_cpu_seconds` is the node's CPU counter ([`CpuCounters`]).
pub fn summary(
    node_name: &str,
    start_time: Option<&str>,
    now: &str,
    measured: bool,
    node_cpu_seconds: f64,
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
        node_total.cpu_seconds = Some(node_cpu_seconds);
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

/// `/metrics/resource` in the Prometheus text format, as a kubelet
/// serves it to metrics-server: CPU counters (`*_cpu_usage_seconds_total`,
/// at the provider's sample time) and memory working sets (gauges) of the
/// containers, pods and node, and `scrape_error` (1 when the provider
/// serves no metrics). A container without a CPU counter yet (its first
/// sample not counted) has its memory only.
pub fn resource_metrics(
    measured: bool,
    node_cpu_seconds: f64,
    pods: &[PodFigures],
    now_ms: i64,
) -> String {
    let mut node_memory = 0u64;
    let mut container_cpu = String::new();
    let mut container_memory = String::new();
    let mut pod_cpu = String::new();
    let mut pod_memory = String::new();
    for p in pods {
        let labels = format!(
            "namespace=\"{}\",pod=\"{}\"",
            escape(&p.namespace),
            escape(&p.name)
        );
        // The CPU counter is as of the provider's sample; memory too.
        let at_ms = p.timestamp_ms().unwrap_or(now_ms);
        for (name, u) in &p.containers {
            let labels = format!("container=\"{}\",{labels}", escape(name));
            if let Some(s) = u.cpu_seconds {
                let _ = writeln!(
                    container_cpu,
                    "container_cpu_usage_seconds_total{{{labels}}} {s:.9} {at_ms}"
                );
            }
            if let Some(b) = u.working_set_bytes {
                let _ = writeln!(
                    container_memory,
                    "container_memory_working_set_bytes{{{labels}}} {b} {at_ms}"
                );
            }
        }
        let total = p.total();
        if let Some(s) = total.cpu_seconds {
            let _ = writeln!(
                pod_cpu,
                "pod_cpu_usage_seconds_total{{{labels}}} {s:.9} {at_ms}"
            );
        }
        if let Some(b) = total.working_set_bytes {
            node_memory = node_memory.saturating_add(b);
            let _ = writeln!(
                pod_memory,
                "pod_memory_working_set_bytes{{{labels}}} {b} {at_ms}"
            );
        }
    }
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, lines: &str| {
        let _ = writeln!(out, "# HELP {name} [STABLE] {help}\n# TYPE {name} {kind}");
        out.push_str(lines);
    };
    family(
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
        &container_cpu,
    );
    family(
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
        &container_memory,
    );
    if measured {
        family(
            "node_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed by the node in core-seconds",
            &format!("node_cpu_usage_seconds_total {node_cpu_seconds:.9} {now_ms}\n"),
        );
        family(
            "node_memory_working_set_bytes",
            "gauge",
            "Current working set of the node in bytes",
            &format!("node_memory_working_set_bytes {node_memory} {now_ms}\n"),
        );
    }
    family(
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
        &pod_cpu,
    );
    family(
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
        &pod_memory,
    );
    family(
        "scrape_error",
        "gauge",
        "1 if there was an error while getting container metrics, 0 otherwise",
        &format!("scrape_error {}\n", u8::from(!measured)),
    );
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

    fn local(ns: &str, name: &str, uid: &str) -> Arc<LocalPod> {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": ns, "uid": uid },
            "status": { "startTime": "2026-01-01T00:00:00Z" },
        }))
        .expect("pod");
        Arc::new(LocalPod::from(pod))
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
                        working_set_bytes: Some(1_048_576),
                        cpu_seconds: None,
                    }
                ),
                (
                    "side".to_owned(),
                    Usage {
                        nano_cores: Some(5_000_000),
                        working_set_bytes: None,
                        cpu_seconds: None,
                    }
                ),
            ]
        );
        assert_eq!(
            p.total(),
            Usage {
                nano_cores: Some(15_000_000),
                working_set_bytes: Some(1_048_576),
                cpu_seconds: None,
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
        let with =
            serde_json::to_value(summary("vn", Some("s"), now, true, 0.5, &pods)).expect("json");
        assert_eq!(with["node"]["nodeName"], "vn");
        assert_eq!(with["node"]["cpu"]["usageNanoCores"], 1_000_000);
        assert_eq!(with["node"]["memory"]["workingSetBytes"], 2048);
        assert_eq!(with["pods"][0]["podRef"]["uid"], "u1");
        assert_eq!(
            with["pods"][0]["containers"][0]["cpu"]["time"],
            "2026-01-01T00:01:00Z"
        );
        assert_eq!(with["pods"][0]["memory"]["workingSetBytes"], 2048);
        assert_eq!(with["node"]["cpu"]["usageCoreNanoSeconds"], 500_000_000);
        // Not counted yet: no counter rather than zero.
        assert!(
            with["pods"][0]["cpu"].get("usageCoreNanoSeconds").is_none(),
            "{with}"
        );
        // Measured but empty: the node uses nothing.
        let idle = serde_json::to_value(summary("vn", None, now, true, 0.0, &[])).expect("json");
        assert_eq!(idle["node"]["cpu"]["usageNanoCores"], 0);
        // Not measured: no figure at all, rather than zeros.
        let none = serde_json::to_value(summary("vn", None, now, false, 0.0, &[])).expect("json");
        assert!(none["node"].get("cpu").is_none(), "{none}");
        assert!(none["node"].get("memory").is_none(), "{none}");
        assert_eq!(none["pods"], json!([]));
    }

    fn figure(uid: &str, timestamp: &str, window: Option<i64>, millicores: u64) -> PodFigures {
        PodFigures {
            namespace: "shop".into(),
            name: format!("web-{uid}"),
            uid: uid.into(),
            start_time: None,
            timestamp: Some(timestamp.into()),
            window_ms: window,
            containers: vec![(
                "web".into(),
                Usage {
                    nano_cores: Some(millicores * 1_000_000),
                    working_set_bytes: Some(100),
                    cpu_seconds: None,
                },
            )],
        }
    }

    fn seconds(pods: &[PodFigures]) -> Vec<Option<f64>> {
        pods.iter().map(|p| p.containers[0].1.cpu_seconds).collect()
    }

    #[test]
    fn go_durations() {
        for (d, want) in [
            ("15s", Some(15_000)),
            ("15.004s", Some(15_004)),
            ("1m0.5s", Some(60_500)),
            ("1h0m0s", Some(3_600_000)),
            ("250ms", Some(250)),
            ("1500us", Some(2)),
            ("0s", Some(0)),
            ("", None),
            ("15", None),
            ("1d", None),
        ] {
            assert_eq!(go_duration_ms(d), want, "{d}");
        }
    }

    #[test]
    fn counters_add_up_the_providers_rates_between_its_samples() {
        let mut counters = CpuCounters::default();
        let all = |_: &str| true;
        // First sample: 200m over a 10 s window, 2 CPU-seconds.
        let mut pods = [figure("u1", "2026-01-01T00:00:10Z", Some(10_000), 200)];
        counters.count(&mut pods, all);
        assert_eq!(seconds(&pods), [Some(2.0)]);
        // The same sample read again: nothing more.
        counters.count(&mut pods, all);
        assert_eq!(seconds(&pods), [Some(2.0)]);
        // 15 s later at 1 core: 15 more. A reader's rate between the two
        // readings, (17 − 2) / 15 s, is the provider's.
        let mut pods = [figure("u1", "2026-01-01T00:00:25Z", Some(15_000), 1_000)];
        counters.count(&mut pods, all);
        assert_eq!(seconds(&pods), [Some(17.0)]);
        // An older sample (another provider replica lagging) counts nothing.
        let mut pods = [figure("u1", "2026-01-01T00:00:20Z", Some(15_000), 4_000)];
        counters.count(&mut pods, all);
        assert_eq!(seconds(&pods), [Some(17.0)]);
        // A second pod, without a window: it starts from zero.
        let mut pods = [
            figure("u1", "2026-01-01T00:00:25Z", Some(15_000), 1_000),
            figure("u2", "2026-01-01T00:00:25Z", None, 500),
        ];
        counters.count(&mut pods, all);
        assert_eq!(seconds(&pods), [Some(17.0), Some(0.0)]);
        assert!((counters.node_seconds() - 17.0).abs() < 1e-9);
        // u1's pod is gone: forgotten, but the node's counter keeps it.
        let mut pods = [figure("u2", "2026-01-01T00:00:35Z", None, 500)];
        counters.count(&mut pods, |uid| uid == "u2");
        assert_eq!(seconds(&pods), [Some(5.0)]);
        assert!((counters.node_seconds() - 22.0).abs() < 1e-9);
        // A pod without a timestamp, or a container without a rate, has
        // no counter.
        let mut pods = [figure("u3", "not a time", Some(1_000), 1)];
        counters.count(&mut pods, all);
        assert_eq!(seconds(&pods), [None]);
    }

    #[test]
    fn resource_metrics_in_prometheus_text() {
        let mut pods = vec![figure("u1", "2026-01-01T00:00:10Z", Some(10_000), 200)];
        // Memory only until the CPU is counted.
        let text = resource_metrics(true, 0.0, &pods, 7);
        assert!(
            !text.contains("container_cpu_usage_seconds_total{"),
            "{text}"
        );
        CpuCounters::default().count(&mut pods, |_| true);
        let at = "1767225610000";
        let text = resource_metrics(true, 2.5, &pods, 7);
        for line in [
            format!(
                "container_cpu_usage_seconds_total{{container=\"web\",namespace=\"shop\",pod=\"web-u1\"}} 2.000000000 {at}"
            ),
            format!(
                "container_memory_working_set_bytes{{container=\"web\",namespace=\"shop\",pod=\"web-u1\"}} 100 {at}"
            ),
            format!(
                "pod_cpu_usage_seconds_total{{namespace=\"shop\",pod=\"web-u1\"}} 2.000000000 {at}"
            ),
            format!("pod_memory_working_set_bytes{{namespace=\"shop\",pod=\"web-u1\"}} 100 {at}"),
            "node_cpu_usage_seconds_total 2.500000000 7".to_owned(),
            "node_memory_working_set_bytes 100 7".to_owned(),
            "# TYPE container_cpu_usage_seconds_total counter".to_owned(),
            "scrape_error 0".to_owned(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        let unmeasured = resource_metrics(false, 0.0, &[], 7);
        assert!(
            unmeasured.lines().any(|l| l == "scrape_error 1"),
            "{unmeasured}"
        );
        assert!(!unmeasured.contains("node_"), "{unmeasured}");
    }
}
