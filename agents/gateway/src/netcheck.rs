//! `liqo-gateway netcheck`: the two ends of `liqoctl test network`, run in
//! pods of the gateway's image (it is on every cluster with liqo-rs, so the
//! check needs no image of its own).
//!
//! - `serve` answers every TCP connection on its port with one HTTP
//!   response whose JSON body names the server and the address the
//!   connection came from, so the checker learns both that it got through
//!   and under which address it was seen (a remapped one, across a tunnel
//!   with NAT). `curl` can talk to it too.
//! - `probe` connects to each target in turn, retrying within a deadline
//!   (routes and Service rules may appear a moment after the pods), and
//!   writes a JSON report of what answered and what did not, and why, to
//!   standard output and to the container's termination message file,
//!   where `liqoctl` reads it from the pod's status. It exits 1 when a
//!   target failed.
//!
//! Everything here is blocking and small: one thread per connection on
//! the server, one per target on the prober.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use liqo_api::netcheck::{Answer, Outcome, ProbeReport, Target};

/// At most this many connections are served at once; more wait in the
/// listen queue.
const MAX_CONNECTIONS: usize = 64;
/// How long a connection may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// A connection attempt gives up after this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Between attempts at one target.
const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// The kubelet keeps at most this much of a termination message.
const TERMINATION_MESSAGE_MAX: usize = 4096;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Answer TCP connections with who we are and who they came from.
    Serve(ServeArgs),
    /// Connect to targets and report what answered.
    Probe(ProbeArgs),
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The address to listen on.
    #[arg(long, default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// The name the server answers with (default: $POD_NAME, else the
    /// host name).
    #[arg(long)]
    name: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct ProbeArgs {
    /// A target, NAME=HOST:PORT (repeatable); NAME says what it stands for
    /// in the report.
    #[arg(long = "target", value_name = "NAME=HOST:PORT", required = true)]
    targets: Vec<String>,
    /// How long each target is retried before it counts as failed.
    #[arg(long, default_value_t = 20, value_name = "SECONDS")]
    timeout: u64,
    /// Where the report is written besides standard output: the
    /// container's termination message file.
    #[arg(long, default_value = "/dev/termination-log")]
    report_file: PathBuf,
    /// The name the report gives as its origin (default: $POD_NAME).
    #[arg(long)]
    name: Option<String>,
}

pub fn run(command: Command) -> anyhow::Result<std::process::ExitCode> {
    match command {
        Command::Serve(args) => serve(&args).map(|()| std::process::ExitCode::SUCCESS),
        Command::Probe(args) => probe(&args),
    }
}

fn own_name(flag: Option<&String>) -> String {
    flag.cloned()
        .or_else(|| std::env::var("POD_NAME").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "netcheck".to_owned())
}

fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let name = Arc::new(own_name(args.name.as_ref()));
    let listener =
        TcpListener::bind(args.listen).with_context(|| format!("listening on {}", args.listen))?;
    tracing::info!(listen = %args.listen, name = %name, "netcheck serving");
    let busy = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(stream) => stream,
            // A connection reset before it was accepted is the client's
            // business, not the server's end.
            Err(e) => {
                tracing::debug!(error = %e, "accept");
                continue;
            }
        };
        while busy.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            std::thread::sleep(Duration::from_millis(10));
        }
        busy.fetch_add(1, Ordering::AcqRel);
        let (name, busy) = (Arc::clone(&name), Arc::clone(&busy));
        std::thread::spawn(move || {
            if let Err(e) = answer(stream, &name) {
                tracing::debug!(error = %e, "answering");
            }
            busy.fetch_sub(1, Ordering::AcqRel);
        });
    }
    Ok(())
}

/// Reads the request (whatever it is, up to its blank line) and answers.
fn answer(mut stream: TcpStream, name: &str) -> std::io::Result<()> {
    let peer = stream.peer_addr()?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    let mut request = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => request.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) => return Err(e),
        }
    }
    let body = serde_json::to_string(&Answer {
        server: name.to_owned(),
        seen_from: peer.ip().to_string(),
    })
    .map_err(std::io::Error::other)?;
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

fn probe(args: &ProbeArgs) -> anyhow::Result<std::process::ExitCode> {
    let targets = args
        .targets
        .iter()
        .map(|t| Target::parse(t).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let timeout = Duration::from_secs(args.timeout);
    // All at once: a target that does not answer costs the whole timeout.
    let results = std::thread::scope(|scope| {
        let running: Vec<_> = targets
            .iter()
            .map(|t| scope.spawn(move || check(t, timeout)))
            .collect();
        running
            .into_iter()
            .zip(&targets)
            .map(|(thread, t)| {
                thread.join().unwrap_or_else(|_| Outcome {
                    name: t.name.clone(),
                    address: t.address.clone(),
                    attempts: 0,
                    rtt_ms: None,
                    answer: None,
                    error: Some("the check of this target crashed".into()),
                })
            })
            .collect()
    });
    let report = ProbeReport {
        from: own_name(args.name.as_ref()),
        results,
    };
    let json = serde_json::to_string(&report)?;
    println!("{json}");
    if json.len() > TERMINATION_MESSAGE_MAX {
        tracing::warn!(
            bytes = json.len(),
            "the report is longer than a termination message may be"
        );
    }
    // The file exists only in a container; elsewhere the report is on
    // standard output alone.
    if let Err(e) = std::fs::write(&args.report_file, &json) {
        tracing::debug!(file = %args.report_file.display(), error = %e, "no termination message");
    }
    Ok(if report.passed() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

/// Tries one target until it answers or `timeout` has passed.
fn check(target: &Target, timeout: Duration) -> Outcome {
    let start = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let began = Instant::now();
        let error = match exchange(&target.address) {
            Ok(answer) => {
                return Outcome {
                    name: target.name.clone(),
                    address: target.address.clone(),
                    attempts,
                    rtt_ms: Some(began.elapsed().as_secs_f64() * 1000.0),
                    answer: Some(answer),
                    error: None,
                };
            }
            Err(e) => e,
        };
        if start.elapsed() + RETRY_PAUSE >= timeout {
            return Outcome {
                name: target.name.clone(),
                address: target.address.clone(),
                attempts,
                rtt_ms: None,
                answer: None,
                error: Some(error),
            };
        }
        std::thread::sleep(RETRY_PAUSE);
    }
}

/// One connection: the request, and the server's answer read back.
fn exchange(address: &str) -> Result<Answer, String> {
    let to = address
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {address}: {e}"))?
        .next()
        .ok_or_else(|| format!("{address} resolves to nothing"))?;
    let mut stream =
        TcpStream::connect_timeout(&to, CONNECT_TIMEOUT).map_err(|e| match e.kind() {
            ErrorKind::TimedOut | ErrorKind::WouldBlock => format!(
                "no answer to the connection within {} s",
                CONNECT_TIMEOUT.as_secs()
            ),
            ErrorKind::ConnectionRefused => "connection refused".to_owned(),
            ErrorKind::HostUnreachable => "host unreachable".to_owned(),
            ErrorKind::NetworkUnreachable => "no route to the network".to_owned(),
            _ => format!("connecting: {e}"),
        })?;
    stream
        .set_read_timeout(Some(READ_TIMEOUT))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET / HTTP/1.0\r\nUser-Agent: liqo-netcheck\r\n\r\n")
        .map_err(|e| format!("sending the request: {e}"))?;
    let mut response = Vec::new();
    let read = stream.take(16 * 1024).read_to_end(&mut response);
    // A server that closes with our request unread resets the connection
    // after its answer: what arrived before still counts.
    if let Err(e) = read
        && response.is_empty()
    {
        return Err(format!("connected, but reading the answer: {e}"));
    }
    let text = String::from_utf8_lossy(&response);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body)
        .ok_or_else(|| "connected, but the answer is not HTTP".to_owned())?;
    serde_json::from_str(body)
        .map_err(|_| "connected, but something else than netcheck answered".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_says_who_it_is_and_who_called() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().expect("accept");
            answer(stream, "server-a").expect("answer");
        });
        let outcome = check(
            &Target::parse(&format!("pod=127.0.0.1:{}", address.port())).expect("target"),
            Duration::from_secs(5),
        );
        server.join().expect("server thread");
        assert_eq!(outcome.error, None);
        let answer = outcome.answer.expect("an answer");
        assert_eq!(answer.server, "server-a");
        assert_eq!(answer.seen_from, "127.0.0.1");
        assert_eq!(outcome.attempts, 1);
    }

    #[test]
    fn a_closed_port_is_refused_and_retried_until_the_deadline() {
        // Bound then dropped: nothing listens there now.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let outcome = check(
            &Target::parse(&format!("svc=127.0.0.1:{port}")).expect("target"),
            Duration::from_millis(1200),
        );
        assert_eq!(outcome.error.as_deref(), Some("connection refused"));
        assert!(outcome.attempts >= 2, "{outcome:?}");
        assert!(outcome.answer.is_none());
    }

    #[test]
    fn something_else_than_netcheck_is_told_apart() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().expect("accept");
            let mut request = [0u8; 64];
            let _ = stream.read(&mut request).expect("read");
            stream
                .write_all(b"HTTP/1.1 404 Not Found\r\n\r\nno")
                .expect("write");
        });
        let error = exchange(&format!("127.0.0.1:{port}")).expect_err("not netcheck");
        server.join().expect("server thread");
        assert_eq!(
            error,
            "connected, but something else than netcheck answered"
        );
    }
}
