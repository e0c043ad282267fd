//! One peer's protocol state: boringtun's `Tunn`, cryptokey routing,
//! roaming, timers and counters.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use boringtun::noise::errors::WireGuardError;
use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use ipnet::IpNet;

use super::Key;
use super::probe::{PROBE_EVERY, PROBE_LEN, Probe, parse_probe, probe_packet};

/// The room for rare messages (handshakes, keepalives, packets that
/// waited for a handshake): a whole IP packet plus the data message's
/// overhead.
const SCRATCH: usize = 65_535 + DATA_OVERHEAD;

/// A data message's size over its packet's: header (16) and tag (16).
/// boringtun does not pad.
const DATA_OVERHEAD: usize = 32;

/// The largest handshake message (an initiation): no buffer handed to
/// boringtun is ever shorter.
const HANDSHAKE_MAX: usize = 148;
/// What a peer is configured with.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    pub private_key: Key,
    pub peer_public_key: Key,
    /// Where to send until the peer has been heard from (roaming moves
    /// it); none: wait to be contacted.
    pub endpoint: Option<SocketAddr>,
    /// Source addresses accepted from the peer, and destinations sent to
    /// it.
    pub allowed_ips: Vec<IpNet>,
    pub persistent_keepalive: Option<u16>,
}

/// Counters and timestamps, as `wg show` gives them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    pub since_last_handshake: Option<Duration>,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    /// Datagrams dropped: not WireGuard, not for us, replayed, or a
    /// packet from outside the allowed addresses.
    pub dropped: u64,
    pub endpoint: Option<SocketAddr>,
    /// The last handshake's round trip, as its initiator measured it.
    pub handshake_rtt: Option<Duration>,
    /// Since the last authenticated datagram from the peer (a keepalive
    /// counts): how a live peer is told from one that went away, sooner
    /// than its session expires.
    pub since_heard: Option<Duration>,
    /// The last probe's round trip through the tunnel (see [`Peer::with_probes`]).
    pub probe_rtt: Option<Duration>,
}

/// Why an incoming datagram was dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Dropped {
    #[error("not a valid WireGuard message for this peer: {0}")]
    Invalid(String),
    #[error("a packet from {0}, outside the peer's allowed addresses")]
    NotAllowed(IpAddr),
}

/// One peer's protocol state.
pub struct Peer {
    tunn: Tunn,
    /// Where replies and timers' messages are made: the data path writes
    /// into its callers' buffers instead.
    scratch: Vec<u8>,
    allowed_ips: Vec<IpNet>,
    endpoint: Option<SocketAddr>,
    dropped: u64,
    tx_bytes: u64,
    rx_bytes: u64,
    heard: Option<std::time::Instant>,
    /// With a persistent keepalive: how long the peer may go unheard
    /// before a handshake is forced (see [`Peer::tick`]).
    unheard_limit: Option<Duration>,
    /// When a handshake was last forced.
    forced: Option<std::time::Instant>,
    /// The round-trip probes through the tunnel, when configured.
    probe: Option<Probe>,
}

/// How often a forced handshake is retried: WireGuard's REKEY_TIMEOUT.
const REKEY_TIMEOUT: Duration = Duration::from_secs(5);

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("allowed_ips", &self.allowed_ips)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Peer {
    pub fn new(config: &PeerConfig, index: u32) -> Self {
        let tunn = Tunn::new(
            StaticSecret::from(config.private_key.0),
            PublicKey::from(config.peer_public_key.0),
            None,
            config.persistent_keepalive,
            index,
            None,
        );
        Self {
            tunn,
            scratch: vec![0; SCRATCH],
            allowed_ips: config.allowed_ips.clone(),
            endpoint: config.endpoint,
            dropped: 0,
            tx_bytes: 0,
            rx_bytes: 0,
            heard: None,
            unheard_limit: config
                .persistent_keepalive
                .map(|k| Duration::from_secs(3 * u64::from(k.max(1)))),
            forced: None,
            probe: None,
        }
    }

    /// Probes the round trip through the tunnel from `ours` to `theirs`
    /// (see [`Probe`]), and answers the peer's probes to `ours`.
    pub fn with_probes(mut self, ours: Ipv4Addr, theirs: Ipv4Addr) -> Self {
        self.probe = Some(Probe {
            ours,
            theirs,
            next: 0,
            pending: None,
            last_sent: None,
            rtt: None,
        });
        self
    }

    /// Where datagrams for the peer go now.
    pub fn endpoint(&self) -> Option<SocketAddr> {
        self.endpoint
    }

    /// Whether the peer takes packets for `dst` (cryptokey routing).
    pub fn routes(&self, dst: IpAddr) -> bool {
        self.allowed_ips.iter().any(|net| net.contains(&dst))
    }

    /// The room [`Peer::outgoing`] needs for a packet of `len` bytes.
    pub fn sealed_room(len: usize) -> usize {
        (len + DATA_OVERHEAD).max(HANDSHAKE_MAX)
    }

    /// The room [`Peer::incoming`] needs for a datagram of `len` bytes.
    pub fn opened_room(len: usize) -> usize {
        len.max(HANDSHAKE_MAX)
    }

    /// An IP packet from the tunnel device: writes what to put on the
    /// network at the start of `dst` (the encrypted packet, or a
    /// handshake initiation while the packet waits in boringtun's queue)
    /// and returns its length. `dst` holds at least
    /// [`Peer::sealed_room`] bytes: the caller's send buffer, so that the
    /// datagram is not copied again.
    pub fn outgoing(&mut self, packet: &[u8], dst: &mut [u8]) -> Option<usize> {
        // Cryptokey routing: only what the peer may receive goes to it
        // (not, say, the device's own IPv6 link-local chatter).
        if !Tunn::dst_address(packet).is_some_and(|dst| self.routes(dst)) {
            return None;
        }
        match self.tunn.encapsulate(packet, dst) {
            TunnResult::WriteToNetwork(datagram) => {
                self.tx_bytes += datagram.len() as u64;
                Some(datagram.len())
            }
            TunnResult::Err(e) => {
                tracing::debug!(error = ?e, "cannot encapsulate");
                None
            }
            TunnResult::Done
            | TunnResult::WriteToTunnelV4(..)
            | TunnResult::WriteToTunnelV6(..) => None,
        }
    }

    /// A datagram from `from`: decrypts the IP packet it carries, if
    /// any, at the start of `dst` (at least [`Peer::opened_room`] bytes:
    /// the caller's buffer for the device, so that the packet is not
    /// copied again) and returns its length, 0 for none. `send` gets
    /// replies for the network (handshake responses, cookies, queued
    /// packets once a session is up).
    pub fn incoming(
        &mut self,
        from: SocketAddr,
        datagram: &[u8],
        dst: &mut [u8],
        mut send: impl FnMut(&[u8]),
    ) -> Result<usize, Dropped> {
        let result = match self.tunn.decapsulate(Some(from.ip()), datagram, dst) {
            TunnResult::Done => Ok(0),
            TunnResult::Err(e) => Err(Dropped::Invalid(describe(&e))),
            TunnResult::WriteToNetwork(reply) => {
                self.tx_bytes += reply.len() as u64;
                send(reply);
                // boringtun then flushes what waited for the handshake.
                while let TunnResult::WriteToNetwork(queued) =
                    self.tunn.decapsulate(None, &[], &mut self.scratch)
                {
                    self.tx_bytes += queued.len() as u64;
                    send(queued);
                }
                Ok(0)
            }
            TunnResult::WriteToTunnelV4(packet, src) => {
                accept(&self.allowed_ips, packet, src.into())
            }
            TunnResult::WriteToTunnelV6(packet, src) => {
                accept(&self.allowed_ips, packet, src.into())
            }
        };
        match &result {
            Ok(_) => {
                // Authenticated: the peer is wherever it sent this from.
                self.rx_bytes += datagram.len() as u64;
                self.endpoint = Some(from);
                self.heard = Some(std::time::Instant::now());
            }
            Err(_) => self.dropped += 1,
        }
        match result {
            Ok(n) if n == PROBE_LEN => Ok(self.answer_probe(&dst[..n], send)),
            other => other,
        }
    }

    /// Takes a probe addressed to us out of the decrypted packets:
    /// answers a request, times a reply. Returns the length to deliver:
    /// the packet's own when it is no probe of ours, else 0.
    fn answer_probe(&mut self, packet: &[u8], mut send: impl FnMut(&[u8])) -> usize {
        let Some(probe) = self.probe.as_mut() else {
            return packet.len();
        };
        let Some((src, reply, number)) = parse_probe(packet, probe.ours) else {
            return packet.len();
        };
        if reply {
            if let Some((pending, at)) = probe.pending
                && pending == number
            {
                probe.rtt = Some(at.elapsed());
                probe.pending = None;
            }
        } else {
            let answer = probe_packet(probe.ours, src, true, number);
            if let TunnResult::WriteToNetwork(datagram) =
                self.tunn.encapsulate(&answer, &mut self.scratch)
            {
                self.tx_bytes += datagram.len() as u64;
                send(datagram);
            }
        }
        0
    }

    /// Drives boringtun's timers (handshake retries, keepalives, rekeys,
    /// expiry); call it every [`TICK`]. `send` gets what is due.
    pub fn tick(&mut self, mut send: impl FnMut(&[u8])) {
        match self.tunn.update_timers(&mut self.scratch) {
            TunnResult::WriteToNetwork(datagram) => {
                self.tx_bytes += datagram.len() as u64;
                send(datagram);
            }
            TunnResult::Err(WireGuardError::ConnectionExpired) => {
                tracing::debug!("session expired; a new handshake starts with the next packet")
            }
            TunnResult::Err(e) => tracing::debug!(error = ?e, "timer"),
            _ => {}
        }
        // boringtun gives up handshaking after 90 s without an answer and
        // waits for a data packet to try again, so a tunnel whose link was
        // cut for longer stays down while idle. A peer with a persistent
        // keepalive should be heard every few seconds: unheard for three
        // keepalives, a handshake is started, again every REKEY_TIMEOUT,
        // until the peer answers (as soon as it can be reached again).
        let unheard = self
            .unheard_limit
            .is_some_and(|limit| self.heard.is_none_or(|t| t.elapsed() >= limit));
        self.send_probe(&mut send);
        let due = self.forced.is_none_or(|t| t.elapsed() >= REKEY_TIMEOUT);
        if unheard && due && self.endpoint.is_some() {
            self.forced = Some(std::time::Instant::now());
            if let TunnResult::WriteToNetwork(initiation) = self
                .tunn
                .format_handshake_initiation(&mut self.scratch, true)
            {
                self.tx_bytes += initiation.len() as u64;
                send(initiation);
            }
        }
    }

    /// Sends a probe every [`PROBE_EVERY`] while a session is up; one
    /// still unanswered by then is lost (the last round trip stays).
    fn send_probe(&mut self, send: &mut impl FnMut(&[u8])) {
        let up = self.tunn.time_since_last_handshake().is_some() && self.endpoint.is_some();
        let Some(probe) = self.probe.as_mut() else {
            return;
        };
        if !up || probe.last_sent.is_some_and(|t| t.elapsed() < PROBE_EVERY) {
            return;
        }
        let now = std::time::Instant::now();
        probe.last_sent = Some(now);
        probe.next += 1;
        probe.pending = Some((probe.next, now));
        let request = probe_packet(probe.ours, probe.theirs, false, probe.next);
        if let TunnResult::WriteToNetwork(datagram) =
            self.tunn.encapsulate(&request, &mut self.scratch)
        {
            self.tx_bytes += datagram.len() as u64;
            send(datagram);
        }
    }

    pub fn stats(&self) -> Stats {
        let (since_last_handshake, _, _, _, rtt_ms) = self.tunn.stats();
        Stats {
            since_last_handshake,
            handshake_rtt: rtt_ms.map(|ms| Duration::from_millis(ms.into())),
            since_heard: self.heard.map(|t| t.elapsed()),
            probe_rtt: self.probe.as_ref().and_then(|p| p.rtt),
            tx_bytes: self.tx_bytes,
            rx_bytes: self.rx_bytes,
            dropped: self.dropped,
            endpoint: self.endpoint,
        }
    }
}

/// A decrypted packet's length if its source is among `allowed_ips`.
fn accept(allowed_ips: &[IpNet], packet: &[u8], src: IpAddr) -> Result<usize, Dropped> {
    // A keepalive is an empty data message: nothing to deliver.
    if packet.is_empty() {
        return Ok(0);
    }
    if !allowed_ips.iter().any(|net| net.contains(&src)) {
        return Err(Dropped::NotAllowed(src));
    }
    Ok(packet.len())
}

/// How often [`Peer::tick`] runs: boringtun's timers have this resolution.
pub const TICK: Duration = Duration::from_millis(250);

/// How long a session is good for after its handshake (WireGuard's
/// REJECT_AFTER_TIME): later, no data goes through it.
pub const SESSION: Duration = Duration::from_secs(180);

fn describe(e: &WireGuardError) -> String {
    format!("{e:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tunnel::probe::ipv4_checksum;

    fn key(byte: u8) -> Key {
        let mut k = [byte; 32];
        // A valid x25519 scalar is any 32 bytes (clamped on use).
        k[0] = byte.wrapping_add(1);
        Key(k)
    }

    fn public(k: &Key) -> Key {
        k.public_of_private().parse().expect("own encoding")
    }

    fn net(s: &str) -> IpNet {
        s.parse().expect("net")
    }

    /// An IPv4 UDP packet from `src` to `dst` with `payload` (checksums
    /// left zero: nothing here checks them).
    fn ipv4(src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
        let total = 20 + 8 + payload.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[8] = 64;
        p[9] = 17;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        p[20..22].copy_from_slice(&1000u16.to_be_bytes());
        p[22..24].copy_from_slice(&2000u16.to_be_bytes());
        p[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p[28..].copy_from_slice(payload);
        p
    }

    struct Pair {
        a: Peer,
        b: Peer,
        a_addr: SocketAddr,
        b_addr: SocketAddr,
    }

    /// What `peer` sends for `packet`.
    fn seal(peer: &mut Peer, packet: &[u8]) -> Option<Vec<u8>> {
        let mut dst = vec![0; Peer::sealed_room(packet.len())];
        peer.outgoing(packet, &mut dst).map(|n| dst[..n].to_vec())
    }

    /// What `peer` delivers for `datagram` (none for an empty packet),
    /// its replies pushed to `replies`.
    fn open(
        peer: &mut Peer,
        from: SocketAddr,
        datagram: &[u8],
        replies: &mut Vec<Vec<u8>>,
    ) -> Result<Option<Vec<u8>>, Dropped> {
        let mut dst = vec![0; Peer::opened_room(datagram.len())];
        let n = peer.incoming(from, datagram, &mut dst, |r| replies.push(r.to_vec()))?;
        Ok((n > 0).then(|| dst[..n].to_vec()))
    }

    impl Pair {
        fn new() -> Self {
            let (ka, kb) = (key(1), key(2));
            let a_addr: SocketAddr = "192.0.2.1:51820".parse().expect("addr");
            let b_addr: SocketAddr = "192.0.2.2:51820".parse().expect("addr");
            let a = Peer::new(
                &PeerConfig {
                    private_key: ka.clone(),
                    peer_public_key: public(&kb),
                    endpoint: Some(b_addr),
                    allowed_ips: vec![net("10.2.0.0/16")],
                    persistent_keepalive: None,
                },
                1,
            );
            let b = Peer::new(
                &PeerConfig {
                    private_key: kb,
                    peer_public_key: public(&ka),
                    endpoint: None,
                    allowed_ips: vec![net("10.1.0.0/16")],
                    persistent_keepalive: None,
                },
                2,
            );
            Self {
                a,
                b,
                a_addr,
                b_addr,
            }
        }

        /// `a` sends `packet`; datagrams bounce between the two until
        /// none is left. Returns what each side delivered.
        fn a_sends(&mut self, packet: &[u8]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
            let to_b = seal(&mut self.a, packet).into_iter().collect();
            self.exchange(to_b)
        }

        fn exchange(&mut self, mut to_b: Vec<Vec<u8>>) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
            let (mut at_a, mut at_b) = (Vec::new(), Vec::new());
            for _ in 0..10 {
                let mut to_a = Vec::new();
                for d in to_b.drain(..) {
                    if let Ok(Some(p)) = open(&mut self.b, self.a_addr, &d, &mut to_a) {
                        at_b.push(p);
                    }
                }
                for d in to_a.drain(..) {
                    if let Ok(Some(p)) = open(&mut self.a, self.b_addr, &d, &mut to_b) {
                        at_a.push(p);
                    }
                }
                if to_b.is_empty() {
                    break;
                }
            }
            (at_a, at_b)
        }
    }

    /// A peer with a persistent keepalive that has not heard from the
    /// other starts a handshake by itself, without a packet to send, and
    /// not more often than every REKEY_TIMEOUT; once the other answered,
    /// it is heard and forces nothing.
    #[test]
    fn an_unheard_peer_with_a_keepalive_is_handshaken_without_traffic() {
        let mut pair = Pair::new();
        pair.a.unheard_limit = Some(Duration::from_secs(3));
        let mut sent = Vec::new();
        pair.a.tick(|d| sent.push(d.to_vec()));
        assert_eq!(sent.len(), 1, "a handshake initiation at once");
        pair.a.tick(|d| sent.push(d.to_vec()));
        assert_eq!(sent.len(), 1, "not again before REKEY_TIMEOUT");
        let (_, delivered) = pair.exchange(sent);
        assert!(delivered.is_empty());
        assert!(
            pair.a.stats().since_heard.is_some(),
            "the response was heard"
        );
        assert!(pair.a.stats().since_last_handshake.is_some());
        pair.a.forced = None;
        let mut more = Vec::new();
        pair.a.tick(|d| more.push(d.to_vec()));
        assert!(more.is_empty(), "a heard peer needs no forced handshake");
    }

    /// Probes go from a's pod CIDR's network address to b's, are answered
    /// by b's peer itself, and time the round trip; neither reaches a
    /// device. A packet of a probe's size that is no probe is delivered.
    #[test]
    fn probes_are_answered_by_the_peer_and_time_the_round_trip() {
        let mut pair = Pair::new();
        let (a_net, b_net) = (Ipv4Addr::new(10, 1, 0, 0), Ipv4Addr::new(10, 2, 0, 0));
        pair.a = pair.a.with_probes(a_net, b_net);
        pair.b = pair.b.with_probes(b_net, a_net);
        let mut sent = Vec::new();
        pair.a.tick(|d| sent.push(d.to_vec()));
        assert!(sent.is_empty(), "no probe before a session");
        pair.a_sends(&ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"up"));
        pair.a.tick(|d| sent.push(d.to_vec()));
        assert_eq!(sent.len(), 1, "a probe once the session is up");
        let (at_a, at_b) = pair.exchange(sent);
        assert!(at_a.is_empty() && at_b.is_empty(), "probes reach no device");
        let rtt = pair.a.stats().probe_rtt.expect("timed");
        assert!(rtt < Duration::from_secs(1), "{rtt:?}");
        assert_eq!(
            pair.b.stats().probe_rtt,
            None,
            "b answered, it did not probe"
        );
        let mut again = Vec::new();
        pair.a.tick(|d| again.push(d.to_vec()));
        assert!(again.is_empty(), "not again before PROBE_EVERY");

        // Same size, same addresses, no magic: an ordinary packet.
        let mut lookalike = probe_packet(a_net, b_net, false, 7);
        lookalike[28] = b'x';
        let d = seal(&mut pair.a, &lookalike).expect("a datagram");
        let got = open(&mut pair.b, pair.a_addr, &d, &mut Vec::new()).expect("authentic");
        assert_eq!(got, Some(lookalike.to_vec()));
        assert_eq!(ipv4_checksum(&probe_packet(a_net, b_net, true, 1)[..20]), 0);
    }

    #[test]
    fn the_first_packet_waits_for_the_handshake_and_then_arrives() {
        let mut pair = Pair::new();
        let packet = ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"hello");
        let (_, at_b) = pair.a_sends(&packet);
        assert_eq!(at_b, vec![packet.clone()]);
        assert!(pair.a.stats().since_last_handshake.is_some());
        // b learnt a's endpoint from the handshake and answers.
        assert_eq!(pair.b.endpoint(), Some(pair.a_addr));
        let reply = ipv4([10, 2, 0, 7], [10, 1, 0, 5], b"world");
        let d = seal(&mut pair.b, &reply).expect("a datagram");
        let at_a = open(&mut pair.a, pair.b_addr, &d, &mut Vec::new()).expect("authentic");
        assert_eq!(at_a, Some(reply));
    }

    #[test]
    fn garbage_truncated_replayed_and_spoofed_datagrams_are_dropped() {
        let mut pair = Pair::new();
        pair.a_sends(&ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"up"));
        let packet = ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"data");
        let datagram = &seal(&mut pair.a, &packet).expect("one datagram");
        let mut delivered = 0;
        // The real one, once.
        let from = pair.a_addr;
        let got = open(&mut pair.b, from, datagram, &mut Vec::new()).expect("authentic");
        assert_eq!(got, Some(packet));
        delivered += 1;
        let before = pair.b.stats().dropped;
        let mut flipped = datagram.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        let bad: [&[u8]; 5] = [
            b"",
            b"\x04\x00\x00\x00garbage",
            &datagram[..datagram.len() / 2],
            &flipped,
            // Replayed.
            datagram,
        ];
        for d in bad {
            let result = open(&mut pair.b, from, d, &mut Vec::new());
            if !d.is_empty() {
                assert!(result.is_err(), "{d:?} was accepted");
            }
            if let Ok(Some(_)) = result {
                delivered += 1;
            }
        }
        assert_eq!(delivered, 1);
        assert!(pair.b.stats().dropped >= before + 4);
        // A packet from outside a's allowed addresses, properly encrypted.
        let spoofed = ipv4([10, 9, 0, 1], [10, 2, 0, 7], b"spoof");
        let datagram = seal(&mut pair.a, &spoofed).expect("one datagram");
        let result = open(&mut pair.b, from, &datagram, &mut Vec::new());
        assert_eq!(
            result,
            Err(Dropped::NotAllowed(IpAddr::from([10, 9, 0, 1])))
        );
    }

    #[test]
    fn packets_for_other_destinations_are_not_sent() {
        let mut pair = Pair::new();
        for packet in [
            ipv4([10, 1, 0, 5], [10, 3, 0, 1], b"elsewhere"),
            b"not an IP packet".to_vec(),
            Vec::new(),
        ] {
            assert_eq!(seal(&mut pair.a, &packet), None);
        }
    }

    #[test]
    fn the_endpoint_follows_the_peer() {
        let mut pair = Pair::new();
        pair.a_sends(&ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"up"));
        pair.a_addr = "198.51.100.9:40000".parse().expect("addr");
        pair.a_sends(&ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"moved"));
        assert_eq!(pair.b.endpoint(), Some(pair.a_addr));
    }
}
