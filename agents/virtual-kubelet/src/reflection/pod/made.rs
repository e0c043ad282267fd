//! The wrappers this agent made and its stores do not show yet: a hint,
//! in memory only, that keeps a pass from making one twice.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::reflection::ObjectKey;

/// How long a wrapper this agent made may take to show in its store
/// before a pass makes it again.
const MADE_WAIT: Duration = Duration::from_secs(10);

/// The wrappers this agent made that its store does not show yet, by
/// local pod (and its UID), with when. A pass that runs meanwhile (the
/// remote pod changed: scheduled, started) waits for the store rather than
/// making the wrapper again, which the provider refused (409) after its
/// admission's work: a quarter of the ReplicaSets made in a 1,000-pod
/// burst were made twice. Memory only, as a hint: after a restart the
/// stores are listed before anything is made, and a wrapper made twice is
/// refused as before.
pub(super) struct Made {
    /// How long a wrapper made may take to show ([`MADE_WAIT`]).
    wait: Duration,
    made: Mutex<HashMap<ObjectKey, (Option<String>, Instant)>>,
}

impl Default for Made {
    fn default() -> Self {
        Self::waiting_at_most(MADE_WAIT)
    }
}

impl Made {
    pub(super) fn waiting_at_most(wait: Duration) -> Self {
        Self {
            wait,
            made: Mutex::default(),
        }
    }

    pub(super) fn made(&self, key: &ObjectKey, uid: Option<String>) {
        if let Ok(mut made) = self.made.lock() {
            made.retain(|_, (_, at)| at.elapsed() < self.wait);
            made.insert(key.clone(), (uid, Instant::now()));
        }
    }

    /// How long still to wait for the wrapper made for pod `uid` at `key`.
    pub(super) fn waiting(&self, key: &ObjectKey, uid: &Option<String>) -> Option<Duration> {
        let made = self.made.lock().ok()?;
        let (made_for, at) = made.get(key)?;
        (made_for == uid)
            .then(|| self.wait.checked_sub(at.elapsed()))
            .flatten()
            .filter(|left| !left.is_zero())
    }

    /// The store shows it, or the pod is gone.
    pub(super) fn seen(&self, key: &ObjectKey) {
        if let Ok(mut made) = self.made.lock() {
            made.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapper_made_is_waited_for_until_seen_or_too_long() {
        let wait = Duration::from_millis(300);
        let made = Made::waiting_at_most(wait);
        let key: ObjectKey = ("shop".into(), "web-1".into());
        let uid = Some("u-1".to_owned());
        assert_eq!(made.waiting(&key, &uid), None, "nothing made");
        made.made(&key, uid.clone());
        assert!(made.waiting(&key, &uid).is_some_and(|left| left <= wait));
        assert_eq!(
            made.waiting(&key, &Some("u-2".to_owned())),
            None,
            "another pod of that name waits for nothing"
        );
        made.seen(&key);
        assert_eq!(made.waiting(&key, &uid), None, "seen in the store");
        made.made(&key, uid.clone());
        std::thread::sleep(wait);
        assert_eq!(
            made.waiting(&key, &uid),
            None,
            "not seen in time: made again"
        );
    }
}
