//! The pod-network mode's kernel objects (`ClusterSpec::pod_network`): the
//! "internet" namespace that joins a testbed's clusters, each cluster's
//! node namespace, each pod's namespace with its veth pair to the node,
//! and the API-server relay in each of them (see [`relay`]).
//!
//! It owns the network namespaces it names (`lqtb-<pid>-…`, see
//! [`names`]) and everything inside them; it never changes the host's own
//! namespace: no device, route, rule or sysctl of the host is touched, and
//! the only way out of a namespace is the relay to the host's loopback.
//!
//! Pods are routed, not bridged (as Calico does): a pod has its address as
//! a /32 on `eth0` and a default route to the node's address; the node has
//! a /32 route to each pod through the pod's veth. Every packet between two
//! pods of a node, and between a pod and a Service's ClusterIP, thus goes
//! through the node namespace's IP layer, where conntrack sees both ways
//! of a connection that kube-proxy's nftables rules DNAT, and a pod that
//! reaches itself through a Service leaves and comes back on the same veth
//! (no bridge hairpin mode, no `br_netfilter`).
//!
//! Everything is made with `ip` and `nft` (iproute2, nftables), which the
//! tests need anyway; names let a later run delete what a crashed one left
//! ([`reap_stale`]).

pub(crate) mod relay;

use std::fs::File;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::Error;

/// The first three bytes of the nodes' addresses on the internet, the
/// fourth being the cluster's place in its testbed.
pub(crate) const INTERNET_SUBNET: [u8; 3] = [192, 168, 100];

/// The name of each pod's interface, and of each node's interface on the
/// internet.
pub(crate) const POD_INTERFACE: &str = "eth0";
const NODE_UPLINK: &str = "inet0";
const INTERNET_BRIDGE: &str = "br0";

/// Where `ip netns add` puts the namespaces it names.
const NETNS_DIR: &str = "/run/netns";

/// How the namespaces are named: after the process that owns them (so that
/// [`reap_stale`] knows when they are orphans), and, for a node's and its
/// pods', after its API server's port, unique on the machine while the
/// cluster runs (clusters of parallel tests share names and pod CIDRs).
pub(crate) mod names {
    use std::net::Ipv4Addr;

    pub(super) const PREFIX: &str = "lqtb-";

    pub(crate) fn internet(n: u32) -> String {
        format!("{PREFIX}{}-internet-{n}", std::process::id())
    }

    pub(crate) fn node(api_port: u16) -> String {
        format!("{PREFIX}{}-{api_port}-node", std::process::id())
    }

    pub(crate) fn pod(api_port: u16, ip: Ipv4Addr) -> String {
        format!("{PREFIX}{}-{api_port}-pod-{ip}", std::process::id())
    }

    /// The node's end of a pod's veth: unique in the node namespace, as
    /// the pod's address is, and within the 15 bytes of a device name.
    pub(crate) fn veth(ip: Ipv4Addr) -> String {
        format!("veth{:08x}", u32::from(ip))
    }

    /// The pid in a name made by [`internet`], [`node`] or [`pod`].
    pub(super) fn owner(name: &str) -> Option<u32> {
        name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
    }
}

/// The path of a named network namespace, to enter it.
pub(crate) fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// Deletes the namespaces (and with them their devices) left by testbed
/// processes that are gone: a run killed with SIGKILL cannot clean up.
pub(crate) fn reap_stale() {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = names::owner(&name) else {
            continue;
        };
        if pid != std::process::id() && crate::process::is_gone(pid) {
            tracing::info!(netns = %name, "deleting a namespace left by a testbed that is gone");
            // Another process may be reaping the same one.
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

/// Runs `ip` with `args`; a failure carries what it printed.
pub(crate) fn ip(args: &[&str]) -> Result<(), Error> {
    run(Command::new("ip").args(args), None)
}

/// Runs `ip -n <netns>` with `args`.
fn ip_in(netns: &str, args: &[&str]) -> Result<(), Error> {
    let mut all = vec!["-n", netns];
    all.extend_from_slice(args);
    ip(&all)
}

/// Loads an nftables ruleset into `netns`.
fn nft(netns: &str, ruleset: &str) -> Result<(), Error> {
    run(
        Command::new("ip").args(["netns", "exec", netns, "nft", "-f", "-"]),
        Some(ruleset),
    )
}

/// Sets a sysctl of `netns` (`net.…` ones are per namespace).
fn sysctl(netns: &str, setting: &str) -> Result<(), Error> {
    run(
        Command::new("ip").args(["netns", "exec", netns, "sysctl", "-qw", setting]),
        None,
    )
}

/// Runs `cmd`, with `input` on its stdin; a failure carries what it printed.
pub(crate) fn run(cmd: &mut Command, input: Option<&str>) -> Result<(), Error> {
    let what = format!(
        "{} {}",
        cmd.get_program().to_string_lossy(),
        cmd.get_args()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let failed = |reason: String| Error::Net {
        what: what.clone(),
        reason,
    };
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| failed(e.to_string()))?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| failed(e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| failed(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ))
    }
}

/// A named network namespace with `lo` up, deleted (with its devices and
/// the veths paired with them) when dropped.
#[derive(Debug)]
pub(crate) struct Netns {
    name: String,
}

impl Netns {
    fn new(name: String) -> Result<Self, Error> {
        // A namesake can only be a leftover of a process whose pid we got.
        if netns_path(&name).exists() {
            let _ = ip(&["netns", "del", &name]);
        }
        ip(&["netns", "add", &name])?;
        let netns = Self { name };
        ip_in(&netns.name, &["link", "set", "lo", "up"])?;
        Ok(netns)
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn path(&self) -> PathBuf {
        netns_path(&self.name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            tracing::warn!(netns = %self.name, "deleting: {e}");
        }
    }
}

/// The "internet" of a testbed: a namespace with a bridge, to which each
/// pod-network cluster's node namespace has a veth, with address
/// `192.168.100.<n>/24`, `n` being the cluster's place in the testbed.
#[derive(Debug)]
pub(crate) struct Internet {
    netns: Netns,
}

static INTERNETS: AtomicU32 = AtomicU32::new(0);

impl Internet {
    pub(crate) fn new() -> Result<Arc<Self>, Error> {
        reap_stale();
        let netns = Netns::new(names::internet(INTERNETS.fetch_add(1, Ordering::Relaxed)))?;
        ip_in(
            netns.name(),
            &["link", "add", INTERNET_BRIDGE, "type", "bridge"],
        )?;
        ip_in(netns.name(), &["link", "set", INTERNET_BRIDGE, "up"])?;
        Ok(Arc::new(Self { netns }))
    }

    /// The namespace's name.
    pub(crate) fn netns(&self) -> &str {
        self.netns.name()
    }

    /// The address of the node at place `n`.
    pub(crate) fn address(n: u8) -> Ipv4Addr {
        let [a, b, c] = INTERNET_SUBNET;
        Ipv4Addr::new(a, b, c, n)
    }

    /// The internet's end of node `n`'s link.
    fn port(n: u8) -> String {
        format!("node{n}")
    }

    /// Links a node namespace to the internet at place `n`.
    fn attach(&self, node: &Netns, n: u8) -> Result<Ipv4Addr, Error> {
        let port = Self::port(n);
        ip_in(
            self.netns(),
            &[
                "link",
                "add",
                &port,
                "type",
                "veth",
                "peer",
                "name",
                NODE_UPLINK,
                "netns",
                node.name(),
            ],
        )?;
        ip_in(
            self.netns(),
            &["link", "set", &port, "master", INTERNET_BRIDGE, "up"],
        )?;
        let address = Self::address(n);
        ip_in(
            node.name(),
            &["addr", "add", &format!("{address}/24"), "dev", NODE_UPLINK],
        )?;
        ip_in(node.name(), &["link", "set", NODE_UPLINK, "up"])?;
        Ok(address)
    }

    /// Cuts or mends node `n`'s link. The internet's end goes down, so the
    /// node keeps its address (and its pods their gateway): the node's end
    /// only loses its carrier.
    pub(crate) fn set_link(&self, n: u8, up: bool) -> Result<(), Error> {
        ip_in(
            self.netns(),
            &[
                "link",
                "set",
                &Self::port(n),
                if up { "up" } else { "down" },
            ],
        )
    }
}

/// A cluster's node namespace: forwarding, linked to the internet, with
/// the relay's redirection of loopback connections (the relay itself runs
/// in the host node, see [`relay`]).
#[derive(Debug)]
pub(crate) struct NodeNet {
    netns: Netns,
    address: Ipv4Addr,
    internet: Arc<Internet>,
    place: u8,
}

impl NodeNet {
    /// The node namespace of the cluster whose API server listens on
    /// `api_port`, at place `place` of `internet`.
    /// `service`: the `kubernetes` Service the relay carries (a real node).
    pub(crate) fn new(
        api_port: u16,
        internet: Arc<Internet>,
        place: u8,
        service: Option<relay::ApiService>,
    ) -> Result<Self, Error> {
        reap_stale();
        let netns = Netns::new(names::node(api_port))?;
        sysctl(netns.name(), "net.ipv4.ip_forward=1")?;
        let address = internet.attach(&netns, place)?;
        nft(netns.name(), &relay::ruleset(service))?;
        Ok(Self {
            netns,
            address,
            internet,
            place,
        })
    }

    pub(crate) fn name(&self) -> &str {
        self.netns.name()
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.netns.path()
    }

    /// The node's address on the internet: its InternalIP, its pods'
    /// gateway and host-network pods' IP.
    pub(crate) fn address(&self) -> Ipv4Addr {
        self.address
    }

    /// Routes the service CIDR `cidr` out of the node's uplink, as a
    /// node's default route does: a connection to a ClusterIP needs a route
    /// before kube-proxy's rules send it to an endpoint.
    pub(crate) fn route_services(&self, cidr: &str) -> Result<(), Error> {
        ip_in(self.name(), &["route", "add", cidr, "dev", NODE_UPLINK])
    }

    pub(crate) fn set_internet_link(&self, up: bool) -> Result<(), Error> {
        self.internet.set_link(self.place, up)
    }
}

/// A pod's namespace: `eth0` with the pod's address, paired with a veth of
/// the node namespace, routed both ways, with the relay's redirection.
/// Dropping it deletes the namespace and the veth.
#[derive(Debug)]
pub(crate) struct PodNet {
    netns: Netns,
    node: String,
    veth: String,
}

impl PodNet {
    /// `node`: the node namespace's name; `gateway`: its address.
    pub(crate) fn new(
        api_port: u16,
        node: &str,
        gateway: Ipv4Addr,
        ip: Ipv4Addr,
    ) -> Result<Self, Error> {
        let veth = names::veth(ip);
        // A veth left by a pod whose namespace outlived it (a process that
        // would not die) holds the name: it is that pod's no more.
        let _ = ip_in(node, &["link", "del", &veth]);
        let netns = Netns::new(names::pod(api_port, ip))?;
        let pod = Self {
            netns,
            node: node.to_owned(),
            veth,
        };
        let (ns, veth) = (pod.netns.name(), pod.veth.as_str());
        ip_in(
            node,
            &[
                "link",
                "add",
                veth,
                "type",
                "veth",
                "peer",
                "name",
                POD_INTERFACE,
                "netns",
                ns,
            ],
        )?;
        ip_in(node, &["link", "set", veth, "up"])?;
        let gateway = gateway.to_string();
        ip_in(
            node,
            &[
                "route",
                "add",
                &format!("{ip}/32"),
                "dev",
                veth,
                "src",
                &gateway,
            ],
        )?;
        ip_in(
            ns,
            &["addr", "add", &format!("{ip}/32"), "dev", POD_INTERFACE],
        )?;
        ip_in(ns, &["link", "set", POD_INTERFACE, "up"])?;
        // The node answers ARP for its own address on any of its devices.
        ip_in(
            ns,
            &[
                "route",
                "add",
                &gateway,
                "dev",
                POD_INTERFACE,
                "scope",
                "link",
            ],
        )?;
        ip_in(
            ns,
            &[
                "route",
                "add",
                "default",
                "via",
                &gateway,
                "dev",
                POD_INTERFACE,
            ],
        )?;
        nft(ns, &relay::ruleset(None))?;
        Ok(pod)
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.netns.path()
    }
}

impl Drop for PodNet {
    fn drop(&mut self) {
        // The veth goes with the namespace, unless a process keeps that
        // alive; then it goes now.
        let _ = ip_in(&self.node, &["link", "del", &self.veth]);
    }
}

/// Runs `f` with the calling thread in the network namespace `netns`, and
/// brings it back: a socket made in `f` stays in `netns` for its life.
pub(crate) fn in_netns<T>(
    netns: &File,
    f: impl FnOnce() -> std::io::Result<T>,
) -> std::io::Result<T> {
    use nix::sched::{CloneFlags, setns};
    let home = File::open("/proc/thread-self/ns/net")?;
    setns(netns, CloneFlags::CLONE_NEWNET)?;
    let result = f();
    setns(&home, CloneFlags::CLONE_NEWNET)
        .expect("invariant: a thread may go back to the namespace it came from");
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_their_owner_and_fit_devices() {
        let pid = std::process::id();
        let ip = Ipv4Addr::new(10, 201, 3, 17);
        assert_eq!(names::node(40123), format!("lqtb-{pid}-40123-node"));
        assert_eq!(
            names::pod(40123, ip),
            format!("lqtb-{pid}-40123-pod-10.201.3.17")
        );
        for name in [names::node(1), names::pod(1, ip), names::internet(7)] {
            assert_eq!(names::owner(&name), Some(pid), "{name}");
        }
        assert_eq!(names::owner("lq-na-1-2"), None);
        assert_eq!(names::veth(ip), "veth0ac90311");
        assert!(names::veth(Ipv4Addr::BROADCAST).len() <= 15);
        assert_eq!(Internet::address(2), Ipv4Addr::new(192, 168, 100, 2));
    }
}
