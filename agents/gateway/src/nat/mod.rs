//! What the gateway installs on its node for one peer: the route of the
//! peer's pods into the tunnel's device and, when this cluster sees them
//! under a remapped CIDR (theirs overlaps one of ours), one nftables table
//! of its own that translates between the two. It touches nothing else of
//! the host: removing the table and the device restores it.
//!
//! The translation is stateless and keeps the host part:
//! - **outgoing** (postrouting, out of the tunnel's device, so after the
//!   routing decision was taken on the remapped address): the destination,
//!   remapped → the peer's real CIDR;
//! - **incoming** (prerouting at raw priority, into the device, so before
//!   conntrack and routing): the source, the peer's real CIDR → remapped.
//!
//! So real addresses cross the tunnel, and each side needs nothing but its
//! own decision and the peer's real pod CIDR; the peer's decision about us
//! is the peer's own business. Being stateless, it needs no conntrack
//! entry to translate replies, so connections opened from either side work
//! alike; ICMP errors quoting a packet keep the quoted addresses untranslated.
//!
//! This layer owns the host's routes to the peers' pods and our nftables
//! tables, and nothing else of the host; it must not touch the API, a
//! tunnel's keys or its packets.
//!
//! - [`table`]: where a peer's pods are seen, and the table translating;
//! - [`route`]: the route into a tunnel's device.

mod route;
mod table;

pub use route::route;
pub use table::{Installed, PeerPods};

/// Why the route or the table could not be installed or removed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("running {0}")]
    Spawn(&'static str, #[source] std::io::Error),
    #[error("{what} refused {input}: {stderr}")]
    Refused {
        what: &'static str,
        input: String,
        stderr: String,
    },
}
