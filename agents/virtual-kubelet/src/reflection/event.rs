//! Events of remote pods back onto the local pods: every Event in a twin
//! about a pod of one of our ReplicaSets whose local pod is bound to the
//! virtual node is copied onto that local pod
//! ([`crate::forge::event`]), and kept up to date as its count grows. The
//! local copy is named after the remote Event's UID and the local copies
//! are followed (by our label), so a restart creates nothing twice. The
//! key is the twin and the remote Event's name; nothing is deleted: both
//! sides' Events expire on their own. Once a copy shows a remote Event,
//! its store keeps it settled, without what it says (a digest of that
//! stays): an hour of a busy cluster's Events is tens of thousands, and
//! nearly all were copied long ago. A copy that changes or goes away
//! after that is written again from a read of the remote Event.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use liqo_agent_runtime::compact::same_version;
use liqo_agent_runtime::follow::{Changes, Followed, Options};
use liqo_api::names::labels;
use serde_json::json;
use tokio::sync::{Notify, watch};

use super::namespace::{PeeringContext, Twins};
use super::pod::LocalPod;
use super::stores::{Clients, PerNamespace};
use super::{Error, Kind, Next, NotYet, ObjectKey, Unjournaled};
use crate::forge::event::{self as forge_event, LocalCopy, RemoteEvent};

#[allow(missing_debug_implementations)]
pub struct Events {
    peering: PeeringContext,
    twins: watch::Receiver<Twins>,
    /// Local pods bound to the virtual node.
    pods: Followed<LocalPod>,
    /// Our local copies, per offloaded namespace.
    local: PerNamespace<Event, LocalCopy>,
    /// Pods' Events, per twin.
    remote: PerNamespace<Event, RemoteEvent>,
    clients: Clients,
    /// The remote Events that changed. A copy or a local pod that
    /// changed is not journaled: the sweep finds it by its fingerprint.
    changed: Changes<ObjectKey>,
    unjournaled: Unjournaled,
}

impl Events {
    pub fn new(
        peering: PeeringContext,
        twins: watch::Receiver<Twins>,
        pods: Followed<LocalPod>,
        wake: &Arc<Notify>,
    ) -> Self {
        let ours = format!("{}={}", labels::MANAGED_BY, labels::MANAGED_BY_VALUE);
        let local = PerNamespace::stored_as(
            "local events of ours",
            watcher::Config::default().labels(&ours),
            vec![wake.clone()],
            Options::converted(LocalCopy::new),
        );
        let remote = PerNamespace::stored_as(
            "remote pods' events",
            watcher::Config::default().fields("involvedObject.kind=Pod"),
            vec![wake.clone()],
            remote_options(),
        );
        let changed = Changes::new();
        remote.record_into(&changed, |e: &RemoteEvent| {
            Some((e.namespace.clone(), e.name.clone()))
        });
        let clients = Clients::new(peering.provider.clone());
        Self {
            peering,
            twins,
            pods,
            local,
            remote,
            clients,
            changed,
            unjournaled: Unjournaled::default(),
        }
    }
}

impl Events {
    /// The remote Event `twin`/`name` as the provider has it now (`None`:
    /// gone, or no client).
    async fn read_remote(&self, twin: &str, name: &str) -> Result<Option<RemoteEvent>, Error> {
        let Some((client, _)) = self.clients.current() else {
            return Ok(None);
        };
        Api::<Event>::namespaced(client, twin)
            .get_opt(name)
            .await
            .map(|e| e.map(RemoteEvent::from))
            .map_err(|source| Error::ReadEvent {
                twin: twin.to_owned(),
                name: name.to_owned(),
                source,
            })
    }
}

/// How remote Events are stored: as [`RemoteEvent::new`] makes them, and
/// a list keeps one settled ([`RemoteEvent::settled`]) while its Event is
/// unchanged.
fn remote_options() -> Options<Event, RemoteEvent> {
    Options::converted(RemoteEvent::new).kept_when(|stored, listed| {
        same_version(
            (&stored.uid, &stored.version),
            (&listed.uid, &listed.version),
        )
    })
}

impl Kind for Events {
    /// The twin and the remote Event's name.
    type Key = ObjectKey;
    const NAME: &'static str = "events";
    /// Copies are many (several per pod) and can wait: few at once, so
    /// that in a burst they do not take the consumer's API server from
    /// the pods' own requests (their status, above all).
    const CONCURRENCY: usize = 4;

    fn prepare(&self) {
        let twins = self.twins.borrow().clone();
        self.local
            .follow_only(Some((self.peering.local.clone(), 0)), twins.keys().cloned());
        self.remote
            .follow_only(self.clients.current(), twins.values().cloned());
    }

    fn keys(&self) -> Vec<Self::Key> {
        let twins: Vec<Arc<str>> = self
            .twins
            .borrow()
            .values()
            .map(|t| Arc::from(t.as_str()))
            .collect();
        // Extended by each twin's names at once: collected one by one,
        // the keys' room doubled as it grew, up to twice what it holds.
        let mut keys = Vec::new();
        for twin in twins {
            let names = self.remote.names(&twin);
            keys.extend(names.into_iter().map(|name| (twin.clone(), name)));
        }
        keys
    }

    /// The remote Events that changed; any when the twins did.
    fn changed(&self) -> Option<Vec<Self::Key>> {
        let keys = self.changed.take();
        let mut h = DefaultHasher::new();
        self.twins.borrow().hash(&mut h);
        if self.unjournaled.changed(h.finish()) {
            return None;
        }
        keys
    }

    /// The twin's local namespace, whether both stores are current, the
    /// remote Event's version, the local pod's UID and the local copy's
    /// version: what converging the key reads.
    fn fingerprint(&self, (twin, name): &Self::Key) -> Option<u64> {
        let mut h = DefaultHasher::new();
        let ns = self
            .twins
            .borrow()
            .iter()
            .find(|(_, t)| **t == **twin)
            .map(|(l, _)| l.clone());
        ns.hash(&mut h);
        let Some(ns) = ns else {
            return Some(h.finish());
        };
        let remote = self.remote.current(twin);
        let local = self.local.current(&ns);
        (remote.is_some(), local.is_some()).hash(&mut h);
        let (Some(remote), Some(local)) = (remote, local) else {
            return Some(h.finish());
        };
        let event = remote.store.get(twin, name);
        event
            .as_ref()
            .map(|e| (e.uid.clone(), e.version.clone()))
            .hash(&mut h);
        let pod = event.as_ref().and_then(|e| {
            let pod = forge_event::local_pod_name(e.pod()?)?;
            self.pods.store.get(&ns, pod)
        });
        pod.as_ref().map(|p| p.uid()).hash(&mut h);
        if let (Some(event), Some(pod)) = (&event, &pod)
            && let Some(uid) = &event.uid
        {
            let copy = forge_event::local_name(&pod.name, &uid.to_string());
            local
                .store
                .get(&ns, &copy)
                .map(|c| c.version.clone())
                .hash(&mut h);
        }
        Some(h.finish())
    }

    async fn converge(&self, (twin, name): &Self::Key) -> Result<Next, Error> {
        let local_ns: BTreeMap<String, String> = self
            .twins
            .borrow()
            .iter()
            .map(|(l, t)| (t.clone(), l.clone()))
            .collect();
        let Some(ns) = local_ns.get(&**twin) else {
            return Ok(Next::Done);
        };
        let not_yet = |side: &'static str| NotYet::Events {
            side,
            namespace: ns.to_string(),
        };
        let remote = self.remote.current(twin).ok_or_else(|| not_yet("remote"))?;
        let local = self.local.current(ns).ok_or_else(|| not_yet("local"))?;
        let Some(event) = remote.store.get(twin, name) else {
            return Ok(Next::Done);
        };
        // Only Events of the pods of our ReplicaSets, whose local pod is
        // bound to this node.
        let Some(pod) = event
            .pod()
            .and_then(forge_event::local_pod_name)
            .and_then(|p| self.pods.store.get(ns, p))
        else {
            return Ok(Next::Done);
        };
        let Some(uid) = &event.uid else {
            return Ok(Next::Done);
        };
        let local_name = forge_event::local_name(&pod.name, &uid.to_string());
        let copy = local.store.get(ns, &local_name);
        let settle = || {
            if let Some(settled) = event.settled() {
                remote.store.settle(twin, name, &event, settled);
            }
        };
        if copy.as_ref().is_some_and(|c| event.shown_by(c)) {
            settle();
            return Ok(Next::Done);
        }
        // The copy is missing or behind. A settled Event no longer holds
        // what it says (its copy was deleted or changed since): read it.
        let read;
        let says = if event.says() {
            &*event
        } else {
            match self.read_remote(twin, name).await? {
                Some(e) => {
                    read = e;
                    &read
                }
                None => return Ok(Next::Done),
            }
        };
        let Some(want) = forge_event::local_event(says, &pod.metadata(), &self.peering.node_name)
        else {
            return Ok(Next::Done);
        };
        let api: Api<Event> = Api::namespaced(self.peering.local.clone(), ns);
        if copy.is_some() {
            let patch = json!({
                "count": want.count,
                "lastTimestamp": want.last_timestamp,
                "message": want.message,
                "reason": want.reason,
                "type": want.type_,
            });
            api.patch(&local_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|source| Error::UpdateEvent {
                    namespace: ns.to_string(),
                    name: local_name.clone(),
                    source,
                })?;
        } else {
            match api.create(&PostParams::default(), &want).await {
                Ok(_) => {}
                // Written by a previous pass, not yet in the store: settled
                // once the store shows it.
                Err(kube::Error::Api(s)) if s.code == 409 => return Ok(Next::Done),
                Err(e) => {
                    return Err(Error::CopyEvent {
                        twin: twin.to_string(),
                        name: name.to_string(),
                        source: e,
                    });
                }
            }
        }
        // What it says is on the copy now.
        settle();
        Ok(Next::Done)
    }
}

/// The Events' stores filled as the agent fills them, for
/// [`super::footprint`].
#[cfg(test)]
pub mod footprint {
    use super::*;

    pub fn remote(events: impl Iterator<Item = Event>) -> Followed<RemoteEvent> {
        liqo_agent_runtime::follow::filled(events, super::remote_options())
    }

    /// The remote Events settled, as the reflection leaves them once
    /// their copies show them.
    pub fn settled(events: impl Iterator<Item = Event>) -> Followed<RemoteEvent> {
        let followed = remote(events);
        for event in followed.store.state() {
            let settled = event.settled().expect("read whole");
            assert!(
                followed
                    .store
                    .settle(&event.namespace, &event.name, &event, settled)
            );
        }
        followed
    }

    pub fn local(events: impl Iterator<Item = Event>) -> Followed<LocalCopy> {
        liqo_agent_runtime::follow::filled(events, Options::converted(LocalCopy::new))
    }
}
