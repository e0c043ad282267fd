//! The reflection loop's tests: what a scan, a sweep and a full pass
//! converge, and when.

use super::*;
use std::sync::Mutex;

/// Keys 1 and 2 have fingerprints the test sets, key 3 none.
#[derive(Default)]
struct Counting {
    prints: Mutex<BTreeMap<u32, u64>>,
    calls: Mutex<BTreeMap<u32, u32>>,
    /// How many times the keys were asked for: the sweeps of a kind
    /// that says what changed.
    sweeps: AtomicU32,
}

/// Starts `kind`'s loop at phase zero, sweeping every `sweep` and
/// converging every key every `full`; returns what wakes it, and the task.
fn start<K: Kind + 'static>(
    kind: K,
    sweep: Duration,
    full: Duration,
) -> (Arc<Notify>, tokio::task::JoinHandle<()>) {
    let wake = Arc::new(Notify::new());
    let task = tokio::spawn(run_every(kind, wake.clone(), sweep, full, Duration::ZERO));
    (wake, task)
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

/// Key 1 takes a second to converge, key 2 none.
struct Slow(Arc<Counting>);

impl Kind for Slow {
    type Key = u32;
    const NAME: &'static str = "slow";
    fn keys(&self) -> Vec<u32> {
        vec![1, 2]
    }
    fn fingerprint(&self, key: &u32) -> Option<u64> {
        self.0.prints.lock().expect("lock").get(key).copied()
    }
    async fn converge(&self, key: &u32) -> Result<Next, Error> {
        *self.0.calls.lock().expect("lock").entry(*key).or_default() += 1;
        if *key == 1 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Ok(Next::Done)
    }
}

#[tokio::test]
async fn a_slow_key_holds_no_other_and_is_never_run_twice_at_once() {
    const SETTLE: Duration = Duration::from_millis(200);
    let counting = Arc::new(Counting::default());
    counting
        .prints
        .lock()
        .expect("lock")
        .extend([(1, 10), (2, 20)]);
    let (wake, task) = start(Slow(counting.clone()), RESYNC, FULL_RESYNC);
    tokio::time::sleep(SETTLE).await;
    assert_eq!(calls(&counting)[..2], [1, 1]);
    // Both change while key 1 is under way: key 2 converges again at
    // once, key 1 only once its first convergence is over.
    counting
        .prints
        .lock()
        .expect("lock")
        .extend([(1, 11), (2, 21)]);
    wake.notify_one();
    tokio::time::sleep(SETTLE).await;
    assert_eq!(
        calls(&counting)[..2],
        [1, 2],
        "key 2 did not wait for key 1"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = calls(&counting);
    task.abort();
    assert_eq!(after[..2], [2, 2], "key 1 again once it was over");
}

fn calls(c: &Counting) -> Vec<u32> {
    let calls = c.calls.lock().expect("lock");
    (1..=3)
        .map(|k| calls.get(&k).copied().unwrap_or(0))
        .collect()
}

/// Key 1 asks to be looked at again after 800 ms.
struct Later(Arc<Counting>);

impl Kind for Later {
    type Key = u32;
    const NAME: &'static str = "later";
    fn keys(&self) -> Vec<u32> {
        vec![1]
    }
    fn fingerprint(&self, key: &u32) -> Option<u64> {
        self.0.prints.lock().expect("lock").get(key).copied()
    }
    async fn converge(&self, key: &u32) -> Result<Next, Error> {
        *self.0.calls.lock().expect("lock").entry(*key).or_default() += 1;
        Ok(Next::After(Duration::from_millis(800)))
    }
}

#[tokio::test]
async fn a_key_to_look_at_later_waits_for_its_time_unless_it_changes() {
    const SETTLE: Duration = Duration::from_millis(150);
    let counting = Arc::new(Counting::default());
    counting.prints.lock().expect("lock").insert(1, 10);
    let (wake, task) = start(Later(counting.clone()), RESYNC, FULL_RESYNC);
    tokio::time::sleep(SETTLE).await;
    assert_eq!(calls(&counting)[0], 1);
    // Another store changed: key 1 is not due and unchanged.
    wake.notify_one();
    tokio::time::sleep(SETTLE).await;
    assert_eq!(calls(&counting)[0], 1, "looked at before its time");
    // It changed: looked at at once.
    counting.prints.lock().expect("lock").insert(1, 11);
    wake.notify_one();
    tokio::time::sleep(SETTLE).await;
    assert_eq!(calls(&counting)[0], 2, "a change was not looked at");
    // Its time comes with nothing changed.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let after = calls(&counting)[0];
    task.abort();
    assert_eq!(after, 3, "not looked at when due");
}

#[tokio::test]
async fn an_unchanged_key_waits_for_the_full_pass() {
    const SETTLE: Duration = Duration::from_millis(300);
    const FULL: Duration = Duration::from_secs(2);
    let counting = Arc::new(Counting::default());
    counting
        .prints
        .lock()
        .expect("lock")
        .extend([(1, 10), (2, 20)]);
    let started = Instant::now();
    let (wake, task) = start(Kind3(counting.clone()), RESYNC, FULL);
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
    tokio::time::sleep_until(started + FULL + SETTLE).await;
    let after = calls(&counting);
    task.abort();
    assert_eq!(after[..2], [2, 3], "the full pass: {after:?}");
}

/// Keys 1 to 3 have fingerprints; the kind's journal is what the test
/// puts in `told` (`None`: anything).
struct Journaled {
    counting: Arc<Counting>,
    told: Mutex<Option<Vec<u32>>>,
}

impl Kind for Arc<Journaled> {
    type Key = u32;
    const NAME: &'static str = "journaled";
    fn keys(&self) -> Vec<u32> {
        vec![1, 2, 3]
    }
    fn fingerprint(&self, key: &u32) -> Option<u64> {
        self.counting.prints.lock().expect("lock").get(key).copied()
    }
    fn changed(&self) -> Option<Vec<u32>> {
        self.told.lock().expect("lock").replace(Vec::new())
    }
    async fn converge(&self, key: &u32) -> Result<Next, Error> {
        *self
            .counting
            .calls
            .lock()
            .expect("lock")
            .entry(*key)
            .or_default() += 1;
        Ok(Next::Done)
    }
}

#[tokio::test]
async fn a_scan_looks_where_the_journal_says_and_a_sweep_everywhere() {
    const SETTLE: Duration = Duration::from_millis(200);
    const SWEEP: Duration = Duration::from_secs(1);
    let counting = Arc::new(Counting::default());
    let prints = |p: [(u32, u64); 3]| counting.prints.lock().expect("lock").extend(p);
    prints([(1, 10), (2, 20), (3, 30)]);
    let kind = Arc::new(Journaled {
        counting: counting.clone(),
        told: Mutex::new(None),
    });
    let started = Instant::now();
    let (wake, task) = start(kind.clone(), SWEEP, FULL_RESYNC);
    tokio::time::sleep(SETTLE).await;
    assert_eq!(calls(&counting), [1, 1, 1], "the first pass is full");
    // Keys 2 and 3 changed, the journal says 2 only: 3 waits for the
    // sweep.
    prints([(1, 10), (2, 21), (3, 31)]);
    *kind.told.lock().expect("lock") = Some(vec![2]);
    wake.notify_one();
    tokio::time::sleep(SETTLE).await;
    assert_eq!(calls(&counting), [1, 2, 1], "only what the journal says");
    // A journal that names a key whose fingerprint did not change
    // does not make it converge again.
    *kind.told.lock().expect("lock") = Some(vec![1]);
    wake.notify_one();
    tokio::time::sleep(SETTLE).await;
    assert_eq!(
        calls(&counting),
        [1, 2, 1],
        "an unchanged key was converged"
    );
    tokio::time::sleep_until(started + SWEEP + SETTLE).await;
    assert_eq!(calls(&counting), [1, 2, 2], "the sweep catches key 3");
    // "Anything": every key's fingerprint is looked at at once.
    prints([(1, 11), (2, 21), (3, 31)]);
    *kind.told.lock().expect("lock") = None;
    wake.notify_one();
    tokio::time::sleep(SETTLE).await;
    let after = calls(&counting);
    task.abort();
    assert_eq!(after, [2, 2, 2], "anything: key 1 changed");
}

/// Twelve keys with fingerprints that never change.
struct Twelve(Arc<Counting>);

impl Kind for Twelve {
    type Key = u32;
    const NAME: &'static str = "twelve";
    fn keys(&self) -> Vec<u32> {
        self.0.sweeps.fetch_add(1, Ordering::Relaxed);
        (1..=12).collect()
    }
    fn fingerprint(&self, key: &u32) -> Option<u64> {
        Some(u64::from(*key))
    }
    fn changed(&self) -> Option<Vec<u32>> {
        Some(Vec::new())
    }
    async fn converge(&self, key: &u32) -> Result<Next, Error> {
        *self.0.calls.lock().expect("lock").entry(*key).or_default() += 1;
        Ok(Next::Done)
    }
}

#[tokio::test]
async fn the_full_pass_is_spread_over_the_sweeps_and_takes_every_key() {
    const SWEEP: Duration = Duration::from_millis(200);
    const FULL: Duration = Duration::from_millis(1200);
    let counting = Arc::new(Counting::default());
    let started = Instant::now();
    let (_wake, task) = start(Twelve(counting.clone()), SWEEP, FULL);
    let again = || {
        let calls = counting.calls.lock().expect("lock");
        assert_eq!(calls.len(), 12, "the first pass takes every key");
        calls.values().filter(|&&n| n > 1).count()
    };
    // Two slices of six converged whole.
    tokio::time::sleep_until(started + SWEEP * 2 + SWEEP / 2).await;
    let early = again();
    // Every slice, once at least.
    tokio::time::sleep_until(started + FULL + SWEEP).await;
    let late = again();
    task.abort();
    assert!(
        (1..12).contains(&early),
        "{early} of 12 keys converged again after two sweeps: one slice a sweep"
    );
    assert_eq!(late, 12, "every key converged again within the full period");
}

#[tokio::test]
async fn a_phase_sets_a_loops_sweeps_apart_from_the_others() {
    const SWEEP: Duration = Duration::from_millis(400);
    const PHASE: Duration = Duration::from_millis(300);
    let (plain, early) = (Arc::new(Counting::default()), Arc::new(Counting::default()));
    let wake = Arc::new(Notify::new());
    let started = Instant::now();
    let loop_of = |counting: &Arc<Counting>, phase| {
        tokio::spawn(run_every(
            Twelve(counting.clone()),
            wake.clone(),
            SWEEP,
            SWEEP * 12,
            phase,
        ))
    };
    let tasks = [loop_of(&plain, Duration::ZERO), loop_of(&early, PHASE)];
    let sweeps = || [&plain, &early].map(|c| c.sweeps.load(Ordering::Relaxed));
    // The first pass at once; the early loop's next sweep 100 ms on.
    tokio::time::sleep_until(started + Duration::from_millis(250)).await;
    let at_250 = sweeps();
    // Then each every 400 ms: at 400, and at 500.
    tokio::time::sleep_until(started + Duration::from_millis(650)).await;
    let at_650 = sweeps();
    for task in tasks {
        task.abort();
    }
    assert_eq!(
        at_250,
        [1, 2],
        "the early loop sweeps 300 ms before the other"
    );
    assert_eq!(at_650, [2, 3], "each sweeps every 400 ms after");
}
