//! The API server's way into a real node's network: an HTTP CONNECT proxy
//! on a Unix socket (the API server's egress selection for the `cluster`
//! network, see `config::egress_selection`) that dials each target from
//! the node's namespace, where pods, the kubelet and Services are reached
//! as on a node; loopback targets (kwok's nodes, the host-process node)
//! still reach the host through the node's relay. As konnectivity does
//! for clusters whose nodes the control plane cannot reach.

use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpSocket, UnixListener, UnixStream};

use crate::podnet::in_netns;

/// Serves CONNECT requests on `socket` until the task is dropped.
pub(crate) async fn serve(socket: PathBuf, netns: File) {
    let _ = std::fs::remove_file(&socket);
    let listener = match UnixListener::bind(&socket) {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(socket = %socket.display(), "real node: egress socket: {e}");
            return;
        }
    };
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let Ok(ns) = netns.try_clone() else { continue };
                connections.spawn(async move {
                    if let Err(e) = tunnel(stream, ns).await {
                        tracing::debug!("real node: egress: {e}");
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn tunnel(stream: UnixStream, ns: File) -> std::io::Result<()> {
    let mut client = BufReader::new(stream);
    let mut request = String::new();
    client.read_line(&mut request).await?;
    // The headers, up to the blank line.
    loop {
        let mut header = String::new();
        if client.read_line(&mut header).await? == 0 || header.trim().is_empty() {
            break;
        }
    }
    let target = match request.split_whitespace().collect::<Vec<_>>()[..] {
        ["CONNECT", target, _] => target.to_owned(),
        _ => {
            client
                .get_mut()
                .write_all(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
                .await?;
            return Err(std::io::Error::other(format!(
                "not a CONNECT: {}",
                request.trim()
            )));
        }
    };
    let upstream = match target.parse::<SocketAddr>() {
        Ok(addr) => match in_netns(&ns, TcpSocket::new_v4) {
            Ok(socket) => socket.connect(addr).await,
            Err(e) => Err(e),
        },
        Err(e) => Err(std::io::Error::other(format!("{target}: {e}"))),
    };
    let mut upstream = match upstream {
        Ok(upstream) => upstream,
        Err(e) => {
            client
                .get_mut()
                .write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
                .await?;
            return Err(e);
        }
    };
    client
        .get_mut()
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}
