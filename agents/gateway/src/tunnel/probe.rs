//! Round-trip probes through the tunnel: what they look like on the wire
//! and what a peer remembers of them. [`super::peer::Peer`] sends and
//! answers them.

use std::net::Ipv4Addr;
use std::time::Duration;

/// Round-trip probes through the tunnel: a small UDP packet from an
/// address of ours to one of the peer's (each side's pod CIDR's network
/// address, which no pod has), answered by the peer's gateway itself:
/// neither request nor reply ever reaches a device. They measure what
/// the peers' pods see: the tunnel, both gateways and the link.
#[derive(Debug, Clone)]
pub(super) struct Probe {
    pub(super) ours: Ipv4Addr,
    pub(super) theirs: Ipv4Addr,
    pub(super) next: u64,
    /// The request in flight: its number and when it left.
    pub(super) pending: Option<(u64, std::time::Instant)>,
    pub(super) last_sent: Option<std::time::Instant>,
    pub(super) rtt: Option<Duration>,
}

/// How often a probe is sent while a session is up.
pub(super) const PROBE_EVERY: Duration = Duration::from_secs(5);
/// What marks a probe: UDP to and from this port, with this payload head.
const PROBE_PORT: u16 = 51899;
const PROBE_MAGIC: &[u8; 9] = b"liqoprobe";
pub(super) const PROBE_LEN: usize = 20 + 8 + PROBE_MAGIC.len() + 1 + 8;

/// A probe packet: IPv4, UDP (checksum 0, allowed over IPv4), the magic,
/// `reply` (0 or 1), the number.
pub(super) fn probe_packet(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    reply: bool,
    number: u64,
) -> [u8; PROBE_LEN] {
    let mut p = [0u8; PROBE_LEN];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(PROBE_LEN as u16).to_be_bytes());
    p[6] = 0x40; // don't fragment
    p[8] = 64;
    p[9] = 17; // UDP
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let sum = ipv4_checksum(&p[..20]);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p[20..22].copy_from_slice(&PROBE_PORT.to_be_bytes());
    p[22..24].copy_from_slice(&PROBE_PORT.to_be_bytes());
    p[24..26].copy_from_slice(&((PROBE_LEN - 20) as u16).to_be_bytes());
    let body = &mut p[28..];
    body[..PROBE_MAGIC.len()].copy_from_slice(PROBE_MAGIC);
    body[PROBE_MAGIC.len()] = u8::from(reply);
    body[PROBE_MAGIC.len() + 1..].copy_from_slice(&number.to_be_bytes());
    p
}

pub(super) fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A probe addressed to `to`: (source, reply, number).
pub(super) fn parse_probe(packet: &[u8], to: Ipv4Addr) -> Option<(Ipv4Addr, bool, u64)> {
    if packet.len() != PROBE_LEN || packet[0] != 0x45 || packet[9] != 17 {
        return None;
    }
    let dst = Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]);
    let port = u16::from_be_bytes([packet[22], packet[23]]);
    let body = &packet[28..];
    if dst != to || port != PROBE_PORT || &body[..PROBE_MAGIC.len()] != PROBE_MAGIC {
        return None;
    }
    let src = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
    let number = u64::from_be_bytes(body[PROBE_MAGIC.len() + 1..].try_into().ok()?);
    Some((src, body[PROBE_MAGIC.len()] == 1, number))
}
