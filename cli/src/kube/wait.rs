//! Waiting for an object to reach a state, the kube-runtime way: a watch
//! (`await_condition`) under a deadline. A watch that fails (the API
//! dropped, rights withdrawn) ends the wait with the same error any other
//! request would give, so an unreachable cluster exits 4 mid-wait too.

use std::fmt::Debug;
use std::time::Duration;

use kube::Resource;
use kube::api::Api;
use kube::runtime::wait::{Condition, await_condition};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

use crate::factory::ClusterClient;

/// How a wait ended, when it did not fail.
#[derive(Debug)]
pub enum Waited<K> {
    /// The condition held; the object as it was then (`None` if it is gone).
    Done(Option<K>),
    TimedOut,
}

/// Waits until `condition` holds for the object `name`, for at most
/// `timeout`. `doing` says what was awaited, for error messages.
pub async fn until<K>(
    cluster: &ClusterClient,
    api: Api<K>,
    name: &str,
    condition: impl Condition<K>,
    timeout: Duration,
    doing: &str,
) -> anyhow::Result<Waited<K>>
where
    K: Clone + Debug + Send + DeserializeOwned + Resource + 'static,
{
    match tokio::time::timeout(timeout, await_condition(api, name, condition)).await {
        Err(_elapsed) => Ok(Waited::TimedOut),
        Ok(Ok(object)) => Ok(Waited::Done(object)),
        Ok(Err(kube::runtime::wait::Error::ProbeFailed(e))) => Err(match e {
            watcher::Error::InitialListFailed(e)
            | watcher::Error::WatchStartFailed(e)
            | watcher::Error::WatchFailed(e) => cluster.explain(e, doing),
            other => {
                anyhow::Error::new(other).context(format!("{doing} on cluster {}", cluster.name))
            }
        }),
    }
}

/// The time left before `deadline`, for waits that share one `--timeout`.
pub fn left(deadline: tokio::time::Instant) -> Duration {
    deadline.saturating_duration_since(tokio::time::Instant::now())
}
