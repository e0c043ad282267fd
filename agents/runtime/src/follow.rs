//! Following objects of the API the kube-runtime way: a reflector keeps a
//! local store level-triggered from a watch, and the agent reads the store,
//! never a stream of events it could miss.
//!
//! The store is *current* only between a complete (re)list and the next
//! failure of the watch. kube's watcher, after a failed watch, resumes
//! from its last resourceVersion without saying when it is back, so a
//! failure here starts a new watcher instead: it lists again, and the store
//! is swapped whole when the list is done. An agent is thus never ready on
//! data it cannot vouch for, and it is ready again as soon as the API
//! answers again, even if nothing changed meanwhile.
//!
//! Memory: a store holds every followed object for as long as the agent
//! runs, so what is stored is trimmed on the way in ([`Options::trim`]):
//! managedFields always (nobody reads them from a store, and they are
//! often a third of an object: the watch does not even read them,
//! [`crate::lean`]), and whatever else the caller says it does not read;
//! or it is made into a value of the caller's own type
//! ([`Options::convert`]) that keeps only what is read. The store is ours,
//! not kube-runtime's: kube's keeps, per object, a key that copies its
//! name, namespace, UID and version again, and needs the stored type to
//! carry a whole `ObjectMeta`. Ours keys an object by its namespace
//! (shared by every object of it) and its name, both given to the
//! conversion to keep ([`Key`]), so a compact stored value costs no copy
//! of either. A namespace's objects are kept in name order, so that the
//! objects whose names start alike are found without a scan and without
//! an index ([`Store::named_after`]: a ReplicaSet's pods are named after
//! it); a list's objects are put in order once it is done, each node of
//! the tree full.
//!
//! Cost of reading: a reader that would otherwise look at every stored
//! object whenever one changes can ask a store to record what changed
//! into a [`Changes`] ([`Followed::record_into`]): the keys of the
//! objects applied or deleted since it last looked, or "anything" after a
//! list, a failed watch or more changes than a journal keeps. The store
//! stays the truth; the journal only says where to look first.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::ops::Bound;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};
use std::time::Duration;

use futures::StreamExt;
use kube::Api;
use kube::Resource;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::lean::{self, Lean};

/// First wait after a failed watch; it doubles up to [`BACKOFF_MAX`] and is
/// reset by a successful list.
const BACKOFF_INITIAL: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(8);

/// Lists are read in pages of this many objects. A page is held whole
/// while it is read (its text, then its objects before they are made
/// into what is stored), and an agent that starts lists every store at
/// once: with kube's default of 500, the virtual kubelet's peak resident
/// memory when it started with 3,000 offloaded pods was twice its peak
/// while those pods were made (86 against 42 MiB). More pages cost more
/// requests, once per list.
const LIST_PAGE: u32 = 100;

/// The state of a followed store, as it changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncState {
    /// The store holds a complete list taken since the last watch failure.
    pub current: bool,
    /// Bumped whenever the store changes, so that readers wake up.
    pub generation: u64,
}

/// A journal keeps at most this many keys: past it, it says "anything"
/// (a reader that far behind looks at everything anyway).
const CHANGES_MAX: usize = 50_000;

/// What changed in one or more stores since the reader last took it: the
/// keys of the objects applied or deleted, in the reader's own terms
/// (each store is told how to make a key of an object), or "anything".
/// It says "anything" when it is new, after a store listed again or
/// failed, and past [`CHANGES_MAX`] keys. Cheap to clone: clones share
/// one journal.
#[derive(Debug)]
pub struct Changes<T> {
    pending: Arc<Mutex<Pending<T>>>,
}

impl<T> Clone for Changes<T> {
    fn clone(&self) -> Self {
        Self {
            pending: self.pending.clone(),
        }
    }
}

#[derive(Debug)]
struct Pending<T> {
    anything: bool,
    keys: Vec<T>,
}

impl<T> Default for Changes<T> {
    fn default() -> Self {
        Self {
            pending: Arc::new(Mutex::new(Pending {
                anything: true,
                keys: Vec::new(),
            })),
        }
    }
}

impl<T> Changes<T> {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending<T>> {
        match self.pending.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The keys recorded since the last call (in the order recorded,
    /// repeats included), or `None`: anything may have changed.
    pub fn take(&self) -> Option<Vec<T>> {
        let mut p = self.lock();
        let keys = std::mem::take(&mut p.keys);
        (!std::mem::take(&mut p.anything)).then_some(keys)
    }

    /// Records that anything may have changed (a store started, stopped
    /// or was swapped by its reader's own doing).
    pub fn anything(&self) {
        let mut p = self.lock();
        p.anything = true;
        p.keys = Vec::new();
    }

    fn push(&self, key: T) {
        let mut p = self.lock();
        if p.anything {
            return;
        }
        if p.keys.len() >= CHANGES_MAX {
            p.anything = true;
            p.keys = Vec::new();
        } else {
            p.keys.push(key);
        }
    }
}

/// Records changes of a store into one journal: called with every applied
/// or deleted object (as stored), or `None` when the whole store changed.
/// Returns false once the journal is dropped.
type Recorder<S> = Box<dyn Fn(Option<&S>) -> bool + Send + Sync>;

/// Where an object is stored: its namespace (empty for a cluster-scoped
/// object) and its name. The store shares one copy of each namespace
/// among its objects; a stored value made by [`Options::convert`] may
/// keep clones of both at the cost of a reference count.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

/// The objects of a followed store, by namespace and name (in order).
type Objects<S> = HashMap<Arc<str>, BTreeMap<Arc<str>, Arc<S>>>;

/// The objects of a list in progress, by namespace, in the order read:
/// put in name order when the list is done.
type Listing<S> = HashMap<Arc<str>, Vec<(Arc<str>, Arc<S>)>>;

/// A followed store: the objects the follow task last saw, as they were
/// stored. Cheap to clone: clones share one store.
#[derive(Debug)]
pub struct Store<S> {
    objects: Arc<RwLock<Objects<S>>>,
}

impl<S> Clone for Store<S> {
    fn clone(&self) -> Self {
        Self {
            objects: self.objects.clone(),
        }
    }
}

impl<S> Default for Store<S> {
    fn default() -> Self {
        Self {
            objects: Arc::default(),
        }
    }
}

impl<S> Store<S> {
    fn read(&self) -> RwLockReadGuard<'_, Objects<S>> {
        match self.objects.read() {
            Ok(o) => o,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn write(&self) -> RwLockWriteGuard<'_, Objects<S>> {
        match self.objects.write() {
            Ok(o) => o,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The object named `name` in `namespace` (empty: a cluster-scoped one).
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<S>> {
        self.read().get(namespace)?.get(name).cloned()
    }

    /// Every stored object.
    pub fn state(&self) -> Vec<Arc<S>> {
        self.read()
            .values()
            .flat_map(|names| names.values().cloned())
            .collect()
    }

    /// The stored objects of `namespace`.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<S>> {
        self.read()
            .get(namespace)
            .map(|names| names.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The stored objects of `namespace` whose names start with
    /// `prefix`, in name order.
    pub fn named_after(&self, namespace: &str, prefix: &str) -> Vec<Arc<S>> {
        self.read()
            .get(namespace)
            .map(|names| {
                names
                    .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
                    .take_while(|(name, _)| name.starts_with(prefix))
                    .map(|(_, v)| v.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The names of the stored objects of `namespace`.
    pub fn names(&self, namespace: &str) -> Vec<Arc<str>> {
        self.read()
            .get(namespace)
            .map(|names| names.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Replaces the stored object `namespace`/`name` with `with` if it is
    /// still `seen`, the very value the caller read (not a newer one the
    /// watch stored since); true when it did. For a reader that needs
    /// less of an object once it has acted on it: what it stores can
    /// drop the rest ("settle"). The API's object did not change, so
    /// nothing is recorded into journals and the store's state is not
    /// bumped. A list that ends swaps in its objects as read, unsettled
    /// (or as [`Options::keep`] says).
    pub fn settle(&self, namespace: &str, name: &str, seen: &Arc<S>, with: S) -> bool {
        let mut objects = self.write();
        match objects.get_mut(namespace).and_then(|n| n.get_mut(name)) {
            Some(stored) if Arc::ptr_eq(stored, seen) => {
                *stored = Arc::new(with);
                true
            }
            _ => false,
        }
    }

    pub fn len(&self) -> usize {
        self.read().values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn insert<S>(objects: &mut Objects<S>, key: &Key, value: Arc<S>) {
    objects
        .entry(key.namespace.clone())
        .or_default()
        .insert(key.name.clone(), value);
}

fn remove<S>(objects: &mut Objects<S>, key: &Key) -> Option<Arc<S>> {
    let names = objects.get_mut(&*key.namespace)?;
    let removed = names.remove(&*key.name);
    if names.is_empty() {
        objects.remove(&*key.namespace);
    }
    removed
}

/// A store that a background task keeps following the API.
pub struct Followed<S> {
    pub store: Store<S>,
    pub state: watch::Receiver<SyncState>,
    recorders: Arc<Mutex<Vec<Recorder<S>>>>,
}

impl<S> Clone for Followed<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            state: self.state.clone(),
            recorders: self.recorders.clone(),
        }
    }
}

/// How a store is fed, beyond what the watch returns: what the API
/// serves (`K`) is trimmed, then made into what is stored (`S`).
pub struct Options<K, S = K> {
    /// Applied to every object before it is stored: drop what is never
    /// read. managedFields are dropped whatever this does.
    pub trim: Option<fn(&mut K)>,
    /// Makes the stored value of an object (trimmed), given where it is
    /// stored.
    pub convert: fn(K, &Key) -> S,
    /// Whether a list keeps the value the store holds (`stored`) in place
    /// of the one it read of the same object (`listed`); none: when they
    /// are equal. For values that readers settle ([`Store::settle`]): a
    /// settled value differs from what a list reads of its object, which
    /// did not change, and both would be held until it is settled again.
    pub keep: Option<fn(stored: &S, listed: &S) -> bool>,
}

impl<K, S> Clone for Options<K, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K, S> Copy for Options<K, S> {}

impl<K, S> Debug for Options<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("trim", &self.trim.is_some())
            .field("keep", &self.keep.is_some())
            .finish_non_exhaustive()
    }
}

impl<K> Default for Options<K, K> {
    /// Objects stored as the API serves them (less their managedFields).
    fn default() -> Self {
        Self {
            trim: None,
            convert: |obj, _| obj,
            keep: None,
        }
    }
}

impl<K> Options<K, K> {
    /// Objects stored as `trim` leaves them.
    pub fn trimmed(trim: fn(&mut K)) -> Self {
        Self {
            trim: Some(trim),
            ..Self::default()
        }
    }
}

impl<K, S> Options<K, S> {
    /// Objects stored as `convert` makes them.
    pub fn converted(convert: fn(K, &Key) -> S) -> Self {
        Self {
            trim: None,
            convert,
            keep: None,
        }
    }

    /// A list keeps a stored value in place of the one it read when
    /// `keep` says so ([`Options::keep`]).
    pub fn kept_when(mut self, keep: fn(stored: &S, listed: &S) -> bool) -> Self {
        self.keep = Some(keep);
        self
    }
}

impl<S> Debug for Followed<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Followed")
            .field("objects", &self.store.len())
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl<S> Followed<S> {
    pub fn is_current(&self) -> bool {
        self.state.borrow().current
    }

    /// From now on, records into `journal` the key `key` makes of every
    /// object applied or deleted, as stored (none when it gives `None`),
    /// and that
    /// anything changed whenever the store is listed again or fails. The
    /// journal is told "anything" at once: what the store held before is
    /// not in it.
    pub fn record_into<T>(
        &self,
        journal: &Changes<T>,
        key: impl Fn(&S) -> Option<T> + Send + Sync + 'static,
    ) where
        T: Send + 'static,
    {
        journal.anything();
        let weak: Weak<Mutex<Pending<T>>> = Arc::downgrade(&journal.pending);
        let recorder: Recorder<S> = Box::new(move |obj| {
            let Some(pending) = weak.upgrade() else {
                return false;
            };
            let journal = Changes { pending };
            match obj {
                Some(obj) => {
                    if let Some(k) = key(obj) {
                        journal.push(k);
                    }
                }
                None => journal.anything(),
            }
            true
        });
        lock_recorders(&self.recorders).push(recorder);
    }
}

fn lock_recorders<S>(
    recorders: &Mutex<Vec<Recorder<S>>>,
) -> std::sync::MutexGuard<'_, Vec<Recorder<S>>> {
    match recorders.lock() {
        Ok(r) => r,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Tells every live recorder of `recorders` about `obj` (`None`: the
/// whole store), and forgets those whose journal is gone.
fn record<S>(recorders: &Mutex<Vec<Recorder<S>>>, obj: Option<&S>) {
    lock_recorders(recorders).retain(|r| r(obj));
}

/// Starts following `api` with `config`; `what` names it in logs. The
/// returned future does the following and never ends: run it beside the
/// agent's work.
pub fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
) -> (Followed<K>, impl Future<Output = ()> + Send)
where
    K: Resource + Clone + DeserializeOwned + Debug + PartialEq + Send + Sync + 'static,
    K::DynamicType: Default,
{
    follow_with(api, config, what, Options::default())
}

/// [`follow`], with the objects stored as `options` say.
pub fn follow_with<K, S>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    options: Options<K, S>,
) -> (Followed<S>, impl Future<Output = ()> + Send)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
    S: PartialEq + Send + Sync + 'static,
{
    let (followed, mut feed) = Feed::new(options);
    let config = config.page_size(LIST_PAGE);
    let api = lean::api(api);
    let task = async move {
        let mut backoff = BACKOFF_INITIAL;
        loop {
            let mut events = watcher(api.clone(), config.clone()).boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        if feed.apply(unwrapped(event)) {
                            backoff = BACKOFF_INITIAL;
                            tracing::info!(what, "in sync with the API");
                        }
                    }
                    Err(error) => {
                        tracing::warn!(what, %error, "watch failed; listing again");
                        feed.failed();
                        break;
                    }
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    };
    (followed, task)
}

/// The event of a watch read lean ([`lean`]), with the objects read.
fn unwrapped<K>(event: watcher::Event<Lean<K>>) -> watcher::Event<K> {
    match event {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(obj) => watcher::Event::InitApply(obj.into_inner()),
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::Apply(obj) => watcher::Event::Apply(obj.into_inner()),
        watcher::Event::Delete(obj) => watcher::Event::Delete(obj.into_inner()),
    }
}

/// A store holding `objects`, as the follow task leaves it once it has
/// listed them (stored as `options` say, and current), without an API:
/// for tests and measurements of what stores hold.
pub fn filled<K, S>(objects: impl IntoIterator<Item = K>, options: Options<K, S>) -> Followed<S>
where
    K: Resource,
    S: PartialEq,
{
    let (followed, mut feed) = Feed::new(options);
    feed.apply(watcher::Event::Init);
    for obj in objects {
        feed.apply(watcher::Event::InitApply(obj));
    }
    feed.apply(watcher::Event::InitDone);
    followed
}

/// What turns watch events into a store's content: the store, its
/// recorders and its state, and the list in progress.
struct Feed<K, S> {
    store: Store<S>,
    recorders: Arc<Mutex<Vec<Recorder<S>>>>,
    options: Options<K, S>,
    tx: watch::Sender<SyncState>,
    /// The objects of a list in progress, swapped in when it is done.
    listing: Listing<S>,
    /// One copy of each namespace seen.
    namespaces: HashSet<Arc<str>>,
}

impl<K, S> Feed<K, S>
where
    K: Resource,
    S: PartialEq,
{
    fn new(options: Options<K, S>) -> (Followed<S>, Self) {
        let store = Store::default();
        let (tx, rx) = watch::channel(SyncState::default());
        let recorders: Arc<Mutex<Vec<Recorder<S>>>> = Arc::default();
        let followed = Followed {
            store: store.clone(),
            state: rx,
            recorders: recorders.clone(),
        };
        let feed = Self {
            store,
            recorders,
            options,
            tx,
            listing: HashMap::new(),
            namespaces: HashSet::new(),
        };
        (followed, feed)
    }

    /// Where `obj` is stored, its namespace shared.
    fn key(&mut self, obj: &K) -> Key {
        let meta = obj.meta();
        let namespace = meta.namespace.as_deref().unwrap_or_default();
        let namespace = match self.namespaces.get(namespace) {
            Some(ns) => ns.clone(),
            None => {
                let ns: Arc<str> = namespace.into();
                self.namespaces.insert(ns.clone());
                ns
            }
        };
        Key {
            namespace,
            name: meta.name.as_deref().unwrap_or_default().into(),
        }
    }

    /// The stored value of `obj`, and where it goes.
    fn stored(&mut self, mut obj: K) -> (Key, S) {
        // What the watch reads has none ([`crate::lean`]); objects given
        // to [`filled`] may.
        obj.meta_mut().managed_fields = None;
        if let Some(trim) = self.options.trim {
            trim(&mut obj);
        }
        let key = self.key(&obj);
        let value = (self.options.convert)(obj, &key);
        (key, value)
    }

    /// The value a list stores at `key`: what the store holds there
    /// already (and its name) when that is the same, or kept as
    /// [`Options::keep`] says, so that a relist (after a watch failed, or
    /// expired) shares what did not change with the store it replaces
    /// instead of holding a second copy of every object until it is
    /// swapped in.
    fn shared_if_unchanged(&self, key: Key, value: S) -> (Key, Arc<S>) {
        let objects = self.store.read();
        if let Some((name, stored)) = objects
            .get(&*key.namespace)
            .and_then(|names| names.get_key_value(&*key.name))
            && match self.options.keep {
                Some(keep) => keep(stored, &value),
                None => **stored == value,
            }
        {
            let key = Key {
                namespace: key.namespace,
                name: name.clone(),
            };
            return (key, stored.clone());
        }
        (key, Arc::new(value))
    }

    /// Applies one event of the watch; true when it ends a list (the
    /// store is current from then on).
    fn apply(&mut self, event: watcher::Event<K>) -> bool {
        let mut done = false;
        match event {
            watcher::Event::Init => {
                self.listing = HashMap::new();
            }
            watcher::Event::InitApply(obj) => {
                let (key, value) = self.stored(obj);
                let (key, value) = self.shared_if_unchanged(key, value);
                self.listing
                    .entry(key.namespace)
                    .or_default()
                    .push((key.name, value));
            }
            watcher::Event::InitDone => {
                // Collected, each namespace's objects are sorted and the
                // tree built from them whole, its nodes full (inserted one
                // by one in the API's order, which is the names', each
                // node would be left about half full). Of an object read
                // twice, the last read is kept.
                let listed: Objects<S> = std::mem::take(&mut self.listing)
                    .into_iter()
                    .map(|(ns, objects)| (ns, objects.into_iter().collect()))
                    .collect();
                *self.store.write() = listed;
                // Namespaces no object is in any more are forgotten.
                let objects = self.store.read();
                self.namespaces.retain(|ns| objects.contains_key(ns));
                drop(objects);
                record(&self.recorders, None);
                done = true;
            }
            watcher::Event::Apply(obj) => {
                let (key, value) = self.stored(obj);
                let value = Arc::new(value);
                insert(&mut self.store.write(), &key, value.clone());
                // Recorded once the store has it, so that a reader told
                // of a change finds it there.
                record(&self.recorders, Some(&value));
            }
            watcher::Event::Delete(obj) => {
                let (key, value) = self.stored(obj);
                let old = remove(&mut self.store.write(), &key);
                record(&self.recorders, Some(old.as_deref().unwrap_or(&value)));
            }
        }
        self.tx.send_modify(|s| {
            s.current |= done;
            s.generation += 1;
        });
        done
    }

    /// The watch failed: the store is no longer current.
    fn failed(&self) {
        record(&self.recorders, None);
        self.tx.send_modify(|s| {
            s.current = false;
            s.generation += 1;
        });
    }
}

#[cfg(test)]
mod tests;
