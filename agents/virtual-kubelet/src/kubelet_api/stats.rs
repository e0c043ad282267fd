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
mod tests;
