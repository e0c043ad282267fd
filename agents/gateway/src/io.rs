//! The tunnel's IO: a TUN device and a UDP socket around one [`Peer`].
//!
//! Three threads share the peer behind a mutex, held only for the
//! protocol work on one batch, never across a system call. Each blocks in
//! its own system calls (no event loop: waking tasks across a runtime's
//! workers cost more than the encryption at these rates), and each
//! direction is one thread from the read to the write: handing batches
//! between two threads per direction cost more in wake-ups than the
//! overlap gained.
//! - device → network: reads the TUN device (with the kernel's offloads
//!   a read is a whole TCP segment of up to 64 KiB, split here into MTU
//!   packets), encrypts the batch straight into one buffer, and sends runs of
//!   equal-sized datagrams with one `sendmsg` each (UDP GSO: the kernel
//!   cuts them);
//! - network → device: receives up to [`quinn_udp::BATCH_SIZE`] buffers
//!   in one `recvmmsg`, each possibly several datagrams the kernel
//!   coalesced (UDP GRO), decrypts them straight into the slots of the
//!   device's next write, and writes the packets to the
//!   device in one go, coalesced back into large segments where the
//!   kernel takes them (TUN GRO);
//! - timers: [`Peer::tick`] every [`crate::tunnel::TICK`].
//!
//! Buffers are allocated once per task; nothing is allocated per packet.
//! quinn-udp does the socket batching (and falls back to one datagram per
//! call where the kernel lacks an offload).

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use std::net::UdpSocket;
use std::os::fd::AsFd;
use std::thread;

use nix::poll::{PollFd, PollFlags, PollTimeout};

use quinn_udp::{RecvMeta, Transmit, UdpSocketState};
use tun_rs::{GROTable, IDEAL_BATCH_SIZE, SyncDevice, VIRTIO_NET_HDR_LEN};

use crate::tunnel::{Peer, TICK};

/// How many packets one read of the device may give.
const BATCH: usize = IDEAL_BATCH_SIZE;
/// The largest datagram or IP packet handled.
const MAX_PACKET: usize = 65_535;
/// The most one GSO send may carry: the payload of one UDP datagram.
const GSO_BYTES: usize = 65_507;
/// Room per datagram in a coalesced receive: what a 1500-byte link
/// carries, and more (a datagram larger than this arrives alone).
const GRO_DATAGRAM: usize = 2048;
/// The socket buffers asked for, each way.
const SOCKET_BUFFER: usize = 4 << 20;
/// A data message's size over its packet's, at most: header and tag (32)
/// and padding to 16 bytes (15).
const SEAL: usize = 32 + 15;

/// What the timers thread tells every [`TICK`]: the peer's counters.
pub type Report = Box<dyn FnMut(&crate::tunnel::Stats) + Send>;

/// Runs the tunnel on threads of its own until an IO error on the
/// device or the socket, which it returns. `report` is given the peer's
/// counters every tick.
pub fn run(device: SyncDevice, socket: UdpSocket, peer: Peer, report: Report) -> io::Result<()> {
    // quinn-udp keeps the socket non-blocking (a blocking recvmmsg would
    // wait for a whole batch): the threads wait in poll() instead.
    let state = UdpSocketState::new((&socket).into())?;
    device.set_nonblocking(false)?;
    // Room for the bursts that batching makes (the kernel caps these at
    // net.core.{r,w}mem_max): a full receive buffer drops datagrams.
    for (what, result) in [
        (
            "receive",
            state.set_recv_buffer_size((&socket).into(), SOCKET_BUFFER),
        ),
        (
            "send",
            state.set_send_buffer_size((&socket).into(), SOCKET_BUFFER),
        ),
    ] {
        if let Err(e) = result {
            tracing::warn!(error = %e, "cannot enlarge the socket's {what} buffer");
        }
    }
    let device = Arc::new(device);
    let udp = Arc::new(Udp { socket, state });
    let peer = Arc::new(Mutex::new(peer));
    let (failed, failure) = std::sync::mpsc::channel();
    let spawn = |name: &str, work: Box<dyn FnOnce() -> io::Result<()> + Send>| {
        let failed = failed.clone();
        thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let _ = failed.send(work());
            })
            .map(drop)
    };
    {
        let (device, udp, peer) = (device.clone(), udp.clone(), peer.clone());
        spawn(
            "tun-to-udp",
            Box::new(move || device_to_network(&device, &udp, &peer)),
        )?;
    }
    {
        let (udp, peer) = (udp.clone(), peer.clone());
        spawn(
            "udp-to-tun",
            Box::new(move || network_to_device(&udp, &device, &peer)),
        )?;
    }
    spawn("timers", Box::new(move || timers(&udp, &peer, report)))?;
    drop(failed);
    failure
        .recv()
        .unwrap_or_else(|_| Err(io::Error::other("the tunnel's threads ended")))
}

/// The socket, with quinn-udp's view of what the kernel offers.
struct Udp {
    socket: UdpSocket,
    state: UdpSocketState,
}

impl Udp {
    /// Sends `contents` to `to`, cut into datagrams of `segment` bytes
    /// (the last may be shorter). A network that cannot take it now (no
    /// route, refused) loses it, as a link would: that never stops the
    /// tunnel.
    fn send(&self, to: SocketAddr, contents: &[u8], segment: usize) {
        let transmit = Transmit {
            destination: to,
            ecn: None,
            contents,
            segment_size: (contents.len() > segment).then_some(segment),
            src_ip: None,
        };
        loop {
            match self.state.try_send((&self.socket).into(), &transmit) {
                Ok(()) => return,
                // Wait for room in the socket's buffer.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if let Err(e) = self.wait(PollFlags::POLLOUT) {
                        tracing::debug!(error = %e, "waiting to send");
                        return;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, %to, "send");
                    return;
                }
            }
        }
    }

    /// Receives a batch, waiting for the first datagram.
    fn recv(&self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> io::Result<usize> {
        loop {
            match self.state.recv((&self.socket).into(), bufs, meta) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait(PollFlags::POLLIN)?,
                other => return other,
            }
        }
    }

    /// Blocks until the socket is ready for `what`.
    fn wait(&self, what: PollFlags) -> io::Result<()> {
        let mut fds = [PollFd::new(self.socket.as_fd(), what)];
        loop {
            match nix::poll::poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => return Ok(()),
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

fn lock(peer: &Mutex<Peer>) -> std::sync::MutexGuard<'_, Peer> {
    // A panic elsewhere must not stop the tunnel: the state is still
    // boringtun's, consistent between calls.
    peer.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Datagrams laid end to end in one buffer, sent as runs of equal sizes.
/// boringtun encrypts straight into it ([`Outgoing::room`]).
struct Outgoing {
    /// Grows to what the largest batch needs, once, and stays.
    buf: Vec<u8>,
    /// Where each datagram ends in `buf`.
    ends: Vec<usize>,
}

impl Outgoing {
    fn new() -> Self {
        Self {
            buf: vec![0; BATCH * (GRO_DATAGRAM + SEAL)],
            ends: Vec::with_capacity(BATCH * 2),
        }
    }

    fn clear(&mut self) {
        self.ends.clear();
    }

    /// Where the datagrams end.
    fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    /// `n` bytes after the last datagram, for the next one.
    fn room(&mut self, n: usize) -> &mut [u8] {
        let start = self.len();
        if self.buf.len() < start + n {
            self.buf.resize(start + n, 0);
        }
        &mut self.buf[start..start + n]
    }

    /// Takes the first `n` bytes of [`Outgoing::room`] as the next
    /// datagram.
    fn commit(&mut self, n: usize) {
        let end = self.len() + n;
        self.ends.push(end);
    }

    fn push(&mut self, datagram: &[u8]) {
        self.room(datagram.len()).copy_from_slice(datagram);
        self.commit(datagram.len());
    }

    /// Sends everything: each run of datagrams of one size (and a shorter
    /// last one) in one call, up to what GSO takes at once.
    fn flush(&mut self, udp: &Udp, to: SocketAddr) {
        let max_segments = udp.state.max_gso_segments().max(1);
        let (mut start, mut i) = (0, 0);
        while i < self.ends.len() {
            let (end, count) = run_from(&self.ends, start, i, max_segments);
            let size = self.ends[i] - start;
            udp.send(to, &self.buf[start..end], size);
            start = end;
            i += count;
        }
        self.clear();
    }
}

/// The run of datagrams that starts with datagram `i` (at `start`) in a
/// buffer whose datagrams end at `ends`: its end and its count. A run is
/// datagrams of the first one's size, at most `max` of them, and may end
/// with one smaller datagram (GSO's rule), and holds at most
/// [`GSO_BYTES`] (a UDP send is one IP packet before the kernel cuts it).
fn run_from(ends: &[usize], start: usize, i: usize, max: usize) -> (usize, usize) {
    let size = ends[i] - start;
    let (mut end, mut count) = (ends[i], 1);
    while i + count < ends.len() && count < max {
        let next = ends[i + count] - end;
        if next > size || end + next - start > GSO_BYTES {
            break;
        }
        end = ends[i + count];
        count += 1;
        if next < size {
            break;
        }
    }
    (end, count)
}

/// Reads the device, encrypts and sends: device → network.
fn device_to_network(device: &SyncDevice, udp: &Udp, peer: &Mutex<Peer>) -> io::Result<()> {
    let mut original = vec![0u8; VIRTIO_NET_HDR_LEN + MAX_PACKET];
    let mut packets = vec![vec![0u8; MAX_PACKET]; BATCH];
    let mut sizes = vec![0usize; BATCH];
    let mut out = Outgoing::new();
    loop {
        let n = match device.recv_multiple(&mut original, &mut packets, &mut sizes, 0) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let to = {
            let mut peer = lock(peer);
            for (packet, size) in packets.iter().zip(&sizes).take(n) {
                let room = out.room(Peer::sealed_room(*size));
                if let Some(sealed) = peer.outgoing(&packet[..*size], room) {
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

/// Decrypted packets, each behind room for the virtio header the device's
/// writes take, at most [`BATCH`] of them: what tun-rs coalesces in one
/// go.
struct Delivered {
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
const SLOT: usize = 2 * VIRTIO_NET_HDR_LEN + MAX_PACKET;

impl Delivered {
    fn new() -> Self {
        Self {
            packets: (0..BATCH).map(|_| Vec::with_capacity(SLOT)).collect(),
            used: 0,
            gro: GROTable::default(),
        }
    }

    /// Writes the packets to the device, coalesced where tun-rs can, and
    /// empties the batch.
    fn write(&mut self, device: &SyncDevice) -> io::Result<()> {
        let used = std::mem::take(&mut self.used);
        if used > 0 {
            device.send_multiple(&mut self.gro, &mut self.packets[..used], VIRTIO_NET_HDR_LEN)?;
        }
        Ok(())
    }

    fn is_full(&self) -> bool {
        self.used == self.packets.len()
    }

    /// `n` bytes of the next slot, after the virtio header: boringtun
    /// decrypts straight into it. The caller ships a full batch first.
    fn room(&mut self, n: usize) -> &mut [u8] {
        let slot = &mut self.packets[self.used];
        let end = VIRTIO_NET_HDR_LEN + n;
        // Only what is missing is zeroed: a slot keeps its length.
        if slot.len() < end {
            slot.resize(end, 0);
        }
        &mut slot[VIRTIO_NET_HDR_LEN..end]
    }

    /// Takes the first `n` bytes of [`Delivered::room`] as the next packet
    /// (none if `n` is 0).
    fn commit(&mut self, n: usize) {
        if n > 0 {
            let slot = &mut self.packets[self.used];
            slot.truncate(VIRTIO_NET_HDR_LEN + n);
            slot[..VIRTIO_NET_HDR_LEN].fill(0);
            self.used += 1;
        }
    }
}

/// Receives, decrypts and writes to the device: network → device.
fn network_to_device(udp: &Udp, device: &SyncDevice, peer: &Mutex<Peer>) -> io::Result<()> {
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

/// Errors of a UDP socket that say something about the network, not about
/// the socket.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::NetworkUnreachable
            | io::ErrorKind::Interrupted
    )
}

fn timers(udp: &Udp, peer: &Mutex<Peer>, mut report: Report) -> io::Result<()> {
    let mut due = Outgoing::new();
    let mut handshaken = false;
    loop {
        thread::sleep(TICK);
        let (to, stats) = {
            let mut peer = lock(peer);
            peer.tick(|d| due.push(d));
            (peer.endpoint(), peer.stats())
        };
        // A session is good for three minutes after its handshake.
        let up = stats
            .since_last_handshake
            .is_some_and(|t| t < std::time::Duration::from_secs(180));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The runs of datagrams of `sizes`: (segment size, count).
    fn runs(sizes: &[usize], max: usize) -> Vec<(usize, usize)> {
        let ends: Vec<usize> = sizes
            .iter()
            .scan(0, |end, s| {
                *end += s;
                Some(*end)
            })
            .collect();
        let mut out = Vec::new();
        let (mut start, mut i) = (0, 0);
        while i < ends.len() {
            let (end, count) = run_from(&ends, start, i, max);
            out.push((ends[i] - start, count));
            start = end;
            i += count;
        }
        out
    }

    #[test]
    fn runs_are_equal_sizes_closed_by_a_smaller_one() {
        assert_eq!(runs(&[100, 100, 100, 60, 100], 64), [(100, 4), (100, 1)]);
        assert_eq!(runs(&[100, 148, 100], 64), [(100, 1), (148, 2)]);
        assert_eq!(runs(&[100; 5], 2), [(100, 2), (100, 2), (100, 1)]);
        assert_eq!(runs(&[], 64), []);
        // No more than one UDP datagram's worth in one send.
        assert_eq!(runs(&[1452; 64], 64), [(1452, 45), (1452, 19)]);
    }
}
