//! Pending local pods kept whole, within a budget. The store keeps a
//! pending pod's JSON (deflated) until its wrapper is made, so that making
//! it reads nothing from the API. When the consumer binds pods faster than
//! the provider takes them (a scale-up of thousands), thousands wait at
//! once, and kept whole they were the largest part of the agent's peak
//! memory. So the texts kept together stay within [`KEPT_MAX`]; a pod that
//! comes past it is kept without, and read from the API when it is made
//! (one GET). A burst of a thousand pods stays within it.

use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::Pod;

use crate::reflection::deflated::{Dictionary, deflate, inflate};

/// The deflated pending pods kept at once, in bytes: about 1,500 pods of
/// a Deployment (a pending pod deflates to about 350 bytes,
/// docs/benchmarks.md, "Reflection stores").
const KEPT_MAX: usize = 512 * 1024;

/// The one budget of the process: the agent has one store of local pods.
static KEPT: Budget = Budget::new(KEPT_MAX);

/// A number of bytes that what is kept together stays within.
#[derive(Debug)]
struct Budget {
    held: AtomicUsize,
    max: usize,
}

impl Budget {
    const fn new(max: usize) -> Self {
        Self {
            held: AtomicUsize::new(0),
            max,
        }
    }

    /// Whether there is room left at all.
    fn has_room(&self) -> bool {
        self.held.load(Ordering::Relaxed) < self.max
    }

    /// Takes `n` bytes of it; false, and nothing taken, when that would
    /// pass its max.
    fn take(&self, n: usize) -> bool {
        self.held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(n).filter(|&after| after <= self.max)
            })
            .is_ok()
    }

    /// Counts `n` bytes whatever is left: a copy of what is kept already.
    fn add(&self, n: usize) {
        self.held.fetch_add(n, Ordering::Relaxed);
    }

    fn give_back(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::Relaxed);
    }
}

/// A pending pod kept whole: its JSON deflated, counted in the budget
/// while it is held.
#[derive(Debug, PartialEq)]
pub(super) struct Whole(Box<[u8]>);

impl Whole {
    /// `pod` kept whole, if the budget has room for it.
    pub(super) fn kept(pod: &Pod) -> Option<Self> {
        // Nothing is serialised and deflated for a pod that cannot be kept.
        if !KEPT.has_room() {
            return None;
        }
        let deflated = deflate(&serde_json::to_vec(pod).ok()?, Dictionary::PendingPod)?;
        KEPT.take(deflated.len()).then_some(Self(deflated))
    }

    /// The pod as it was kept.
    pub(super) fn pod(&self) -> Option<Pod> {
        serde_json::from_slice(&inflate(&self.0, Dictionary::PendingPod)?).ok()
    }
}

impl Clone for Whole {
    fn clone(&self) -> Self {
        KEPT.add(self.0.len());
        Self(self.0.clone())
    }
}

impl Drop for Whole {
    fn drop(&mut self) {
        KEPT.give_back(self.0.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_takes_what_fits_and_is_given_back() {
        let budget = Budget::new(100);
        assert!(budget.take(60));
        assert!(!budget.take(41), "past the max: nothing taken");
        assert!(budget.take(40), "exactly to the max");
        assert!(!budget.has_room());
        budget.give_back(60);
        assert!(budget.has_room());
        assert!(budget.take(60));
        budget.add(10);
        assert!(!budget.take(1), "a copy counts past the max");
    }
}
