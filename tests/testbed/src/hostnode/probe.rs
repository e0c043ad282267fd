//! Readiness and liveness probes of host-process containers: what they
//! check, when they are due, and how many results it takes to change their
//! verdict. `httpGet` and `tcpSocket` are checked; `exec` and `grpc` are not
//! supported and always pass.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// What a probe checks.
#[derive(Debug, Clone)]
enum Check {
    /// A GET answered with a status in 200..400.
    Http {
        url: String,
        headers: Vec<(String, String)>,
    },
    /// A TCP connection accepted.
    Tcp { host: String, port: u16 },
    /// A probe that cannot be checked here; it always passes.
    Unsupported,
    /// A probe that points nowhere (an unknown named port); it always fails.
    Invalid,
}

/// A probe of one container and its running verdict.
#[derive(Debug)]
pub(super) struct Prober {
    check: Check,
    initial_delay: Duration,
    period: Duration,
    timeout: Duration,
    success_threshold: u32,
    failure_threshold: u32,
    /// What a fresh container is taken to be until the thresholds say
    /// otherwise: not ready, but alive.
    initially_healthy: bool,
    healthy: bool,
    successes: u32,
    failures: u32,
    next_at: Instant,
}

impl Prober {
    /// A readiness probe: a container is not ready until it passes.
    pub(super) fn readiness(probe: &Probe, container: &Container, pod_ip: Ipv4Addr) -> Self {
        Self::new(probe, container, pod_ip, false)
    }

    /// A liveness probe: a container is alive until it fails.
    pub(super) fn liveness(probe: &Probe, container: &Container, pod_ip: Ipv4Addr) -> Self {
        Self::new(probe, container, pod_ip, true)
    }

    fn new(probe: &Probe, container: &Container, pod_ip: Ipv4Addr, healthy: bool) -> Self {
        let seconds = |v: Option<i32>, default: u64| {
            Duration::from_secs(v.and_then(|v| u64::try_from(v).ok()).unwrap_or(default))
        };
        let count = |v: Option<i32>, default: u32| {
            v.and_then(|v| u32::try_from(v).ok())
                .filter(|v| *v > 0)
                .unwrap_or(default)
        };
        Self {
            check: check(probe, container, pod_ip),
            initial_delay: seconds(probe.initial_delay_seconds, 0),
            period: seconds(probe.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: seconds(probe.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: count(probe.success_threshold, 1),
            failure_threshold: count(probe.failure_threshold, 3),
            initially_healthy: healthy,
            healthy,
            successes: 0,
            failures: 0,
            next_at: Instant::now(),
        }
    }

    /// Starts over for a container (re)started at `now`.
    pub(super) fn reset(&mut self, now: Instant) {
        self.healthy = self.initially_healthy;
        self.successes = 0;
        self.failures = 0;
        self.next_at = now + self.initial_delay;
    }

    pub(super) fn healthy(&self) -> bool {
        self.healthy
    }

    pub(super) fn due(&self, now: Instant) -> bool {
        now >= self.next_at
    }

    /// Takes in the result of a check made at `now` and returns the verdict.
    pub(super) fn record(&mut self, now: Instant, passed: bool) -> bool {
        self.next_at = now + self.period;
        if passed {
            self.failures = 0;
            self.successes += 1;
            if self.successes >= self.success_threshold {
                self.healthy = true;
            }
        } else {
            self.successes = 0;
            self.failures += 1;
            if self.failures >= self.failure_threshold {
                self.healthy = false;
            }
        }
        self.healthy
    }

    /// Makes the check once.
    pub(super) async fn run(&self, http: &reqwest::Client) -> bool {
        match &self.check {
            Check::Http { url, headers } => {
                let mut request = http.get(url).timeout(self.timeout);
                for (name, value) in headers {
                    request = request.header(name, value);
                }
                request
                    .send()
                    .await
                    .is_ok_and(|r| (200..400).contains(&r.status().as_u16()))
            }
            Check::Tcp { host, port } => tokio::time::timeout(
                self.timeout,
                tokio::net::TcpStream::connect((host.as_str(), *port)),
            )
            .await
            .is_ok_and(|r| r.is_ok()),
            Check::Unsupported => true,
            Check::Invalid => false,
        }
    }
}

fn check(probe: &Probe, container: &Container, pod_ip: Ipv4Addr) -> Check {
    let port = |port: &IntOrString| -> Option<u16> {
        match port {
            IntOrString::Int(n) => u16::try_from(*n).ok(),
            IntOrString::String(name) => container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .and_then(|p| u16::try_from(p.container_port).ok()),
        }
    };
    let host = |host: Option<&String>| {
        host.filter(|h| !h.is_empty())
            .cloned()
            .unwrap_or_else(|| pod_ip.to_string())
    };
    if let Some(get) = &probe.http_get {
        let Some(port) = port(&get.port) else {
            return Check::Invalid;
        };
        let scheme = get.scheme.as_deref().unwrap_or("HTTP").to_ascii_lowercase();
        let path = get.path.as_deref().unwrap_or("/");
        let slash = if path.starts_with('/') { "" } else { "/" };
        Check::Http {
            url: format!("{scheme}://{}:{port}{slash}{path}", host(get.host.as_ref())),
            headers: get
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
        }
    } else if let Some(tcp) = &probe.tcp_socket {
        match port(&tcp.port) {
            Some(port) => Check::Tcp {
                host: host(tcp.host.as_ref()),
                port,
            },
            None => Check::Invalid,
        }
    } else {
        Check::Unsupported
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn container() -> Container {
        serde_json::from_value(json!({
            "name": "c",
            "ports": [{ "name": "http", "containerPort": 8080 }],
        }))
        .expect("container")
    }

    fn probe(value: serde_json::Value) -> Probe {
        serde_json::from_value(value).expect("probe")
    }

    const IP: Ipv4Addr = Ipv4Addr::new(127, 1, 2, 3);

    #[test]
    fn http_probes_resolve_named_ports_and_default_to_the_pod_ip() {
        let p = Prober::readiness(
            &probe(json!({ "httpGet": { "port": "http", "path": "healthz" } })),
            &container(),
            IP,
        );
        let Check::Http { url, .. } = &p.check else {
            panic!("{:?}", p.check)
        };
        assert_eq!(url, "http://127.1.2.3:8080/healthz");

        let p = Prober::readiness(
            &probe(json!({ "httpGet": { "port": 9, "host": "127.0.0.1" } })),
            &container(),
            IP,
        );
        let Check::Http { url, .. } = &p.check else {
            panic!("{:?}", p.check)
        };
        assert_eq!(url, "http://127.0.0.1:9/");

        let p = Prober::readiness(
            &probe(json!({ "httpGet": { "port": "nope" } })),
            &container(),
            IP,
        );
        assert!(matches!(p.check, Check::Invalid));
        let p = Prober::readiness(
            &probe(json!({ "exec": { "command": ["true"] } })),
            &container(),
            IP,
        );
        assert!(matches!(p.check, Check::Unsupported));
    }

    #[test]
    fn thresholds_flip_the_verdict() {
        let now = Instant::now();
        let mut ready = Prober::readiness(
            &probe(
                json!({ "tcpSocket": { "port": 1 }, "successThreshold": 2, "failureThreshold": 2, "initialDelaySeconds": 5, "periodSeconds": 3 }),
            ),
            &container(),
            IP,
        );
        ready.reset(now);
        assert!(!ready.healthy(), "not ready before the first check");
        assert!(!ready.due(now), "the initial delay holds the first check");
        assert!(ready.due(now + Duration::from_secs(5)));
        assert!(!ready.record(now, true), "one success of two");
        assert!(!ready.due(now + Duration::from_secs(2)), "period");
        assert!(ready.record(now, true), "two successes");
        assert!(ready.record(now, false), "one failure of two");
        assert!(!ready.record(now, false), "two failures");
        ready.reset(now);
        assert!(!ready.healthy());

        let mut alive = Prober::liveness(
            &probe(json!({ "tcpSocket": { "port": 1 } })),
            &container(),
            IP,
        );
        alive.reset(now);
        assert!(alive.healthy(), "alive until proven dead");
        assert!(alive.record(now, false));
        assert!(alive.record(now, false));
        assert!(!alive.record(now, false), "the default threshold is 3");
    }
}
