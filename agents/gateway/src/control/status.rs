//! What is written of each tunnel: a Connection's status, written when a
//! condition or decision changes, and the counters its process reports
//! ([`Counters`]) at most every [`COUNTERS_EVERY`].

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use liqo_api::networking::{Connection, ConnectionStatus, conditions};

use super::endpoints::published_endpoint;
use super::plan::Planned;
use super::supervisor::{RESTART_BACKOFF, Tunnels};
use crate::tunnel::Counters;

/// The most often counters alone are written to a status.
pub const COUNTERS_EVERY: Duration = Duration::from_secs(10);
impl Tunnels {
    /// `process`: whether a process runs, and why the last one ended if
    /// none has reported since.
    pub(super) fn status_of(
        &self,
        p: &Planned,
        process: (bool, Option<&str>),
        report: Option<&Counters>,
        pod_cidr: Option<String>,
        service: Option<&Service>,
    ) -> ConnectionStatus {
        let previous = self
            .written
            .get(&p.object)
            .map(|(s, _)| s.conditions.clone())
            .unwrap_or_default();
        let now = Time(Timestamp::now());
        let mut status = ConnectionStatus {
            public_key: Some(self.key.public_of_private()),
            pod_cidr,
            ..Default::default()
        };
        let (configured, established) = match &p.tunnel {
            Err(why) => (
                ("False", "Refused", why.to_string()),
                ("False", "NotConfigured", "the tunnel cannot run".to_owned()),
            ),
            Ok(tunnel) => {
                status.peer_seen_as = Some(tunnel.seen_as.to_string());
                status.interface = Some(tunnel.device.clone());
                let mut exposure = Ok(());
                if tunnel.endpoint.is_none() {
                    status.listen_port = Some(tunnel.port);
                    match published_endpoint(
                        self.settings.endpoint_host.as_deref(),
                        self.settings.exposed_by.map(|t| (t, service)),
                        tunnel.port,
                    ) {
                        Ok(endpoint) => status.endpoint = endpoint,
                        Err(why) => exposure = Err(why),
                    }
                }
                let (running, ended) = process;
                let configured = if let Err(why) = exposure {
                    ("False", "NotExposed", why.to_string())
                } else if let Some(why) = ended {
                    (
                        "False",
                        conditions::FAILING,
                        format!(
                            "the tunnel's process ended: {why}; it is started again every {}s",
                            RESTART_BACKOFF.as_secs()
                        ),
                    )
                } else if running {
                    (
                        "True",
                        "Running",
                        format!("the tunnel runs on {}", tunnel.device),
                    )
                } else {
                    (
                        "False",
                        "NotRunning",
                        "the tunnel's process is not running (see the gateway's log); \
                         it is started again"
                            .to_owned(),
                    )
                };
                let established = match report {
                    Some(r) if r.established() => (
                        "True",
                        "Handshake",
                        "a session with the peer is live".to_owned(),
                    ),
                    _ => (
                        "False",
                        "NoHandshake",
                        match &tunnel.endpoint {
                            Some(e) => format!("no handshake with the peer's gateway at {e}"),
                            None => "waiting for the peer's gateway to dial".to_owned(),
                        },
                    ),
                };
                if let Some(r) = report {
                    status.tx_bytes = r.tx_bytes;
                    status.rx_bytes = r.rx_bytes;
                    // The probes' when there are any, else the handshake's.
                    status.rtt_ms = r
                        .probe_rtt_ms
                        .map(|ms| (ms * 1000.0).round() / 1000.0)
                        .or(r.handshake_rtt_ms.map(|ms| ms as f64));
                    status.last_handshake = r.since_handshake_ms.map(|ms| {
                        // Whole seconds: a report's age jitters by its tick.
                        let at = Timestamp::now().as_second() - (ms / 1000) as i64;
                        Timestamp::from_second(at)
                            .map(|t| t.to_string())
                            .unwrap_or_default()
                    });
                }
                (configured, established)
            }
        };
        for (type_, (state, reason, message)) in [
            (conditions::CONFIGURED, configured),
            (conditions::ESTABLISHED, established),
        ] {
            let transition = previous
                .iter()
                .find(|c| c.type_ == type_ && c.status == state)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            status.conditions.push(Condition {
                type_: type_.to_owned(),
                status: state.to_owned(),
                reason: reason.to_owned(),
                message,
                last_transition_time: transition,
                observed_generation: None,
            });
        }
        status
    }

    /// Writes `status` when something other than counters changed, or
    /// counters changed and were last written [`COUNTERS_EVERY`] ago.
    pub(super) async fn write_status(
        &mut self,
        object: &ObjectRef<Connection>,
        status: ConnectionStatus,
    ) {
        let due = match self.written.get(object) {
            None => true,
            Some((last, at)) => {
                let decisions = |s: &ConnectionStatus| {
                    let mut s = s.clone();
                    (s.tx_bytes, s.rx_bytes, s.rtt_ms, s.last_handshake) = (0, 0, None, None);
                    for c in &mut s.conditions {
                        c.last_transition_time = Time(Timestamp::UNIX_EPOCH);
                    }
                    s
                };
                decisions(last) != decisions(&status)
                    || (last != &status && at.elapsed() >= COUNTERS_EVERY)
            }
        };
        if !due {
            return;
        }
        let Some(namespace) = object.namespace.as_deref() else {
            return;
        };
        let api: Api<Connection> = Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({ "status": status });
        match api
            .patch_status(&object.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {
                self.written
                    .insert(object.clone(), (status, Instant::now()));
            }
            // Deleted meanwhile: the next pass forgets it.
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!(connection = %object, error = %e, "cannot write the status"),
        }
    }
}
