//! The way from a node's or pod's namespace to the API servers on the
//! host's loopback, at the very URLs the host uses, so that kubeconfigs
//! and `KUBERNETES_SERVICE_HOST` work unchanged in every namespace, for
//! every testbed cluster of the machine (a virtual kubelet in a consumer's
//! pod talks to the consumer's and the provider's API servers).
//!
//! In each namespace, an nftables rule ([`ruleset`]) redirects TCP
//! connections to `127.0.0.0/8` to the relay's listener there, on
//! `127.0.0.1:`[`RELAY_PORT`]. The relay ([`Relay`], a task of the host
//! node) reads where each connection was going (`SO_ORIGINAL_DST`), and
//! connects there: first inside the namespace, in case a process of the
//! pod listens on that loopback address itself (the relay's socket is
//! marked so that the rule lets it through), else in the host's namespace.
//! Then it copies bytes both ways. Other traffic is not touched: UDP to
//! loopback stays in the namespace.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsFd;
use std::path::Path;

use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinSet;

use super::in_netns;

/// Where the relay listens in each namespace. A privileged port that no
/// agent uses; a connection made to it directly is refused.
pub(crate) const RELAY_PORT: u16 = 1;

/// The mark of the relay's own connections inside a namespace, which the
/// redirection lets through ("lq").
const MARK: u32 = 0x6c71;

/// The nftables table of a namespace's redirection to its relay.
pub(crate) fn ruleset() -> String {
    format!(
        "table ip liqo-testbed-relay {{\n\
         \tchain output {{\n\
         \t\ttype nat hook output priority -100; policy accept;\n\
         \t\tmeta mark {MARK:#x} return\n\
         \t\tip daddr 127.0.0.0/8 tcp dport != {RELAY_PORT} redirect to :{RELAY_PORT}\n\
         \t}}\n\
         }}\n"
    )
}

/// A running relay; dropping it stops it and every connection it carries.
#[derive(Debug)]
pub(crate) struct Relay {
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Starts the relay of the namespace at `netns` (a path under
    /// `/run/netns`), as a task of the calling runtime.
    pub(crate) fn start(netns: &Path) -> std::io::Result<Self> {
        let ns = File::open(netns)?;
        let listener = in_netns(&ns, || {
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, RELAY_PORT))
        })?;
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let label = netns.display().to_string();
        let task = tokio::spawn(async move {
            // Dropped with the task: the connections end with the relay.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            let ns = match ns.try_clone() {
                                Ok(ns) => ns,
                                Err(e) => {
                                    tracing::warn!(netns = %label, "relay: {e}");
                                    continue;
                                }
                            };
                            let label = label.clone();
                            connections.spawn(async move {
                                if let Err(e) = carry(stream, &ns).await {
                                    tracing::debug!(netns = %label, "relay: {e}");
                                }
                            });
                        }
                        Err(e) => tracing::warn!(netns = %label, "relay: accepting: {e}"),
                    },
                    // Reaps finished connections; never ready when empty.
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(Self { task })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Connects a redirected connection to where it was going, and copies
/// until either side closes.
async fn carry(mut client: TcpStream, ns: &File) -> std::io::Result<()> {
    let target = original_destination(&client)?;
    if target.port() == RELAY_PORT {
        return Err(std::io::Error::other("a connection to the relay itself"));
    }
    let mut upstream = match connect_inside(ns, target).await {
        Ok(stream) => stream,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            TcpStream::connect(target).await?
        }
        Err(e) => return Err(e),
    };
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// Where a redirected connection was going.
fn original_destination(stream: &TcpStream) -> std::io::Result<SocketAddr> {
    let sin =
        nix::sys::socket::getsockopt(&stream.as_fd(), nix::sys::socket::sockopt::OriginalDst)?;
    let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
    Ok(SocketAddr::V4(SocketAddrV4::new(
        ip,
        u16::from_be(sin.sin_port),
    )))
}

/// Connects to `target` from inside the namespace, past the redirection.
async fn connect_inside(ns: &File, target: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = in_netns(ns, TcpSocket::new_v4)?;
    nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::Mark, &MARK)?;
    socket.connect(target).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ruleset_lets_the_relay_through_and_redirects_the_rest() {
        let rules = ruleset();
        let mark = rules.find("meta mark 0x6c71 return").expect("mark rule");
        let redirect = rules
            .find("ip daddr 127.0.0.0/8 tcp dport != 1 redirect to :1")
            .expect("redirect rule");
        assert!(mark < redirect, "{rules}");
    }
}
