//! One peer's nftables table: the stateless translation between the
//! peer's real pod CIDR and where this cluster sees it.

use std::io::Write as _;
use std::process::{Command, Stdio};

use ipnet::IpNet;

use super::Error;

/// How one peer's pods are reached through one tunnel device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPods {
    /// The tunnel's device (one per peer).
    pub device: String,
    /// The peer's pod CIDR as the peer knows it: what crosses the tunnel.
    pub peer: IpNet,
    /// Where this cluster sees the peer's pods, when not at `peer`.
    pub seen_as: Option<IpNet>,
}

impl PeerPods {
    /// The CIDR routed into the device: where local pods send.
    pub fn routed(&self) -> IpNet {
        self.seen_as.unwrap_or(self.peer)
    }

    /// Our table's name: one per tunnel device, so one per peer.
    pub fn table(&self) -> String {
        format!("liqo-gw-{}", self.device)
    }

    /// The `nft -f` input that makes our table what these pods need, in
    /// one transaction: created if missing, deleted, then defined, so that
    /// applying it again (or after a crash) leaves exactly one copy, and a
    /// peer whose pods need no translation leaves no table.
    pub fn ruleset(&self) -> String {
        let table = self.table();
        let mut text = format!("add table inet {table}\ndelete table inet {table}\n");
        if let Some(seen_as) = self.seen_as {
            let (peer, device) = (self.peer, &self.device);
            let family = match peer {
                IpNet::V4(_) => "ip",
                IpNet::V6(_) => "ip6",
            };
            let hostmask = peer.hostmask();
            let (real, remapped) = (peer.network(), seen_as.network());
            text.push_str(&format!(
                "table inet {table} {{\n\
                 \t# The peer's pods {peer} are seen here as {seen_as}, host part kept.\n\
                 \tchain incoming {{\n\
                 \t\t# Before conntrack and routing, which see the remapped source.\n\
                 \t\ttype filter hook prerouting priority raw; policy accept;\n\
                 \t\tiifname \"{device}\" {family} saddr {peer} \
                 {family} saddr set {family} saddr & {hostmask} | {remapped}\n\
                 \t}}\n\
                 \tchain outgoing {{\n\
                 \t\t# After routing, which chose the device by the remapped destination.\n\
                 \t\ttype filter hook postrouting priority srcnat; policy accept;\n\
                 \t\toifname \"{device}\" {family} daddr {seen_as} \
                 {family} daddr set {family} daddr & {hostmask} | {real}\n\
                 \t}}\n\
                 }}\n"
            ));
        }
        text
    }

    /// The `nft -f` input that removes our table, whether it exists or not.
    pub fn removal(&self) -> String {
        let table = self.table();
        format!("add table inet {table}\ndelete table inet {table}\n")
    }
}

/// Applies an `nft -f` input in one transaction.
pub fn nft(input: &str) -> Result<(), Error> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Spawn("nft", e))?;
    child
        .stdin
        .take()
        .expect("invariant: stdin is piped")
        .write_all(input.as_bytes())
        .map_err(|e| Error::Spawn("nft", e))?;
    let out = child
        .wait_with_output()
        .map_err(|e| Error::Spawn("nft", e))?;
    if !out.status.success() {
        return Err(Error::Refused {
            what: "nft",
            input: input.to_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// Our table while it is installed: removed when dropped. The route goes
/// with the device.
#[derive(Debug)]
pub struct Installed {
    pods: PeerPods,
}

impl Installed {
    /// Makes the table what `pods` need (none when nothing is
    /// remapped, removing what an earlier run may have left).
    pub fn install(pods: PeerPods) -> Result<Self, Error> {
        nft(&pods.ruleset())?;
        Ok(Self { pods })
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if self.pods.seen_as.is_none() {
            return;
        }
        match nft(&self.pods.removal()) {
            Ok(()) => tracing::info!(table = %self.pods.table(), "NAT table removed"),
            Err(e) => tracing::warn!(error = %e, "removing the NAT table"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("cidr")
    }

    #[test]
    fn identical_cidrs_translate_both_ways_keeping_the_host_part() {
        let p = PeerPods {
            device: "liqo0".into(),
            peer: net("10.200.0.0/16"),
            seen_as: Some(net("10.201.0.0/16")),
        };
        assert_eq!(p.routed(), net("10.201.0.0/16"));
        assert_eq!(
            p.ruleset(),
            "add table inet liqo-gw-liqo0\n\
             delete table inet liqo-gw-liqo0\n\
             table inet liqo-gw-liqo0 {\n\
             \t# The peer's pods 10.200.0.0/16 are seen here as 10.201.0.0/16, host part kept.\n\
             \tchain incoming {\n\
             \t\t# Before conntrack and routing, which see the remapped source.\n\
             \t\ttype filter hook prerouting priority raw; policy accept;\n\
             \t\tiifname \"liqo0\" ip saddr 10.200.0.0/16 \
             ip saddr set ip saddr & 0.0.255.255 | 10.201.0.0\n\
             \t}\n\
             \tchain outgoing {\n\
             \t\t# After routing, which chose the device by the remapped destination.\n\
             \t\ttype filter hook postrouting priority srcnat; policy accept;\n\
             \t\toifname \"liqo0\" ip daddr 10.201.0.0/16 \
             ip daddr set ip daddr & 0.0.255.255 | 10.200.0.0\n\
             \t}\n\
             }\n"
        );
    }

    #[test]
    fn without_remap_the_ruleset_only_removes_our_table() {
        let p = PeerPods {
            device: "wg1".into(),
            peer: net("10.210.0.0/16"),
            seen_as: None,
        };
        assert_eq!(p.routed(), net("10.210.0.0/16"));
        assert_eq!(p.ruleset(), p.removal());
        assert_eq!(
            p.removal(),
            "add table inet liqo-gw-wg1\ndelete table inet liqo-gw-wg1\n"
        );
    }

    #[test]
    fn ipv6_uses_ip6_matches() {
        let p = PeerPods {
            device: "liqo0".into(),
            peer: net("fd00::/64"),
            seen_as: Some(net("fd01::/64")),
        };
        let rules = p.ruleset();
        assert!(
            rules.contains(
                "ip6 saddr fd00::/64 ip6 saddr set ip6 saddr & ::ffff:ffff:ffff:ffff | fd01::"
            ),
            "{rules}"
        );
        assert!(
            rules.contains(
                "ip6 daddr fd01::/64 ip6 daddr set ip6 daddr & ::ffff:ffff:ffff:ffff | fd00::"
            ),
            "{rules}"
        );
    }
}
