//! The control layer: one tunnel for each Connection of the cluster,
//! run as the gateway's own `tunnel` subcommand in a child process, and
//! the status each one reports.
//!
//! This layer owns what the gateway reads and writes in the API for its
//! tunnels and the processes it runs them in; it must not touch a
//! tunnel's packets, sockets or devices (those are the `tunnel`
//! process's: [`crate::io`], [`crate::nat`]).
//!
//! - [`keys`]: the gateway's key pair, kept in a Secret;
//! - [`pins`]: the network each tenant's end of the tunnel is fixed to;
//! - [`plan`]: the decisions, pure;
//! - [`supervisor`]: the tunnel processes;
//! - [`status`]: what each tunnel reports, and the Connections' statuses;
//! - [`endpoints`]: where peers dial a listening tunnel;
//! - [`readiness`]: whether the agent is ready.

mod endpoints;
mod keys;
mod pins;
mod plan;
mod readiness;
mod status;
mod supervisor;

use std::collections::BTreeMap;

use ipnet::IpNet;
use liqo_api::names::labels;
use liqo_api::networking::GatewayServiceType;

pub use endpoints::listen_address;
pub use keys::ensure_key;
pub use readiness::ReadinessInputs;
pub use supervisor::{Observed, TUNNEL_FAILED, Tunnels, run_tunnels};

/// The field manager of what the gateway writes.
const MANAGER: &str = "liqo-gateway";

/// How the agent runs tunnels: from its flags.
#[derive(Debug, Clone)]
pub struct Settings {
    /// What sets this gateway's tunnel devices apart from another's on
    /// the same host: its public key.
    pub instance: String,
    /// The gateway's namespace: connections there dial their provider;
    /// connections anywhere else (tenant namespaces) listen.
    pub namespace: String,
    /// The host peers dial (an address or a DNS name), published with the
    /// port in the status of listening connections.
    pub endpoint_host: Option<String>,
    /// The Service in front of the listening tunnels, if any: the
    /// published endpoint comes from it (see [`published_endpoint`]).
    pub exposed_by: Option<GatewayServiceType>,
    /// Where tunnels bind: the endpoint's address when it is one of the
    /// node's (so that answers leave from the address peers dial, on a
    /// node with several), else every address.
    pub listen_address: std::net::IpAddr,
    /// The UDP ports listening connections take, one each.
    pub ports: std::ops::RangeInclusive<u16>,
    pub remap_pool: Vec<IpNet>,
    /// The tunnel devices' MTU.
    pub mtu: u16,
    /// The network namespace the tunnels (their devices, sockets, routes
    /// and tables) live in, when not the agent's own.
    pub netns: Option<std::path::PathBuf>,
}

pub(crate) fn our_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        ),
        (labels::COMPONENT.to_owned(), "gateway".to_owned()),
    ])
}

pub(crate) fn is_ours(l: &BTreeMap<String, String>) -> bool {
    l.get(labels::MANAGED_BY).map(String::as_str) == Some(labels::MANAGED_BY_VALUE)
}
