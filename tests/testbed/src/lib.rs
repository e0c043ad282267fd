//! Real, independent Kubernetes clusters on loopback for liqo-rs's tests and
//! demo: each with its own PKI, etcd, kube-apiserver (RBAC, service-account
//! tokens, CSR signing), controller-manager, scheduler, and kwok faking its
//! worker nodes; and, when given a folder of agent binaries, a host-process
//! node whose agent pods run as real local processes (see [`HOST_PROCESS_LABEL`]);
//! and, in the pod-network mode (`ClusterSpec::pod_network`), a node
//! network namespace per cluster, a namespace per pod, an "internet"
//! joining the clusters and kube-proxy (see `podnet`); and a containerd of
//! a test's own that imports and runs OCI image archives ([`Containerd`]).
//!
//! The binaries come from the Go modules pinned under `tests/toolchain/`
//! (see [`Toolchain`]). Every process is tied to the thread that started it,
//! so a test that crashes leaves nothing running; every port is picked free
//! at start, so a crashed run cannot wedge the next one.

mod cluster;
mod containerd;
pub mod dirs;
pub mod dns;
pub mod failure;
mod hostnode;
mod pki;
mod podnet;
mod ports;
mod process;
mod realnode;
pub mod storage;
mod toolchain;

use std::path::{Path, PathBuf};

pub use cluster::{
    ApiServerState, Cluster, ClusterSpec, KWOK_ANNOTATION, ProcessInfo, client_from_kubeconfig,
    kubeconfig_json,
};
pub use containerd::{Containerd, ContainerdError, ImageEntry};
pub use hostnode::{HOST_PROCESS_LABEL, HOST_PROCESS_TAINT, default_host_images};
pub use pki::CertAndKey;
pub use process::{agent_processes, resident_bytes, tail};
pub use realnode::{TOOLBOX_IMAGE, cgroups_of, protocol as cni_protocol};
pub use toolchain::{BINARIES, Toolchain};

/// Removes what testbed processes that are gone left on the machine (one
/// killed with SIGKILL cannot clean up): their network namespaces and
/// their real nodes' cgroups. Their processes died with them.
pub fn reap_stale() {
    podnet::reap_stale();
    realnode::reap_stale();
}

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
    #[error("{what}: {reason}")]
    Net { what: String, reason: String },
    #[error("cluster {cluster}: timed out waiting for {what}; {log}")]
    Timeout {
        cluster: String,
        what: String,
        log: String,
    },
    #[error("building the workspace's binaries: {0}")]
    Build(String),
    #[error("cluster {cluster}: cannot {action} the kube-apiserver while it is {state}")]
    ApiServerState {
        cluster: String,
        action: &'static str,
        state: ApiServerState,
    },
    #[error("cluster {cluster}: sending {signal} to the kube-apiserver")]
    Signal {
        cluster: String,
        signal: String,
        #[source]
        source: nix::errno::Errno,
    },
    #[error(
        "{} exists and was not made by liqo-testbed; choose another folder or remove it",
        path.display()
    )]
    NotMadeByTestbed { path: PathBuf },
}

/// The folder of the agent binaries (`liqo-gateway`, …):
/// `LIQO_AGENT_BIN_DIR` if set; else, in a test (an executable in
/// `target/<profile>/deps/`), `target/<profile>/` once [`built_bin_dir`]
/// has made its binaries current; else the folder of the running
/// executable (`liqo-testbed` next to the agents it was built with). The
/// folder may lack the agents if they were not built; their pods then fail
/// to pull their image.
pub fn default_agent_bin_dir() -> Result<Option<PathBuf>, Error> {
    if let Some(dir) = std::env::var_os("LIQO_AGENT_BIN_DIR") {
        return Ok(Some(PathBuf::from(dir)));
    }
    let Ok(exe) = std::env::current_exe() else {
        return Ok(None);
    };
    match exe.parent() {
        Some(dir) if dir.file_name().is_some_and(|n| n == "deps") => built_bin_dir().map(Some),
        dir => Ok(dir.map(Path::to_owned)),
    }
}

/// Where `cargo build --workspace` runs: this crate is `tests/testbed`.
const WORKSPACE_ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The result of the one build of a process, shared by every caller.
static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();

/// The cargo profile folder (`target/debug/`) of the running test, after
/// `cargo build --workspace --bins --locked` has made every binary in it
/// current: a test never runs a binary older than the sources. The build
/// runs once per process (a no-op build takes about a second); test
/// binaries running at once are serialised by cargo's own lock. Its
/// progress and compiler errors go to stderr.
pub fn built_bin_dir() -> Result<PathBuf, Error> {
    BUILT
        .get_or_init(build_workspace_bins)
        .clone()
        .map_err(Error::Build)
}

fn build_workspace_bins() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding the running test: {e}"))?;
    let deps = exe.parent().filter(|d| d.ends_with("deps"));
    let Some(dir) = deps.and_then(Path::parent) else {
        return Err(format!(
            "{} is not a test in a cargo profile folder (target/<profile>/deps)",
            exe.display()
        ));
    };
    let profile = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{} names no cargo profile", dir.display()))?;
    // The cargo that runs the tests, so that its toolchain builds the bins.
    let cargo = std::env::var_os("CARGO")
        .or_else(|| option_env!("CARGO").map(Into::into))
        .unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(&cargo);
    cmd.current_dir(WORKSPACE_ROOT)
        .args(["build", "--workspace", "--bins", "--locked"])
        .args(["--message-format", "json-render-diagnostics"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit());
    if profile != "debug" {
        cmd.args(["--profile", profile]);
    }
    // What cargo sets for the running test alone (its package's name and
    // folder, …). Build scripts that watch one of them (ring watches
    // CARGO_MANIFEST_DIR) would otherwise rebuild, and rebuild again at the
    // next build from a shell.
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let per_test = name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_EXE_")
            || name.starts_with("CARGO_MANIFEST_")
            || matches!(
                name,
                "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
                    | "OUT_DIR"
            );
        if per_test {
            cmd.env_remove(name);
        }
    }
    let command = format!(
        "{} build --workspace --bins --locked (in {WORKSPACE_ROOT})",
        Path::new(&cargo).display()
    );
    let output = cmd
        .output()
        .map_err(|e| format!("running {command}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{command} failed ({}); the compiler's errors are above",
            output.status
        ));
    }
    // Every binary must land where this test looks: a CARGO_TARGET_DIR
    // that differs between the test run and this build would leave stale
    // ones in `dir`.
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let Some(executable) = message["executable"].as_str().map(Path::new)
            && executable.parent() != Some(dir)
        {
            return Err(format!(
                "{command} built {} but the test runs from {}; build and test with the same target folder",
                executable.display(),
                dir.display()
            ));
        }
    }
    Ok(dir.to_owned())
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

/// Creates `object` with `api`; one that exists already is kept (a node
/// started again). `whose` names the objects in errors ("the cluster
/// DNS's").
pub(crate) async fn create_or_keep<K>(
    api: kube::Api<K>,
    object: serde_json::Value,
    whose: &str,
) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let object: K =
        serde_json::from_value(object).map_err(|e| Error::Spec(format!("{whose} objects: {e}")))?;
    let what = format!("creating {whose} {}", K::kind(&()));
    match api.create(&kube::api::PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(source) => Err(Error::Kube { what, source }),
    }
}

/// Several clusters started together, stopped together when dropped.
#[derive(Debug)]
pub struct Testbed {
    clusters: Vec<Cluster>,
    root: PathBuf,
    /// Set when the testbed made its own folder, which goes with it
    /// (unless its test fails: [`failure`]).
    tempdir: Option<tempfile::TempDir>,
}

impl Testbed {
    /// Starts the clusters in parallel, in a temporary folder.
    pub async fn start(specs: Vec<ClusterSpec>) -> Result<Self, Error> {
        let tempdir = tempfile::Builder::new()
            .prefix("liqo-testbed-")
            .tempdir()
            .map_err(io_error(&std::env::temp_dir()))?;
        dirs::claim(tempdir.path())?;
        match Self::start_in(tempdir.path(), specs).await {
            Ok(mut testbed) => {
                testbed.tempdir = Some(tempdir);
                Ok(testbed)
            }
            // What started is stopped; its logs say why the rest did not.
            Err(e) => {
                let root = tempdir.path().to_path_buf();
                failure::leave(&root, Some(tempdir));
                Err(e)
            }
        }
    }

    /// Starts the clusters in parallel, each in a folder of `root` named
    /// after it. `root` is made if missing; each cluster's folder must be
    /// missing, empty or left by a testbed (see [`dirs`]), and is cleared.
    pub async fn start_in(root: &Path, specs: Vec<ClusterSpec>) -> Result<Self, Error> {
        let mut names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::Spec(format!("cluster names must differ: {names:?}")));
        }
        // Checked before anything starts, so that a refused folder stops
        // every cluster from starting, not just its own.
        for spec in &specs {
            dirs::may_use(&root.join(&spec.name))?;
        }
        if !root.exists() {
            dirs::claim(root)?;
        }
        let toolchain = tokio::task::spawn_blocking(Toolchain::locate)
            .await
            .map_err(|e| Error::Toolchain(e.to_string()))??;
        // One internet for all the pod-network clusters; a node's place on
        // it is its cluster's in `specs`.
        let internet = if specs.iter().any(ClusterSpec::has_node_netns) {
            Some(podnet::Internet::new()?)
        } else {
            None
        };
        let starts = specs.into_iter().zip(1u8..).map(|(spec, place)| {
            let dir = root.join(&spec.name);
            let toolchain = toolchain.clone();
            let uplink = (internet.clone())
                .filter(|_| spec.has_node_netns())
                .map(|internet| cluster::Uplink { internet, place });
            async move { Cluster::start_with(spec, &dir, &toolchain, uplink).await }
        });
        // On an error the clusters already started are dropped, and stopped.
        let clusters = futures::future::try_join_all(starts).await?;
        Ok(Self {
            clusters,
            root: root.to_owned(),
            tempdir: None,
        })
    }

    /// `n` clusters named `cluster-1` … `cluster-n`, with default specs
    /// and a host-process node running the agents of
    /// [`default_agent_bin_dir`].
    pub async fn start_default(n: u8) -> Result<Self, Error> {
        // Blocking: it may build the workspace first.
        let bin_dir = tokio::task::spawn_blocking(default_agent_bin_dir)
            .await
            .map_err(|e| Error::Build(e.to_string()))??;
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

    /// The cluster of that name, to change (stop or pause its API server).
    ///
    /// # Panics
    /// If there is none, as [`Testbed::cluster`].
    pub fn cluster_mut(&mut self, name: &str) -> &mut Cluster {
        self.clusters
            .iter_mut()
            .find(|c| c.name() == name)
            .unwrap_or_else(|| panic!("the testbed has no cluster named {name}"))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Stops every cluster and, the test being done with them, removes
    /// the testbed's own folder now (a drop leaves that to the test's
    /// outcome: [`failure`]).
    pub fn stop(mut self) {
        self.clusters.clear();
        drop(self.tempdir.take());
    }
}

impl Drop for Testbed {
    /// A failed test keeps the folder and prints the logs' tails
    /// ([`failure`]); the clusters' processes are stopped either way (their
    /// own drop).
    fn drop(&mut self) {
        // Stopped first: a real node unmounts what it bound in the folder.
        self.clusters.clear();
        failure::leave(&self.root, self.tempdir.take());
    }
}
