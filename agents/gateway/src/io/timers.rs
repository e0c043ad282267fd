//! The timers thread: the peer's timers every [`TICK`], and its counters
//! handed on.

use std::io;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use super::udp::{Outgoing, Udp};
use super::{OnStats, lock};
use crate::tunnel::{Peer, SESSION, TICK};

/// How often the timers run until the first handshake completes, for the
/// first [`QUICK_FOR`] of a tunnel: the handshake starts at once and the
/// tunnel is told up within this of it (a peering waits for it).
const QUICK_TICK: Duration = Duration::from_millis(20);
const QUICK_FOR: Duration = Duration::from_secs(3);

pub(super) fn timers(udp: &Udp, peer: &Mutex<Peer>, mut report: OnStats) -> io::Result<()> {
    let mut due = Outgoing::new();
    let mut handshaken = false;
    let started = Instant::now();
    loop {
        let (to, stats) = {
            let mut peer = lock(peer);
            peer.tick(|d| due.push(d));
            (peer.endpoint(), peer.stats())
        };
        let up = stats.since_last_handshake.is_some_and(|t| t < SESSION);
        if up != handshaken {
            handshaken = up;
            tracing::info!(up, ?stats, "tunnel");
        }
        report(&stats);
        match to {
            Some(to) => due.flush(udp, to),
            None => due.clear(),
        }
        let quick = !handshaken && started.elapsed() < QUICK_FOR;
        thread::sleep(if quick { QUICK_TICK } else { TICK });
    }
}
