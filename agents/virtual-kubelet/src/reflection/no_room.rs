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
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use liqo_agent_runtime::follow::{Key, Options, follow_with};
use liqo_api::capacity::unplaceable_asking;
use liqo_api::names;
use liqo_api::sharing::Amounts;
use tokio::sync::watch;

use super::namespace::{PeeringContext, Twins};
use crate::node::FIELD_MANAGER;

/// The Event's reason.
pub const REASON: &str = "NoRoomOnProvider";
/// How often the pods are looked at, changed or not.
const TICK: Duration = Duration::from_secs(5);

/// What the store keeps of an unbound pod: its name, what it asks, and
/// whether it waits for a virtual node (a few dozen bytes, where the
/// whole pod would be kilobytes: a burst of new pods passes through this
/// store before the scheduler binds them).
#[derive(Debug, Clone, PartialEq)]
pub struct Unbound {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub uid: String,
    /// The scheduler left it unbound (`PodScheduled` False,
    /// `Unschedulable`), and the placement policy let it onto virtual
    /// nodes (it tolerates their taint).
    pub waits: bool,
    pub asks: Amounts,
}

impl Unbound {
    pub fn new(pod: Pod, key: &Key) -> Self {
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
        Self {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            waits: !bound && tolerates && unschedulable,
            asks: liqo_api::capacity::requests_of(&pod),
        }
    }

    /// Whether it waits for a virtual node in a namespace offloaded here.
    pub fn waiting_here(&self, twins: &Twins) -> bool {
        self.waits && twins.contains_key(self.namespace.as_ref())
    }

    /// The Event's name: one per pod and provider.
    pub fn event_name(&self, provider: &str) -> String {
        format!("{}.{}.noroom-{provider}", self.name, self.uid)
    }

    /// The pod, as far as an Event about it needs.
    fn as_pod(&self) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(self.name.to_string()),
                namespace: Some(self.namespace.to_string()),
                uid: Some(self.uid.clone()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }
}

/// Says why on every unbound pod of a namespace offloaded here that the
/// provider has no node for.
pub async fn keep(peering: PeeringContext, mut twins: watch::Receiver<Twins>) {
    let (pending, follow_pending) = follow_with(
        Api::<Pod>::all(peering.local.clone()),
        watcher::Config::default().fields("spec.nodeName=,status.phase=Pending"),
        "unbound pods",
        Options::converted(Unbound::new),
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
            let present: HashSet<&str> = pods.iter().map(|p| p.uid.as_str()).collect();
            said.retain(|uid| present.contains(uid.as_str()));
            let bound = *peering.largest_free_node.borrow();
            for pod in pods.iter().filter(|p| p.waiting_here(&here)) {
                if said.contains(&pod.uid) {
                    continue;
                }
                let provider = peering.provider_id.as_str();
                let Some(why) = bound.and_then(|l| unplaceable_asking(pod.asks, l, provider))
                else {
                    continue;
                };
                match say(&peering, pod, &why).await {
                    Ok(()) => {
                        said.insert(pod.uid.clone());
                    }
                    Err(error) => {
                        tracing::warn!(pod = %pod.name, %error, "cannot say why the pod waits");
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

async fn say(peering: &PeeringContext, pod: &Unbound, why: &str) -> Result<(), kube::Error> {
    let provider = peering.provider_id.as_str();
    let event = crate::forge::event::warning(
        &pod.as_pod(),
        Some(pod.event_name(provider)),
        REASON,
        why,
        FIELD_MANAGER,
        &peering.node_name,
        Time(Timestamp::now()),
    );
    let events: Api<Event> = Api::namespaced(peering.local.clone(), &pod.namespace);
    match events.create(&PostParams::default(), &event).await {
        Ok(_) => {
            tracing::info!(pod = %pod.name, %why, "no room on the provider");
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
        let pod = |ns: &str, node: Option<&str>, tolerates: bool, reason: &str| -> Unbound {
            let tolerations = if tolerates {
                json!([{ "key": names::VIRTUAL_NODE_TAINT, "operator": "Exists" }])
            } else {
                json!([])
            };
            let pod: Pod = serde_json::from_value(json!({
                "metadata": { "name": "p", "namespace": ns, "uid": "u-1" },
                "spec": { "nodeName": node, "tolerations": tolerations, "containers": [
                    { "name": "c", "resources": { "requests": { "cpu": "7" } } },
                ] },
                "status": { "conditions": [
                    { "type": "PodScheduled", "status": "False", "reason": reason },
                ] },
            }))
            .expect("pod");
            let key = Key {
                namespace: ns.into(),
                name: "p".into(),
            };
            Unbound::new(pod, &key)
        };
        let twins = Twins::from([("shop".to_owned(), "shop-consumer".to_owned())]);
        let waiting = pod("shop", None, true, "Unschedulable");
        assert!(waiting.waiting_here(&twins));
        assert_eq!(waiting.asks.cpu_millis, 7000);
        for (ns, node, tolerates, reason) in [
            ("other", None, true, "Unschedulable"),
            ("shop", Some("n"), true, "Unschedulable"),
            ("shop", None, false, "Unschedulable"),
            ("shop", None, true, "SchedulingGated"),
        ] {
            assert!(
                !pod(ns, node, tolerates, reason).waiting_here(&twins),
                "{ns} {node:?} {tolerates} {reason}"
            );
        }
        assert_eq!(waiting.event_name("provider-1"), "p.u-1.noroom-provider-1");
        let about = waiting.as_pod();
        assert_eq!(
            (
                about.metadata.name.as_deref(),
                about.metadata.uid.as_deref()
            ),
            (Some("p"), Some("u-1"))
        );
    }
}
