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
//! the local pods). [`stores`] follows one kind per namespace.
//!
//! Level-triggered: a kind never reacts to an event, it compares the
//! reflector stores of both sides with what they should be, for every key
//! in them, whenever any store changes and at least every [`RESYNC`]. So a
//! restarted agent, a missed event or an object changed by someone else
//! all converge the same way, and nothing is done twice: what exists is
//! seen in the stores before anything is created.

pub mod event;
pub mod mirror;
pub mod namespace;
pub mod pod;
pub mod references;
pub mod stores;
pub mod token;

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
const CONCURRENCY: usize = 16;
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
    /// Makes one key as it should be.
    fn converge(&self, key: &Self::Key) -> impl Future<Output = Result<Next, Error>> + Send;
}

/// Runs `kind` forever: every key converges on every wake-up of `wake`,
/// at least every [`RESYNC`], and failed ones again after their backoff.
pub async fn run<K: Kind>(kind: K, wake: Arc<Notify>) {
    // Per key: when to look again, and the current backoff (zero when the
    // last attempt did not fail) and the last error logged.
    let mut again: BTreeMap<K::Key, (Instant, Duration, Option<String>)> = BTreeMap::new();
    loop {
        kind.prepare();
        let now = Instant::now();
        // A failed key waits for its backoff; any other is looked at on
        // every pass, which costs nothing when it is as it should be.
        let all: std::collections::BTreeSet<K::Key> = kind.keys().into_iter().collect();
        // Keys gone from both sides are forgotten.
        again.retain(|k, _| all.contains(k));
        let keys: Vec<K::Key> = all
            .into_iter()
            .filter(|k| {
                again
                    .get(k)
                    .is_none_or(|(at, backoff, _)| backoff.is_zero() || *at <= now)
            })
            .collect();
        let results: Vec<_> = futures::stream::iter(keys)
            .map(|key| {
                let kind = &kind;
                async move {
                    let result = kind.converge(&key).await;
                    (key, result)
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let now = Instant::now();
        for (key, result) in results {
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
        let next = again
            .values()
            .map(|(at, _, _)| *at)
            .min()
            .map_or(RESYNC, |at| at.saturating_duration_since(now))
            .min(RESYNC);
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
