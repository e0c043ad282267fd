//! The gateway's Prometheus metrics, served at `/metrics` on the health
//! port: one series per connection, from the tunnels' last reports. A
//! registry is built afresh at each scrape from what the agent observed,
//! so a removed connection's series go with it.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::control::Observed;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    /// `namespace/name` of the Connection.
    connection: String,
    /// The peer's cluster ID.
    peer: String,
}

/// The text exposition of every connection's figures.
pub fn render(observed: &Observed) -> String {
    let mut registry = Registry::with_prefix("liqo_gateway_tunnel");
    let configured = Family::<Labels, Gauge>::default();
    let established = Family::<Labels, Gauge>::default();
    let since = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let rtt = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let probe = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let tx = Family::<Labels, Counter>::default();
    let rx = Family::<Labels, Counter>::default();
    let dropped = Family::<Labels, Counter>::default();
    for (connection, (planned, report)) in observed.read().unwrap_or_else(|e| e.into_inner()).iter()
    {
        let labels = Labels {
            connection: connection.clone(),
            peer: planned.peer_id.clone(),
        };
        configured
            .get_or_create(&labels)
            .set(i64::from(planned.tunnel.is_ok() && report.is_some()));
        established
            .get_or_create(&labels)
            .set(i64::from(report.as_ref().is_some_and(|r| r.established())));
        let Some(report) = report else { continue };
        if let Some(ms) = report.since_handshake_ms {
            since.get_or_create(&labels).set(ms as f64 / 1000.0);
        }
        if let Some(ms) = report.handshake_rtt_ms {
            rtt.get_or_create(&labels).set(ms as f64 / 1000.0);
        }
        if let Some(ms) = report.probe_rtt_ms {
            probe.get_or_create(&labels).set(ms / 1000.0);
        }
        tx.get_or_create(&labels).inc_by(report.tx_bytes);
        rx.get_or_create(&labels).inc_by(report.rx_bytes);
        dropped.get_or_create(&labels).inc_by(report.dropped);
    }
    registry.register(
        "configured",
        "1 while the connection's tunnel process runs",
        configured,
    );
    registry.register(
        "established",
        "1 while a session with the peer is live (a handshake within 3 minutes)",
        established,
    );
    registry.register(
        "seconds_since_handshake",
        "Seconds since the last completed handshake",
        since,
    );
    registry.register(
        "handshake_rtt_seconds",
        "Round-trip time of the last handshake this side initiated",
        rtt,
    );
    registry.register(
        "probe_rtt_seconds",
        "Round-trip time of the last probe through the tunnel (every 5 s)",
        probe,
    );
    registry.register("transmit_bytes", "Bytes sent to the peer, encrypted", tx);
    registry.register(
        "receive_bytes",
        "Bytes received from the peer, encrypted",
        rx,
    );
    registry.register(
        "dropped_datagrams",
        "Datagrams dropped: not WireGuard, not for this peer, replayed, or from outside its addresses",
        dropped,
    );
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}
