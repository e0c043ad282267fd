//! Reflection: keeping objects on the provider (and their status on the
//! consumer) as the consumer's objects say. This module owns the one
//! generic, level-triggered reflector loop ([`run`]); one module per kind
//! says what a key is and how one key converges: [`namespace`] (twin
//! namespaces from NamespaceOffloadings), [`pod`] (pods bound to the
//! virtual node, as ReplicaSets of one), [`mirror`] (ConfigMaps, Secrets,
//! Services and EndpointSlices copied into the twins, one reflector per
//! kind, translated by [`crate::forge::reflected`] and
//! [`crate::forge::exposition`]), [`references`] (holds back pods whose
//! ConfigMaps or Secrets are missing), [`token`] (service account
//! tokens of offloaded pods), [`event`] (remote pods' Events back onto
//! the local pods). [`deflated`] packs what the pod stores keep while
//! it waits. [`stores`] follows one kind per namespace. [`Error`] says
//! what failed converging a key, or what it waits for ([`NotYet`]).
//!
//! Level-triggered: a kind never reacts to an event, it compares the
//! reflector stores of both sides with what they should be, for every key
//! in them, whenever any store changes and at least every [`FULL_RESYNC`]. So a
//! restarted agent, a missed event or an object changed by someone else
//! all converge the same way, and nothing is done twice: what exists is
//! seen in the stores before anything is created.
//!
//! Cost at scale: a kind may give each key a fingerprint of what its
//! convergence reads ([`Kind::fingerprint`], e.g. the resource versions
//! of the objects of one pod on both sides), and say which keys its
//! stores changed since it was last asked ([`Kind::changed`], from
//! journals the stores write as they apply the watch's events). A scan
//! woken by a store change then looks at the keys that changed and those
//! whose time has come, not at 10,000 pods; every [`RESYNC`] a sweep
//! looks at every key and converges those whose fingerprint changed
//! (what no journal says, such as a copy changed by someone else); and
//! every [`FULL_RESYNC`] a full pass converges every key whatever its
//! fingerprint. The loop stays level-triggered: journals and
//! fingerprints say where to look, the stores what to do, and a missed
//! change is caught by the next sweep or full pass.

//! Keys are converged continuously rather than in passes: a scan queues
//! the keys to look at and each starts as soon as one of [`Kind::CONCURRENCY`]
//! slots is free, so a pod bound now does not wait for the slowest
//! request of the pods bound before it (the tail of the added start
//! latency).

pub mod claims;
mod deflated;
pub mod demand;
mod error;
pub mod event;
#[cfg(test)]
mod footprint;
mod keys;
pub mod mirror;
pub mod nameserver;
pub mod namespace;
pub mod no_room;
pub mod pod;
pub mod references;
pub mod stores;
pub mod token;

pub use self::error::{Error, NotYet};
pub use self::keys::Gathered;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt::Debug;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use liqo_agent_runtime::follow::Followed;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Every key's fingerprint is looked at this often, even when no store
/// changed or no journal says so.
pub const RESYNC: Duration = Duration::from_secs(5);
/// Every key converges this often, whatever its fingerprint: what is
/// neither watched nor in a fingerprint still converges.
pub const FULL_RESYNC: Duration = Duration::from_secs(60);
/// Retries of a failed key start here and double up to [`BACKOFF_MAX`].
const BACKOFF_INITIAL: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A store change wakes the loop after this pause, so that a burst of
/// changes (a list after a restart) is one pass, not hundreds.
const DEBOUNCE: Duration = Duration::from_millis(20);
/// The room a kind's queue of keys keeps when it drains.
const QUEUE_ROOM: usize = 64;

/// The key of a kind whose keys are objects: their namespace and name,
/// shared with the stores (a clone is a reference count). A kind keeps
/// one per object it converged, and a sweep makes one per object of a
/// kind: at 10,000 pods, tens of thousands of them.
pub type ObjectKey = (Arc<str>, Arc<str>);

/// What a converged key needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing until a store changes (or the next resync).
    Done,
    /// Look again after this long: something is under way that no watched
    /// store will say is over (a namespace being deleted on the provider).
    After(Duration),
}

/// One kind of reflected object.
pub trait Kind: Send + Sync {
    type Key: Ord + Hash + Clone + Debug + Send + Sync;
    /// The kind's name in logs.
    const NAME: &'static str;
    /// How many keys converge at once: enough to keep a slow API busy, few
    /// enough not to flood it after a restart.
    const CONCURRENCY: usize = 32;
    /// Called once per pass before [`Kind::keys`]: adjust what is followed.
    fn prepare(&self) {}
    /// Every key present on either side.
    fn keys(&self) -> Vec<Self::Key>;
    /// What [`Kind::converge`] reads for `key`, hashed: while it stays the
    /// same, a key that converged is not looked at again before the next
    /// full pass (nor before its time, when it asked to be looked at again
    /// after a while). `None` (the default): look at it on every pass.
    fn fingerprint(&self, _key: &Self::Key) -> Option<u64> {
        None
    }
    /// The keys whose objects changed since the last call (repeats
    /// allowed), or `None`: any key may have (the default, and what a
    /// kind says when something outside its journals changed, such as
    /// the twins). Called once per scan, before [`Kind::keys`] if that
    /// is called.
    fn changed(&self) -> Option<Vec<Self::Key>> {
        None
    }
    /// Makes one key as it should be.
    fn converge(&self, key: &Self::Key) -> impl Future<Output = Result<Next, Error>> + Send;
}

/// Runs `kind` forever: on every wake-up of `wake`, every key the kind
/// says changed ([`Kind::changed`]; every key when it cannot say) whose
/// fingerprint changed (or that has none) converges; every key's
/// fingerprint is looked at every [`RESYNC`]; every key converges at
/// least every [`FULL_RESYNC`], failed ones again after their backoff,
/// and those that asked for it after their time.
///
/// The full passes are spread over the sweeps: each sweep converges the
/// keys of one slice (by their hash) whatever their fingerprint, and the
/// slices come round within [`FULL_RESYNC`]; only the first pass takes
/// every key. Queued all at once, every key of every kind was held in the
/// queues together each minute (at 10,000 pods, megabytes for a moment).
///
/// Keys are converged continuously, [`Kind::CONCURRENCY`] at a time: a scan
/// (on a wake-up, debounced) queues the keys to look at, and a key is
/// started as soon as a slot is free, without waiting for the slowest
/// request of the keys started before it. A key is never converged twice
/// at once; one that a scan skipped because it was under way is scanned
/// again when it ends.
pub async fn run<K: Kind>(kind: K, wake: Arc<Notify>) {
    run_every(kind, wake, RESYNC, FULL_RESYNC, next_phase(RESYNC)).await;
}

/// The kinds start together and would sweep together, each holding every
/// key of its own at that moment (at 10,000 pods, a megabyte or two in
/// all, at once): each loop's sweeps come `phase` (within one `sweep`)
/// after the others'. Spread by the golden ratio, phases stay apart
/// however many loops start.
fn next_phase(sweep: Duration) -> Duration {
    static STARTED: AtomicU32 = AtomicU32::new(0);
    let started = STARTED.fetch_add(1, Ordering::Relaxed);
    sweep.mul_f64((f64::from(started) * 0.618_033_988_749_895).fract())
}

/// [`run`], sweeping every `sweep` and converging every key every `full`,
/// the sweeps after the first coming `phase` early.
async fn run_every<K: Kind>(
    kind: K,
    wake: Arc<Notify>,
    sweep: Duration,
    full: Duration,
    phase: Duration,
) {
    // The keys are converged whole in `slices` slices, one every
    // `slice_period`, so that each is converged every `full`.
    let slice_period = sweep.min(full);
    let slices = u64::try_from(full.as_millis() / slice_period.as_millis().max(1))
        .unwrap_or(1)
        .max(1);
    // Per key: when to look again, and the current backoff (zero when the
    // last attempt did not fail) and the last error logged (a hash of its
    // text: while a store lists again every key fails, at 10,000 pods as
    // many texts).
    let mut again: BTreeMap<K::Key, (Instant, Duration, Option<u64>)> = BTreeMap::new();
    // Per key that converged (Done, or After a while), by the key's hash:
    // the fingerprint it converged with. Two keys of one hash (at 40,000
    // keys, a chance in billions) share an entry: a key found unchanged
    // by the other's fingerprint waits for the next full pass; a key gone
    // whose hash a live key has is kept until that one goes too.
    let mut done: HashMap<u64, u64> = HashMap::new();
    // What the last scan cost: scans are spaced by four times that at
    // least, so that scanning many keys stays a fraction of the work.
    let mut scan_cost = Duration::ZERO;
    let mut last_sweep: Option<Instant> = None;
    // When the last slice was converged whole, and how many were.
    let mut last_slice: Option<Instant> = None;
    let mut slices_done: u64 = 0;
    // Keys under way, and whether a scan skipped them meanwhile.
    let mut in_flight: BTreeMap<K::Key, bool> = BTreeMap::new();
    // Keys to start, with the fingerprint taken when they were queued.
    let mut queue: VecDeque<(K::Key, Option<u64>)> = VecDeque::new();
    let mut running = FuturesUnordered::new();
    // When to scan next (now, at the start).
    let mut scan_at: Option<Instant> = Some(Instant::now());
    loop {
        let now = Instant::now();
        if scan_at.is_some_and(|at| at <= now) {
            scan_at = None;
            kind.prepare();
            let changed = kind.changed();
            let first = last_slice.is_none();
            // The slice this scan converges whole, when one is due: every
            // key the first time.
            let full_slice = last_slice
                .is_none_or(|at| now.saturating_duration_since(at) >= slice_period)
                .then(|| {
                    last_slice = Some(now);
                    slices_done += 1;
                    (slices_done > 1).then_some(slices_done % slices)
                });
            let is_sweep = full_slice.is_some()
                || changed.is_none()
                || last_sweep.is_none_or(|at| now.saturating_duration_since(at) >= sweep);
            // Sorted, each once. Sorted in place and looked up by hash: a
            // sweep at 10,000 pods held a second copy of every key, in a
            // tree, a megabyte per kind at every pass.
            let mut candidates: Vec<K::Key> = match changed {
                Some(mut keys) if !is_sweep => {
                    // What the journals say, and the keys whose time has
                    // come (a backoff over, a wait asked for).
                    keys.extend(
                        again
                            .iter()
                            .filter(|(_, (at, _, _))| *at <= now)
                            .map(|(k, _)| k.clone()),
                    );
                    keys
                }
                _ => {
                    last_sweep = Some(now);
                    kind.keys()
                }
            };
            candidates.sort_unstable();
            candidates.dedup();
            if first {
                let shifted = now.checked_sub(phase).unwrap_or(now);
                last_sweep = Some(shifted);
                last_slice = Some(shifted);
            }
            if is_sweep {
                // Keys gone from both sides are forgotten (their hashes
                // sorted in a list: a set took twice the room).
                let mut hashes: Vec<u64> = candidates.iter().map(hash_of).collect();
                hashes.sort_unstable();
                let present = |hash: &u64| hashes.binary_search(hash).is_ok();
                again.retain(|k, _| present(&hash_of(k)));
                done.retain(|k, _| present(k));
                queue.retain(|(k, _)| present(&hash_of(k)));
            }
            let queued: HashSet<u64> = queue.iter().map(|(k, _)| hash_of(k)).collect();
            for k in candidates {
                if let Some(skipped) = in_flight.get_mut(&k) {
                    *skipped = true;
                    continue;
                }
                // A failed key waits for its backoff; any other is looked
                // at unless it converged with what the stores still say.
                let waiting = again
                    .get(&k)
                    .is_some_and(|(at, backoff, _)| !backoff.is_zero() && *at > now);
                if waiting || queued.contains(&hash_of(&k)) {
                    continue;
                }
                let print = kind.fingerprint(&k);
                // Converged with what the stores still say, and not due
                // again (a failed key is always looked at once its
                // backoff is over).
                let not_due = again
                    .get(&k)
                    .is_none_or(|(at, backoff, _)| backoff.is_zero() && *at > now);
                let is_full = match full_slice {
                    Some(Some(slice)) => hash_of(&k) % slices == slice,
                    Some(None) => true,
                    None => false,
                };
                let unchanged = !is_full
                    && not_due
                    && print.is_some()
                    && done.get(&hash_of(&k)).copied() == print;
                if !unchanged {
                    queue.push_back((k, print));
                }
            }
            scan_cost = now.elapsed();
            tracing::trace!(kind = K::NAME, queued = queue.len(), running = running.len(), cost = ?scan_cost, "scanned");
        }
        while running.len() < K::CONCURRENCY
            && let Some((key, print)) = queue.pop_front()
        {
            in_flight.insert(key.clone(), false);
            let kind = &kind;
            running.push(async move {
                // When each key starts and how long it took, for telling
                // a wait for a slot from a slow request (`RUST_LOG` at
                // trace for this module; `tests/bench/offload.sh
                // --agent-log`).
                tracing::trace!(kind = K::NAME, ?key, "converging");
                let started = Instant::now();
                let result = kind.converge(&key).await;
                tracing::trace!(kind = K::NAME, ?key, took = ?started.elapsed(), ok = result.is_ok(), "converge ended");
                (key, print, result)
            });
        }
        // A full pass queues every key: the queue's room is given back as
        // it drains, not held at its largest for as long as the agent
        // runs (at 10,000 pods, a megabyte per kind).
        if queue.capacity() > QUEUE_ROOM && queue.len() < queue.capacity() / 4 {
            queue.shrink_to(QUEUE_ROOM.max(queue.len() * 2));
        }
        let now = Instant::now();
        let until = |last: Option<Instant>, period: Duration| {
            last.map_or(Duration::ZERO, |at| {
                period.saturating_sub(now.saturating_duration_since(at))
            })
        };
        let to_sweep = until(last_sweep, sweep).min(until(last_slice, slice_period));
        // Only what is still to come: a key past its time is queued or
        // under way since the last scan.
        let mut next = again
            .values()
            .map(|(at, _, _)| *at)
            .filter(|at| *at > now)
            .min()
            .map_or(sweep, |at| at.saturating_duration_since(now))
            .min(to_sweep);
        if let Some(at) = scan_at {
            next = next.min(at.saturating_duration_since(now));
        }
        tokio::select! {
            Some((key, print, result)) = running.next(), if !running.is_empty() => {
                let skipped = in_flight.remove(&key) == Some(true);
                record::<K>(&mut again, &mut done, key.clone(), print, result);
                // A scan passed it by while it ran: that key alone is
                // looked at again (a whole new scan here would, for a kind
                // without fingerprints, queue every key again, forever).
                let backing_off = again
                    .get(&key)
                    .is_some_and(|(_, backoff, _)| !backoff.is_zero());
                if skipped && !backing_off && !queue.iter().any(|(k, _)| *k == key) {
                    let print = kind.fingerprint(&key);
                    queue.push_back((key, print));
                }
            }
            () = wake.notified() => scan_soon(&mut scan_at, DEBOUNCE.max(scan_cost * 4)),
            () = tokio::time::sleep(next) => {
                if scan_at.is_none() {
                    scan_at = Some(Instant::now());
                }
            }
        }
    }
}

/// A value's hash, the same in every pass and every run: a key's (`done`
/// in [`run_every`]), an error's text (the last one logged).
fn hash_of<T: Hash>(value: &T) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// Schedules a scan after `pause`, unless one is due sooner: a burst of
/// changes is one scan, not hundreds.
fn scan_soon(scan_at: &mut Option<Instant>, pause: Duration) {
    let at = Instant::now() + pause;
    *scan_at = Some(scan_at.map_or(at, |s| s.min(at)));
}

/// Keeps what one convergence of `key` says for the next scans: its
/// fingerprint when it converged, its backoff and error when it failed.
fn record<K: Kind>(
    again: &mut BTreeMap<K::Key, (Instant, Duration, Option<u64>)>,
    done: &mut HashMap<u64, u64>,
    key: K::Key,
    print: Option<u64>,
    result: Result<Next, Error>,
) {
    let now = Instant::now();
    match (&result, print) {
        (Ok(Next::Done | Next::After(_)), Some(print)) => {
            done.insert(hash_of(&key), print);
        }
        _ => {
            done.remove(&hash_of(&key));
        }
    }
    match result {
        Ok(Next::Done) => {
            if let Some((_, _, Some(_))) = again.remove(&key) {
                tracing::info!(kind = K::NAME, ?key, "converged");
            }
        }
        Ok(Next::After(wait)) => {
            let logged = again.remove(&key).and_then(|(_, _, e)| e);
            again.insert(key, (now + wait, Duration::ZERO, logged));
        }
        Err(error) => {
            let (backoff, logged) = match again.remove(&key) {
                Some((_, b, logged)) if !b.is_zero() => ((b * 2).min(BACKOFF_MAX), logged),
                Some((_, _, logged)) => (BACKOFF_INITIAL, logged),
                None => (BACKOFF_INITIAL, None),
            };
            let why = error.chain();
            let hash = hash_of(&why);
            if logged != Some(hash) {
                // Waiting for a store or a client is expected after a
                // start; only real failures are warnings.
                if error.is_waiting() {
                    tracing::debug!(kind = K::NAME, ?key, %why, "not yet; retrying");
                } else {
                    tracing::warn!(kind = K::NAME, ?key, %why, "cannot converge; retrying");
                }
            }
            again.insert(key, (now + backoff, backoff, Some(hash)));
        }
    }
}

/// Whether what a kind reads besides its journaled stores (the twins,
/// the provider's client, the remap) changed since it was last asked:
/// its hash is kept, and a change means "any key may have changed".
#[derive(Debug, Default)]
pub struct Unjournaled(std::sync::Mutex<Option<u64>>);

impl Unjournaled {
    /// Whether `now` differs from the hash of the last call (true on the
    /// first).
    pub fn changed(&self, now: u64) -> bool {
        let Ok(mut last) = self.0.lock() else {
            return true;
        };
        last.replace(now) != Some(now)
    }
}

/// The twins' keys in a journal, `(twin, name)`, as keys of the local
/// namespaces, `(local namespace, name)`; those of a twin no longer
/// known are dropped (the twin's stores are stopped, which says
/// "anything").
pub fn in_local_namespaces(
    twins: &namespace::Twins,
    keys: Vec<ObjectKey>,
) -> impl Iterator<Item = ObjectKey> {
    let local_of: BTreeMap<String, Arc<str>> = twins
        .iter()
        .map(|(l, t)| (t.clone(), Arc::from(l.as_str())))
        .collect();
    keys.into_iter()
        .filter_map(move |(twin, name)| Some((local_of.get(&*twin)?.clone(), name)))
}

/// Wakes `wake` whenever `followed`'s store changes; never ends while the
/// store is followed.
pub async fn wake_on<S>(mut followed: Followed<S>, wake: Arc<Notify>) {
    while followed.state.changed().await.is_ok() {
        wake.notify_one();
    }
}

#[cfg(test)]
mod tests;
