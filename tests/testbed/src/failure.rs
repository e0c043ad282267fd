//! What a testbed leaves when the test that owns it fails: the folder,
//! kept, and the last lines of every log in it, printed with the test's
//! output so that a failure in CI can be read without a second run.
//!
//! A test fails by panicking or by returning an error. A panic is seen
//! where the testbed is dropped ([`std::thread::panicking`]); an error is
//! known only once the test's body has returned, after its testbeds are
//! dropped. So a test run under a [`Watch`] (`#[liqo_e2e::test]` starts
//! one) has its testbeds hand their folders over when they are dropped,
//! their processes stopped, and the watch keeps and reports them or
//! removes them by the test's outcome.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// Lines of each log shown.
const TAIL_LINES: usize = 25;

/// Logs are found at most this deep under the testbed's folder: a real
/// node's pod logs are `<cluster>/<node>/pod-logs/<pod>/<container>/0.log`.
const MAX_DEPTH: usize = 8;

thread_local! {
    /// The folders handed over to this thread's [`Watch`], while one runs.
    static HANDED_OVER: RefCell<Option<Vec<Left>>> = const { RefCell::new(None) };
}

/// A dropped testbed's folder, and the temporary folder that removes it
/// when dropped (`None` for a folder the caller chose, never removed).
#[derive(Debug)]
struct Left {
    root: PathBuf,
    tempdir: Option<TempDir>,
}

impl Left {
    /// Keeps the folder and prints its logs' tails when `failed`; removes
    /// it (if it is the testbed's own) otherwise.
    fn settle(self, failed: bool) {
        // A folder already removed (a testbed stopped) has nothing to show.
        if failed && self.root.exists() {
            if let Some(tempdir) = self.tempdir {
                let _ = tempdir.keep();
            }
            report(&self.root);
        }
    }
}

/// One test's watch over the testbeds it drops, on the thread that runs
/// the test's body: made before the body runs and told its outcome after
/// ([`Watch::finish`]). A panic before that counts as a failure.
#[derive(Debug)]
pub struct Watch {
    failed: bool,
    /// Thread-bound: the testbeds hand over on the thread they drop on.
    _thread: PhantomData<*const ()>,
}

impl Watch {
    /// Starts watching the testbeds dropped on this thread.
    #[must_use = "the watch ends when dropped"]
    pub fn start() -> Self {
        HANDED_OVER.with(|h| *h.borrow_mut() = Some(Vec::new()));
        Self {
            failed: false,
            _thread: PhantomData,
        }
    }

    /// Ends the watch with the test's outcome: a failed test keeps every
    /// folder handed over and prints its logs, a passed one removes them.
    pub fn finish(mut self, failed: bool) {
        self.failed = failed;
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let failed = self.failed || std::thread::panicking();
        let left = HANDED_OVER
            .with(|h| h.borrow_mut().take())
            .unwrap_or_default();
        for folder in left {
            folder.settle(failed);
        }
    }
}

/// What a testbed's drop does with its folder `root`: kept and reported
/// when the thread is panicking; handed over while a [`Watch`] runs on
/// this thread; else removed with `tempdir` (if any) at once.
pub(crate) fn leave(root: &Path, tempdir: Option<TempDir>) {
    let left = Left {
        root: root.to_owned(),
        tempdir,
    };
    if std::thread::panicking() {
        return left.settle(true);
    }
    let unwatched = HANDED_OVER.with(|h| match h.borrow_mut().as_mut() {
        Some(handed_over) => {
            handed_over.push(left);
            None
        }
        None => Some(left),
    });
    if let Some(left) = unwatched {
        left.settle(false);
    }
}

/// Prints, to the test's standard error, where the folder is kept and the
/// tail of each `*.log` under it.
pub(crate) fn report(root: &Path) {
    let mut logs = Vec::new();
    find_logs(root, MAX_DEPTH, &mut logs);
    logs.sort();
    eprintln!(
        "liqo-testbed: the test failed; its clusters' folder is kept at {} (remove it when done)",
        root.display()
    );
    for log in logs {
        let tail = crate::process::tail(&log, TAIL_LINES);
        if tail.is_empty() {
            continue;
        }
        let name = log.strip_prefix(root).unwrap_or(&log);
        eprintln!("----- {} (last {TAIL_LINES} lines)\n{tail}", name.display());
    }
}

fn find_logs(dir: &Path, depth: usize, logs: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        if kind.is_dir() && depth > 0 {
            find_logs(&path, depth - 1, logs);
        } else if kind.is_file() && path.extension().is_some_and(|e| e == "log") {
            logs.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder made as a testbed makes its own.
    fn testbed_folder() -> (PathBuf, TempDir) {
        let tempdir = tempfile::Builder::new()
            .prefix("liqo-testbed-watch-")
            .tempdir()
            .expect("temp dir");
        std::fs::write(tempdir.path().join("kube-apiserver.log"), "last line").expect("log");
        (tempdir.path().to_owned(), tempdir)
    }

    #[test]
    fn a_watched_test_that_fails_keeps_the_folder_and_one_that_passes_removes_it() {
        for failed in [true, false] {
            let (root, tempdir) = testbed_folder();
            let watch = Watch::start();
            leave(&root, Some(tempdir));
            assert!(root.exists(), "the watch decides, not the drop");
            watch.finish(failed);
            assert_eq!(root.exists(), failed, "failed: {failed}");
            let _ = std::fs::remove_dir_all(&root);
        }
    }

    #[test]
    fn without_a_watch_the_folder_goes_with_its_testbed() {
        let (root, tempdir) = testbed_folder();
        leave(&root, Some(tempdir));
        assert!(!root.exists());
    }

    #[test]
    fn a_panic_after_the_testbed_is_dropped_keeps_its_folder() {
        let (root, tempdir) = testbed_folder();
        let kept = root.clone();
        let outcome = std::thread::spawn(move || {
            let _watch = Watch::start();
            leave(&root, Some(tempdir));
            panic!("the test failed after its testbed was dropped");
        })
        .join();
        assert!(outcome.is_err());
        assert!(kept.exists());
        let _ = std::fs::remove_dir_all(&kept);
    }

    #[test]
    fn logs_are_found_below_the_root_and_nothing_else() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let deep = tmp.path().join("a/logs");
        std::fs::create_dir_all(&deep).expect("dirs");
        std::fs::write(deep.join("kube-apiserver.log"), "x").expect("log");
        std::fs::write(deep.join("etcd.db"), "x").expect("other");
        std::fs::write(tmp.path().join("top.log"), "x").expect("log");
        let mut logs = Vec::new();
        find_logs(tmp.path(), MAX_DEPTH, &mut logs);
        logs.sort();
        assert_eq!(
            logs,
            vec![deep.join("kube-apiserver.log"), tmp.path().join("top.log")]
        );
    }
}
