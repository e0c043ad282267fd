//! The termination messages of a pod's containers, as a kubelet makes
//! them: the file each container start gets at its
//! `terminationMessagePath`, what is read of it (or of the log) when the
//! container exits, and the terminated state it is reported in.

use std::path::PathBuf;
use std::process::ExitStatus;

use k8s_openapi::api::core::v1::{Container, ContainerStateTerminated};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::super::{HostNodeConfig, StartError};
use super::{PodRuntime, Running};

/// Where a container's termination message is when its spec does not say.
pub(super) const TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";
/// How much of the termination message file a kubelet reads.
const TERMINATION_MESSAGE_MAX: usize = 4096;
/// How much of its log a failed container's message falls back to
/// (`FallbackToLogsOnError`), as with a kubelet.
const FALLBACK_LOG_LINES: usize = 80;
const FALLBACK_LOG_MAX: usize = 2048;

/// Where a container's termination message comes from.
#[derive(Debug)]
pub(super) struct MessageSource {
    /// The host's file bound at the container's `terminationMessagePath`.
    pub(super) file: PathBuf,
    /// `terminationMessagePolicy: FallbackToLogsOnError`.
    pub(super) fallback_to_logs: bool,
    /// The container's log, and where this run of it starts there.
    pub(super) log: PathBuf,
    pub(super) log_start: u64,
}

impl PodRuntime {
    /// A fresh, empty file for the termination message of a container
    /// about to start, as a kubelet makes one per container start.
    pub(super) fn termination_message_file(
        &self,
        config: &HostNodeConfig,
        spec: &Container,
    ) -> Result<PathBuf, StartError> {
        let path = self
            .dir(config)
            .join(format!("{}.termination-log", spec.name));
        std::fs::write(&path, "").map_err(|source| StartError::Write {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    }
}

impl MessageSource {
    /// The message of a container that exited, `failed` or not.
    pub(super) fn read(&self, failed: bool) -> Option<String> {
        use std::io::{Read as _, Seek as _};
        let mut file = Vec::new();
        if let Ok(f) = std::fs::File::open(&self.file) {
            // Bounded: a container may write a huge file.
            let _ = f
                .take(TERMINATION_MESSAGE_MAX as u64)
                .read_to_end(&mut file);
        }
        let log = || {
            let mut log = Vec::new();
            if let Ok(mut f) = std::fs::File::open(&self.log)
                && f.seek(std::io::SeekFrom::Start(self.log_start)).is_ok()
            {
                let _ = f.read_to_end(&mut log);
            }
            log
        };
        termination_message(&file, self.fallback_to_logs && failed, log)
    }
}

/// A container's termination message as a kubelet makes it: what it wrote
/// to its file (at most [`TERMINATION_MESSAGE_MAX`] bytes); if nothing and
/// `fall_back` (a failed container with `FallbackToLogsOnError`), the end
/// of its log: the last [`FALLBACK_LOG_LINES`] lines, of which the last
/// [`FALLBACK_LOG_MAX`] bytes.
fn termination_message(
    file: &[u8],
    fall_back: bool,
    log: impl FnOnce() -> Vec<u8>,
) -> Option<String> {
    let file = &file[..file.len().min(TERMINATION_MESSAGE_MAX)];
    if !file.is_empty() {
        return Some(String::from_utf8_lossy(file).into_owned());
    }
    if !fall_back {
        return None;
    }
    let log = log();
    let body = log.strip_suffix(b"\n").unwrap_or(&log);
    let start = body
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, b)| **b == b'\n')
        .nth(FALLBACK_LOG_LINES - 1)
        .map_or(0, |(i, _)| i + 1);
    let lines = &log[start..];
    let tail = &lines[lines.len().saturating_sub(FALLBACK_LOG_MAX)..];
    (!tail.is_empty()).then(|| String::from_utf8_lossy(tail).into_owned())
}

/// How a process ended, as the kubelet reports it: a signal shows as exit
/// code 128 + signal.
pub(super) fn terminated(status: ExitStatus, running: &Running) -> ContainerStateTerminated {
    use std::os::unix::process::ExitStatusExt;
    let exit_code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1);
    ContainerStateTerminated {
        exit_code,
        signal: status.signal(),
        reason: Some(if exit_code == 0 { "Completed" } else { "Error" }.to_owned()),
        started_at: Some(Time(running.started_at)),
        finished_at: Some(Time(Timestamp::now())),
        container_id: Some(running.id.clone()),
        message: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize) -> Vec<u8> {
        (1..=n)
            .map(|i| format!("line {i}\n"))
            .collect::<String>()
            .into_bytes()
    }

    #[test]
    fn the_termination_message_is_the_file_then_the_log_of_a_failure() {
        let no_log = || panic!("the log is read only to fall back on");
        assert_eq!(
            termination_message(b"bye", true, no_log).as_deref(),
            Some("bye")
        );
        let big = vec![b'x'; 5000];
        assert_eq!(
            termination_message(&big, false, no_log).map(|m| m.len()),
            Some(TERMINATION_MESSAGE_MAX)
        );
        // Empty file: nothing, unless the policy falls back and it failed.
        assert_eq!(termination_message(b"", false, no_log), None);
        assert_eq!(
            termination_message(b"", true, || b"oops\n".to_vec()).as_deref(),
            Some("oops\n")
        );
        assert_eq!(termination_message(b"", true, Vec::new), None);
        // The last 80 lines…
        let message = termination_message(b"", true, || lines(100)).expect("message");
        assert!(message.starts_with("line 21\n"), "{message}");
        assert!(message.ends_with("line 100\n"), "{message}");
        // … of which the last 2048 bytes.
        let long: Vec<u8> = (0..100)
            .flat_map(|i| format!("{i:0>99}\n").into_bytes())
            .collect();
        let message = termination_message(b"", true, || long.clone()).expect("message");
        assert_eq!(message.len(), FALLBACK_LOG_MAX);
        assert!(message.ends_with(&format!("{:0>99}\n", 99)));
    }
}
