//! Decrypted packets on their way to the TUN device, written in batches
//! that tun-rs coalesces (TUN GRO).

use std::io;

use tun_rs::{GROTable, SyncDevice, VIRTIO_NET_HDR_LEN};

use super::{BATCH, MAX_PACKET};

/// Where a decrypted packet starts in its slot, the virtio header the
/// device's writes take just before it. boringtun copies a packet's
/// ciphertext there from 16 bytes into its datagram, and the datagrams of
/// a coalesced receive start at multiples of their size, itself a
/// multiple of 16: so both ends of the copy are aligned to 8 (docs of
/// [`super`]). So are the segments tun-rs then appends to a flow's first
/// packet, whose payloads are multiples of 8 long.
pub(super) const PACKET_AT: usize = 16;

/// Decrypted packets, each behind room for the virtio header the device's
/// writes take, at most [`BATCH`] of them: what tun-rs coalesces in one
/// go.
pub(super) struct Delivered {
    packets: Vec<Vec<u8>>,
    used: usize,
    /// tun-rs's state for coalescing, kept between writes.
    gro: GROTable,
}

/// The room each of [`Delivered`]'s slots has. tun-rs coalesces a TCP
/// flow's packets by appending them to the first one's buffer, and only
/// where that buffer already has room for a whole segment (it never
/// reallocates): with less, every packet reaches the kernel alone, and
/// the kernel's receive path costs per packet.
const SLOT: usize = PACKET_AT + VIRTIO_NET_HDR_LEN + MAX_PACKET;

impl Delivered {
    pub(super) fn new() -> Self {
        Self {
            packets: (0..BATCH).map(|_| Vec::with_capacity(SLOT)).collect(),
            used: 0,
            gro: GROTable::default(),
        }
    }

    /// Writes the packets to the device, coalesced where tun-rs can, and
    /// empties the batch.
    pub(super) fn write(&mut self, device: &SyncDevice) -> io::Result<()> {
        let used = std::mem::take(&mut self.used);
        if used > 0 {
            device.send_multiple(&mut self.gro, &mut self.packets[..used], PACKET_AT)?;
        }
        Ok(())
    }

    pub(super) fn is_full(&self) -> bool {
        self.used == self.packets.len()
    }

    /// `n` bytes of the next slot, after the virtio header: boringtun
    /// decrypts straight into it. The caller ships a full batch first.
    pub(super) fn room(&mut self, n: usize) -> &mut [u8] {
        let slot = &mut self.packets[self.used];
        let end = PACKET_AT + n;
        // Only what is missing is zeroed: a slot keeps its length.
        if slot.len() < end {
            slot.resize(end, 0);
        }
        &mut slot[PACKET_AT..end]
    }

    /// Takes the first `n` bytes of [`Delivered::room`] as the next packet
    /// (none if `n` is 0).
    pub(super) fn commit(&mut self, n: usize) {
        if n > 0 {
            let slot = &mut self.packets[self.used];
            slot.truncate(PACKET_AT + n);
            slot[PACKET_AT - VIRTIO_NET_HDR_LEN..PACKET_AT].fill(0);
            self.used += 1;
        }
    }
}
