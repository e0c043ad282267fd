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
//! often a third of an object), and whatever else the caller says it does
//! not read. A store can also keep an index by a key of each object
//! ([`Options::index`], e.g. the value of a label), updated with the store from the same
//! events, so that finding the objects of one value costs no scan.
//!
//! Cost of reading: a reader that would otherwise look at every stored
//! object whenever one changes can ask a store to record what changed
//! into a [`Journal`] ([`Followed::record_into`]): the keys of the
//! objects applied or deleted since it last looked, or "anything" after a
//! list, a failed watch or more changes than a journal keeps. The store
//! stays the truth; the journal only says where to look first.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use futures::StreamExt;
use kube::Api;
use kube::Resource;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

/// First wait after a failed watch; it doubles up to [`BACKOFF_MAX`] and is
/// reset by a successful list.
const BACKOFF_INITIAL: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(8);

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
const JOURNAL_MAX: usize = 50_000;

/// What changed in one or more stores since the reader last took it: the
/// keys of the objects applied or deleted, in the reader's own terms
/// (each store is told how to make a key of an object), or "anything".
/// It says "anything" when it is new, after a store listed again or
/// failed, and past [`JOURNAL_MAX`] keys. Cheap to clone: clones share
/// one journal.
#[derive(Debug)]
pub struct Journal<T> {
    pending: Arc<Mutex<Pending<T>>>,
}

impl<T> Clone for Journal<T> {
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

impl<T> Default for Journal<T> {
    fn default() -> Self {
        Self {
            pending: Arc::new(Mutex::new(Pending {
                anything: true,
                keys: Vec::new(),
            })),
        }
    }
}

impl<T> Journal<T> {
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
        if p.keys.len() >= JOURNAL_MAX {
            p.anything = true;
            p.keys = Vec::new();
        } else {
            p.keys.push(key);
        }
    }
}

/// Records changes of a store into one journal: called with every applied
/// or deleted object (as stored: trimmed), or `None` when
/// the whole store changed. Returns false once the journal is dropped.
type Recorder<K> = Box<dyn Fn(Option<&K>) -> bool + Send + Sync>;

/// A store that a background task keeps following the API.
#[derive(Clone)]
pub struct Followed<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    pub store: Store<K>,
    pub state: watch::Receiver<SyncState>,
    /// The index by [`Options::index`], when one was asked for.
    index: Option<LabelIndex<K>>,
    recorders: Arc<Mutex<Vec<Recorder<K>>>>,
}

/// The followed objects by their index key: key → the objects'
/// references (few per value). Kept in step with the store by the task
/// that feeds it, from the same events.
struct LabelIndex<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    key: fn(&K) -> Option<String>,
    map: Arc<RwLock<HashMap<String, Vec<ObjectRef<K>>>>>,
}

impl<K> Clone for LabelIndex<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    fn clone(&self) -> Self {
        Self {
            key: self.key,
            map: self.map.clone(),
        }
    }
}

/// A reference by namespace and name only: the index keeps no resource
/// version or UID per object.
fn bare_ref<K>(obj: &K) -> ObjectRef<K>
where
    K: Resource,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    let meta = obj.meta();
    let key = ObjectRef::new(meta.name.as_deref().unwrap_or_default());
    match meta.namespace.as_deref() {
        Some(ns) => key.within(ns),
        None => key,
    }
}

/// The value of `label` on `obj`: an index key ([`Options::index`]).
pub fn label_of<K: Resource>(obj: &K, label: &str) -> Option<String> {
    obj.meta().labels.as_ref()?.get(label).cloned()
}

fn index_insert<K>(map: &mut HashMap<String, Vec<ObjectRef<K>>>, value: &str, key: ObjectRef<K>)
where
    K: Resource,
    K::DynamicType: Eq + Hash + Clone,
{
    let refs = map.entry(value.to_owned()).or_default();
    if !refs.contains(&key) {
        refs.push(key);
    }
}

fn index_remove<K>(map: &mut HashMap<String, Vec<ObjectRef<K>>>, value: &str, key: &ObjectRef<K>)
where
    K: Resource,
    K::DynamicType: Eq + Hash + Clone,
{
    if let Some(refs) = map.get_mut(value) {
        refs.retain(|r| r != key);
        if refs.is_empty() {
            map.remove(value);
        }
    }
}

/// How a store is fed, beyond what the watch returns.
pub struct Options<K> {
    /// Applied to every object before it is stored: drop what is never
    /// read. managedFields are dropped whatever this does.
    pub trim: Option<fn(&mut K)>,
    /// Keep an index by the key this gives of each object (none: not
    /// indexed) ([`Followed::by_index`]).
    pub index: Option<fn(&K) -> Option<String>>,
}

impl<K> Debug for Options<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("trim", &self.trim.is_some())
            .field("index", &self.index.is_some())
            .finish()
    }
}

impl<K> Default for Options<K> {
    fn default() -> Self {
        Self {
            trim: None,
            index: None,
        }
    }
}

impl<K> Debug for Followed<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Followed")
            .field("objects", &self.store.len())
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl<K> Followed<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    pub fn is_current(&self) -> bool {
        self.state.borrow().current
    }

    /// The stored objects whose [`Options::index`] key is `value`
    /// (none when the store keeps no index).
    pub fn by_index(&self, value: &str) -> Vec<Arc<K>> {
        let Some(index) = &self.index else {
            return Vec::new();
        };
        let refs = match index.map.read() {
            Ok(map) => map.get(value).cloned().unwrap_or_default(),
            Err(poisoned) => poisoned
                .into_inner()
                .get(value)
                .cloned()
                .unwrap_or_default(),
        };
        refs.iter().filter_map(|r| self.store.get(r)).collect()
    }

    /// From now on, records into `journal` the key `key` makes of every
    /// object applied or deleted, as stored (none when it gives `None`),
    /// and that
    /// anything changed whenever the store is listed again or fails. The
    /// journal is told "anything" at once: what the store held before is
    /// not in it.
    pub fn record_into<T>(
        &self,
        journal: &Journal<T>,
        key: impl Fn(&K) -> Option<T> + Send + Sync + 'static,
    ) where
        T: Send + 'static,
    {
        journal.anything();
        let weak: Weak<Mutex<Pending<T>>> = Arc::downgrade(&journal.pending);
        let recorder: Recorder<K> = Box::new(move |obj| {
            let Some(pending) = weak.upgrade() else {
                return false;
            };
            let journal = Journal { pending };
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

fn lock_recorders<K>(
    recorders: &Mutex<Vec<Recorder<K>>>,
) -> std::sync::MutexGuard<'_, Vec<Recorder<K>>> {
    match recorders.lock() {
        Ok(r) => r,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Tells every live recorder of `recorders` about `obj` (`None`: the
/// whole store), and forgets those whose journal is gone.
fn record<K>(recorders: &Mutex<Vec<Recorder<K>>>, obj: Option<&K>) {
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
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
{
    follow_with(api, config, what, Options::default())
}

/// [`follow`], with the stored objects trimmed and indexed as `options`
/// say.
pub fn follow_with<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    options: Options<K>,
) -> (Followed<K>, impl Future<Output = ()> + Send)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
{
    let (followed, mut feed) = Feed::new(options);
    let tx = feed.tx.clone();
    let task = async move {
        let mut backoff = BACKOFF_INITIAL;
        loop {
            let mut events = watcher(api.clone(), config.clone()).boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        if feed.apply(event) {
                            backoff = BACKOFF_INITIAL;
                            tracing::info!(what, "in sync with the API");
                        }
                    }
                    Err(error) => {
                        tracing::warn!(what, %error, "watch failed; listing again");
                        record(&feed.recorders, None);
                        tx.send_modify(|s| {
                            s.current = false;
                            s.generation += 1;
                        });
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

/// A store holding `objects`, as the follow task leaves it once it has
/// listed them (trimmed and indexed as `options` say, and current),
/// without an API: for tests and measurements of what stores hold.
pub fn filled<K>(objects: impl IntoIterator<Item = K>, options: Options<K>) -> Followed<K>
where
    K: Resource + Clone + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
{
    let (followed, mut feed) = Feed::new(options);
    feed.apply(watcher::Event::Init);
    for obj in objects {
        feed.apply(watcher::Event::InitApply(obj));
    }
    feed.apply(watcher::Event::InitDone);
    followed
}

/// What turns watch events into a store's content: the store's writer,
/// its index, its recorders and its state.
struct Feed<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    writer: reflector::store::Writer<K>,
    reader: Store<K>,
    index: Option<LabelIndex<K>>,
    /// The index of a list in progress, swapped in with the store's.
    buffer: HashMap<String, Vec<ObjectRef<K>>>,
    recorders: Arc<Mutex<Vec<Recorder<K>>>>,
    trim: Option<fn(&mut K)>,
    tx: watch::Sender<SyncState>,
}

impl<K> Feed<K>
where
    K: Resource + Clone + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
{
    fn new(options: Options<K>) -> (Followed<K>, Self) {
        let writer = reflector::store::Writer::default();
        let store = writer.as_reader();
        let (tx, rx) = watch::channel(SyncState::default());
        let index = options.index.map(|key| LabelIndex {
            key,
            map: Arc::default(),
        });
        let recorders: Arc<Mutex<Vec<Recorder<K>>>> = Arc::default();
        let followed = Followed {
            store: store.clone(),
            state: rx,
            index: index.clone(),
            recorders: recorders.clone(),
        };
        let feed = Self {
            writer,
            reader: store,
            index,
            buffer: HashMap::new(),
            recorders,
            trim: options.trim,
            tx,
        };
        (followed, feed)
    }

    /// Applies one event of the watch; true when it ends a list (the
    /// store is current from then on).
    fn apply(&mut self, event: watcher::Event<K>) -> bool {
        let trim = self.trim;
        let event = event.modify(|obj| {
            obj.meta_mut().managed_fields = None;
            if let Some(trim) = trim {
                trim(obj);
            }
        });
        if let Some(index) = &self.index {
            update_index(index, &mut self.buffer, &self.reader, &event);
        }
        self.writer.apply_watcher_event(&event);
        let done = matches!(event, watcher::Event::InitDone);
        // Recorded once the store has it, so that a reader told of a
        // change finds it there.
        match &event {
            watcher::Event::Apply(obj) | watcher::Event::Delete(obj) => {
                record(&self.recorders, Some(obj));
            }
            watcher::Event::InitDone => record(&self.recorders, None),
            _ => {}
        }
        self.tx.send_modify(|s| {
            s.current |= done;
            s.generation += 1;
        });
        done
    }
}

/// Brings `index` in step with `event`, before the store applies it (so
/// that the object it replaces is still in `store`).
fn update_index<K>(
    index: &LabelIndex<K>,
    buffer: &mut HashMap<String, Vec<ObjectRef<K>>>,
    store: &Store<K>,
    event: &watcher::Event<K>,
) where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    let mut map = match index.map.write() {
        Ok(map) => map,
        Err(poisoned) => poisoned.into_inner(),
    };
    match event {
        watcher::Event::Apply(obj) | watcher::Event::Delete(obj) => {
            let key = bare_ref(obj);
            if let Some(old) = store.get(&key)
                && let Some(value) = (index.key)(old.as_ref())
            {
                index_remove(&mut map, &value, &key);
            }
            if let watcher::Event::Apply(obj) = event
                && let Some(value) = (index.key)(obj)
            {
                index_insert(&mut map, &value, key);
            }
        }
        watcher::Event::Init => buffer.clear(),
        watcher::Event::InitApply(obj) => {
            if let Some(value) = (index.key)(obj) {
                index_insert(buffer, &value, bare_ref(obj));
            }
        }
        watcher::Event::InitDone => *map = std::mem::take(buffer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::ObjectMeta;

    const LABEL: &str = "example.com/owner";

    fn pod(name: &str, owner: Option<&str>, version: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("ns".to_owned()),
                resource_version: Some(version.to_owned()),
                labels: owner.map(|o| [(LABEL.to_owned(), o.to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    /// Feeds events to a store and its index as the follow task does, and
    /// returns, per owner asked, the names found by label.
    fn indexed(events: Vec<watcher::Event<Pod>>, owners: &[&str]) -> Vec<Vec<String>> {
        let (store, mut writer) = reflector::store();
        let index = LabelIndex {
            key: |p: &Pod| label_of(p, LABEL),
            map: Arc::default(),
        };
        let mut buffer = HashMap::new();
        for event in events {
            update_index(&index, &mut buffer, &store, &event);
            writer.apply_watcher_event(&event);
        }
        let followed = Followed {
            store,
            state: watch::channel(SyncState::default()).1,
            index: Some(index),
            recorders: Arc::default(),
        };
        owners
            .iter()
            .map(|o| {
                let mut names: Vec<String> = followed
                    .by_index(o)
                    .iter()
                    .filter_map(|p| p.metadata.name.clone())
                    .collect();
                names.sort();
                names
            })
            .collect()
    }

    #[test]
    fn the_index_follows_the_store() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        type Case = (
            &'static str,
            Vec<watcher::Event<Pod>>,
            Vec<Vec<&'static str>>,
        );
        let cases: Vec<Case> = vec![
            (
                "a list, then changes",
                vec![
                    Init,
                    InitApply(pod("a", Some("x"), "1")),
                    InitApply(pod("b", Some("x"), "1")),
                    InitApply(pod("c", None, "1")),
                    InitDone,
                    Apply(pod("d", Some("y"), "2")),
                ],
                vec![vec!["a", "b"], vec!["d"]],
            ),
            (
                "a relabelled object moves",
                vec![
                    Init,
                    InitApply(pod("a", Some("x"), "1")),
                    InitDone,
                    Apply(pod("a", Some("y"), "2")),
                ],
                vec![vec![], vec!["a"]],
            ),
            (
                "a deleted object goes, an unlabelled one is never there",
                vec![
                    Init,
                    InitApply(pod("a", Some("x"), "1")),
                    InitApply(pod("b", Some("x"), "1")),
                    InitDone,
                    Delete(pod("a", Some("x"), "2")),
                    Apply(pod("b", None, "2")),
                ],
                vec![vec![], vec![]],
            ),
            (
                "a relist replaces the index whole, and only when done",
                vec![
                    Init,
                    InitApply(pod("a", Some("x"), "1")),
                    InitDone,
                    Init,
                    InitApply(pod("b", Some("y"), "3")),
                ],
                vec![vec!["a"], vec![]],
            ),
            (
                "after the relist",
                vec![
                    Init,
                    InitApply(pod("a", Some("x"), "1")),
                    InitDone,
                    Init,
                    InitApply(pod("b", Some("y"), "3")),
                    InitDone,
                ],
                vec![vec![], vec!["b"]],
            ),
        ];
        for (name, events, want) in cases {
            assert_eq!(indexed(events, &["x", "y"]), want, "{name}");
        }
    }

    #[test]
    fn without_an_index_nothing_is_found() {
        let (store, _writer) = reflector::store::<Pod>();
        let followed = Followed {
            store,
            state: watch::channel(SyncState::default()).1,
            index: None,
            recorders: Arc::default(),
        };
        assert!(followed.by_index("x").is_empty());
    }

    #[test]
    fn a_journal_says_what_changed_or_anything() {
        let followed = {
            let (store, _writer) = reflector::store::<Pod>();
            Followed {
                store,
                state: watch::channel(SyncState::default()).1,
                index: None,
                recorders: Arc::default(),
            }
        };
        let journal = Journal::new();
        followed.record_into(&journal, |p: &Pod| p.metadata.name.clone());
        assert_eq!(journal.take(), None, "new: anything");
        assert_eq!(journal.take(), Some(vec![]), "then nothing");
        record(&followed.recorders, Some(&pod("a", None, "1")));
        record(&followed.recorders, Some(&pod("b", None, "1")));
        assert_eq!(journal.take(), Some(vec!["a".to_owned(), "b".to_owned()]));
        // A relist or a failed watch: anything, and what was recorded
        // before it is dropped.
        record(&followed.recorders, Some(&pod("c", None, "1")));
        record(&followed.recorders, None);
        record(&followed.recorders, Some(&pod("d", None, "1")));
        assert_eq!(journal.take(), None);
        // Past its bound, a journal says anything.
        for _ in 0..=JOURNAL_MAX {
            record(&followed.recorders, Some(&pod("e", None, "1")));
        }
        assert_eq!(journal.take(), None, "past the bound");
        // A dropped journal's recorder goes with the next change.
        drop(journal);
        record(&followed.recorders, Some(&pod("f", None, "1")));
        assert!(lock_recorders(&followed.recorders).is_empty());
    }
}
