//! The way from a real node's pods to the API servers on the host's
//! loopback: the last plugin of the node's CNI network (the
//! `liqo-testbed-cni` program, see [`protocol`]) asks the node, over a Unix
//! socket, to put a relay in each new pod's namespace, as the pod-network
//! mode's pods have (see `crate::podnet::relay`), and to take it away when
//! the pod goes.
//!
//! The pod's namespace is pinned in containerd's own mount namespace (see
//! `crate::realnode`): the node opens it through `/proc/<pid>/root` of the
//! plugin, which waits for the answer.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::podnet;
use crate::podnet::relay::{self, ApiService, Relay};

/// What the plugin and the node say to each other: one line of JSON each.
pub mod protocol {
    use serde::{Deserialize, Serialize};

    /// The plugin's request.
    #[derive(Debug, Serialize, Deserialize)]
    pub struct Request {
        /// `ADD` or `DEL`, as CNI's `CNI_COMMAND`.
        pub command: String,
        /// The pod sandbox's id (`CNI_CONTAINERID`).
        pub container: String,
        /// The namespace's path in the plugin's mount namespace
        /// (`CNI_NETNS`); the node reaches that mount namespace through the
        /// plugin's pid, which it takes from the socket (`SO_PEERCRED`).
        pub netns: String,
    }

    /// The answer: `ok`, or why not.
    pub const OK: &str = "ok";
}

/// Serves the plugin's requests on `socket` until the task is dropped.
pub(crate) async fn serve(socket: PathBuf, service: ApiService) {
    let _ = std::fs::remove_file(&socket);
    let listener = match UnixListener::bind(&socket) {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(socket = %socket.display(), "real node: CNI socket: {e}");
            return;
        }
    };
    // The relays of the pods, by sandbox.
    let mut relays: HashMap<String, Relay> = HashMap::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        if let Err(e) = answer(stream, &mut relays, service).await {
            tracing::warn!("real node: CNI request: {e}");
        }
    }
}

async fn answer(
    stream: UnixStream,
    relays: &mut HashMap<String, Relay>,
    service: ApiService,
) -> std::io::Result<()> {
    // The plugin's pid as this process sees it: the plugin runs in the
    // node's PID namespace, where its own pid means another process.
    let pid = stream
        .peer_cred()?
        .pid()
        .and_then(|p| u32::try_from(p).ok())
        .ok_or_else(|| std::io::Error::other("the plugin's pid is unknown"))?;
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read).read_line(&mut line).await?;
    let request: protocol::Request = serde_json::from_str(&line).map_err(std::io::Error::other)?;
    let result = match request.command.as_str() {
        "ADD" => add(&request, pid, service).map(|relay| {
            relays.insert(request.container.clone(), relay);
        }),
        "DEL" => {
            relays.remove(&request.container);
            Ok(())
        }
        other => Err(format!("unknown command {other}")),
    };
    let reply = match result {
        Ok(()) => protocol::OK.to_owned(),
        Err(e) => e,
    };
    write.write_all(format!("{reply}\n").as_bytes()).await
}

/// Puts the redirection and a relay in the pod's namespace, which the
/// plugin (process `pid`) names.
fn add(request: &protocol::Request, pid: u32, service: ApiService) -> Result<Relay, String> {
    let path = Path::new("/proc")
        .join(pid.to_string())
        .join("root")
        .join(request.netns.trim_start_matches('/'));
    let ns = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut nft = Command::new("nft");
    nft.args(["-f", "-"]);
    crate::process::with_netns(&mut nft, Some(&path)).map_err(|e| e.to_string())?;
    podnet::run(&mut nft, Some(&relay::ruleset(Some(service)))).map_err(|e| e.to_string())?;
    Relay::start_with(ns, &request.container, Some(service)).map_err(|e| e.to_string())
}
