//! The timers thread: the peer's timers every [`TICK`], and its counters
//! handed on.

use std::io;
use std::sync::Mutex;
use std::thread;

use super::udp::{Outgoing, Udp};
use super::{OnStats, lock};
use crate::tunnel::{Peer, SESSION, TICK};

pub(super) fn timers(udp: &Udp, peer: &Mutex<Peer>, mut report: OnStats) -> io::Result<()> {
    let mut due = Outgoing::new();
    let mut handshaken = false;
    loop {
        thread::sleep(TICK);
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
    }
}
