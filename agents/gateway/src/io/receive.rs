//! The network → device thread: receives, decrypts, writes to the device.

use std::io::{self, IoSliceMut};
use std::sync::Mutex;

use quinn_udp::RecvMeta;
use tun_rs::SyncDevice;

use super::device::Delivered;
use super::udp::{Outgoing, Udp, transient};
use super::{GRO_DATAGRAM, MAX_PACKET, lock};
use crate::tunnel::Peer;

/// Receives, decrypts and writes to the device: network → device.
pub(super) fn network_to_device(
    udp: &Udp,
    device: &SyncDevice,
    peer: &Mutex<Peer>,
) -> io::Result<()> {
    let slots = quinn_udp::BATCH_SIZE;
    // With GRO one receive brings up to gro_segments() datagrams laid end
    // to end: a buffer too small for them truncates the lot.
    let slot_size = (udp.state.gro_segments() * GRO_DATAGRAM).max(MAX_PACKET);
    let mut buffers = vec![vec![0u8; slot_size]; slots];
    let mut meta = vec![RecvMeta::default(); slots];
    let mut replies = Outgoing::new();
    let mut delivered = Delivered::new();
    loop {
        let received = {
            let mut iovs: Vec<IoSliceMut<'_>> =
                buffers.iter_mut().map(|b| IoSliceMut::new(b)).collect();
            udp.recv(&mut iovs, &mut meta)
        };
        let count = match received {
            Ok(count) => count,
            // What ICMP reports about earlier sends (refused, unreachable)
            // surfaces here on Linux: not this socket's failure.
            Err(e) if transient(&e) => {
                tracing::debug!(error = %e, "receive");
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut guard = lock(peer);
        for (m, buf) in meta.iter().zip(&buffers).take(count) {
            // An empty datagram is a datagram too (and carries nothing).
            let stride = if m.stride == 0 { m.len } else { m.stride }.max(1);
            for datagram in buf[..m.len].chunks(stride) {
                if delivered.is_full() {
                    // Write it, without holding the peer meanwhile.
                    drop(guard);
                    delivered.write(device)?;
                    guard = lock(peer);
                }
                let room = delivered.room(Peer::opened_room(datagram.len()));
                match guard.incoming(m.addr, datagram, room, |r| replies.push(r)) {
                    Ok(opened) => delivered.commit(opened),
                    Err(why) => tracing::debug!(from = %m.addr, %why, "datagram dropped"),
                }
            }
        }
        let to = guard.endpoint();
        drop(guard);
        // Handshake replies, and what waited for the handshake: rare, and
        // sent from here.
        match to {
            Some(to) => replies.flush(udp, to),
            None => replies.clear(),
        }
        delivered.write(device)?;
    }
}
