//! The Pod Security level an offloaded namespace carries on its consumer,
//! so that a pod its providers would refuse is refused here, at creation,
//! the Kubernetes way: `kubectl apply` warns, a ReplicaSet gets
//! `FailedCreate` with the reason and its controller backs off, rather
//! than a pod made, bound, refused and replaced at once
//! (docs/offloading.md, "A pod the provider's terms refuse").
//!
//! The level is the strictest of the providers that may receive the
//! namespace's pods. With `Remote` every pod goes to one of them: the
//! namespace enforces it. With `LocalAndRemote` a pod may still run at
//! home: it only warns and audits at it. `Local` sets nothing. The
//! namespace's own labels are kept where they are as strict or stricter,
//! and put back as they were when the offloading ends: what they were is
//! kept in [`BEFORE`]. Pure: no IO.

use std::collections::BTreeMap;
use std::str::FromStr;

use crate::admission::labels;
use crate::offloading::PodOffloadingStrategy;
use crate::pod_security::Level;

/// The annotation of an offloaded namespace that keeps its own Pod
/// Security mode labels as they were before liqoctl set its providers'
/// level (JSON: label to value, `null` where there was none).
pub const BEFORE: &str = "liqo.io/pod-security-before";

/// The modes set at the providers' level for `strategy`.
pub fn modes(strategy: PodOffloadingStrategy) -> &'static [&'static str] {
    match strategy {
        PodOffloadingStrategy::Remote => &labels::MODES,
        PodOffloadingStrategy::LocalAndRemote => &[labels::AUDIT, labels::WARN],
        PodOffloadingStrategy::Local => &[],
    }
}

/// What changes on a namespace: each label or annotation to its new value
/// (`None`: removed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub labels: BTreeMap<String, Option<String>>,
    pub annotations: BTreeMap<String, Option<String>>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

/// What puts a namespace with `current_labels` and `current_annotations`
/// at `level` (`None`: no provider's level, so its own labels come back)
/// for `strategy`.
pub fn changes(
    strategy: PodOffloadingStrategy,
    level: Option<Level>,
    current_labels: &BTreeMap<String, String>,
    current_annotations: &BTreeMap<String, String>,
) -> Changes {
    let before: BTreeMap<String, Option<String>> = current_annotations
        .get(BEFORE)
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_else(|| {
            labels::MODES
                .iter()
                .map(|m| ((*m).to_owned(), current_labels.get(*m).cloned()))
                .collect()
        });
    let wanted: BTreeMap<String, Option<String>> = labels::MODES
        .iter()
        .map(|mode| {
            let own = before.get(*mode).cloned().flatten();
            let value = match level.filter(|_| modes(strategy).contains(mode)) {
                Some(level) => {
                    let own_level = own.as_deref().and_then(|v| Level::from_str(v).ok());
                    match own_level {
                        Some(o) if o >= level => own,
                        _ => Some(level.as_str().to_owned()),
                    }
                }
                None => own,
            };
            ((*mode).to_owned(), value)
        })
        .collect();
    let mut out = Changes::default();
    for (mode, value) in &wanted {
        if current_labels.get(mode) != value.as_ref() {
            out.labels.insert(mode.clone(), value.clone());
        }
    }
    let ours = wanted
        .iter()
        .any(|(mode, value)| before.get(mode).cloned().flatten() != *value);
    let annotation = ours.then(|| serde_json::to_string(&before).unwrap_or_default());
    if current_annotations.get(BEFORE) != annotation.as_ref() {
        out.annotations.insert(BEFORE.to_owned(), annotation);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// The labels and annotations after `c`.
    fn after(
        c: &Changes,
        mut l: BTreeMap<String, String>,
        mut a: BTreeMap<String, String>,
    ) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        for (k, v) in &c.labels {
            match v {
                Some(v) => l.insert(k.clone(), v.clone()),
                None => l.remove(k),
            };
        }
        for (k, v) in &c.annotations {
            match v {
                Some(v) => a.insert(k.clone(), v.clone()),
                None => a.remove(k),
            };
        }
        (l, a)
    }

    #[test]
    fn remote_enforces_local_and_remote_warns_and_the_end_puts_back_what_was() {
        use PodOffloadingStrategy::*;
        let own = map(&[("team", "a")]);
        let none = BTreeMap::new();
        let c = changes(Remote, Some(Level::Baseline), &own, &none);
        let (l, a) = after(&c, own.clone(), none.clone());
        for m in labels::MODES {
            assert_eq!(l.get(m).map(String::as_str), Some("baseline"), "{m}");
        }
        assert!(a.contains_key(BEFORE));
        // Applied again: nothing more.
        assert!(changes(Remote, Some(Level::Baseline), &l, &a).is_empty());
        // LocalAndRemote: warn and audit only.
        let c = changes(LocalAndRemote, Some(Level::Restricted), &l, &a);
        let (l2, a2) = after(&c, l.clone(), a.clone());
        assert_eq!(l2.get(labels::ENFORCE), None);
        assert_eq!(l2.get(labels::WARN).map(String::as_str), Some("restricted"));
        // The end: its own labels back, our annotation gone.
        let c = changes(Local, None, &l2, &a2);
        let (l3, a3) = after(&c, l2, a2);
        assert_eq!(l3, own);
        assert_eq!(a3, none);
    }

    #[test]
    fn a_stricter_level_of_the_namespaces_own_is_kept_and_a_looser_one_comes_back() {
        use PodOffloadingStrategy::*;
        let own = map(&[
            (labels::ENFORCE, "restricted"),
            (labels::WARN, "privileged"),
        ]);
        let none = BTreeMap::new();
        let c = changes(Remote, Some(Level::Baseline), &own, &none);
        assert!(!c.labels.contains_key(labels::ENFORCE), "{c:?}");
        let (l, a) = after(&c, own.clone(), none.clone());
        assert_eq!(l.get(labels::WARN).map(String::as_str), Some("baseline"));
        assert_eq!(l.get(labels::AUDIT).map(String::as_str), Some("baseline"));
        let (l, a) = after(&changes(Remote, None, &l, &a), l, a);
        assert_eq!((l, a), (own.clone(), none.clone()));
        // Nothing stricter than what it has: nothing is ours to keep.
        let strict = map(&[
            (labels::ENFORCE, "restricted"),
            (labels::WARN, "restricted"),
            (labels::AUDIT, "restricted"),
        ]);
        assert!(changes(Remote, Some(Level::Baseline), &strict, &none).is_empty());
    }
}
