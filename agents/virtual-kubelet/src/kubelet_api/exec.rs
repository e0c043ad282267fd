//! `kubectl exec` on an offloaded pod: the API server's leg to a kubelet
//! is an HTTP upgrade to SPDY/3.1 with the `v4.channel.k8s.io` streaming
//! protocol (one SPDY stream per channel, named by its `streamType`
//! header: error, stdin, stdout, stderr, resize); the agent answers it
//! ([`super::spdy`] frames it) and runs the command in the remote pod
//! through the provider's `pods/exec` (kube's WebSocket client), copying
//! the channels both ways. The command's status (a `metav1.Status`, as the
//! provider's kubelet gave it) goes back on the error stream.

use std::collections::BTreeMap;

use futures::SinkExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{Api, AttachParams, TerminalSize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::route::BadQuery;
use super::spdy::{Decoder, Encoder, Frame};

/// The streaming protocol spoken: the one whose status is a JSON
/// `metav1.Status` on the error stream.
pub const PROTOCOL: &str = "v4.channel.k8s.io";

/// What the query of `/exec` asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecOptions {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// The options of an `/exec` query (`command` repeated, `input`,
/// `output`, `error`, `tty` as `1`/`true`), or why they are refused.
pub fn exec_options(pairs: &[(String, String)]) -> Result<ExecOptions, BadQuery> {
    let flag = |key: &str| {
        pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .is_some_and(|(_, v)| v == "1" || v == "true")
    };
    let opts = ExecOptions {
        command: pairs
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect(),
        stdin: flag("input"),
        stdout: flag("output"),
        stderr: flag("error"),
        tty: flag("tty"),
    };
    if opts.command.is_empty() {
        return Err(BadQuery("you must specify at least 1 command".to_owned()));
    }
    if !opts.stdin && !opts.stdout && !opts.stderr {
        return Err(BadQuery(
            "you must specify at least 1 of stdin, stdout, stderr".to_owned(),
        ));
    }
    Ok(opts)
}

/// Whether the client offers the protocol spoken here, among the values
/// of its `X-Stream-Protocol-Version` headers.
pub fn offers_protocol<'a>(values: impl IntoIterator<Item = &'a str>) -> bool {
    values
        .into_iter()
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == PROTOCOL)
}

/// The streams the client opens for `opts`, by type.
fn expected_streams(opts: &ExecOptions) -> Vec<&'static str> {
    let mut out = vec!["error"];
    if opts.stdin {
        out.push("stdin");
    }
    if opts.stdout {
        out.push("stdout");
    }
    if opts.stderr && !opts.tty {
        out.push("stderr");
    }
    if opts.tty {
        out.push("resize");
    }
    out
}

/// A resize message (`{"Width":…,"Height":…}`).
fn terminal_size(json: &[u8]) -> Option<TerminalSize> {
    let v: serde_json::Value = serde_json::from_slice(json).ok()?;
    Some(TerminalSize {
        width: u16::try_from(v.get("Width")?.as_u64()?).ok()?,
        height: u16::try_from(v.get("Height")?.as_u64()?).ok()?,
    })
}

/// The body of the error stream for a status: nothing for success (the
/// client takes an empty error stream as success), else the status.
fn status_body(status: Option<&Status>) -> Option<Vec<u8>> {
    match status {
        None => None,
        Some(s) if s.status.as_deref() == Some("Success") => None,
        Some(s) => serde_json::to_vec(s).ok(),
    }
}

fn failure(message: String) -> Status {
    Status {
        status: Some("Failure".to_owned()),
        message: Some(message),
        reason: Some("InternalError".to_owned()),
        code: Some(500),
        ..Status::default()
    }
}

/// Runs one exec session on an upgraded connection: waits for the
/// client's streams, starts the command in `remote` (a pod of `pods`),
/// and copies until the command ends.
pub async fn session<IO>(
    io: IO,
    pods: Api<Pod>,
    remote: String,
    container: String,
    opts: ExecOptions,
) where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut reader, mut writer) = tokio::io::split(io);
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Frame>();
    // The writer owns the compression context: frames go out in order.
    let write = async move {
        let mut encoder = match Encoder::new() {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(%e, "exec: no SPDY encoder");
                return;
            }
        };
        while let Some(frame) = out_rx.recv().await {
            let Ok(bytes) = encoder.encode(&frame) else {
                return;
            };
            if writer.write_all(&bytes).await.is_err() || writer.flush().await.is_err() {
                return;
            }
        }
        let _ = writer.shutdown().await;
    };
    let write = tokio::spawn(write);

    let mut decoder = Decoder::default();
    let mut buf = Vec::with_capacity(16 * 1024);
    let mut streams: BTreeMap<&'static str, u32> = BTreeMap::new();
    let expected = expected_streams(&opts);
    let mut started = false;
    let mut stdin_tx: Option<mpsc::UnboundedSender<Option<Vec<u8>>>> = None;
    let mut resize_tx: Option<mpsc::UnboundedSender<TerminalSize>> = None;
    let mut runner: Option<tokio::task::JoinHandle<()>> = None;
    let mut stdin_ended = false;
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        // Whole frames first, then more bytes.
        let decoded = match decoder.decode(&buf) {
            Ok(d) => d,
            Err(error) => {
                tracing::debug!(%error, "exec: bad SPDY input");
                break;
            }
        };
        let Some((frame, used)) = decoded else {
            match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        buf.drain(..used);
        match frame {
            Frame::SynStream {
                stream,
                fin,
                headers,
            } => {
                let kind = headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case("streamtype"))
                    .map(|(_, v)| v.as_str());
                let _ = out_tx.send(Frame::SynReply {
                    stream,
                    fin: false,
                    headers: Vec::new(),
                });
                if let Some(kind) = expected.iter().find(|k| Some(**k) == kind) {
                    streams.insert(kind, stream);
                    // Input that ends at once: said once the command runs.
                    stdin_ended |= *kind == "stdin" && fin;
                }
                if !started && expected.iter().all(|k| streams.contains_key(k)) {
                    started = true;
                    let (tx, rx) = mpsc::unbounded_channel();
                    if stdin_ended {
                        let _ = tx.send(None);
                    }
                    stdin_tx = Some(tx);
                    let (rtx, rrx) = mpsc::unbounded_channel();
                    resize_tx = Some(rtx);
                    runner = Some(tokio::spawn(run(
                        pods.clone(),
                        remote.clone(),
                        container.clone(),
                        opts.clone(),
                        streams.clone(),
                        out_tx.clone(),
                        rx,
                        rrx,
                    )));
                }
            }
            Frame::Data { stream, fin, data } => {
                if Some(&stream) == streams.get("stdin") {
                    if let Some(tx) = &stdin_tx {
                        if !data.is_empty() {
                            let _ = tx.send(Some(data));
                        }
                        if fin {
                            let _ = tx.send(None);
                        }
                    }
                } else if Some(&stream) == streams.get("resize")
                    && let Some(tx) = &resize_tx
                {
                    for line in data.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                        if let Some(size) = terminal_size(line) {
                            let _ = tx.send(size);
                        }
                    }
                }
            }
            Frame::Ping { id } => {
                let _ = out_tx.send(Frame::Ping { id });
            }
            Frame::GoAway { .. } => break,
            Frame::SynReply { .. } | Frame::RstStream { .. } | Frame::Other { .. } => {}
        }
    }
    // The client is gone (it leaves once the error stream ended): what is
    // still running for it stops.
    if let Some(runner) = runner {
        runner.abort();
    }
    drop(out_tx);
    drop(stdin_tx);
    let _ = write.await;
}

/// Runs the command on the provider and copies its channels into the
/// client's streams; the status ends the error stream.
#[allow(clippy::too_many_arguments)]
async fn run(
    pods: Api<Pod>,
    remote: String,
    container: String,
    opts: ExecOptions,
    streams: BTreeMap<&'static str, u32>,
    out: mpsc::UnboundedSender<Frame>,
    mut stdin_rx: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    mut resize_rx: mpsc::UnboundedReceiver<TerminalSize>,
) {
    let error_stream = streams.get("error").copied().unwrap_or(0);
    let finish = |out: &mpsc::UnboundedSender<Frame>, status: Option<&Status>| {
        if let Some(body) = status_body(status) {
            let _ = out.send(Frame::Data {
                stream: error_stream,
                fin: false,
                data: body,
            });
        }
        let _ = out.send(Frame::Data {
            stream: error_stream,
            fin: true,
            data: Vec::new(),
        });
    };
    let params = AttachParams {
        container: Some(container),
        stdin: opts.stdin,
        stdout: opts.stdout,
        stderr: opts.stderr && !opts.tty,
        tty: opts.tty,
        ..AttachParams::default()
    };
    let mut process = match pods.exec(&remote, opts.command.clone(), &params).await {
        Ok(p) => p,
        Err(e) => {
            let message = match &e {
                kube::Error::Api(s) => s.message.clone(),
                other => format!(
                    "the provider cannot run the command: {}",
                    liqo_agent_runtime::error_chain(other)
                ),
            };
            // The output streams end, then the error says why.
            for kind in ["stdout", "stderr"] {
                if let Some(stream) = streams.get(kind) {
                    let _ = out.send(Frame::Data {
                        stream: *stream,
                        fin: true,
                        data: Vec::new(),
                    });
                }
            }
            finish(&out, Some(&failure(message)));
            return;
        }
    };
    let status = process.take_status();
    let stdin = process.stdin();
    let stdin_task = async move {
        let Some(mut stdin) = stdin else { return };
        while let Some(Some(data)) = stdin_rx.recv().await {
            if stdin.write_all(&data).await.is_err() {
                return;
            }
        }
        // End of input: dropping the writer tells the provider.
        let _ = stdin.shutdown().await;
    };
    let stdin_task = tokio::spawn(stdin_task);
    if let Some(mut sizes) = process.terminal_size() {
        tokio::spawn(async move {
            while let Some(size) = resize_rx.recv().await {
                if sizes.send(size).await.is_err() {
                    return;
                }
            }
        });
    }
    let copy = |reader: Option<tokio::io::ReadHalf<tokio::io::SimplexStream>>,
                stream: Option<u32>| {
        let out = out.clone();
        async move {
            let (Some(mut reader), Some(stream)) = (reader, stream) else {
                return;
            };
            let mut chunk = vec![0u8; 16 * 1024];
            loop {
                match reader.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let _ = out.send(Frame::Data {
                            stream,
                            fin: false,
                            data: chunk[..n].to_vec(),
                        });
                    }
                }
            }
            let _ = out.send(Frame::Data {
                stream,
                fin: true,
                data: Vec::new(),
            });
        }
    };
    let stdout = copy(process.stdout(), streams.get("stdout").copied());
    let stderr = copy(process.stderr(), streams.get("stderr").copied());
    tokio::join!(stdout, stderr);
    let status = match status {
        Some(s) => s.await,
        None => None,
    };
    stdin_task.abort();
    finish(&out, status.as_ref());
    let _ = process.join().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(raw: &[(&str, &str)]) -> Vec<(String, String)> {
        raw.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn options_from_the_query() {
        let got = exec_options(&pairs(&[
            ("command", "sh"),
            ("command", "-c"),
            ("command", "echo hi"),
            ("output", "1"),
            ("error", "1"),
        ]));
        assert_eq!(
            got,
            Ok(ExecOptions {
                command: vec!["sh".into(), "-c".into(), "echo hi".into()],
                stdout: true,
                stderr: true,
                ..ExecOptions::default()
            })
        );
        assert!(exec_options(&pairs(&[("output", "1")])).is_err());
        assert!(exec_options(&pairs(&[("command", "ls")])).is_err());
    }

    #[test]
    fn streams_by_options() {
        let opts = |stdin, tty| ExecOptions {
            command: vec!["x".into()],
            stdin,
            stdout: true,
            stderr: true,
            tty,
        };
        assert_eq!(
            expected_streams(&opts(false, false)),
            ["error", "stdout", "stderr"]
        );
        assert_eq!(
            expected_streams(&opts(true, true)),
            ["error", "stdin", "stdout", "resize"]
        );
    }

    #[test]
    fn protocols_and_statuses() {
        assert!(offers_protocol(["v5.channel.k8s.io", "v4.channel.k8s.io"]));
        assert!(offers_protocol(["v5.channel.k8s.io, v4.channel.k8s.io"]));
        assert!(!offers_protocol(["v3.channel.k8s.io"]));
        let success = Status {
            status: Some("Success".into()),
            ..Status::default()
        };
        assert_eq!(status_body(Some(&success)), None);
        assert_eq!(status_body(None), None);
        let body = status_body(Some(&failure("boom".into()))).expect("a body");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["message"], "boom");
        assert_eq!(
            terminal_size(br#"{"Width":80,"Height":24}"#).map(|s| (s.width, s.height)),
            Some((80, 24))
        );
        assert!(terminal_size(b"nope").is_none());
    }
}
