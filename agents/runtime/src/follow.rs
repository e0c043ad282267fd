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

use std::fmt::Debug;
use std::hash::Hash;
use std::time::Duration;

use futures::StreamExt;
use kube::Api;
use kube::Resource;
use kube::runtime::reflector::{self, Store};
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

/// A store that a background task keeps following the API.
#[derive(Clone)]
pub struct Followed<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    pub store: Store<K>,
    pub state: watch::Receiver<SyncState>,
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
    let (store, mut writer) = reflector::store();
    let (tx, rx) = watch::channel(SyncState::default());
    let task = async move {
        let mut backoff = BACKOFF_INITIAL;
        loop {
            let mut events = watcher(api.clone(), config.clone()).boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        writer.apply_watcher_event(&event);
                        let done = matches!(event, watcher::Event::InitDone);
                        if done {
                            backoff = BACKOFF_INITIAL;
                            tracing::info!(what, "in sync with the API");
                        }
                        tx.send_modify(|s| {
                            s.current |= done;
                            s.generation += 1;
                        });
                    }
                    Err(error) => {
                        tracing::warn!(what, %error, "watch failed; listing again");
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
    (Followed { store, state: rx }, task)
}
