//! The device → network thread: reads the TUN device, encrypts, sends.

use std::io;
use std::sync::Mutex;

use tun_rs::{SyncDevice, VIRTIO_NET_HDR_LEN};

use super::udp::{Outgoing, Udp};
use super::{BATCH, MAX_PACKET, SPLIT_AT, lock};
use crate::tunnel::Peer;

/// Reads the device, encrypts and sends: device → network.
pub(super) fn device_to_network(
    device: &SyncDevice,
    udp: &Udp,
    peer: &Mutex<Peer>,
) -> io::Result<()> {
    let mut original = vec![0u8; VIRTIO_NET_HDR_LEN + MAX_PACKET];
    let mut packets = vec![vec![0u8; SPLIT_AT + MAX_PACKET]; BATCH];
    let mut sizes = vec![0usize; BATCH];
    let mut out = Outgoing::new();
    loop {
        let n = match device.recv_multiple(&mut original, &mut packets, &mut sizes, SPLIT_AT) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let to = {
            let mut peer = lock(peer);
            for (packet, size) in packets.iter().zip(&sizes).take(n) {
                let room = out.room(Peer::sealed_room(*size));
                if let Some(sealed) = peer.outgoing(&packet[SPLIT_AT..SPLIT_AT + *size], room) {
                    out.commit(sealed);
                }
            }
            peer.endpoint()
        };
        match to {
            Some(to) => out.flush(udp, to),
            None => out.clear(),
        }
    }
}
