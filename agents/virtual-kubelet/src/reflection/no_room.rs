//! Pods that the consumer's scheduler does not bind to the virtual node
//! because no node of the provider has room for them: the placement
//! policy makes every pod of an offloaded namespace ask for a virtual node
//! whose largest-free labels hold it (docs/offloading.md, "A pod no node
//! can hold"), and the scheduler's own reason says no more than "didn't
//! match Pod's node affinity/selector". So each such pending pod of a
//! namespace offloaded here gets one Warning Event of this agent, reason
//! [`REASON`], naming the provider, what the pod asks and the most free on
//! one of its nodes.
//!
//! Level-triggered: the unbound pending pods of the cluster are followed,
//! and looked at whenever they, the twins or the provider's bound change,
//! and every [`TICK`]. The Event is named after the pod and the provider,
//! so that it is written once per pod whatever restarts (a second create
//! gets 409); what was written is remembered only to spare the API.

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use liqo_agent_runtime::follow::follow;
use liqo_api::names;
use tokio::sync::watch;

use super::namespace::{PeeringContext, Twins};
use crate::node::FIELD_MANAGER;

/// The Event's reason.
pub const REASON: &str = "NoRoomOnProvider";
/// How often the pods are looked at, changed or not.
const TICK: Duration = Duration::from_secs(5);

/// Whether `pod` is one the scheduler left unbound (`PodScheduled` False,
/// `Unschedulable`) that the placement policy let onto virtual nodes (it
/// tolerates their taint), in a namespace offloaded here.
pub fn waiting_here(pod: &Pod, twins: &Twins) -> bool {
    let spec = pod.spec.as_ref();
    let bound = spec.and_then(|s| s.node_name.as_deref()).is_some();
    let tolerates = spec.and_then(|s| s.tolerations.as_ref()).is_some_and(|ts| {
        ts.iter()
            .any(|t| t.key.as_deref() == Some(names::VIRTUAL_NODE_TAINT))
    });
    let unschedulable = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
        });
    let offloaded_here = pod
        .metadata
        .namespace
        .as_ref()
        .is_some_and(|ns| twins.contains_key(ns));
    !bound && tolerates && unschedulable && offloaded_here
}

/// The Event's name: one per pod and provider.
pub fn event_name(pod: &Pod, provider: &str) -> String {
    format!(
        "{}.{}.noroom-{provider}",
        pod.name_any(),
        pod.uid().unwrap_or_default()
    )
}

/// Says why on every unbound pod of a namespace offloaded here that the
/// provider has no node for.
pub async fn keep(peering: PeeringContext, mut twins: watch::Receiver<Twins>) {
    let (pending, follow_pending) = follow(
        Api::<Pod>::all(peering.local.clone()),
        watcher::Config::default().fields("spec.nodeName=,status.phase=Pending"),
        "unbound pods",
    );
    let mut largest = peering.largest_free_node.clone();
    let mut changed = pending.clone();
    let said = async move {
        // The pods said of, by UID; forgotten as they leave the store.
        let mut said: HashSet<String> = HashSet::new();
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let pods = pending.store.state();
            let here = twins.borrow().clone();
            let present: HashSet<String> = pods.iter().filter_map(|p| p.uid()).collect();
            said.retain(|uid| present.contains(uid));
            for pod in pods.iter().filter(|p| waiting_here(p, &here)) {
                let uid = pod.uid().unwrap_or_default();
                if said.contains(&uid) {
                    continue;
                }
                let Some(why) = peering.unplaceable(pod) else {
                    continue;
                };
                match say(&peering, pod, &why).await {
                    Ok(()) => {
                        said.insert(uid);
                    }
                    Err(error) => {
                        tracing::warn!(pod = %pod.name_any(), %error, "cannot say why the pod waits");
                    }
                }
            }
            tokio::select! {
                _ = ticker.tick() => {}
                r = changed.state.changed() => if r.is_err() { return },
                r = twins.changed() => if r.is_err() { return },
                r = largest.changed() => if r.is_err() { return },
            }
        }
    };
    tokio::join!(follow_pending, said);
}

async fn say(peering: &PeeringContext, pod: &Pod, why: &str) -> Result<(), kube::Error> {
    let provider = peering.provider_id.as_str();
    let event = crate::forge::event::warning(
        pod,
        Some(event_name(pod, provider)),
        REASON,
        why,
        FIELD_MANAGER,
        &peering.node_name,
        Time(Timestamp::now()),
    );
    let events: Api<Event> =
        Api::namespaced(peering.local.clone(), &pod.namespace().unwrap_or_default());
    match events.create(&PostParams::default(), &event).await {
        Ok(_) => {
            tracing::info!(pod = %pod.name_any(), %why, "no room on the provider");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_unbound_pods_placed_for_virtual_nodes_of_namespaces_offloaded_here() {
        let pod = |ns: &str, node: Option<&str>, tolerates: bool, reason: &str| -> Pod {
            let tolerations = if tolerates {
                json!([{ "key": names::VIRTUAL_NODE_TAINT, "operator": "Exists" }])
            } else {
                json!([])
            };
            serde_json::from_value(json!({
                "metadata": { "name": "p", "namespace": ns, "uid": "u-1" },
                "spec": { "nodeName": node, "tolerations": tolerations, "containers": [] },
                "status": { "conditions": [
                    { "type": "PodScheduled", "status": "False", "reason": reason },
                ] },
            }))
            .expect("pod")
        };
        let twins = Twins::from([("shop".to_owned(), "shop-consumer".to_owned())]);
        assert!(waiting_here(
            &pod("shop", None, true, "Unschedulable"),
            &twins
        ));
        for (ns, node, tolerates, reason) in [
            ("other", None, true, "Unschedulable"),
            ("shop", Some("n"), true, "Unschedulable"),
            ("shop", None, false, "Unschedulable"),
            ("shop", None, true, "SchedulingGated"),
        ] {
            assert!(
                !waiting_here(&pod(ns, node, tolerates, reason), &twins),
                "{ns} {node:?} {tolerates} {reason}"
            );
        }
        assert_eq!(
            event_name(&pod("shop", None, true, ""), "provider-1"),
            "p.u-1.noroom-provider-1"
        );
    }
}
