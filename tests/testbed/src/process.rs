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
pub(crate) fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only
    // makes the async-signal-safe prctl(2) system call.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
}

/// A folder (or file) of the host bound over a path of a child's own view
/// of the file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BindMount {
    pub(crate) source: PathBuf,
    /// Must exist, and be of the same kind as `source`.
    pub(crate) target: PathBuf,
    pub(crate) read_only: bool,
}

/// Makes the child run in a mount namespace of its own, where `mounts` are
/// bound in order (a folder before what is mounted inside it): the host
/// sees none of them, and they go with the child. Nothing to do without
/// mounts. Needs root (CAP_SYS_ADMIN).
#[allow(unsafe_code)]
pub(crate) fn with_mounts(cmd: &mut Command, mounts: &[BindMount]) -> std::io::Result<()> {
    use std::ffi::{CStr, CString};
    use std::os::unix::ffi::OsStrExt as _;
    use std::os::unix::process::CommandExt;

    use nix::mount::{MsFlags, mount};
    use nix::sched::{CloneFlags, unshare};

    if mounts.is_empty() {
        return Ok(());
    }
    let c_path = |path: &Path| {
        CString::new(path.as_os_str().as_bytes()).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} holds a NUL byte", path.display()),
            )
        })
    };
    // Made before the fork: the child must not allocate.
    let mounts: Vec<(CString, CString, bool)> = mounts
        .iter()
        .map(|m| Ok((c_path(&m.source)?, c_path(&m.target)?, m.read_only)))
        .collect::<std::io::Result<_>>()?;
    const NONE: Option<&CStr> = None;
    // SAFETY: the closure runs in the forked child before exec; it only
    // makes the unshare(2) and mount(2) system calls, with C strings made
    // before the fork (nix passes a `CStr` as it is, without allocating).
    unsafe {
        cmd.pre_exec(move || {
            unshare(CloneFlags::CLONE_NEWNS)?;
            // Private, so that the binds below never reach the host's view.
            mount(
                NONE,
                c"/",
                NONE,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                NONE,
            )?;
            for (source, target, read_only) in &mounts {
                mount(
                    Some(source.as_c_str()),
                    target.as_c_str(),
                    NONE,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    NONE,
                )?;
                if *read_only {
                    // A bind mount takes its own flags only when remounted.
                    mount(
                        NONE,
                        target.as_c_str(),
                        NONE,
                        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                        NONE,
                    )?;
                }
            }
            Ok(())
        });
    }
    Ok(())
}

/// Makes the child run in the network namespace at `netns` (a path under
/// `/run/netns`): its sockets, devices and routes are the namespace's.
/// Nothing to do without one. Needs root (CAP_SYS_ADMIN).
#[allow(unsafe_code)]
pub(crate) fn with_netns(cmd: &mut Command, netns: Option<&Path>) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;

    use nix::sched::{CloneFlags, setns};

    let Some(netns) = netns else {
        return Ok(());
    };
    // Opened before the fork: the child must not allocate.
    let ns = File::open(netns)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", netns.display())))?;
    // SAFETY: the closure runs in the forked child before exec and only
    // makes the setns(2) system call, on a file opened before the fork.
    unsafe {
        cmd.pre_exec(move || {
            setns(&ns, CloneFlags::CLONE_NEWNET)?;
            Ok(())
        });
    }
    Ok(())
}

/// Whether process `pid` is gone: it does not exist, or it has exited and
/// waits to be reaped by a parent (a supervisor killed after `up` left,
/// whose parent is the machine's init, may stay a zombie a while).
pub(crate) fn is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's name, which ends with ")".
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// Whether a process of the machine, in whatever mount namespace, has a
/// mount on `path`: such a folder must not be removed, as removing a mount
/// point of another namespace detaches that mount.
pub(crate) fn mounted_anywhere(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    // mountinfo escapes spaces, tabs, newlines and backslashes in octal.
    let mut wanted = Vec::new();
    for b in path.as_os_str().as_bytes() {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => wanted.extend(format!("\\{b:03o}").bytes()),
            _ => wanted.push(*b),
        }
    }
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .any(|pid| {
            std::fs::read(format!("/proc/{pid}/mountinfo")).is_ok_and(|info| {
                info.split(|b| *b == b'\n')
                    .any(|line| line.split(|b| *b == b' ').nth(4) == Some(wanted.as_slice()))
            })
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_are_seen_by_the_child_only() {
        use std::os::unix::fs::MetadataExt as _;
        // /proc/self belongs to the process's effective user.
        if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() != 0) {
            eprintln!("skipped: mount namespaces need root");
            return;
        }
        let root = tempfile::tempdir().expect("tempdir");
        let source = root.path().join("source");
        let target = root.path().join("target");
        std::fs::create_dir_all(&source).expect("source");
        std::fs::create_dir_all(&target).expect("target");
        std::fs::write(source.join("key"), "value").expect("write");
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(format!(
            "cat {0}/key; touch {0}/new 2>/dev/null && echo writable || echo read-only",
            target.display()
        ));
        let mounts = [BindMount {
            source: source.clone(),
            target: target.clone(),
            read_only: true,
        }];
        with_mounts(&mut cmd, &mounts).expect("mounts");
        let out = cmd.output().expect("run");
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "valueread-only\n");
        assert_eq!(
            std::fs::read_dir(&target).expect("target").count(),
            0,
            "the host does not see the mount"
        );
        assert!(!mounted_anywhere(&target), "gone with the child");
    }
}
