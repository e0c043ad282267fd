//! Running a pod's startup, readiness and liveness probes when they are
//! due, and acting on their verdicts: `Unhealthy` events, and a restart of
//! a container that fails its startup or liveness probe.

use std::time::Instant;

use super::super::probe::{Dialer, Prober};
use super::{Event, PodRuntime};

/// Which probe.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Startup,
    Readiness,
    Liveness,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Startup => "Startup",
            Self::Readiness => "Readiness",
            Self::Liveness => "Liveness",
        }
    }
}

impl PodRuntime {
    /// Runs the probes that are due, all at once, and acts on the verdicts:
    /// readiness and liveness wait for the startup probe; a container that
    /// fails its startup or liveness probe is stopped, to be restarted.
    pub(super) async fn probe(&mut self, dialer: &Dialer) {
        let now = Instant::now();
        let mut due = Vec::new();
        for (i, c) in self.containers.iter().enumerate() {
            let Some(running) = c.running.as_ref().filter(|r| r.kill_at.is_none()) else {
                continue;
            };
            let started = c.startup.as_ref().is_none_or(Prober::healthy);
            let probers = [
                (Kind::Startup, c.startup.as_ref().filter(|_| !started)),
                (Kind::Readiness, c.readiness.as_ref().filter(|_| started)),
                (Kind::Liveness, c.liveness.as_ref().filter(|_| started)),
            ];
            for (kind, prober) in probers {
                if let Some(p) = prober.filter(|p| p.due(now)) {
                    due.push((i, kind, p, &running.exec));
                }
            }
        }
        if due.is_empty() {
            return;
        }
        let outcomes =
            futures::future::join_all(due.iter().map(|(_, _, p, exec)| p.run(dialer, exec))).await;
        let due: Vec<(usize, Kind)> = due.into_iter().map(|(i, k, _, _)| (i, k)).collect();
        for ((i, kind), outcome) in due.into_iter().zip(outcomes) {
            let label = self.label(&self.containers[i].spec.name);
            let grace = self.grace;
            let c = &mut self.containers[i];
            let Some(prober) = (match kind {
                Kind::Startup => c.startup.as_mut(),
                Kind::Readiness => c.readiness.as_mut(),
                Kind::Liveness => c.liveness.as_mut(),
            }) else {
                continue;
            };
            let healthy = prober.record(now, outcome.is_ok());
            if let Some(why) = prober.report(&outcome) {
                tracing::info!(container = %label, "{} probe failed: {why}", kind.name());
                let message = format!("{} probe failed: {why}", kind.name());
                self.events
                    .push(Event::warning(c.spec.name.clone(), "Unhealthy", message));
            }
            let kills = matches!(kind, Kind::Startup | Kind::Liveness);
            if kills
                && !healthy
                && prober.failed_out()
                && let Some(running) = c.running.as_mut()
            {
                tracing::info!(container = %label, "{} probe failed; restarting", kind.name());
                let message = format!(
                    "Container {} failed {} probe, will be restarted",
                    c.spec.name,
                    kind.name().to_ascii_lowercase()
                );
                self.events
                    .push(Event::normal(c.spec.name.clone(), "Killing", message));
                running.process.terminate();
                running.kill_at = Some(now + grace);
            }
        }
    }
}
