//! Child processes of a test cluster: started with their output in a log
//! file, tied to the life of the thread that started them, stopped with
//! SIGTERM and then SIGKILL.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A running child process. Dropping it stops it.
#[derive(Debug)]
pub(crate) struct Process {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Starts `program` with `args`, its stdout and stderr appended to `log`.
    pub(crate) fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> std::io::Result<Self> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        Self::spawn_command(name, cmd, log)
    }

    /// Starts `cmd` as prepared by the caller (environment, working
    /// folder), with no stdin and its stdout and stderr appended to `log`.
    pub(crate) fn spawn_command(name: &str, mut cmd: Command, log: &Path) -> std::io::Result<Self> {
        let out = File::options().create(true).append(true).open(log)?;
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        die_with_parent(&mut cmd);
        let child = cmd.spawn().map_err(|e| {
            let program = Path::new(cmd.get_program());
            std::io::Error::new(e.kind(), format!("starting {}: {e}", program.display()))
        })?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if the process has ended.
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Asks the process to stop with SIGTERM, without waiting.
    pub(crate) fn terminate(&mut self) {
        if self.exited().is_none() {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        }
    }

    /// Kills the process with SIGKILL and reaps it.
    pub(crate) fn kill(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Asks the process to stop, and kills it if it has not after `grace`.
    pub(crate) fn stop(&mut self, grace: Duration) {
        stop_all([self], grace);
    }

    /// The last `lines` lines of the process's log.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// Asks every process to stop at once, and kills those that have not after
/// `grace`: stopping many processes takes one grace period, not one each.
pub(crate) fn stop_all<'a>(processes: impl IntoIterator<Item = &'a mut Process>, grace: Duration) {
    let mut processes: Vec<&mut Process> = processes.into_iter().collect();
    for process in processes.iter_mut() {
        process.terminate();
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if processes.iter_mut().all(|p| p.exited().is_some()) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for process in processes.iter_mut() {
        process.kill();
    }
}

/// The last `lines` lines of a text file (empty if it cannot be read).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Makes the kernel kill the child when the thread that spawned it ends, so
/// that a crashed or killed test run leaves no control plane behind.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only
    // makes the async-signal-safe prctl(2) system call.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
}

/// Resident memory of a process in bytes, read from /proc (Linux only).
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The agent processes that a cluster's host-process node runs: those whose
/// `KUBECONFIG` lies in the cluster's folder. Read from /proc, so it works
/// from any process, not only the one that started them.
pub fn agent_processes(cluster_dir: &Path) -> Vec<super::ProcessInfo> {
    // With its trailing slash, so that cluster `a` does not claim `ab`'s.
    let mut dir = cluster_dir.as_os_str().as_encoded_bytes().to_vec();
    dir.push(b'/');
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<super::ProcessInfo> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|b| *b == 0).any(|var| {
                    var.strip_prefix(b"KUBECONFIG=".as_slice())
                        .is_some_and(|path| path.starts_with(&dir))
                })
            })
        })
        .map(|pid| super::ProcessInfo {
            name: std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim().to_owned())
                .unwrap_or_default(),
            pid,
            resident_bytes: resident_bytes(pid),
        })
        .collect();
    found.sort_by_key(|p| p.pid);
    found
}
