//! What the encryption alone costs: boringtun sealing and opening
//! 1,420-byte packets (an MTU-sized TCP segment in the tunnel) on one
//! core, in a loop, as the tunnel's threads do for every packet: the
//! ceiling of one peering's throughput per direction on the machine it
//! runs on. `tests/bench/tunnel.sh` prints it beside the tunnel's own
//! figures.
//!
//!   cargo bench -p liqo-gateway --bench seal

use std::time::{Duration, Instant};

use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};

/// An IP packet's size: the tunnel's MTU.
const PACKET: usize = 1420;
/// Packets per measurement: 284 MB of them, more than any cache holds.
const PACKETS: usize = 200_000;
/// Measurements; the median is printed.
const ROUNDS: usize = 5;
/// A data message's size: the packet behind a header (16), then the tag
/// (16); boringtun does not pad.
const SEALED: usize = PACKET + 32;

fn main() {
    let (mut sender, mut receiver) = handshaken();
    let packet = ipv4_packet();
    let mut sealed = vec![0u8; SEALED * PACKETS];
    let mut opened = vec![0u8; PACKET + 64];
    let mut seal_times = Vec::with_capacity(ROUNDS);
    let mut open_times = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for slot in sealed.chunks_exact_mut(SEALED) {
            match sender.encapsulate(&packet, slot) {
                TunnResult::WriteToNetwork(out) => assert_eq!(out.len(), SEALED),
                _ => panic!("sealing failed"),
            }
        }
        seal_times.push(start.elapsed());
        let start = Instant::now();
        for slot in sealed.chunks_exact(SEALED) {
            match receiver.decapsulate(None, slot, &mut opened) {
                TunnResult::WriteToTunnelV4(out, _) => assert_eq!(out.len(), PACKET),
                _ => panic!("opening failed"),
            }
        }
        open_times.push(start.elapsed());
    }
    println!(
        "boringtun, {PACKET}-byte packets on one core: seal {:.2} Gbit/s, open {:.2} Gbit/s",
        gbits(&mut seal_times),
        gbits(&mut open_times)
    );
}

/// Gbit of packets per second in the median round.
fn gbits(times: &mut [Duration]) -> f64 {
    times.sort();
    let median = times[times.len() / 2].as_secs_f64();
    (PACKETS * PACKET * 8) as f64 / median / 1e9
}

/// Two ends of a tunnel whose handshake is done, each with a session.
fn handshaken() -> (Tunn, Tunn) {
    let (a, b) = (StaticSecret::from([1u8; 32]), StaticSecret::from([2u8; 32]));
    let (a_public, b_public) = (PublicKey::from(&a), PublicKey::from(&b));
    let mut sender = Tunn::new(a, b_public, None, None, 1, None);
    let mut receiver = Tunn::new(b, a_public, None, None, 2, None);
    let mut initiation = vec![0u8; 256];
    let TunnResult::WriteToNetwork(initiation) =
        sender.format_handshake_initiation(&mut initiation, false)
    else {
        panic!("no handshake initiation");
    };
    let mut response = vec![0u8; 256];
    let TunnResult::WriteToNetwork(response) =
        receiver.decapsulate(None, initiation, &mut response)
    else {
        panic!("no handshake response");
    };
    let mut keepalive = vec![0u8; 256];
    // The initiator's session is up once it reads the response; the
    // responder's once the first data message (a keepalive) arrives.
    if let TunnResult::WriteToNetwork(keepalive) =
        sender.decapsulate(None, response, &mut keepalive)
    {
        let mut out = vec![0u8; 256];
        let _ = receiver.decapsulate(None, keepalive, &mut out);
    }
    (sender, receiver)
}

/// An IPv4 packet of [`PACKET`] bytes, its header complete enough for
/// boringtun to route and size it.
fn ipv4_packet() -> Vec<u8> {
    let mut packet = vec![0xa5u8; PACKET];
    packet[0] = 0x45;
    packet[2..4].copy_from_slice(&u16::try_from(PACKET).unwrap_or(u16::MAX).to_be_bytes());
    packet[8] = 64;
    packet[9] = 6;
    packet[12..16].copy_from_slice(&[10, 99, 0, 1]);
    packet[16..20].copy_from_slice(&[10, 99, 0, 2]);
    packet
}
