//! The kube-apiserver under a test's control: what has been done to it
//! ([`ApiServerState`]), and stopping, starting again, pausing and resuming
//! it while the rest of the cluster runs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use super::Cluster;
use crate::process::Process;
use crate::{Error, io_error};

/// What a test has done to a cluster's kube-apiserver (see
/// [`Cluster::stop_apiserver`], [`Cluster::pause_apiserver`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApiServerState {
    Running,
    /// Stopped with SIGSTOP: it still holds its port, so connections are
    /// accepted by the kernel and then hang.
    Paused,
    /// Exited on request: its port refuses connections.
    Stopped,
}

impl std::fmt::Display for ApiServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Stopped => "stopped",
        })
    }
}

/// How the kube-apiserver was started, to start it again the same way.
#[derive(Debug)]
pub(super) struct ApiServer {
    /// Its place in [`Cluster::processes`].
    pub(super) index: usize,
    pub(super) program: PathBuf,
    pub(super) args: Vec<String>,
    pub(super) state: ApiServerState,
}

/// How long a stopping kube-apiserver may take to exit before it is killed.
/// It stops listening at once on SIGTERM, but then waits on the watches of
/// the controllers, kwok and agents, which do not end: it would linger for
/// a minute. It keeps no state of its own (etcd does), so the kill loses
/// nothing.
const APISERVER_STOP_GRACE: Duration = Duration::from_secs(3);

impl Cluster {
    pub(super) async fn wait_for_apiserver(&mut self, client: &kube::Client) -> Result<(), Error> {
        self.wait_for("kube-apiserver to be ready", || {
            let client = client.clone();
            async move {
                let request = http::Request::get("/readyz")
                    .body(Vec::new())
                    .map_err(|e| Error::Spec(e.to_string()))?;
                Ok(client.request_text(request).await.is_ok_and(|t| t == "ok"))
            }
        })
        .await
    }

    /// What has been done to the kube-apiserver.
    pub fn apiserver_state(&self) -> ApiServerState {
        self.apiserver
            .as_ref()
            .map_or(ApiServerState::Stopped, |a| a.state)
    }

    /// Stops the kube-apiserver with SIGTERM (SIGKILL if it has not exited
    /// after 3 s, as it will not while clients hold watches) and returns
    /// once it has exited, in about 3 s: its port then refuses
    /// connections. The rest of the cluster keeps running (etcd keeps the
    /// data), and [`Cluster::ensure_running`] does not count it as a crash.
    /// Stopping a paused one resumes it first; stopping a stopped one does
    /// nothing.
    pub async fn stop_apiserver(&mut self) -> Result<(), Error> {
        match self.apiserver_state() {
            ApiServerState::Stopped => return Ok(()),
            // A stopped process would hold SIGTERM pending until SIGCONT.
            ApiServerState::Paused => self.resume_apiserver()?,
            ApiServerState::Running => {}
        }
        let api = self
            .apiserver
            .as_mut()
            .expect("invariant: a running kube-apiserver has its launch recorded");
        // Before the signal: if this future is dropped while waiting, the
        // exit is still one that was asked for.
        api.state = ApiServerState::Stopped;
        let process = &mut self.processes[api.index];
        process.terminate();
        let deadline = Instant::now() + APISERVER_STOP_GRACE;
        while process.exited().is_none() {
            if Instant::now() > deadline {
                tracing::debug!(cluster = %self.spec.name, "kube-apiserver still draining watches; killing it");
                process.kill();
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tracing::info!(cluster = %self.spec.name, "kube-apiserver stopped");
        Ok(())
    }

    /// Starts a stopped kube-apiserver again with the same address, port,
    /// certificates and flags, so that [`Cluster::server`], every
    /// kubeconfig and every client made before keep working, and returns
    /// once `/readyz` answers (at most 90 s). Starting a running one does
    /// nothing; a paused one must be resumed instead.
    ///
    /// Like every process of the cluster, the new one is tied to the thread
    /// that calls this (it is killed when that thread ends): call it from
    /// the thread, or the runtime, that started the cluster.
    pub async fn start_apiserver(&mut self) -> Result<(), Error> {
        match self.apiserver_state() {
            ApiServerState::Running => return Ok(()),
            state @ ApiServerState::Paused => {
                return Err(Error::ApiServerState {
                    cluster: self.spec.name.clone(),
                    action: "start",
                    state,
                });
            }
            ApiServerState::Stopped => {}
        }
        let api = self
            .apiserver
            .as_ref()
            .expect("invariant: a stopped kube-apiserver has its launch recorded");
        let log = self.dir.join("logs").join("kube-apiserver.log");
        let process = Process::spawn("kube-apiserver", &api.program, &api.args, &log)
            .map_err(io_error(&api.program))?;
        tracing::info!(cluster = %self.spec.name, pid = process.pid(), "kube-apiserver started again");
        let index = api.index;
        // The old process has exited and been reaped: dropping it is a no-op.
        self.processes[index] = process;
        if let Some(api) = self.apiserver.as_mut() {
            api.state = ApiServerState::Running;
        }
        let client = self.client().await?;
        self.wait_for_apiserver(&client).await
    }

    /// [`Cluster::stop_apiserver`], then [`Cluster::start_apiserver`].
    pub async fn restart_apiserver(&mut self) -> Result<(), Error> {
        self.stop_apiserver().await?;
        self.start_apiserver().await
    }

    /// Freezes the kube-apiserver with SIGSTOP, so that it looks dead
    /// without going away: connections to it are accepted by the kernel and
    /// then hang, requests time out. Returns once the process is stopped.
    /// Pausing a paused one does nothing; a stopped one cannot be paused.
    pub fn pause_apiserver(&mut self) -> Result<(), Error> {
        match self.apiserver_state() {
            ApiServerState::Paused => return Ok(()),
            state @ ApiServerState::Stopped => {
                return Err(Error::ApiServerState {
                    cluster: self.spec.name.clone(),
                    action: "pause",
                    state,
                });
            }
            ApiServerState::Running => {}
        }
        self.signal_apiserver(Signal::SIGSTOP)?;
        if let Some(api) = self.apiserver.as_mut() {
            api.state = ApiServerState::Paused;
        }
        Ok(())
    }

    /// Lets a paused kube-apiserver run again (SIGCONT); the requests that
    /// hung meanwhile are then answered. Resuming a running one does
    /// nothing; a stopped one must be started instead.
    pub fn resume_apiserver(&mut self) -> Result<(), Error> {
        match self.apiserver_state() {
            ApiServerState::Running => return Ok(()),
            state @ ApiServerState::Stopped => {
                return Err(Error::ApiServerState {
                    cluster: self.spec.name.clone(),
                    action: "resume",
                    state,
                });
            }
            ApiServerState::Paused => {}
        }
        self.signal_apiserver(Signal::SIGCONT)?;
        if let Some(api) = self.apiserver.as_mut() {
            api.state = ApiServerState::Running;
        }
        Ok(())
    }

    /// Sends `signal` to the running kube-apiserver and waits (at most 2 s)
    /// until /proc shows it stopped (SIGSTOP) or not (otherwise), so that a
    /// caller's next request meets the new state.
    fn signal_apiserver(&mut self, signal: Signal) -> Result<(), Error> {
        let api = self
            .apiserver
            .as_ref()
            .expect("invariant: only a started kube-apiserver is signalled");
        let process = &mut self.processes[api.index];
        let failed = |source| Error::Signal {
            cluster: self.spec.name.clone(),
            signal: signal.as_str().to_owned(),
            source,
        };
        // An exited child may be reaped and its pid reused: never signal it.
        if process.exited().is_some() {
            return Err(failed(nix::errno::Errno::ESRCH));
        }
        let pid = process.pid();
        kill(Pid::from_raw(pid as i32), signal).map_err(failed)?;
        let want_stopped = signal == Signal::SIGSTOP;
        let deadline = Instant::now() + Duration::from_secs(2);
        while is_stopped(pid) != want_stopped && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

/// Whether a process is stopped by a signal (state `T` in /proc).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name, which is in parentheses and
        // may itself hold spaces or parentheses.
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
}
