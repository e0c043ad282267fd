//! What a tunnel process reports of its tunnel, one JSON object a line
//! on its standard output ([`crate::io`] prints it), and the agent reads
//! to write the Connection's status ([`crate::control`]).

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{SESSION, Stats};

/// A tunnel is established while the peer was heard from this recently
/// (three keepalives) and its session is current.
const HEARD_WITHIN: Duration = Duration::from_secs(30);

/// A tunnel's counters, as its process prints them (one JSON object a
/// line) and the agent reads them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Counters {
    pub since_handshake_ms: Option<u64>,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub dropped: u64,
    pub endpoint: Option<SocketAddr>,
    pub handshake_rtt_ms: Option<u64>,
    #[serde(default)]
    pub since_heard_ms: Option<u64>,
    /// The last probe's round trip through the tunnel, in milliseconds.
    #[serde(default)]
    pub probe_rtt_ms: Option<f64>,
}

impl Counters {
    pub fn of(stats: &Stats) -> Self {
        Self {
            since_handshake_ms: stats.since_last_handshake.map(|d| d.as_millis() as u64),
            tx_bytes: stats.tx_bytes,
            rx_bytes: stats.rx_bytes,
            dropped: stats.dropped,
            endpoint: stats.endpoint,
            handshake_rtt_ms: stats.handshake_rtt.map(|d| d.as_millis() as u64),
            since_heard_ms: stats.since_heard.map(|d| d.as_millis() as u64),
            probe_rtt_ms: stats.probe_rtt.map(|d| d.as_secs_f64() * 1000.0),
        }
    }

    pub fn established(&self) -> bool {
        let within = |ms: Option<u64>, limit: Duration| {
            ms.is_some_and(|ms| Duration::from_millis(ms) < limit)
        };
        within(self.since_handshake_ms, SESSION) && within(self.since_heard_ms, HEARD_WITHIN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip_and_tell_a_live_session() {
        let report = Counters {
            since_handshake_ms: Some(1_000),
            tx_bytes: 10,
            rx_bytes: 20,
            dropped: 0,
            endpoint: Some("127.0.0.1:51820".parse().expect("addr")),
            handshake_rtt_ms: Some(3),
            since_heard_ms: Some(500),
            probe_rtt_ms: Some(0.25),
        };
        let line = serde_json::to_string(&report).expect("json");
        assert_eq!(
            serde_json::from_str::<Counters>(&line).expect("back"),
            report
        );
        assert!(report.established());
        let old = Counters {
            since_handshake_ms: Some(181_000),
            ..report.clone()
        };
        assert!(!old.established());
        let silent = Counters {
            since_heard_ms: Some(31_000),
            ..report
        };
        assert!(!silent.established(), "a peer not heard from for 30 s");
        assert!(!Counters::default().established());
    }
}
