//! Followed stores of one kind, one per namespace: the consumer's identity
//! on a provider may only watch inside its twin namespaces, and on the
//! consumer only the offloaded namespaces' objects are worth holding in
//! memory. The set of namespaces follows the twins; a renewed provider
//! client restarts every store with it.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher;
use liqo_agent_runtime::follow::{Changes, Followed, Options, follow_with};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::provider::ProviderClient;

/// A namespaced kind of the API, as a per-namespace store follows it.
pub trait Namespaced:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Debug
    + PartialEq
    + Send
    + Sync
    + 'static
{
}

impl<K> Namespaced for K where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + PartialEq
        + Send
        + Sync
        + 'static
{
}

/// A store and the task that follows it, stopped when dropped.
struct Entry<S> {
    followed: Followed<S>,
    task: JoinHandle<()>,
}

impl<S> Drop for Entry<S> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Inner<S> {
    /// The client generation the stores were started with.
    client_version: Option<u64>,
    by_namespace: BTreeMap<String, Entry<S>>,
}

/// Stores of objects of kind `K` (stored as `S`), one per followed
/// namespace.
pub struct PerNamespace<K, S = K> {
    what: &'static str,
    config: watcher::Config,
    /// How every object is stored.
    options: Options<K, S>,
    /// Woken whenever any store changes.
    wakes: Vec<Arc<Notify>>,
    inner: Mutex<Inner<S>>,
    /// Journals recording the changes of every store, now and to come.
    journals: Mutex<Vec<Attach<S>>>,
}

/// Attaches one journal to a store just started (`Some`), or tells it
/// that a store was stopped (`None`).
type Attach<S> = Arc<dyn Fn(Option<&Followed<S>>) + Send + Sync>;

impl<K, S> Debug for PerNamespace<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerNamespace")
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

impl<K: Namespaced> PerNamespace<K> {
    /// Objects stored as the API serves them.
    pub fn new(what: &'static str, config: watcher::Config, wakes: Vec<Arc<Notify>>) -> Self {
        Self::stored_as(what, config, wakes, Options::default())
    }
}

impl<K, S> PerNamespace<K, S>
where
    K: Namespaced,
    S: PartialEq + Send + Sync + 'static,
{
    /// Objects stored as `options` say.
    pub fn stored_as(
        what: &'static str,
        config: watcher::Config,
        wakes: Vec<Arc<Notify>>,
        options: Options<K, S>,
    ) -> Self {
        Self {
            what,
            config,
            options,
            wakes,
            inner: Mutex::new(Inner {
                client_version: None,
                by_namespace: BTreeMap::new(),
            }),
            journals: Mutex::new(Vec::new()),
        }
    }

    /// Records into `journal` the key `key` makes of every object that
    /// changes in any of the stores ([`Followed::record_into`]), and
    /// "anything" whenever a store starts or stops.
    pub fn record_into<T>(
        &self,
        journal: &Changes<T>,
        key: impl Fn(&S) -> Option<T> + Send + Sync + 'static,
    ) where
        T: Send + 'static,
    {
        let key = Arc::new(key);
        let journal = journal.clone();
        let attach: Attach<S> = Arc::new(move |followed| match followed {
            Some(followed) => {
                let key = key.clone();
                followed.record_into(&journal, move |obj| key(obj));
            }
            None => journal.anything(),
        });
        if let Ok(inner) = self.inner.lock() {
            for entry in inner.by_namespace.values() {
                attach(Some(&entry.followed));
            }
        }
        if let Ok(mut journals) = self.journals.lock() {
            journals.push(attach);
        }
    }

    fn attached(&self) -> Vec<Attach<S>> {
        self.journals.lock().map(|j| j.clone()).unwrap_or_default()
    }

    /// Follows exactly `namespaces` with `client` (`None`: no client, no
    /// store); `version` changes when the client does.
    pub fn follow_only(
        &self,
        client: Option<(kube::Client, u64)>,
        namespaces: impl IntoIterator<Item = String>,
    ) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let attached = self.attached();
        let stopped = |inner: &Inner<S>| {
            if !inner.by_namespace.is_empty() {
                for attach in &attached {
                    attach(None);
                }
            }
        };
        let Some((client, version)) = client else {
            stopped(&inner);
            inner.by_namespace.clear();
            inner.client_version = None;
            return;
        };
        if inner.client_version != Some(version) {
            stopped(&inner);
            inner.by_namespace.clear();
            inner.client_version = Some(version);
        }
        let wanted: std::collections::BTreeSet<String> = namespaces.into_iter().collect();
        if inner.by_namespace.keys().any(|ns| !wanted.contains(ns)) {
            stopped(&inner);
        }
        inner.by_namespace.retain(|ns, _| wanted.contains(ns));
        for ns in wanted {
            if let std::collections::btree_map::Entry::Vacant(e) = inner.by_namespace.entry(ns) {
                let (followed, task) = follow_with(
                    Api::namespaced(client.clone(), e.key()),
                    self.config.clone(),
                    self.what,
                    self.options,
                );
                for attach in &attached {
                    attach(Some(&followed));
                }
                let mut changes = followed.state.clone();
                let wakes = self.wakes.clone();
                let task = tokio::spawn(async move {
                    let wake = async move {
                        while changes.changed().await.is_ok() {
                            for w in &wakes {
                                w.notify_one();
                            }
                        }
                    };
                    tokio::join!(task, wake);
                });
                e.insert(Entry { followed, task });
            }
        }
    }

    /// The store of `namespace`, when it is followed and holds a complete
    /// list.
    pub fn current(&self, namespace: &str) -> Option<Followed<S>> {
        let inner = self.inner.lock().ok()?;
        let entry = inner.by_namespace.get(namespace)?;
        entry.followed.is_current().then(|| entry.followed.clone())
    }

    /// The names in the store of `namespace` (empty when not followed).
    pub fn names(&self, namespace: &str) -> Vec<Arc<str>> {
        let Ok(inner) = self.inner.lock() else {
            return Vec::new();
        };
        inner
            .by_namespace
            .get(namespace)
            .map(|e| e.followed.store.names(namespace))
            .unwrap_or_default()
    }
}

/// The provider's client and its generation, bumped whenever the channel
/// says it changed (a renewed kubeconfig).
#[allow(missing_debug_implementations)] // kube::Client is not Debug.
pub struct Clients {
    inner: Mutex<(watch::Receiver<ProviderClient>, u64)>,
}

impl Clients {
    pub fn new(rx: watch::Receiver<ProviderClient>) -> Self {
        Self {
            inner: Mutex::new((rx, 0)),
        }
    }

    /// The current client and its generation, or `None` when there is none.
    pub fn current(&self) -> Option<(kube::Client, u64)> {
        let mut inner = self.inner.lock().ok()?;
        let (rx, version) = &mut *inner;
        if rx.has_changed().unwrap_or(false) {
            *version += 1;
        }
        let client = rx.borrow_and_update().clone().ok()?;
        Some((client, *version))
    }
}

/// A kind kept in the twins, followed on both sides: the consumer's
/// offloaded namespaces (`local`, with its own client) and their twins on
/// the provider (`remote`, with the provider's current client).
pub fn follow_twins<K, S>(
    local: &PerNamespace<K, S>,
    remote: &PerNamespace<K, S>,
    local_client: &kube::Client,
    clients: &Clients,
    twins: &super::namespace::Twins,
) where
    K: Namespaced,
    S: PartialEq + Send + Sync + 'static,
{
    local.follow_only(Some((local_client.clone(), 0)), twins.keys().cloned());
    remote.follow_only(clients.current(), twins.values().cloned());
}

/// Every object of either side of [`follow_twins`], keyed by its local
/// namespace and name, sorted, once each.
pub fn keys_in_twins<K, S>(
    local: &PerNamespace<K, S>,
    remote: &PerNamespace<K, S>,
    twins: &super::namespace::Twins,
) -> Vec<super::ObjectKey>
where
    K: Namespaced,
    S: PartialEq + Send + Sync + 'static,
{
    let namespaces: Vec<(Arc<str>, &String)> = twins
        .iter()
        .map(|(local_ns, twin)| (Arc::from(local_ns.as_str()), twin))
        .collect();
    let mut first = Vec::new();
    for (ns, _) in &namespaces {
        first.extend(local.names(ns).into_iter().map(|name| (ns.clone(), name)));
    }
    let mut keys = super::Gathered::from_first(first);
    for (ns, twin) in &namespaces {
        for name in remote.names(twin) {
            keys.add(ns, &name, || name.clone());
        }
    }
    keys.into_keys()
}
