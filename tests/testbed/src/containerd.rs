//! A containerd of a test's own, as a cluster's node runs one: Debian's
//! `containerd` and `runc`, with its root, state and socket in a folder
//! of the test, so that it shares nothing with another containerd of the
//! machine. Images are imported from OCI archives (no registry is
//! reachable) and run with `ctr`. Dropping it stops the daemon and
//! unmounts whatever it left mounted under its folder.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::process::Process;

/// The containerd namespace a kubelet's images live in.
pub const NAMESPACE: &str = "k8s.io";

#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    #[error("writing {}", .0.display())]
    Write(PathBuf, #[source] std::io::Error),
    #[error("starting containerd (Debian's containerd and runc are needed: tests/setup.sh)")]
    Spawn(#[source] std::io::Error),
    #[error("containerd did not answer on {} within 20 s; its log:\n{log}", socket.display())]
    NotReady { socket: PathBuf, log: String },
    #[error("running ctr {0}")]
    Ctr(String, #[source] std::io::Error),
    #[error("ctr {args} failed: {stderr}")]
    Failed { args: String, stderr: String },
}

/// The socket of the containerd whose files live in `dir`.
pub(crate) fn socket_in(dir: &Path) -> PathBuf {
    dir.join("containerd.sock")
}

/// The start of the config of a containerd whose files (root, state,
/// sockets) all live in `dir`, so that it shares nothing with another.
pub(crate) fn own_files(dir: &Path) -> String {
    let socket = socket_in(dir);
    format!(
        "version = 2\n\
         root = \"{root}\"\n\
         state = \"{state}\"\n\
         [grpc]\n  address = \"{socket}\"\n\
         [ttrpc]\n  address = \"{socket}.ttrpc\"\n",
        root = dir.join("root").display(),
        state = dir.join("state").display(),
        socket = socket.display(),
    )
}

/// A running containerd.
#[derive(Debug)]
pub struct Containerd {
    dir: PathBuf,
    socket: PathBuf,
    process: Option<Process>,
}

/// An image as containerd lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageEntry {
    pub reference: String,
    pub digest: String,
}

impl Containerd {
    /// Starts a containerd whose files all live in `dir`.
    pub fn start(dir: &Path) -> Result<Self, ContainerdError> {
        let socket = socket_in(dir);
        let config = dir.join("config.toml");
        let write = |path: &Path, text: String| {
            std::fs::write(path, text).map_err(|e| ContainerdError::Write(path.to_owned(), e))
        };
        std::fs::create_dir_all(dir).map_err(|e| ContainerdError::Write(dir.to_owned(), e))?;
        write(
            &config,
            format!(
                "{}[debug]\n  level = \"info\"\n\
                 [plugins.\"io.containerd.grpc.v1.cri\"]\n  disable_tcp_service = true\n",
                own_files(dir)
            ),
        )?;
        let log = dir.join("containerd.log");
        let process = Process::spawn(
            "containerd",
            Path::new("containerd"),
            &["--config".to_owned(), config.display().to_string()],
            &log,
        )
        .map_err(ContainerdError::Spawn)?;
        let containerd = Self {
            dir: dir.to_owned(),
            socket,
            process: Some(process),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while containerd.ctr(&["version"]).is_err() {
            if Instant::now() > deadline {
                return Err(ContainerdError::NotReady {
                    socket: containerd.socket.clone(),
                    log: crate::process::tail(&log, 20),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(containerd)
    }

    /// A handle on the containerd serving `socket`, started by another
    /// (a real node's); dropping it leaves that containerd alone.
    pub fn attach(socket: &Path) -> Self {
        Self {
            dir: socket.parent().unwrap_or(Path::new("/")).to_owned(),
            socket: socket.to_owned(),
            process: None,
        }
    }

    /// Whether it answers.
    pub fn answers(&self) -> bool {
        self.ctr(&["version"]).is_ok()
    }

    /// The socket kubelets and `ctr` talk to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Imports the OCI archive `archive` into [`NAMESPACE`], as
    /// `kind load image-archive` and `k3s ctr images import` do.
    pub fn import(&self, archive: &Path) -> Result<(), ContainerdError> {
        let archive = archive.display().to_string();
        self.ctr(&["images", "import", "--all-platforms", &archive])
            .map(drop)
    }

    /// Names image `source` also `target`, as loading an image under
    /// that name would.
    pub fn tag(&self, source: &str, target: &str) -> Result<(), ContainerdError> {
        self.ctr(&["images", "tag", "--force", source, target])
            .map(drop)
    }

    /// The images of [`NAMESPACE`], with their manifests' digests.
    pub fn images(&self) -> Result<Vec<ImageEntry>, ContainerdError> {
        let out = self.ctr(&["images", "ls"])?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .filter_map(|line| {
                let mut columns = line.split_whitespace();
                let reference = columns.next()?.to_owned();
                let digest = columns.nth(1)?.to_owned();
                Some(ImageEntry { reference, digest })
            })
            .collect())
    }

    /// Runs `args` (the whole command line: the image's entrypoint is not
    /// kept) in a new container of `image`, removed once it has exited;
    /// returns what it printed.
    pub fn run(&self, image: &str, id: &str, args: &[&str]) -> Result<Output, ContainerdError> {
        let mut all = vec!["run", "--rm", image, id];
        all.extend_from_slice(args);
        self.ctr(&all)
    }

    /// `ctr` against this containerd, in [`NAMESPACE`]; an error unless it
    /// exits 0.
    fn ctr(&self, args: &[&str]) -> Result<Output, ContainerdError> {
        let joined = args.join(" ");
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", NAMESPACE])
            .args(args)
            .output()
            .map_err(|e| ContainerdError::Ctr(joined.clone(), e))?;
        if !out.status.success() {
            return Err(ContainerdError::Failed {
                args: joined,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(out)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let Some(mut process) = self.process.take() else {
            return;
        };
        process.stop(Duration::from_secs(5));
        // Snapshots and shim mounts that a killed daemon left behind, the
        // deepest first.
        let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return;
        };
        let mut ours: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4))
            .filter(|m| Path::new(m).starts_with(&self.dir))
            .collect();
        ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mount in ours {
            let _ = nix::mount::umount2(mount, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}
