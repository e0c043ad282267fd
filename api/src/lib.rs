//! The contract between `liqoctl` and the in-cluster agents: the names,
//! labels and resource types both sides read and write. No IO lives here.

pub mod names;

/// The version of liqo-rs this crate belongs to; `liqoctl`, the agents and
/// the image tags in `manifests/` all carry it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
