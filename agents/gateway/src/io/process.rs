//! `liqo-gateway tunnel`: one tunnel process, built from its flags: the
//! TUN device and the UDP socket, the peer's route and NAT table, and the
//! sans-IO peer they carry. The agent runs one for each connection; the
//! tests and the benchmark run it against standard WireGuard.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use liqo_api::networking::RemapError;

use crate::flags::TunnelArgs;
use crate::{nat, tunnel};

/// Why the tunnel process could not start or stopped. Its chain of
/// causes is the one line the agent keeps as the reason the tunnel ended;
/// where an error alone said it, it still does (`transparent`).
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("reading {0}")]
    ReadKey(String, #[source] std::io::Error),
    #[error("{0}")]
    BadKey(String, #[source] tunnel::KeyError),
    #[error("give --allowed-ips, --peer-cidr or both: the peer would be allowed nothing")]
    NothingAllowed,
    #[error(
        "--peer-remapped-cidr {remapped} must be of the family and length of \
         --peer-cidr {peer}: the host part is kept"
    )]
    RemappedShape { remapped: IpNet, peer: IpNet },
    #[error(
        "--peer-remapped-cidr {remapped} overlaps {clash}, which this cluster uses: \
         choose another"
    )]
    RemappedClash { remapped: IpNet, clash: IpNet },
    #[error(transparent)]
    Remap(RemapError),
    #[error("creating the TUN device {0}")]
    CreateDevice(String, #[source] std::io::Error),
    #[error("listening on {0}")]
    Listen(SocketAddr, #[source] std::io::Error),
    #[error(transparent)]
    LocalAddress(std::io::Error),
    #[error("installing the NAT table")]
    InstallNat(#[source] nat::Error),
    #[error("routing the peer's pods")]
    Route(#[source] nat::Error),
    #[error("starting the tunnel's threads")]
    StartThreads(#[source] std::io::Error),
    #[error("the tunnel's threads ended")]
    ThreadsEnded(#[source] tokio::sync::oneshot::error::RecvError),
    #[error("tunnel IO")]
    Io(#[source] std::io::Error),
}

/// Runs the tunnel its flags describe until a signal, or until its IO
/// fails.
pub async fn run(args: TunnelArgs) -> Result<(), ProcessError> {
    let key_file = || args.private_key_file.display().to_string();
    let private_key: tunnel::Key = read_key(&args.private_key_file)
        .map_err(|e| ProcessError::ReadKey(key_file(), e))?
        .parse()
        .map_err(|e| ProcessError::BadKey(key_file(), e))?;
    let pods = peer_pods(&args)?;
    let mut allowed_ips = args.allowed_ips.clone();
    // Real addresses cross the tunnel: the peer's own pod CIDR.
    allowed_ips.extend(pods.as_ref().map(|p| p.peer));
    if allowed_ips.is_empty() {
        return Err(ProcessError::NothingAllowed);
    }
    let config = tunnel::PeerConfig {
        private_key,
        peer_public_key: args.peer_public_key,
        endpoint: args.peer_endpoint,
        allowed_ips,
        persistent_keepalive: args.persistent_keepalive,
    };
    let mut device = tun_rs::DeviceBuilder::new().name(&args.interface);
    if let Some(address) = args.address {
        device = device.ipv4(address.addr(), address.prefix_len(), None);
    }
    let device = device
        .mtu(args.mtu)
        .offload(!args.no_offload)
        .build_sync()
        .map_err(|e| ProcessError::CreateDevice(args.interface.clone(), e))?;
    let socket =
        std::net::UdpSocket::bind(args.listen).map_err(|e| ProcessError::Listen(args.listen, e))?;
    tracing::info!(
        interface = %args.interface,
        address = ?args.address,
        listen = %socket.local_addr().map_err(ProcessError::LocalAddress)?,
        public_key = %config.private_key.public_of_private(),
        offload = !args.no_offload,
        "tunnel up"
    );
    // Before traffic flows: the table (or the removal of one an earlier
    // run left), then the route. The route goes with the device.
    let _nat = match pods {
        None => None,
        Some(pods) => {
            let routed = pods.routed();
            let installed =
                nat::Installed::install(pods.clone()).map_err(ProcessError::InstallNat)?;
            nat::route(routed, &args.interface).map_err(ProcessError::Route)?;
            tracing::info!(
                peer_cidr = %pods.peer,
                seen_as = %routed,
                table = %pods.seen_as.map(|_| pods.table()).unwrap_or_else(|| "none".into()),
                "routed into the tunnel"
            );
            Some(installed)
        }
    };
    let mut peer = tunnel::Peer::new(&config, 0);
    // Round-trip probes between the two pod CIDRs' network addresses.
    if let (Some(ipnet::IpNet::V4(local)), Some(ipnet::IpNet::V4(theirs))) =
        (args.local_cidr, args.peer_cidr)
    {
        peer = peer.with_probes(local.network(), theirs.network());
    }
    let report: super::OnStats = if args.report {
        Box::new(printer())
    } else {
        Box::new(|_: &tunnel::Stats| {})
    };
    // The data plane runs on threads of its own; this one waits for a
    // signal or for them to fail.
    // (Not the runtime's blocking pool: the runtime would wait for them
    // at exit.)
    let (done, tunnel) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("tunnel".into())
        .spawn(move || {
            let _ = done.send(super::run(device, socket, peer, report));
        })
        .map_err(ProcessError::StartThreads)?;
    tokio::select! {
        result = tunnel => result
            .map_err(ProcessError::ThreadsEnded)?
            .map_err(ProcessError::Io)?,
        () = liqo_agent_runtime::shutdown_signal() => {}
    }
    Ok(())
}

/// The key file's text, or standard input's for `-`.
fn read_key(path: &std::path::Path) -> std::io::Result<String> {
    if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    }
}

/// What the flags say about the peer's pods: where they are, and where
/// this cluster sees them.
fn peer_pods(args: &TunnelArgs) -> Result<Option<nat::PeerPods>, ProcessError> {
    use liqo_api::networking::{overlap, remap};
    let Some(peer) = args.peer_cidr.map(|c| c.trunc()) else {
        return Ok(None);
    };
    let seen_as = match (args.peer_remapped_cidr, args.local_cidr) {
        (Some(remapped), local) => {
            let remapped = remapped.trunc();
            if remapped.prefix_len() != peer.prefix_len()
                || remapped.max_prefix_len() != peer.max_prefix_len()
            {
                return Err(ProcessError::RemappedShape { remapped, peer });
            }
            if let Some(clash) = local
                .iter()
                .chain(&args.avoid)
                .find(|n| overlap(n, &remapped))
            {
                return Err(ProcessError::RemappedClash {
                    remapped,
                    clash: *clash,
                });
            }
            Some(remapped)
        }
        (None, Some(local)) => {
            remap(local, peer, &args.remap_pool, &args.avoid).map_err(ProcessError::Remap)?
        }
        (None, None) => None,
    };
    Ok(Some(nat::PeerPods {
        device: args.interface.clone(),
        peer,
        seen_as,
    }))
}

/// What `tunnel --report` calls every tick: prints the tunnel's
/// [`tunnel::Counters`] about once a second, and at once when the tunnel
/// comes up or goes down, so that its Connection says so without waiting.
fn printer() -> impl FnMut(&tunnel::Stats) + Send {
    use std::io::Write as _;
    let mut last: Option<(Instant, bool)> = None;
    move |stats| {
        let counters = tunnel::Counters::of(stats);
        let established = counters.established();
        if last.is_some_and(|(t, was)| was == established && t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        last = Some((Instant::now(), established));
        let line = serde_json::to_string(&counters).unwrap_or_default();
        let mut out = std::io::stdout().lock();
        // The agent reading it is gone: nothing to tell anyone.
        let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::{Cli, Command};
    use clap::Parser as _;

    /// What `liqo-gateway tunnel` with these flags routes, and under what.
    fn pods_of(extra: &[&str]) -> anyhow::Result<Option<nat::PeerPods>> {
        let base = [
            "liqo-gateway",
            "tunnel",
            "--address",
            "10.99.0.1/24",
            "--private-key-file",
            "k",
            "--peer-public-key",
            "29QfL/gCYN3ASZ39Gf7A/UOqE+SFK1jbHwKLwaTgVhs=",
        ];
        let cli = Cli::try_parse_from(base.iter().chain(extra))?;
        let Some(Command::Tunnel(args)) = cli.command else {
            anyhow::bail!("not the tunnel command");
        };
        Ok(peer_pods(&args)?)
    }

    fn net(s: &str) -> ipnet::IpNet {
        s.parse().expect("cidr")
    }

    #[test]
    fn the_peer_is_remapped_only_when_it_overlaps_something_of_ours() -> anyhow::Result<()> {
        assert_eq!(pods_of(&[])?, None);
        let p = |extra: &[&str]| -> anyhow::Result<(ipnet::IpNet, Option<ipnet::IpNet>)> {
            let p = pods_of(extra)?.expect("a peering");
            assert_eq!(p.device, "liqo0");
            Ok((p.peer, p.seen_as))
        };
        let local = ["--local-cidr", "10.200.0.0/16"];
        // Disjoint, or nothing known of ours: seen as it is.
        assert_eq!(
            p(&["--peer-cidr", "10.201.0.0/16", local[0], local[1]])?,
            (net("10.201.0.0/16"), None)
        );
        assert_eq!(
            p(&["--peer-cidr", "10.200.0.0/16"])?,
            (net("10.200.0.0/16"), None)
        );
        // Identical: the default pool's first /16; the service CIDR too.
        assert_eq!(
            p(&["--peer-cidr", "10.200.0.0/16", local[0], local[1]])?,
            (net("10.200.0.0/16"), Some(net("100.64.0.0/16")))
        );
        assert_eq!(
            p(&[
                "--peer-cidr",
                "10.96.0.0/16",
                local[0],
                local[1],
                "--avoid",
                "10.96.0.0/12,100.64.0.0/16"
            ])?,
            (net("10.96.0.0/16"), Some(net("100.65.0.0/16")))
        );
        // Given: taken as it is, even without overlap.
        assert_eq!(
            p(&[
                "--peer-cidr",
                "10.201.0.0/16",
                "--peer-remapped-cidr",
                "10.202.9.9/16"
            ])?,
            (net("10.201.0.0/16"), Some(net("10.202.0.0/16")))
        );
        // Flags that mean nothing alone.
        assert!(pods_of(&local).is_err());
        assert!(pods_of(&["--peer-remapped-cidr", "10.202.0.0/16"]).is_err());
        Ok(())
    }
}
