//! The sans-IO side of one WireGuard peer: boringtun's `Tunn` (the
//! Noise handshake, sessions, timers) plus what WireGuard asks of the
//! device around it: cryptokey routing of what comes in (a decrypted
//! packet must come from the peer's allowed addresses), roaming (the
//! peer's endpoint is wherever its last authenticated datagram came from),
//! and counters. Bytes in, bytes out, no sockets and no clock of its own
//! beyond boringtun's: [`crate::io`] drives it, and the tests here drive
//! two of them against each other.
//!
//! This layer must not touch a device, a socket, a thread, the API or the
//! host's configuration: whatever does IO lives in [`crate::io`] (the
//! datagrams and packets) or [`crate::nat`] (routes and tables).
//!
//! - [`key`]: WireGuard's keys in their text form;
//! - [`peer`]: one peer's protocol state, its counters and what it drops;
//! - [`probe`]: the round-trip probes the peers answer themselves;
//! - [`report`]: what a tunnel process reports of its tunnel to the agent.

mod key;
mod peer;
mod probe;
mod report;

pub use key::{Key, KeyError};
pub use peer::{Peer, PeerConfig, SESSION, Stats, TICK};
pub use report::Counters;
