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
//!
//! On a real node ([`crate::realnode`]) pods find their API server as
//! kubelet tells them, at the `kubernetes` Service's ClusterIP, whose
//! endpoint is the API server's loopback address: unreachable from a pod.
//! There the rule also takes connections to that ClusterIP's port 443
//! (before kube-proxy's rules would), and the relay carries them to the
//! API server ([`ApiService`]).

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
/// redirection lets through. Clear of kube-proxy's masquerade and drop
/// bits (0x4000 and 0x8000, its defaults): a connection marked with the
/// first is masqueraded to the node's address on its way to loopback, gets
/// no answer, and the relay's connect hangs for minutes before it fails,
/// which is how every node's reconnection to its API server after a pause
/// once hung.
const MARK: u32 = 0x1c71;

/// How long a connect inside the namespace may take before the host's
/// namespace is tried.
const INSIDE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// kube-proxy's masquerade and drop bits, which [`MARK`] must not carry.
#[cfg(test)]
const KUBE_PROXY_BITS: u32 = 0x4000 | 0x8000;

/// The `kubernetes` Service of a real node's cluster: connections to its
/// ClusterIP on port 443 go to the API server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ApiService {
    pub(crate) cluster_ip: Ipv4Addr,
    pub(crate) api_server: SocketAddr,
}

/// The port of the `kubernetes` Service.
const API_SERVICE_PORT: u16 = 443;

/// The nftables table of a namespace's redirection to its relay. Its
/// chain comes before kube-proxy's (priority -100), so that the
/// `kubernetes` Service is carried by the relay rather than DNATed to a
/// loopback address.
pub(crate) fn ruleset(service: Option<ApiService>) -> String {
    let service = service
        .map(|s| {
            format!(
                "\t\tip daddr {} tcp dport {API_SERVICE_PORT} redirect to :{RELAY_PORT}\n",
                s.cluster_ip
            )
        })
        .unwrap_or_default();
    format!(
        "table ip liqo-testbed-relay {{\n\
         \tchain output {{\n\
         \t\ttype nat hook output priority -110; policy accept;\n\
         \t\tmeta mark {MARK:#x} return\n\
         \t\tip daddr 127.0.0.0/8 tcp dport != {RELAY_PORT} redirect to :{RELAY_PORT}\n\
         {service}\
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
        Self::start_with(File::open(netns)?, &netns.display().to_string(), None)
    }

    /// [`Relay::start`] for the namespace `ns` (`label` names it in logs),
    /// carrying `service` to its API server.
    pub(crate) fn start_with(
        ns: File,
        label: &str,
        service: Option<ApiService>,
    ) -> std::io::Result<Self> {
        let listener = in_netns(&ns, || {
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, RELAY_PORT))
        })?;
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let label = label.to_owned();
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
                                if let Err(e) = carry(stream, &ns, service).await {
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
async fn carry(
    mut client: TcpStream,
    ns: &File,
    service: Option<ApiService>,
) -> std::io::Result<()> {
    let target = original_destination(&client)?;
    if target.port() == RELAY_PORT {
        return Err(std::io::Error::other("a connection to the relay itself"));
    }
    if let Some(service) = service
        && target == SocketAddr::from((service.cluster_ip, API_SERVICE_PORT))
    {
        let mut upstream = TcpStream::connect(service.api_server).await?;
        tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
        return Ok(());
    }
    // Loopback answers at once, with a SYN-ACK or a reset; no answer in a
    // second means something of the namespace took the packet, and the
    // host's namespace is tried as for a refusal.
    let inside = tokio::time::timeout(INSIDE_PATIENCE, connect_inside(ns, target)).await;
    let mut upstream = match inside {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            TcpStream::connect(target).await?
        }
        Err(_elapsed) => {
            tracing::warn!(%target, "relay: no answer inside the namespace; connecting from the host's");
            TcpStream::connect(target).await?
        }
        Ok(Err(e)) => return Err(e),
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
        let rules = ruleset(None);
        assert!(!rules.contains("443"), "{rules}");
        let with_service = ruleset(Some(ApiService {
            cluster_ip: Ipv4Addr::new(10, 96, 0, 1),
            api_server: "127.0.0.1:6443".parse().expect("an address"),
        }));
        assert!(
            with_service.contains("ip daddr 10.96.0.1 tcp dport 443 redirect to :1"),
            "{with_service}"
        );
        let mark = rules.find("meta mark 0x1c71 return").expect("mark rule");
        let redirect = rules
            .find("ip daddr 127.0.0.0/8 tcp dport != 1 redirect to :1")
            .expect("redirect rule");
        assert!(mark < redirect, "{rules}");
    }

    #[test]
    fn the_relays_mark_is_none_of_kube_proxys() {
        assert_eq!(MARK & KUBE_PROXY_BITS, 0, "{MARK:#x}");
    }
}
