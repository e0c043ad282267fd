//! What a testbed leaves when the test that owns it fails: the folder,
//! kept, and the last lines of every log in it, printed with the test's
//! output so that a failure in CI can be read without a second run.

use std::path::{Path, PathBuf};

/// Lines of each log shown.
const TAIL_LINES: usize = 25;

/// Logs are found at most this deep under the testbed's folder (cluster,
/// node, pods).
const MAX_DEPTH: usize = 5;

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
