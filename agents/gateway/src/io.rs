//! The tunnel's IO: a TUN device and a UDP socket around one [`Peer`].
//!
//! Three tasks share the peer behind a mutex, held only for the protocol
//! work on one batch, never across an await:
//! - device → network: reads the TUN device (with the kernel's offloads
//!   a read is a whole TCP segment of up to 64 KiB, split here into MTU
//!   packets), encrypts, sends;
//! - network → device: receives a datagram, then whatever else is already
//!   waiting (up to [`BATCH`]), decrypts, and writes the packets to the
//!   device in one go, coalesced back into large segments where the
//!   kernel takes them (GRO);
//! - timers: [`Peer::tick`] every [`crate::tunnel::TICK`].
//!
//! Buffers are allocated once per task; nothing is allocated per packet.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::UdpSocket;
use tun_rs::{AsyncDevice, GROTable, IDEAL_BATCH_SIZE, VIRTIO_NET_HDR_LEN};

use crate::tunnel::{Peer, SCRATCH, TICK};

/// How many datagrams are taken from the socket in one batch.
const BATCH: usize = IDEAL_BATCH_SIZE;
/// The largest datagram or IP packet handled.
const MAX_PACKET: usize = 65_535;

/// Runs the tunnel until an IO error on the device or the socket.
pub async fn run(device: AsyncDevice, socket: UdpSocket, peer: Peer) -> io::Result<()> {
    let device = Arc::new(device);
    let socket = Arc::new(socket);
    let peer = Arc::new(Mutex::new(peer));
    tokio::select! {
        result = device_to_network(device.clone(), socket.clone(), peer.clone()) => result,
        result = network_to_device(device, socket.clone(), peer.clone()) => result,
        result = timers(socket, peer) => result,
    }
}

fn lock(peer: &Mutex<Peer>) -> std::sync::MutexGuard<'_, Peer> {
    // A panic elsewhere must not stop the tunnel: the state is still
    // boringtun's, consistent between calls.
    peer.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sends what the protocol produced; a full socket buffer drops the
/// datagram, as a congested link would, and TCP recovers.
fn send_now(socket: &UdpSocket, to: Option<SocketAddr>, datagram: &[u8]) {
    let Some(to) = to else {
        return;
    };
    match socket.try_send_to(datagram, to) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) => tracing::debug!(error = %e, %to, "send"),
    }
}

async fn device_to_network(
    device: Arc<AsyncDevice>,
    socket: Arc<UdpSocket>,
    peer: Arc<Mutex<Peer>>,
) -> io::Result<()> {
    let mut original = vec![0u8; VIRTIO_NET_HDR_LEN + MAX_PACKET];
    let mut packets = vec![vec![0u8; MAX_PACKET]; BATCH];
    let mut sizes = vec![0usize; BATCH];
    let mut scratch = vec![0u8; SCRATCH];
    // Datagrams of one batch, sent after the lock is released.
    let mut out: Vec<Vec<u8>> = (0..BATCH).map(|_| Vec::with_capacity(2048)).collect();
    loop {
        let n = device
            .recv_multiple(&mut original, &mut packets, &mut sizes, 0)
            .await?;
        let mut used = 0;
        let to = {
            let mut peer = lock(&peer);
            for (packet, size) in packets.iter().zip(&sizes).take(n) {
                peer.outgoing(&packet[..*size], &mut scratch, |d| {
                    if let Some(slot) = out.get_mut(used) {
                        slot.clear();
                        slot.extend_from_slice(d);
                        used += 1;
                    }
                });
            }
            peer.endpoint()
        };
        for datagram in &out[..used] {
            if let Some(to) = to {
                // Wait for room rather than drop what the device gave; a
                // network that cannot take it now (no route, refused)
                // loses the datagram, as a link would.
                if let Err(e) = socket.send_to(datagram, to).await {
                    tracing::debug!(error = %e, %to, "send");
                }
            }
        }
    }
}

async fn network_to_device(
    device: Arc<AsyncDevice>,
    socket: Arc<UdpSocket>,
    peer: Arc<Mutex<Peer>>,
) -> io::Result<()> {
    let mut datagram = vec![0u8; MAX_PACKET];
    let mut scratch = vec![0u8; SCRATCH];
    // Decrypted packets, each behind room for the virtio header the
    // device's writes take.
    let mut packets: Vec<Vec<u8>> = (0..BATCH)
        .map(|_| Vec::with_capacity(VIRTIO_NET_HDR_LEN + MAX_PACKET))
        .collect();
    let mut replies: Vec<(Vec<u8>, Option<SocketAddr>)> = Vec::new();
    let mut gro = GROTable::default();
    loop {
        let (len, from) = match socket.recv_from(&mut datagram).await {
            Ok(received) => received,
            // What ICMP reports about earlier sends (refused, unreachable)
            // surfaces here on Linux: not this socket's failure.
            Err(e) if transient(&e) => {
                tracing::debug!(error = %e, "receive");
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut used = 0;
        {
            let mut peer = lock(&peer);
            let mut batch = Batch {
                scratch: &mut scratch,
                packets: &mut packets,
                used: &mut used,
                replies: &mut replies,
            };
            batch.take(&mut peer, from, &datagram[..len]);
            // Whatever else is already there, without waiting.
            while *batch.used < BATCH {
                match socket.try_recv_from(&mut datagram) {
                    Ok((len, from)) => batch.take(&mut peer, from, &datagram[..len]),
                    Err(_) => break,
                }
            }
        }
        // Handshake replies are rare: allocating for them is fine.
        for (reply, to) in replies.drain(..) {
            send_now(&socket, to, &reply);
        }
        if used > 0 {
            device
                .send_multiple(&mut gro, &mut packets[..used], VIRTIO_NET_HDR_LEN)
                .await?;
        }
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

/// What one batch of datagrams from the network produced.
struct Batch<'a> {
    scratch: &'a mut [u8],
    /// Decrypted packets for the device, each behind room for the virtio
    /// header; the first `used` are this batch's.
    packets: &'a mut [Vec<u8>],
    used: &'a mut usize,
    /// Replies for the network, and where to.
    replies: &'a mut Vec<(Vec<u8>, Option<SocketAddr>)>,
}

impl Batch<'_> {
    fn take(&mut self, peer: &mut Peer, from: SocketAddr, datagram: &[u8]) {
        let (packets, used) = (&mut *self.packets, &mut *self.used);
        let mut sent = Vec::new();
        let result = peer.incoming(
            from,
            datagram,
            self.scratch,
            |r| sent.push(r.to_vec()),
            |p| {
                if let Some(slot) = packets.get_mut(*used) {
                    slot.clear();
                    slot.resize(VIRTIO_NET_HDR_LEN, 0);
                    slot.extend_from_slice(p);
                    *used += 1;
                }
            },
        );
        if let Err(why) = result {
            tracing::debug!(%from, %why, "datagram dropped");
        }
        let to = peer.endpoint();
        self.replies.extend(sent.into_iter().map(|r| (r, to)));
    }
}

async fn timers(socket: Arc<UdpSocket>, peer: Arc<Mutex<Peer>>) -> io::Result<()> {
    let mut scratch = vec![0u8; SCRATCH];
    let mut due: Vec<Vec<u8>> = Vec::new();
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut handshaken = false;
    loop {
        interval.tick().await;
        let (to, stats) = {
            let mut peer = lock(&peer);
            peer.tick(&mut scratch, |d| due.push(d.to_vec()));
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
        for datagram in due.drain(..) {
            send_now(&socket, to, &datagram);
        }
    }
}
