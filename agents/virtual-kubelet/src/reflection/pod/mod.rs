//! Pods: every local pod bound to the virtual node in a namespace with a
//! ready twin runs on the provider as a ReplicaSet of one in the twin, or
//! a Job of one for a pod meant to end ([`crate::forge::pod`] translates
//! it), so that the provider's controllers keep it running while the
//! consumer is away. The ReplicaSet's pod is made first, by this agent
//! ([`crate::forge::pod::first_pod`]), and the ReplicaSet once the pod is seen,
//! which adopts it: the pod does not wait for the provider's ReplicaSet
//! controller and its rate-limited client. The remote pod's status comes back to the local
//! pod. Deleting the local pod deletes the wrapper and the remote pod
//! with the same grace period,
//! and once the remote pod is gone the local one is removed as a kubelet
//! does (grace 0, UID precondition). A ReplicaSet whose local pod is gone
//! is removed. The key is the local pod's namespace and name, so both
//! sides of one pod converge together and nothing is created twice.
//!
//! The provider's side is followed with one set of stores (ReplicaSets,
//! Jobs, pods, carrying our UID label) per twin namespace: the consumer's
//! identity may watch inside its twins only. They are started and stopped
//! as twins come and go, and restarted with a renewed provider client.
//!
//! Scale (see "Scale and restart safety" in docs/virtual-kubelet.md): the
//! remote pods are indexed by their local pod's name, so one pod
//! converges without a scan of its twin; the stores keep only what this
//! module reads, in types of its own ([`stored::StoredWrapper`]: a wrapper's
//! identity, our label and whether someone changed its spec;
//! [`stored::RemotePod`]: a remote pod's identity and the status the local pod
//! shows, deflated; [`LocalPod`]: a local pod's identity, phase, reason,
//! status digest and requests, and the whole pod, deflated, only while
//! it is pending and its wrapper not made yet, the remote objects being
//! made from it, and within a budget of [`whole`]); and each key has a
//! fingerprint (resource versions of its objects) so that a pass looks
//! only at the pods that changed.
//!
//! This module owns the pod reflector's entry ([`Pods`], its
//! [`Kind`]: keys, journals and fingerprints); [`stored`] the types its
//! stores keep, [`remote`] the provider's stores per twin, [`converge`]
//! what one pod's convergence does, [`put_back`] wrappers changed by
//! others, [`status`] the remote status brought back, [`made`] the
//! wrappers made and not seen yet, [`whole`] the pending pods kept whole.

mod converge;
#[cfg(test)]
pub mod footprint;
mod made;
mod put_back;
mod remote;
mod status;
mod stored;
mod whole;

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use liqo_agent_runtime::follow::{Changes, Followed};
use tokio::sync::{Notify, watch};

use self::made::Made;
use self::remote::{ProviderStores, TwinStores};
pub use self::stored::LocalPod;
use super::nameserver::Nameservers;
use super::namespace::{PeeringContext, Twins};
use super::references::References;
use super::{Error, Gathered, Kind, Next, ObjectKey, Unjournaled, in_local_namespaces};
use crate::provider::ProviderClient;

#[allow(missing_debug_implementations)]
pub struct Pods {
    pub peering: PeeringContext,
    /// Local pods bound to the virtual node.
    pub local: Followed<LocalPod>,
    pub twins: watch::Receiver<Twins>,
    /// Whether [`super::namespace`] has looked at every offloading.
    pub synced: watch::Receiver<bool>,
    pub wake: Arc<Notify>,
    provider_stores: Mutex<ProviderStores>,
    clients: Mutex<(watch::Receiver<ProviderClient>, u64)>,
    /// Holds back pods whose ConfigMaps or Secrets are missing.
    references: Option<References>,
    /// Where remote pods reach the consumer's API with their token.
    token_api: Option<crate::forge::token::ApiAddress>,
    /// Where remote pods resolve names, per offloaded namespace, and the
    /// consumer's cluster domain; none: with the provider's DNS.
    names: Option<(watch::Receiver<Nameservers>, String)>,
    /// The local pods that changed, by namespace and name.
    changed_local: Changes<ObjectKey>,
    /// The remote objects that changed, by twin and local pod name.
    changed_remote: Changes<ObjectKey>,
    made: Made,
    unjournaled: Unjournaled,
}

impl Pods {
    pub fn new(
        peering: PeeringContext,
        local: Followed<LocalPod>,
        twins: watch::Receiver<Twins>,
        synced: watch::Receiver<bool>,
        wake: Arc<Notify>,
    ) -> Self {
        let clients = Mutex::new((peering.provider.clone(), 0));
        let changed_local = Changes::new();
        local.record_into(&changed_local, |p| {
            Some((p.namespace.clone(), p.name.clone()))
        });
        Self {
            peering,
            local,
            twins,
            synced,
            wake,
            provider_stores: Mutex::new(ProviderStores::default()),
            clients,
            references: None,
            token_api: None,
            names: None,
            changed_local,
            changed_remote: Changes::new(),
            made: Made::default(),
            unjournaled: Unjournaled::default(),
        }
    }

    /// Remote pods mount their token ([`super::token`]) and reach the
    /// consumer's API at `api`.
    pub fn with_token_api(mut self, api: crate::forge::token::ApiAddress) -> Self {
        self.token_api = Some(api);
        self
    }

    /// Pods wait for their ConfigMaps and Secrets as `references` says.
    pub fn with_references(mut self, references: References) -> Self {
        self.references = Some(references);
        self
    }

    /// Remote pods resolve names where `nameservers` says, in the
    /// consumer's cluster domain `domain`.
    pub fn with_names(mut self, nameservers: watch::Receiver<Nameservers>, domain: String) -> Self {
        self.names = Some((nameservers, domain));
        self
    }

    fn twin_stores(&self, twin: &str) -> Option<Arc<TwinStores>> {
        self.provider_stores.lock().ok()?.by_twin.get(twin).cloned()
    }

    fn twin_of(&self, local_ns: &str) -> Option<String> {
        self.twins.borrow().get(local_ns).cloned()
    }
}

impl Kind for Pods {
    /// The local pod's namespace and name.
    type Key = ObjectKey;
    const NAME: &'static str = "pod";

    fn prepare(&self) {
        let (client, version) = {
            let Ok(mut clients) = self.clients.lock() else {
                return;
            };
            let (rx, version) = &mut *clients;
            if rx.has_changed().unwrap_or(false) {
                *version += 1;
            }
            (rx.borrow_and_update().clone(), *version)
        };
        let Ok(mut provider_stores) = self.provider_stores.lock() else {
            return;
        };
        // Stopped stores leave keys that no journal will name.
        let Ok(client) = client else {
            provider_stores.by_twin.clear();
            provider_stores.client_version = None;
            self.changed_remote.anything();
            return;
        };
        if provider_stores.client_version != Some(version) {
            provider_stores.by_twin.clear();
            provider_stores.client_version = Some(version);
            self.changed_remote.anything();
        }
        let twins: Vec<String> = self.twins.borrow().values().cloned().collect();
        if provider_stores.by_twin.keys().any(|t| !twins.contains(t)) {
            provider_stores.by_twin.retain(|t, _| twins.contains(t));
            self.changed_remote.anything();
        }
        for twin in twins {
            if let std::collections::btree_map::Entry::Vacant(e) =
                provider_stores.by_twin.entry(twin)
            {
                let twin_stores =
                    TwinStores::start(client.clone(), e.key(), &self.wake, &self.changed_remote);
                e.insert(Arc::new(twin_stores));
            }
        }
    }

    /// The local pods, and the local pods of remote objects that no
    /// local pod is left for (gathered without a second copy of every
    /// key: both sides name the same pods).
    fn keys(&self) -> Vec<Self::Key> {
        let mut keys = Gathered::from_first(
            self.local
                .store
                .state()
                .iter()
                .map(|p| (p.namespace.clone(), p.name.clone()))
                .collect(),
        );
        let twins = self.twins.borrow().clone();
        if let Ok(provider_stores) = self.provider_stores.lock() {
            for (local_ns, twin) in &twins {
                if let Some(twin_stores) = provider_stores.by_twin.get(twin) {
                    let local_ns: Arc<str> = Arc::from(local_ns.as_str());
                    for rs in twin_stores.replica_sets.store.state().iter() {
                        keys.add(&local_ns, &rs.id.name, || rs.id.name.clone());
                    }
                    for job in twin_stores.jobs.store.state().iter() {
                        keys.add(&local_ns, &job.id.name, || job.id.name.clone());
                    }
                    // A pod made before its wrapper may be all there is.
                    for p in twin_stores.pods.store.state().iter() {
                        if let Some(local) = crate::forge::event::local_pod_name(&p.id.name) {
                            keys.add(&local_ns, local, || Arc::from(local));
                        }
                    }
                }
            }
        }
        keys.into_keys()
    }

    /// The local pods that changed, and the local pods of the remote
    /// objects that did; any pod when the twins, the remap, the provider's
    /// client or whether the stores are current changed.
    fn changed(&self) -> Option<Vec<Self::Key>> {
        let local = self.changed_local.take();
        let remote = self.changed_remote.take();
        let twins = self.twins.borrow().clone();
        let mut h = DefaultHasher::new();
        twins.hash(&mut h);
        self.synced.borrow().hash(&mut h);
        self.peering.remap().hash(&mut h);
        if let Ok(provider_stores) = self.provider_stores.lock() {
            provider_stores.client_version.hash(&mut h);
            for (twin, twin_stores) in &provider_stores.by_twin {
                (twin, twin_stores.is_current()).hash(&mut h);
            }
        }
        self.local.is_current().hash(&mut h);
        if self.unjournaled.changed(h.finish()) {
            return None;
        }
        let mut keys = local?;
        keys.extend(in_local_namespaces(&twins, remote?));
        Some(keys)
    }

    fn fingerprint(&self, (ns, name): &Self::Key) -> Option<u64> {
        let mut h = DefaultHasher::new();
        let local = self.local.store.get(ns, name);
        local.as_ref().map(|p| p.identity()).hash(&mut h);
        let twin = self.twin_of(ns);
        twin.hash(&mut h);
        self.synced.borrow().hash(&mut h);
        // The local status carries pod IPs where this cluster sees them: a
        // remap decided (or changed) after a pod's status was written
        // changes what it should say.
        self.peering.remap().hash(&mut h);
        if let Some(twin) = twin {
            let (client_version, twin_stores) = {
                let provider_stores = self.provider_stores.lock().ok()?;
                (
                    provider_stores.client_version,
                    provider_stores.by_twin.get(&twin).cloned(),
                )
            };
            client_version.hash(&mut h);
            if let Some(twin_stores) = twin_stores {
                twin_stores.is_current().hash(&mut h);
                twin_stores.wrappers(&twin, name).hash(&mut h);
                let mut remote: Vec<_> = twin_stores
                    .pods_named_for(&twin, name)
                    .iter()
                    .map(|p| (p.id.uid.clone(), p.id.version.clone(), p.id.for_pod.clone()))
                    .collect();
                remote.sort();
                remote.hash(&mut h);
            }
        }
        Some(h.finish())
    }

    async fn converge(&self, key: &Self::Key) -> Result<Next, Error> {
        self.converge_pod(key).await
    }
}
