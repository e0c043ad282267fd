//! Real, independent Kubernetes clusters on loopback for liqo-rs's tests and
//! demo: each with its own PKI, etcd, kube-apiserver (RBAC, service-account
//! tokens, CSR signing), controller-manager, scheduler, and kwok faking its
//! worker nodes; and, when given a folder of agent binaries, a host-process
//! node whose agent pods run as real local processes (see [`HOST_PROCESS_LABEL`]).
//!
//! The binaries come from the Go modules pinned under `tests/toolchain/`
//! (see [`Toolchain`]). Every process is tied to the thread that started it,
//! so a test that crashes leaves nothing running; every port is picked free
//! at start, so a crashed run cannot wedge the next one.

mod cluster;
mod hostnode;
mod pki;
mod ports;
mod process;
mod toolchain;

use std::path::{Path, PathBuf};

pub use cluster::{
    Cluster, ClusterSpec, KWOK_ANNOTATION, ProcessInfo, client_from_kubeconfig, kubeconfig_yaml,
};
pub use hostnode::{HOST_PROCESS_LABEL, HOST_PROCESS_TAINT, default_host_images};
pub use pki::Pair;
pub use process::{agent_processes, resident_bytes, tail};
pub use toolchain::{BINARIES, Toolchain};

/// Why a testbed could not start or be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("control-plane binaries: {0}")]
    Toolchain(String),
    #[error("{0}")]
    Spec(String),
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("generating certificates")]
    Pki(#[from] rcgen::Error),
    #[error("kubeconfig {}: {reason}", path.display())]
    Kubeconfig { path: PathBuf, reason: String },
    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("cluster {cluster}: {process} exited ({status}); its log ends with:\n{log}")]
    Exited {
        cluster: String,
        process: String,
        status: String,
        log: String,
    },
    #[error("cluster {cluster}: the host-process node {node} stopped running")]
    HostNodeStopped { cluster: String, node: String },
    #[error("building the HTTP client of the probes")]
    ProbeClient(#[source] reqwest::Error),
    #[error("cluster {cluster}: timed out waiting for {what}; {log}")]
    Timeout {
        cluster: String,
        what: String,
        log: String,
    },
}

/// The folder of the freshly built agent binaries (`liqo-gateway`, …):
/// `LIQO_AGENT_BIN_DIR` if set, else the cargo profile folder the running
/// executable was built in (`target/debug/` for both a binary there and a
/// test in `target/debug/deps/`). The folder may lack the agents if they
/// were not built; their pods are then faked.
pub fn default_agent_bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("LIQO_AGENT_BIN_DIR") {
        return Some(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().map(Path::to_owned)
    } else {
        Some(dir.to_owned())
    }
}

/// Writes a file only its owner may read: keys, kubeconfigs, tokens.
pub(crate) fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents.as_bytes())
}

pub(crate) fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_owned(),
        source,
    }
}

/// Several clusters started together, stopped together when dropped.
#[derive(Debug)]
pub struct Testbed {
    clusters: Vec<Cluster>,
    root: PathBuf,
    /// Set when the testbed made its own folder, which goes with it.
    _tempdir: Option<tempfile::TempDir>,
}

impl Testbed {
    /// Starts the clusters in parallel, in a temporary folder.
    pub async fn start(specs: Vec<ClusterSpec>) -> Result<Self, Error> {
        let tempdir = tempfile::Builder::new()
            .prefix("liqo-testbed-")
            .tempdir()
            .map_err(io_error(&std::env::temp_dir()))?;
        let mut testbed = Self::start_in(tempdir.path(), specs).await?;
        testbed._tempdir = Some(tempdir);
        Ok(testbed)
    }

    /// Starts the clusters in parallel, each in a folder of `root` named
    /// after it.
    pub async fn start_in(root: &Path, specs: Vec<ClusterSpec>) -> Result<Self, Error> {
        let mut names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::Spec(format!("cluster names must differ: {names:?}")));
        }
        let toolchain = tokio::task::spawn_blocking(Toolchain::locate)
            .await
            .map_err(|e| Error::Toolchain(e.to_string()))??;
        let starts = specs.into_iter().map(|spec| {
            let dir = root.join(&spec.name);
            let toolchain = toolchain.clone();
            async move { Cluster::start(spec, &dir, &toolchain).await }
        });
        // On an error the clusters already started are dropped, and stopped.
        let clusters = futures::future::try_join_all(starts).await?;
        Ok(Self {
            clusters,
            root: root.to_owned(),
            _tempdir: None,
        })
    }

    /// `n` clusters named `cluster-1` … `cluster-n`, with default specs
    /// and a host-process node running the agents of
    /// [`default_agent_bin_dir`].
    pub async fn start_default(n: u8) -> Result<Self, Error> {
        let bin_dir = default_agent_bin_dir();
        Self::start(
            (1..=n)
                .map(|i| ClusterSpec {
                    agent_bin_dir: bin_dir.clone(),
                    ..ClusterSpec::new(format!("cluster-{i}"), i)
                })
                .collect(),
        )
        .await
    }

    pub fn clusters(&self) -> &[Cluster] {
        &self.clusters
    }

    pub fn clusters_mut(&mut self) -> &mut [Cluster] {
        &mut self.clusters
    }

    /// The cluster of that name.
    ///
    /// # Panics
    /// If there is none: a test asked for a cluster it did not start.
    pub fn cluster(&self, name: &str) -> &Cluster {
        self.clusters
            .iter()
            .find(|c| c.name() == name)
            .unwrap_or_else(|| panic!("the testbed has no cluster named {name}"))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Stops every cluster.
    pub fn stop(self) {
        drop(self);
    }
}
