//! Startup, readiness and liveness probes of host-process containers: what
//! they check, when they are due, and how many results it takes to change
//! their verdict. `httpGet` (HTTP only), `tcpSocket` and `exec` are checked
//! as a kubelet checks them; `grpc` probes and HTTPS `httpGet` always fail,
//! with a message that says they are not supported here.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::env;
use crate::process::{self, BindMount};

/// What a grpc probe says, in the events and the pod's Ready condition.
pub(super) const GRPC_UNSUPPORTED: &str = "grpc probes are not supported on the host-process node";
/// How much of an exec probe's output its failure message quotes.
const OUTPUT_MAX: usize = 1024;

/// What an exec probe runs with: what its container's process got.
#[derive(Debug, Clone, Default)]
pub(super) struct ExecContext {
    pub(super) env: BTreeMap<String, String>,
    pub(super) dir: PathBuf,
    pub(super) mounts: Vec<BindMount>,
}

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
    /// A command that exits 0, run as the container's process runs.
    Exec { command: Vec<String> },
    /// A probe that cannot be checked here (grpc, HTTPS) or points nowhere
    /// (an unknown named port): it always fails, saying why.
    Fail(String),
}

/// What one check found: `Err` says why it failed.
pub(super) type Outcome = Result<(), String>;

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
    /// The last failure told in an event, so that a failure that repeats
    /// is told once; cleared by a success.
    reported: Option<String>,
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

    /// A startup probe: a container has not started until it passes.
    pub(super) fn startup(probe: &Probe, container: &Container, pod_ip: Ipv4Addr) -> Self {
        Self::new(probe, container, pod_ip, false)
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
            reported: None,
        }
    }

    /// Starts over for a container (re)started at `now`.
    pub(super) fn reset(&mut self, now: Instant) {
        self.healthy = self.initially_healthy;
        self.successes = 0;
        self.failures = 0;
        self.next_at = now + self.initial_delay;
        self.reported = None;
    }

    pub(super) fn healthy(&self) -> bool {
        self.healthy
    }

    /// Whether the probe has failed as many times in a row as it may.
    pub(super) fn failed_out(&self) -> bool {
        self.failures >= self.failure_threshold
    }

    pub(super) fn due(&self, now: Instant) -> bool {
        now >= self.next_at
    }

    /// Takes in the result of a check made at `now` and returns the verdict.
    pub(super) fn record(&mut self, now: Instant, passed: bool) -> bool {
        self.next_at = now + self.period;
        if passed {
            self.reported = None;
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

    /// The failure to tell in an event, if it is not the one told last.
    pub(super) fn report(&mut self, outcome: &Outcome) -> Option<String> {
        let Err(message) = outcome else {
            return None;
        };
        if self.reported.as_ref() == Some(message) {
            return None;
        }
        self.reported = Some(message.clone());
        Some(message.clone())
    }

    /// Makes the check once; exec probes run with `exec`.
    pub(super) async fn run(&self, http: &reqwest::Client, exec: &ExecContext) -> Outcome {
        match &self.check {
            Check::Http { url, headers } => {
                let mut request = http.get(url).timeout(self.timeout);
                for (name, value) in headers {
                    request = request.header(name, value);
                }
                match request.send().await {
                    Ok(r) if (200..400).contains(&r.status().as_u16()) => Ok(()),
                    Ok(r) => Err(format!(
                        "HTTP probe failed with statuscode: {}",
                        r.status().as_u16()
                    )),
                    Err(e) => Err(format!("Get {url:?}: {}", super::pod::chain(&e))),
                }
            }
            Check::Tcp { host, port } => {
                let connect = tokio::net::TcpStream::connect((host.as_str(), *port));
                match tokio::time::timeout(self.timeout, connect).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(format!("dial tcp {host}:{port}: {e}")),
                    Err(_) => Err(format!("dial tcp {host}:{port}: i/o timeout")),
                }
            }
            Check::Exec { command } => run_exec(command, exec, self.timeout).await,
            Check::Fail(why) => Err(why.clone()),
        }
    }
}

/// Runs an exec probe's command as the container's process runs (its
/// environment, folder and mounts), for at most `timeout`: it passes if it
/// exits 0.
async fn run_exec(command: &[String], ctx: &ExecContext, timeout: Duration) -> Outcome {
    let Some((program, args)) = command.split_first() else {
        return Err("exec probe without a command".to_owned());
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(&ctx.env)
        .current_dir(&ctx.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    process::die_with_parent(&mut cmd);
    process::with_mounts(&mut cmd, &ctx.mounts)
        .map_err(|e| format!("cannot run exec probe {command:?}: {e}"))?;
    let mut cmd = tokio::process::Command::from(cmd);
    // A command past its timeout is killed when its future is dropped.
    cmd.kill_on_drop(true);
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot run exec probe {command:?}: {e}"))?;
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Err(_) => Err(format!(
            "command {command:?} timed out after {}s",
            timeout.as_secs()
        )),
        Ok(Err(e)) => Err(format!("running exec probe {command:?}: {e}")),
        Ok(Ok(out)) if out.status.success() => Ok(()),
        Ok(Ok(out)) => {
            let mut output = out.stdout;
            output.extend_from_slice(&out.stderr);
            output.truncate(OUTPUT_MAX);
            let output = String::from_utf8_lossy(&output);
            Err(format!(
                "command {command:?} exited with {}: {}",
                out.status,
                output.trim()
            ))
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
    let no_port = |p: &IntOrString| {
        let p = match p {
            IntOrString::Int(n) => n.to_string(),
            IntOrString::String(name) => name.clone(),
        };
        Check::Fail(format!("port {p:?} is not a port of the container"))
    };
    if let Some(get) = &probe.http_get {
        let Some(port) = port(&get.port) else {
            return no_port(&get.port);
        };
        let scheme = get.scheme.as_deref().unwrap_or("HTTP").to_ascii_lowercase();
        if scheme != "http" {
            return Check::Fail(format!(
                "{} httpGet probes are not supported on the host-process node",
                scheme.to_ascii_uppercase()
            ));
        }
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
            None => no_port(&tcp.port),
        }
    } else if let Some(exec) = &probe.exec {
        // As a kubelet: `$(VAR)` refers to the container's plain `value`
        // variables only.
        let vars: BTreeMap<String, String> = (container.env.iter().flatten())
            .filter(|v| v.value_from.is_none())
            .map(|v| (v.name.clone(), v.value.clone().unwrap_or_default()))
            .collect();
        Check::Exec {
            command: (exec.command.iter().flatten())
                .map(|word| env::expand(word, &vars))
                .collect(),
        }
    } else if probe.grpc.is_some() {
        Check::Fail(GRPC_UNSUPPORTED.to_owned())
    } else {
        Check::Fail("the probe has no handler".to_owned())
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
        assert!(matches!(&p.check, Check::Fail(why) if why.contains("\"nope\"")));
        let p = Prober::readiness(&probe(json!({ "grpc": { "port": 9 } })), &container(), IP);
        assert!(matches!(&p.check, Check::Fail(why) if why == GRPC_UNSUPPORTED));
        let p = Prober::readiness(
            &probe(json!({ "httpGet": { "port": 9, "scheme": "HTTPS" } })),
            &container(),
            IP,
        );
        assert!(matches!(&p.check, Check::Fail(why) if why.contains("HTTPS")));
    }

    #[tokio::test]
    async fn exec_probes_run_the_command_with_the_container_env_and_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let http = reqwest::Client::new();
        let ctx = ExecContext {
            env: BTreeMap::from([
                ("PATH".to_owned(), std::env::var("PATH").unwrap_or_default()),
                ("WORD".to_owned(), "swordfish".to_owned()),
            ]),
            dir: dir.path().to_owned(),
            mounts: Vec::new(),
        };
        std::fs::write(dir.path().join("here"), "").expect("write");
        let mut c = container();
        c.env = Some(vec![
            serde_json::from_value(json!({ "name": "X", "value": "here" })).expect("env"),
        ]);
        let exec = |command: serde_json::Value, timeout: i32| {
            Prober::readiness(
                &probe(json!({ "exec": { "command": command }, "timeoutSeconds": timeout })),
                &c,
                IP,
            )
        };
        let run = |p: Prober| {
            let http = http.clone();
            let ctx = ctx.clone();
            async move { p.run(&http, &ctx).await }
        };
        assert_eq!(run(exec(json!(["true"]), 1)).await, Ok(()));
        let failed = run(exec(json!(["false"]), 1))
            .await
            .expect_err("false fails");
        assert!(failed.contains("exit status: 1"), "{failed}");
        // In the container's folder, `$(X)` from its plain env.
        assert_eq!(run(exec(json!(["test", "-e", "$(X)"]), 1)).await, Ok(()));
        assert_eq!(
            run(exec(json!(["sh", "-c", "test \"$WORD\" = swordfish"]), 1)).await,
            Ok(())
        );
        let output = run(exec(json!(["sh", "-c", "echo oops; exit 3"]), 1)).await;
        assert!(
            output.as_ref().is_err_and(|e| e.contains("oops")),
            "{output:?}"
        );
        let slow = Instant::now();
        let timed_out = run(exec(json!(["sleep", "5"]), 1))
            .await
            .expect_err("timeout");
        assert!(timed_out.contains("timed out after 1s"), "{timed_out}");
        assert!(slow.elapsed() < Duration::from_secs(3));
        let missing = run(exec(json!(["/no/such/probe"]), 1))
            .await
            .expect_err("missing");
        assert!(missing.contains("cannot run"), "{missing}");
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
