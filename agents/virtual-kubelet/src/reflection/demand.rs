//! What the pods of each offloaded namespace request (and the claims kept
//! for it, [`super::claims`]), stated on its twin
//! on the provider (the annotation `liqo.io/demand`), so that the
//! provider's gateway divides the tenant's grant between the twins as the
//! pods need it (docs/offloading.md, "The grant across twin namespaces").
//! A statement, not a claim: however it is divided, the twins' quotas
//! never add up to more than the grant.
//!
//! Level-triggered like the rest: computed from the store of local pods
//! whenever it or the twins change, written where it differs from what
//! was last written, and written again now and then (a twin made again,
//! or its annotation changed by someone else).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use liqo_agent_runtime::follow::Followed;
use liqo_api::shares::{DEMAND_ANNOTATION, demand_annotation};
use liqo_api::sharing::Amounts;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Error;
use super::namespace::{PeeringContext, Twins};
use super::pod::LocalPod;

/// Changes closer together than this are stated once.
const DEBOUNCE: Duration = Duration::from_secs(1);
/// A statement is written again after this long, changed or not.
const REWRITE: Duration = Duration::from_secs(60);
/// How soon a failed write is tried again.
const RETRY: Duration = Duration::from_secs(2);

/// What the pods bound to the node request, by local namespace: every pod
/// that has not ended (one being deleted still runs on the provider).
pub fn demands<'a>(pods: impl IntoIterator<Item = &'a LocalPod>) -> BTreeMap<String, Amounts> {
    let mut out: BTreeMap<String, Amounts> = BTreeMap::new();
    for pod in pods {
        if pod.ended() {
            continue;
        }
        let d = out.entry(pod.namespace.to_string()).or_default();
        d.cpu_millis = d.cpu_millis.saturating_add(pod.requests.cpu_millis);
        d.memory_bytes = d.memory_bytes.saturating_add(pod.requests.memory_bytes);
        d.pods += 1;
    }
    out
}

/// States the demands on the twins, for ever.
pub async fn keep(
    peering: PeeringContext,
    pods: Followed<LocalPod>,
    claims: super::claims::ClaimDemand,
    mut twins: watch::Receiver<Twins>,
) {
    let mut pod_state = pods.state.clone();
    // Twin → the statement last written there, and when.
    let mut written: BTreeMap<String, (String, Instant)> = BTreeMap::new();
    let mut failing: Option<String> = None;
    let mut wait = REWRITE;
    loop {
        tokio::select! {
            _ = pod_state.changed() => {}
            () = claims.changed.notified() => {}
            _ = twins.changed() => {}
            () = tokio::time::sleep(wait) => {}
        }
        tokio::time::sleep(DEBOUNCE).await;
        wait = REWRITE;
        if !pods.is_current() {
            continue;
        }
        let twins_now = twins.borrow().clone();
        let demands = demands(pods.store.state().iter().map(|p| &**p));
        written.retain(|twin, _| twins_now.values().any(|t| t == twin));
        for (local_ns, twin) in &twins_now {
            let mut demand = demands.get(local_ns).copied().unwrap_or_default();
            let stored = claims.of(local_ns);
            demand.storage_bytes = stored.storage_bytes;
            demand.claims = stored.claims;
            let text = demand_annotation(&demand);
            if written
                .get(twin)
                .is_some_and(|(t, at)| *t == text && at.elapsed() < REWRITE)
            {
                continue;
            }
            match state(&peering, twin, &text).await {
                Ok(()) => {
                    tracing::debug!(%twin, demand = %text, "demand stated");
                    written.insert(twin.clone(), (text, Instant::now()));
                    failing = None;
                }
                Err(error) => {
                    let error = error.chain();
                    if failing.as_ref() != Some(&error) {
                        tracing::warn!(%twin, %error, "cannot state the twin's demand");
                        failing = Some(error);
                    }
                    wait = RETRY;
                }
            }
        }
    }
}

async fn state(peering: &PeeringContext, twin: &str, text: &str) -> Result<(), Error> {
    let provider = peering.provider_client()?;
    let patch = json!({ "metadata": { "annotations": { DEMAND_ANNOTATION: text } } });
    Api::<Namespace>::all(provider)
        .patch(twin, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| Error::StateDemand {
            twin: twin.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn pod(ns: &str, phase: &str, cpu: &str, memory: &str) -> LocalPod {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": "p", "namespace": ns, "uid": "u" },
            "spec": { "containers": [{
                "name": "c",
                "resources": { "requests": { "cpu": cpu, "memory": memory } },
            }] },
            "status": { "phase": phase },
        }))
        .expect("a pod");
        LocalPod::from(pod)
    }

    #[test]
    fn demands_add_up_per_namespace_without_ended_pods() {
        let pods = [
            pod("a", "Running", "500m", "1Gi"),
            pod("a", "Pending", "250m", "512Mi"),
            pod("a", "Succeeded", "4", "8Gi"),
            pod("b", "Running", "1", "0"),
            pod("b", "Failed", "1", "0"),
        ];
        let d = demands(pods.iter());
        assert_eq!(
            d["a"],
            Amounts {
                cpu_millis: 750,
                memory_bytes: 1536 << 20,
                pods: 2,
                ..Amounts::default()
            }
        );
        assert_eq!(
            d["b"],
            Amounts {
                cpu_millis: 1000,
                memory_bytes: 0,
                pods: 1,
                ..Amounts::default()
            }
        );
    }
}
