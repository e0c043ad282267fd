//! The control-plane binaries: found in `LIQO_TOOLCHAIN_DIR`, or built (once,
//! then cached) from the Go modules pinned under `tests/toolchain/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use crate::Error;

/// Names of the binaries a cluster needs.
pub const BINARIES: [&str; 11] = [
    "coredns",
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-proxy",
    "kubelet",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "local-path-provisioner",
    "metrics-server",
];

const BUILD_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../toolchain/build.sh");

static LOCATED: Mutex<Option<PathBuf>> = Mutex::new(None);

/// A folder holding every binary of [`BINARIES`].
#[derive(Debug, Clone)]
pub struct Toolchain {
    dir: PathBuf,
}

impl Toolchain {
    /// Finds the binaries, building them first if the cache lacks them (which
    /// takes many minutes once, and blocks the calling thread meanwhile).
    pub fn locate() -> Result<Self, Error> {
        let mut located = LOCATED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dir) = located.as_ref() {
            return Ok(Self { dir: dir.clone() });
        }
        let dir = match std::env::var_os("LIQO_TOOLCHAIN_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => build()?,
        };
        for bin in BINARIES {
            if !dir.join(bin).is_file() {
                return Err(Error::Toolchain(format!(
                    "{} has no {bin}; unset LIQO_TOOLCHAIN_DIR or run tests/toolchain/build.sh",
                    dir.display()
                )));
            }
        }
        *located = Some(dir.clone());
        Ok(Self { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn binary(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn build() -> Result<PathBuf, Error> {
    let output = Command::new("bash")
        .arg(BUILD_SCRIPT)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| Error::Toolchain(format!("running {BUILD_SCRIPT}: {e}")))?;
    if !output.status.success() {
        return Err(Error::Toolchain(format!(
            "{BUILD_SCRIPT} failed ({}); its output is above",
            output.status
        )));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = stdout
        .lines()
        .last()
        .ok_or_else(|| Error::Toolchain(format!("{BUILD_SCRIPT} printed no folder")))?;
    Ok(PathBuf::from(dir.trim()))
}
