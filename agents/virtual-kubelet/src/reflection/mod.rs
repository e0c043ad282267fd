//! Reflection: keeping objects on the provider (and their status on the
//! consumer) as the consumer's objects say. This module owns the one
//! generic, level-triggered reflector loop ([`run`]); one module per kind
//! says what a key is and how one key converges: [`namespace`] (twin
//! namespaces from NamespaceOffloadings), [`pod`] (pods bound to the
//! virtual node, as ReplicaSets of one).
//!
//! Level-triggered: a kind never reacts to an event, it compares the
//! reflector stores of both sides with what they should be, for every key
//! in them, whenever any store changes and at least every [`RESYNC`]. So a
//! restarted agent, a missed event or an object changed by someone else
//! all converge the same way, and nothing is done twice: what exists is
//! seen in the stores before anything is created.
//!
//! Cost at scale: a kind may give each key a fingerprint of what its
//! convergence reads ([`Kind::fingerprint`], e.g. the resource versions
//! of the objects of one pod on both sides). A key whose last convergence
//! ended well is skipped while its fingerprint stays the same, except on
//! the full pass every [`RESYNC`], which looks at every key whatever its
//! fingerprint. So a store change costs a pass over the keys whose
//! objects changed, not over 10,000 pods, and the loop stays
//! level-triggered: the fingerprint is taken from the stores, not from
//! events, and a missed change is caught by the full pass.

pub mod namespace;
pub mod pod;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Resource;
use liqo_agent_runtime::follow::Followed;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Every key is looked at again this often even when no store changed:
/// what is not watched (a provider namespace, the passing of time) still
/// converges.
pub const RESYNC: Duration = Duration::from_secs(5);
/// How many keys converge at once: enough to keep a slow API busy, few
/// enough not to flood it after a restart.
const CONCURRENCY: usize = 32;
/// Retries of a failed key start here and double up to [`BACKOFF_MAX`].
const BACKOFF_INITIAL: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A store change wakes the loop after this pause, so that a burst of
/// changes (a list after a restart) is one pass, not hundreds.
const DEBOUNCE: Duration = Duration::from_millis(20);

/// What went wrong converging one key; it is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// Something the key needs is not there yet (the provider's client,
    /// the ForeignCluster, a store not in sync).
    #[error("{0}")]
    NotYet(String),
}

impl Error {
    pub fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let what = what.into();
        move |source| Self::Api { what, source }
    }

    /// The error and its causes on one line, for the log.
    fn chain(&self) -> String {
        let mut out = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            out.push_str(": ");
            out.push_str(&s.to_string());
            source = s.source();
        }
        out
    }
}

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
    type Key: Ord + Clone + Debug + Send + Sync;
    /// The kind's name in logs.
    const NAME: &'static str;
    /// Called once per pass before [`Kind::keys`]: adjust what is followed.
    fn prepare(&self) {}
    /// Every key present on either side.
    fn keys(&self) -> Vec<Self::Key>;
    /// What [`Kind::converge`] reads for `key`, hashed: while it stays the
    /// same, a key that converged is not looked at again before the next
    /// full pass. `None` (the default): look at it on every pass.
    fn fingerprint(&self, _key: &Self::Key) -> Option<u64> {
        None
    }
    /// Makes one key as it should be.
    fn converge(&self, key: &Self::Key) -> impl Future<Output = Result<Next, Error>> + Send;
}

/// Runs `kind` forever: every key converges on every wake-up of `wake`,
/// at least every [`RESYNC`], and failed ones again after their backoff.
pub async fn run<K: Kind>(kind: K, wake: Arc<Notify>) {
    // Per key: when to look again, and the current backoff (zero when the
    // last attempt did not fail) and the last error logged.
    let mut again: BTreeMap<K::Key, (Instant, Duration, Option<String>)> = BTreeMap::new();
    // Per key that converged (Done): the fingerprint it converged with.
    let mut done: BTreeMap<K::Key, u64> = BTreeMap::new();
    let mut last_full: Option<Instant> = None;
    loop {
        kind.prepare();
        let now = Instant::now();
        let full = last_full.is_none_or(|at| now.saturating_duration_since(at) >= RESYNC);
        if full {
            last_full = Some(now);
        }
        // A failed key waits for its backoff; any other is looked at on
        // every pass unless it converged with what the stores still say.
        let all: std::collections::BTreeSet<K::Key> = kind.keys().into_iter().collect();
        // Keys gone from both sides are forgotten.
        again.retain(|k, _| all.contains(k));
        done.retain(|k, _| all.contains(k));
        let keys: Vec<(K::Key, Option<u64>)> = all
            .into_iter()
            .filter(|k| {
                again
                    .get(k)
                    .is_none_or(|(at, backoff, _)| backoff.is_zero() || *at <= now)
            })
            .filter_map(|k| {
                let print = kind.fingerprint(&k);
                let unchanged = !full
                    && !again.contains_key(&k)
                    && print.is_some()
                    && done.get(&k).copied() == print;
                (!unchanged).then_some((k, print))
            })
            .collect();
        let results: Vec<_> = futures::stream::iter(keys)
            .map(|(key, print)| {
                let kind = &kind;
                async move {
                    let result = kind.converge(&key).await;
                    (key, print, result)
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let now = Instant::now();
        for (key, print, result) in results {
            match (&result, print) {
                (Ok(Next::Done), Some(print)) => {
                    done.insert(key.clone(), print);
                }
                _ => {
                    done.remove(&key);
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
                    if logged.as_deref() != Some(&why) {
                        // Waiting for a store or a client is expected
                        // after a start; only real failures are warnings.
                        if matches!(error, Error::NotYet(_)) {
                            tracing::debug!(kind = K::NAME, ?key, %why, "not yet; retrying");
                        } else {
                            tracing::warn!(kind = K::NAME, ?key, %why, "cannot converge; retrying");
                        }
                    }
                    again.insert(key, (now + backoff, backoff, Some(why)));
                }
            }
        }
        let to_full = last_full.map_or(Duration::ZERO, |at| {
            RESYNC.saturating_sub(now.saturating_duration_since(at))
        });
        let next = again
            .values()
            .map(|(at, _, _)| *at)
            .min()
            .map_or(RESYNC, |at| at.saturating_duration_since(now))
            .min(to_full);
        tokio::select! {
            () = wake.notified() => tokio::time::sleep(DEBOUNCE).await,
            () = tokio::time::sleep(next) => {}
        }
    }
}

/// Wakes `wake` whenever `followed`'s store changes; never ends while the
/// store is followed.
pub async fn wake_on<K>(mut followed: Followed<K>, wake: Arc<Notify>)
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    while followed.state.changed().await.is_ok() {
        wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Keys 1 and 2 have fingerprints the test sets, key 3 none.
    #[derive(Default)]
    struct Counting {
        prints: Mutex<BTreeMap<u32, u64>>,
        calls: Mutex<BTreeMap<u32, u32>>,
    }

    struct Kind3(Arc<Counting>);

    impl Kind for Kind3 {
        type Key = u32;
        const NAME: &'static str = "test";
        fn keys(&self) -> Vec<u32> {
            vec![1, 2, 3]
        }
        fn fingerprint(&self, key: &u32) -> Option<u64> {
            self.0.prints.lock().expect("lock").get(key).copied()
        }
        async fn converge(&self, key: &u32) -> Result<Next, Error> {
            *self.0.calls.lock().expect("lock").entry(*key).or_default() += 1;
            Ok(Next::Done)
        }
    }

    fn calls(c: &Counting) -> Vec<u32> {
        let calls = c.calls.lock().expect("lock");
        (1..=3)
            .map(|k| calls.get(&k).copied().unwrap_or(0))
            .collect()
    }

    #[tokio::test]
    async fn an_unchanged_key_waits_for_the_full_pass() {
        const SETTLE: Duration = Duration::from_millis(300);
        let counting = Arc::new(Counting::default());
        counting
            .prints
            .lock()
            .expect("lock")
            .extend([(1, 10), (2, 20)]);
        let wake = Arc::new(Notify::new());
        let started = Instant::now();
        let task = tokio::spawn(run(Kind3(counting.clone()), wake.clone()));
        tokio::time::sleep(SETTLE).await;
        assert_eq!(calls(&counting), [1, 1, 1], "the first pass is full");
        wake.notify_one();
        tokio::time::sleep(SETTLE).await;
        assert_eq!(calls(&counting), [1, 1, 2], "nothing changed but key 3");
        counting.prints.lock().expect("lock").insert(2, 21);
        wake.notify_one();
        tokio::time::sleep(SETTLE).await;
        assert_eq!(calls(&counting), [1, 2, 3], "key 2 changed");
        // The next full pass looks at every key.
        tokio::time::sleep_until(started + RESYNC + SETTLE).await;
        let after = calls(&counting);
        task.abort();
        assert_eq!(after[..2], [2, 3], "the full pass: {after:?}");
    }
}
