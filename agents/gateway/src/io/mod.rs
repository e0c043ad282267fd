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
//! Where bytes are copied from one buffer to another (tun-rs splitting
//! and coalescing segments, boringtun copying a packet before it seals or
//! opens it in place), both ends share their alignment to 8 bytes
//! ([`SPLIT_AT`], [`udp::SEND_AT`], [`device::PACKET_AT`]): the static
//! images' C library (musl) copies with `rep movsq` after aligning the
//! destination, which the processor runs at a fraction of its speed when
//! the source is aligned differently. Measured, in the tunnel between two
//! namespaces with the static binary: docs/benchmarks.md, "Tunnel".
//! quinn-udp does the socket batching (and falls back to one datagram per
//! call where the kernel lacks an offload).
//!
//! This layer owns the device, the socket and the threads that move bytes
//! between them; it must not decide anything about a peer (that is the
//! sans-IO [`crate::tunnel`]'s) nor touch the API.
//!
//! - [`udp`]: the socket, and datagrams sent in runs (GSO);
//! - [`device`]: packets written to the TUN device in batches (GRO);
//! - [`send`], [`receive`], [`timers`]: one thread each;
//! - [`process`]: the `tunnel` subcommand, which builds the device, the
//!   socket, the peer and its route and NAT table from its flags.

mod device;
pub mod process;
mod receive;
mod send;
mod timers;
mod udp;

use std::io;
use std::net::UdpSocket;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;

use quinn_udp::UdpSocketState;
use tun_rs::{IDEAL_BATCH_SIZE, SyncDevice};

use crate::tunnel::Peer;

/// How many packets one read of the device may give.
const BATCH: usize = IDEAL_BATCH_SIZE;
/// The largest datagram or IP packet handled.
const MAX_PACKET: usize = 65_535;
/// The most one GSO send may carry: the payload of one UDP datagram.
const GSO_BYTES: usize = 65_507;
/// Room per datagram in a coalesced receive: what a 1500-byte link
/// carries, and more (a datagram larger than this arrives alone).
const GRO_DATAGRAM: usize = 2048;
/// The receive buffer asked for. Past `net.core.rmem_max` where the
/// gateway may (it holds `CAP_NET_ADMIN`): when the receiving thread
/// waits for a core, datagrams queue here, and a full buffer drops a
/// whole coalesced run of them (up to 64 KiB of TCP segments) at once.
const RECEIVE_BUFFER: usize = 16 << 20;
/// The send buffer asked for (up to `net.core.wmem_max`): a full one makes
/// the sender wait, never drops.
const SEND_BUFFER: usize = 4 << 20;
/// A data message's size over its packet's, at most: header and tag (32)
/// and padding to 16 bytes (15).
const SEAL: usize = 32 + 15;
/// Where the device's reads put each packet they split from a segment.
/// The segment is read after the virtio header (10 bytes) into a buffer
/// aligned to 8 or more, so its bytes lie 2 past an 8-byte boundary: the
/// split packets are put likewise, and boringtun copies each to 16 bytes
/// into its datagram, which [`udp::SEND_AT`] puts 2 past a boundary too.
const SPLIT_AT: usize = 2;

/// What the timers thread tells every [`crate::tunnel::TICK`]: the
/// peer's counters.
pub type OnStats = Box<dyn FnMut(&crate::tunnel::Stats) + Send>;

/// Runs the tunnel on threads of its own until an IO error on the
/// device or the socket, which it returns. `report` is given the peer's
/// counters every tick.
pub fn run(device: SyncDevice, socket: UdpSocket, peer: Peer, report: OnStats) -> io::Result<()> {
    // quinn-udp keeps the socket non-blocking (a blocking recvmmsg would
    // wait for a whole batch): the threads wait in poll() instead.
    let state = UdpSocketState::new((&socket).into())?;
    device.set_nonblocking(false)?;
    udp::enlarge_buffers(&socket, &state);
    let device = Arc::new(device);
    let udp = Arc::new(udp::Udp { socket, state });
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
            Box::new(move || send::device_to_network(&device, &udp, &peer)),
        )?;
    }
    {
        let (udp, peer) = (udp.clone(), peer.clone());
        spawn(
            "udp-to-tun",
            Box::new(move || receive::network_to_device(&udp, &device, &peer)),
        )?;
    }
    spawn(
        "timers",
        Box::new(move || timers::timers(&udp, &peer, report)),
    )?;
    drop(failed);
    failure
        .recv()
        .unwrap_or_else(|_| Err(io::Error::other("the tunnel's threads ended")))
}

fn lock(peer: &Mutex<Peer>) -> std::sync::MutexGuard<'_, Peer> {
    // Release builds abort on a panic (the workspace's profile); in a
    // build that unwinds, a panic elsewhere must not stop the tunnel: the
    // state is still boringtun's, consistent between calls.
    peer.lock().unwrap_or_else(PoisonError::into_inner)
}
