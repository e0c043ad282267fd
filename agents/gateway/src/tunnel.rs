//! The sans-IO side of one WireGuard peering: boringtun's `Tunn` (the
//! Noise handshake, sessions, timers) plus what WireGuard asks of the
//! device around it: cryptokey routing of what comes in (a decrypted
//! packet must come from the peer's allowed addresses), roaming (the
//! peer's endpoint is wherever its last authenticated datagram came from),
//! and counters. Bytes in, bytes out, no sockets and no clock of its own
//! beyond boringtun's: [`crate::io`] drives it, and the tests here drive
//! two of them against each other.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use boringtun::noise::errors::WireGuardError;
use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use ipnet::IpNet;

/// WireGuard's overhead on a packet: outer IPv4 (20) or IPv6 (40), UDP
/// (8), and the data message's header and tag (32). The tunnel's MTU is
/// the link's minus the IPv6 figure, as WireGuard's own default does.
pub const OVERHEAD_V6: u16 = 40 + 8 + 32;

/// The smallest scratch buffer the calls below accept: a whole IP packet
/// plus the data message's overhead, and never less than a handshake
/// initiation (148 bytes).
pub const SCRATCH: usize = 65_535 + 32;

/// A key in WireGuard's text form (32 bytes, base64), as `wg genkey` and
/// `wg pubkey` write them.
#[derive(Clone)]
pub struct Key([u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Private keys never reach a log: show nothing of the bytes.
        f.write_str("Key(..)")
    }
}

impl std::str::FromStr for Key {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bytes = BASE64
            .decode(s.trim())
            .map_err(|e| format!("not base64: {e}"))?;
        let bytes: [u8; 32] = bytes
            .try_into()
            .map_err(|b: Vec<u8>| format!("{} bytes, a key has 32", b.len()))?;
        Ok(Self(bytes))
    }
}

impl Key {
    /// A new private key from the system's random source.
    pub fn generate() -> Self {
        Self(StaticSecret::random_from_rng(rand_core::OsRng).to_bytes())
    }

    /// The key in WireGuard's text form. Not `Display`, so that a private
    /// key never reaches a log by a stray `{}`: only where it must go
    /// (its Secret, a tunnel process's standard input).
    pub fn expose(&self) -> String {
        BASE64.encode(self.0)
    }

    /// The public key of this private key, in WireGuard's text form.
    pub fn public_of_private(&self) -> String {
        let secret = StaticSecret::from(self.0);
        BASE64.encode(PublicKey::from(&secret).as_bytes())
    }
}

/// What a peering is configured with.
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
}

/// Why an incoming datagram was dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Dropped {
    #[error("not a valid WireGuard message for this peer: {0}")]
    Invalid(String),
    #[error("a packet from {0}, outside the peer's allowed addresses")]
    NotAllowed(IpAddr),
}

/// One peering's protocol state.
pub struct Peer {
    tunn: Tunn,
    allowed_ips: Vec<IpNet>,
    endpoint: Option<SocketAddr>,
    dropped: u64,
    tx_bytes: u64,
    rx_bytes: u64,
    heard: Option<std::time::Instant>,
}

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
            allowed_ips: config.allowed_ips.clone(),
            endpoint: config.endpoint,
            dropped: 0,
            tx_bytes: 0,
            rx_bytes: 0,
            heard: None,
        }
    }

    /// Where datagrams for the peer go now.
    pub fn endpoint(&self) -> Option<SocketAddr> {
        self.endpoint
    }

    /// Whether the peer takes packets for `dst` (cryptokey routing).
    pub fn routes(&self, dst: IpAddr) -> bool {
        self.allowed_ips.iter().any(|net| net.contains(&dst))
    }

    /// An IP packet from the tunnel device: `send` gets what to put on the
    /// network (the encrypted packet, or a handshake initiation while the
    /// packet waits in boringtun's queue).
    pub fn outgoing(&mut self, packet: &[u8], scratch: &mut [u8], mut send: impl FnMut(&[u8])) {
        // Cryptokey routing: only what the peer may receive goes to it
        // (not, say, the device's own IPv6 link-local chatter).
        if !Tunn::dst_address(packet).is_some_and(|dst| self.routes(dst)) {
            return;
        }
        match self.tunn.encapsulate(packet, scratch) {
            TunnResult::WriteToNetwork(datagram) => {
                self.tx_bytes += datagram.len() as u64;
                send(datagram);
            }
            TunnResult::Err(e) => tracing::debug!(error = ?e, "cannot encapsulate"),
            TunnResult::Done
            | TunnResult::WriteToTunnelV4(..)
            | TunnResult::WriteToTunnelV6(..) => {}
        }
    }

    /// A datagram from `from`: `send` gets replies for the network
    /// (handshake responses, cookies, queued packets once a session is
    /// up), `deliver` the decrypted IP packets for the tunnel device.
    pub fn incoming(
        &mut self,
        from: SocketAddr,
        datagram: &[u8],
        scratch: &mut [u8],
        mut send: impl FnMut(&[u8]),
        mut deliver: impl FnMut(&[u8]),
    ) -> Result<(), Dropped> {
        let result = match self.tunn.decapsulate(Some(from.ip()), datagram, scratch) {
            TunnResult::Done => Ok(()),
            TunnResult::Err(e) => Err(Dropped::Invalid(describe(&e))),
            TunnResult::WriteToNetwork(reply) => {
                self.tx_bytes += reply.len() as u64;
                send(reply);
                // boringtun then flushes what waited for the handshake.
                while let TunnResult::WriteToNetwork(queued) =
                    self.tunn.decapsulate(None, &[], scratch)
                {
                    self.tx_bytes += queued.len() as u64;
                    send(queued);
                }
                Ok(())
            }
            TunnResult::WriteToTunnelV4(packet, src) => {
                self.accept(packet, src.into(), &mut deliver)
            }
            TunnResult::WriteToTunnelV6(packet, src) => {
                self.accept(packet, src.into(), &mut deliver)
            }
        };
        match &result {
            Ok(()) => {
                // Authenticated: the peer is wherever it sent this from.
                self.rx_bytes += datagram.len() as u64;
                self.endpoint = Some(from);
                self.heard = Some(std::time::Instant::now());
            }
            Err(_) => self.dropped += 1,
        }
        result
    }

    fn accept(
        &mut self,
        packet: &[u8],
        src: IpAddr,
        deliver: &mut impl FnMut(&[u8]),
    ) -> Result<(), Dropped> {
        // A keepalive is an empty data message: nothing to deliver.
        if packet.is_empty() {
            return Ok(());
        }
        if !self.routes(src) {
            return Err(Dropped::NotAllowed(src));
        }
        deliver(packet);
        Ok(())
    }

    /// Drives boringtun's timers (handshake retries, keepalives, rekeys,
    /// expiry); call it every [`TICK`]. `send` gets what is due.
    pub fn tick(&mut self, scratch: &mut [u8], mut send: impl FnMut(&[u8])) {
        match self.tunn.update_timers(scratch) {
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
    }

    pub fn stats(&self) -> Stats {
        let (since_last_handshake, _, _, _, rtt_ms) = self.tunn.stats();
        Stats {
            since_last_handshake,
            handshake_rtt: rtt_ms.map(|ms| Duration::from_millis(ms.into())),
            since_heard: self.heard.map(|t| t.elapsed()),
            tx_bytes: self.tx_bytes,
            rx_bytes: self.rx_bytes,
            dropped: self.dropped,
            endpoint: self.endpoint,
        }
    }
}

/// How often [`Peer::tick`] runs: boringtun's timers have this resolution.
pub const TICK: Duration = Duration::from_millis(250);

fn describe(e: &WireGuardError) -> String {
    format!("{e:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

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
        scratch: Vec<u8>,
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
                scratch: vec![0; SCRATCH],
            }
        }

        /// `a` sends `packet`; datagrams bounce between the two until
        /// none is left. Returns what each side delivered.
        fn a_sends(&mut self, packet: &[u8]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
            let mut to_b: Vec<Vec<u8>> = Vec::new();
            self.a
                .outgoing(packet, &mut self.scratch, |d| to_b.push(d.to_vec()));
            self.exchange(to_b)
        }

        fn exchange(&mut self, mut to_b: Vec<Vec<u8>>) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
            let (mut at_a, mut at_b) = (Vec::new(), Vec::new());
            for _ in 0..10 {
                let mut to_a = Vec::new();
                for d in to_b.drain(..) {
                    let _ = self.b.incoming(
                        self.a_addr,
                        &d,
                        &mut self.scratch,
                        |r| to_a.push(r.to_vec()),
                        |p| at_b.push(p.to_vec()),
                    );
                }
                for d in to_a.drain(..) {
                    let _ = self.a.incoming(
                        self.b_addr,
                        &d,
                        &mut self.scratch,
                        |r| to_b.push(r.to_vec()),
                        |p| at_a.push(p.to_vec()),
                    );
                }
                if to_b.is_empty() {
                    break;
                }
            }
            (at_a, at_b)
        }
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
        let mut to_a = Vec::new();
        pair.b
            .outgoing(&reply, &mut pair.scratch, |d| to_a.push(d.to_vec()));
        let mut at_a = Vec::new();
        for d in to_a {
            pair.a
                .incoming(
                    pair.b_addr,
                    &d,
                    &mut pair.scratch,
                    |_| {},
                    |p| at_a.push(p.to_vec()),
                )
                .expect("authentic");
        }
        assert_eq!(at_a, vec![reply]);
    }

    #[test]
    fn garbage_truncated_replayed_and_spoofed_datagrams_are_dropped() {
        let mut pair = Pair::new();
        pair.a_sends(&ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"up"));
        let packet = ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"data");
        let mut datagrams = Vec::new();
        pair.a
            .outgoing(&packet, &mut pair.scratch, |d| datagrams.push(d.to_vec()));
        let [datagram] = datagrams.as_slice() else {
            panic!("one datagram: {datagrams:?}");
        };
        let delivered = std::cell::Cell::new(0);
        let deliver = |_: &[u8]| delivered.set(delivered.get() + 1);
        // The real one, once.
        let from = pair.a_addr;
        pair.b
            .incoming(from, datagram, &mut pair.scratch, |_| {}, deliver)
            .expect("authentic");
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
            let result = pair.b.incoming(from, d, &mut pair.scratch, |_| {}, deliver);
            if !d.is_empty() {
                assert!(result.is_err(), "{d:?} was accepted");
            }
        }
        assert_eq!(delivered.get(), 1);
        assert!(pair.b.stats().dropped >= before + 4);
        // A packet from outside a's allowed addresses, properly encrypted.
        let spoofed = ipv4([10, 9, 0, 1], [10, 2, 0, 7], b"spoof");
        let mut datagrams = Vec::new();
        pair.a
            .outgoing(&spoofed, &mut pair.scratch, |d| datagrams.push(d.to_vec()));
        let result = pair
            .b
            .incoming(from, &datagrams[0], &mut pair.scratch, |_| {}, deliver);
        assert_eq!(
            result,
            Err(Dropped::NotAllowed(IpAddr::from([10, 9, 0, 1])))
        );
        assert_eq!(delivered.get(), 1);
    }

    #[test]
    fn packets_for_other_destinations_are_not_sent() {
        let mut pair = Pair::new();
        let mut sent = 0;
        for packet in [
            ipv4([10, 1, 0, 5], [10, 3, 0, 1], b"elsewhere"),
            b"not an IP packet".to_vec(),
            Vec::new(),
        ] {
            pair.a.outgoing(&packet, &mut pair.scratch, |_| sent += 1);
        }
        assert_eq!(sent, 0);
    }

    #[test]
    fn the_endpoint_follows_the_peer() {
        let mut pair = Pair::new();
        pair.a_sends(&ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"up"));
        pair.a_addr = "198.51.100.9:40000".parse().expect("addr");
        pair.a_sends(&ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"moved"));
        assert_eq!(pair.b.endpoint(), Some(pair.a_addr));
    }

    #[test]
    fn keys_read_as_wireguard_writes_them() {
        // RFC 7748's test vector: Alice's private and public keys.
        let private: Key = "dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo="
            .parse()
            .expect("key");
        assert_eq!(
            private.public_of_private(),
            "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo="
        );
        assert!("c2hvcnQ=".parse::<Key>().is_err());
        assert!("not base64!".parse::<Key>().is_err());
        assert_eq!(format!("{private:?}"), "Key(..)");
    }
}
