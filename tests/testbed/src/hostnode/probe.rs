//! Startup, readiness and liveness probes of host-process containers: what
//! they check, when they are due, and how many results it takes to change
//! their verdict. `httpGet` (HTTP only), `tcpSocket` and `exec` are checked
//! as a kubelet checks them; `grpc` probes and HTTPS `httpGet` always fail,
//! with a message that says they are not supported here. In the
//! pod-network mode, the node's connections (`httpGet`, `tcpSocket`) are
//! made from its network namespace, where the pods' addresses are routed,
//! and exec probes run in their pod's.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

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
    /// The network namespace it ran in, if not the host's.
    pub(super) netns: Option<PathBuf>,
}

/// Where the node makes the connections of its `httpGet` and `tcpSocket`
/// probes: in its network namespace, if it has one (a socket stays in the
/// namespace it was made in), else in the host's.
#[derive(Debug, Clone, Default)]
pub(crate) struct Dialer {
    pub(crate) netns: Option<PathBuf>,
}

impl Dialer {
    async fn connect(&self, host: &str, port: u16) -> std::io::Result<TcpStream> {
        let addr = tokio::net::lookup_host((host, port))
            .await?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{host} has no address")))?;
        let new = |addr: &SocketAddr| match addr {
            SocketAddr::V4(_) => TcpSocket::new_v4(),
            SocketAddr::V6(_) => TcpSocket::new_v6(),
        };
        let socket = match &self.netns {
            Some(path) => {
                let ns = std::fs::File::open(path)?;
                crate::podnet::in_netns(&ns, || new(&addr))?
            }
            None => new(&addr)?,
        };
        socket.connect(addr).await
    }
}

/// What a probe checks.
#[derive(Debug, Clone)]
enum Check {
    /// A GET answered with a status in 200..400.
    Http {
        /// For messages.
        url: String,
        host: String,
        port: u16,
        path: String,
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

    /// Makes the check once: connections through `dialer`, exec probes
    /// with `exec`.
    pub(super) async fn run(&self, dialer: &Dialer, exec: &ExecContext) -> Outcome {
        match &self.check {
            Check::Http {
                url,
                host,
                port,
                path,
                headers,
            } => {
                let get = http_get(dialer, host, *port, path, headers);
                match tokio::time::timeout(self.timeout, get).await {
                    Ok(Ok(status)) if (200..400).contains(&status) => Ok(()),
                    Ok(Ok(status)) => Err(format!("HTTP probe failed with statuscode: {status}")),
                    Ok(Err(e)) => Err(format!("Get {url:?}: {e}")),
                    Err(_) => Err(format!(
                        "Get {url:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
                    )),
                }
            }
            Check::Tcp { host, port } => {
                let connect = dialer.connect(host, *port);
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

/// A GET of `path` as a kubelet's probe makes it (its `User-Agent`,
/// `Accept`, the probe's headers, which may override them), with no
/// redirect followed; the status it was answered with.
pub(crate) async fn http_get(
    dialer: &Dialer,
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
) -> std::io::Result<u16> {
    let mut stream = dialer.connect(host, port).await?;
    let given = |name: &str| headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    let mut request = format!("GET {path} HTTP/1.1\r\n");
    for (name, default) in [
        ("Host", format!("{host}:{port}")),
        ("User-Agent", "kube-probe/1.34".to_owned()),
        ("Accept", "*/*".to_owned()),
    ] {
        if !given(name) {
            request.push_str(&format!("{name}: {default}\r\n"));
        }
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    // The status line is all a probe looks at.
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    while !head.contains(&b'\n') && head.len() < 4096 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    status_code(&head).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed HTTP response")
    })
}

/// The status code of an HTTP/1 response's first line.
fn status_code(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_whitespace();
    words.next().filter(|v| v.starts_with("HTTP/1."))?;
    words.next()?.parse().ok()
}

/// Runs an exec probe's command as the container's process runs (its
/// environment, folder, mounts and network namespace), for at most
/// `timeout`: it passes if it exits 0.
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
        .and_then(|()| process::with_netns(&mut cmd, ctx.netns.as_deref()))
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
        let path = format!("{slash}{path}");
        let host = host(get.host.as_ref());
        Check::Http {
            url: format!("{scheme}://{host}:{port}{path}"),
            host,
            port,
            path,
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
        let http = Dialer::default();
        let ctx = ExecContext {
            env: BTreeMap::from([
                ("PATH".to_owned(), std::env::var("PATH").unwrap_or_default()),
                ("WORD".to_owned(), "swordfish".to_owned()),
            ]),
            dir: dir.path().to_owned(),
            mounts: Vec::new(),
            netns: None,
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
    fn status_codes_come_from_the_status_line() {
        assert_eq!(status_code(b"HTTP/1.1 204 No Content\r\n"), Some(204));
        assert_eq!(status_code(b"HTTP/1.0 302 Found\r\nLocation: /"), Some(302));
        assert_eq!(status_code(b"SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(status_code(b""), None);
    }

    #[tokio::test]
    async fn http_probes_send_the_kubelet_headers_and_read_the_status() {
        use tokio::io::{AsyncBufReadExt as _, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            let mut stream = BufReader::new(stream);
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                stream.read_line(&mut line).await.expect("read");
                if line == "\r\n" || line.is_empty() {
                    break;
                }
                head.push(line.trim_end().to_owned());
            }
            stream
                .get_mut()
                .write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
                .await
                .expect("write");
            head
        });
        let headers = [("X-Probe".to_owned(), "yes".to_owned())];
        let status = http_get(&Dialer::default(), "127.0.0.1", port, "/healthz", &headers)
            .await
            .expect("get");
        assert_eq!(status, 503);
        let head = server.await.expect("server");
        assert_eq!(head[0], "GET /healthz HTTP/1.1");
        for line in [
            format!("Host: 127.0.0.1:{port}"),
            "User-Agent: kube-probe/1.34".to_owned(),
            "X-Probe: yes".to_owned(),
            "Connection: close".to_owned(),
        ] {
            assert!(head.contains(&line), "{line} not in {head:?}");
        }
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
