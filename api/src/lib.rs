//! The contract between `liqoctl` and the in-cluster agents: the names,
//! labels and resource types both sides read and write. No IO lives here.

pub mod identity;
pub mod names;
pub mod resources;

pub use identity::{ClusterId, ClusterIdentity};

/// The version of liqo-rs this crate belongs to; `liqoctl`, the agents and
/// the image tags in `manifests/` all carry it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Parses an IPv4 or IPv6 CIDR such as `10.200.0.0/16`, normalised to its
/// network address; `what` names it in the error.
pub fn parse_cidr(what: &str, value: &str) -> Result<ipnet::IpNet, String> {
    let net: ipnet::IpNet = value
        .parse()
        .map_err(|_| format!("{what} {value:?} is not a CIDR such as 10.0.0.0/16"))?;
    Ok(net.trunc())
}
