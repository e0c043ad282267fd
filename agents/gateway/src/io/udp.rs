//! The tunnel's UDP socket, with quinn-udp's batching: datagrams laid end
//! to end in one buffer and sent in runs of equal sizes (UDP GSO).

use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{setsockopt, sockopt};
use quinn_udp::{RecvMeta, Transmit, UdpSocketState};

use super::{BATCH, GRO_DATAGRAM, GSO_BYTES, RECEIVE_BUFFER, SEAL, SEND_BUFFER};

/// Gives `socket` room for the bursts that batching makes: the receive
/// buffer past the kernel's cap where the process may raise it, else up
/// to the cap, as the send buffer. Says what it got (the kernel doubles
/// what is asked, for its own bookkeeping).
pub(super) fn enlarge_buffers(socket: &UdpSocket, state: &UdpSocketState) {
    let received = match setsockopt(socket, sockopt::RcvBufForce, &RECEIVE_BUFFER) {
        Ok(()) => Ok(()),
        // Without CAP_NET_ADMIN: up to net.core.rmem_max.
        Err(Errno::EPERM) => state.set_recv_buffer_size(socket.into(), RECEIVE_BUFFER),
        Err(e) => Err(e.into()),
    };
    let sent = state.set_send_buffer_size(socket.into(), SEND_BUFFER);
    for (what, result) in [("receive", received), ("send", sent)] {
        if let Err(e) = result {
            tracing::warn!(error = %e, "cannot enlarge the socket's {what} buffer");
        }
    }
    tracing::info!(
        receive = state.recv_buffer_size(socket.into()).unwrap_or_default(),
        send = state.send_buffer_size(socket.into()).unwrap_or_default(),
        "socket buffers (bytes)"
    );
}

/// The socket, with quinn-udp's view of what the kernel offers.
pub(super) struct Udp {
    pub(super) socket: UdpSocket,
    pub(super) state: UdpSocketState,
}

impl Udp {
    /// Sends `contents` to `to`, cut into datagrams of `segment` bytes
    /// (the last may be shorter). A network that cannot take it now (no
    /// route, refused) loses it, as a link would: that never stops the
    /// tunnel.
    pub(super) fn send(&self, to: SocketAddr, contents: &[u8], segment: usize) {
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
    pub(super) fn recv(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> io::Result<usize> {
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

/// Where the first datagram starts in [`Outgoing`]'s buffer. Data
/// messages are multiples of 16 bytes long, so every one starts 2 past an
/// 8-byte boundary, and the packet boringtun copies to 16 bytes into it
/// shares its alignment with the packet it copies ([`super::SPLIT_AT`]).
pub(super) const SEND_AT: usize = 2;

/// Datagrams laid end to end in one buffer, from [`SEND_AT`], sent as runs
/// of equal sizes. boringtun encrypts straight into it ([`Outgoing::room`]).
pub(super) struct Outgoing {
    /// Grows to what the largest batch needs, once, and stays.
    buf: Vec<u8>,
    /// Where each datagram ends in `buf`, from [`SEND_AT`].
    ends: Vec<usize>,
}

impl Outgoing {
    pub(super) fn new() -> Self {
        Self {
            buf: vec![0; SEND_AT + BATCH * (GRO_DATAGRAM + SEAL)],
            ends: Vec::with_capacity(BATCH * 2),
        }
    }

    pub(super) fn clear(&mut self) {
        self.ends.clear();
    }

    /// Where the datagrams end.
    fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    /// `n` bytes after the last datagram, for the next one.
    pub(super) fn room(&mut self, n: usize) -> &mut [u8] {
        let start = SEND_AT + self.len();
        if self.buf.len() < start + n {
            self.buf.resize(start + n, 0);
        }
        &mut self.buf[start..start + n]
    }

    /// Takes the first `n` bytes of [`Outgoing::room`] as the next
    /// datagram.
    pub(super) fn commit(&mut self, n: usize) {
        let end = self.len() + n;
        self.ends.push(end);
    }

    pub(super) fn push(&mut self, datagram: &[u8]) {
        self.room(datagram.len()).copy_from_slice(datagram);
        self.commit(datagram.len());
    }

    /// Sends everything: each run of datagrams of one size (and a shorter
    /// last one) in one call, up to what GSO takes at once.
    pub(super) fn flush(&mut self, udp: &Udp, to: SocketAddr) {
        let max_segments = udp.state.max_gso_segments().max(1);
        let (mut start, mut i) = (0, 0);
        while i < self.ends.len() {
            let (end, count) = run_from(&self.ends, start, i, max_segments);
            let size = self.ends[i] - start;
            udp.send(to, &self.buf[SEND_AT + start..SEND_AT + end], size);
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

/// Errors of a UDP socket that say something about the network, not about
/// the socket.
pub(super) fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::NetworkUnreachable
            | io::ErrorKind::Interrupted
    )
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

    #[test]
    fn the_receive_buffer_goes_past_the_kernels_cap_with_net_admin() {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let state = UdpSocketState::new((&socket).into()).expect("state");
        let before = state.recv_buffer_size((&socket).into()).expect("size");
        enlarge_buffers(&socket, &state);
        let after = state.recv_buffer_size((&socket).into()).expect("size");
        let cap: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .expect("rmem_max")
            .trim()
            .parse()
            .expect("a number");
        // The kernel reports twice what was set.
        if nix::unistd::geteuid().is_root() {
            assert_eq!(after, 2 * RECEIVE_BUFFER, "forced past the cap of {cap}");
        } else {
            assert_eq!(after, 2 * RECEIVE_BUFFER.min(cap), "up to the cap");
        }
        assert!(after > before, "{before} -> {after}");
    }
}
