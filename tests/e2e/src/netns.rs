//! Network namespaces that a test makes for itself, joined by veth pairs,
//! with processes started inside them and sockets opened from inside them;
//! all of it removed when dropped. Needs root (CAP_NET_ADMIN) and
//! iproute2. Traffic stays in the namespaces the test made.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Runs `ip` with `args`; an error carries its stderr.
pub fn ip(args: &[&str]) -> Result<()> {
    run("ip", args)
}

/// Runs a command to completion; an error carries its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<()> {
    stdout(program, args).map(drop)
}

/// Runs a command to completion and returns what it printed; an error
/// carries its stderr.
pub fn stdout(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    ensure!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// A network namespace, deleted (with its devices) when dropped.
#[derive(Debug)]
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    /// A new namespace, named after `label` and this process, with `lo` up.
    pub fn new(label: &str) -> Result<Self> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("lq-{label}-{}-{n}", std::process::id());
        ip(&["netns", "add", &name])?;
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `ip -n <ns> args`.
    pub fn ip(&self, args: &[&str]) -> Result<()> {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Runs a command inside to completion.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<()> {
        self.stdout(program, args).map(drop)
    }

    /// Runs a command inside and returns what it printed.
    pub fn stdout(&self, program: &str, args: &[&str]) -> Result<String> {
        let mut all = vec!["netns", "exec", &self.name, program];
        all.extend_from_slice(args);
        stdout("ip", &all)
    }

    /// Runs a command inside with a clean environment (only `PATH`, and
    /// `HOME` pointing nowhere), capturing its output.
    pub fn output(&self, program: &Path, args: &[&str]) -> Result<crate::Run> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name])
            .arg(program)
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", "/nonexistent")
            .stdin(Stdio::null());
        let out = cmd
            .output()
            .with_context(|| format!("running {}", program.display()))?;
        Ok(crate::Run::from(crate::command_line(&cmd), out))
    }

    /// Starts a command inside; killed when the [`Process`] is dropped.
    /// Its output goes to `log`.
    pub fn spawn(&self, program: &Path, args: &[&str], log: &Path) -> Result<Process> {
        self.spawn_with_env(program, args, &[], log)
    }

    /// [`NetNs::spawn`] with more environment variables.
    pub fn spawn_with_env(
        &self,
        program: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Result<Process> {
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .arg(program)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        Ok(Process {
            child,
            log: log.to_owned(),
        })
    }

    fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }

    /// Runs `f` on a thread that has entered this namespace (a network
    /// namespace is per thread), and returns its result.
    pub fn within<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> std::thread::JoinHandle<Result<T>> {
        let path = self.path();
        std::thread::spawn(move || {
            let ns = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .context("entering the namespace")?;
            f()
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// A veth pair between two namespaces, each end with an address; returns
/// the names of a's end and b's end.
pub fn link(a: &NetNs, a_addr: &str, b: &NetNs, b_addr: &str) -> Result<(String, String)> {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let (ea, eb) = (format!("va{n}"), format!("vb{n}"));
    ip(&[
        "link", "add", &ea, "netns", &a.name, "type", "veth", "peer", "name", &eb, "netns", &b.name,
    ])?;
    for (ns, dev, addr) in [(a, &ea, a_addr), (b, &eb, b_addr)] {
        ns.ip(&["addr", "add", addr, "dev", dev])?;
        ns.ip(&["link", "set", dev, "up"])?;
    }
    Ok((ea, eb))
}

/// A process in a namespace, killed when dropped.
#[derive(Debug)]
pub struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What it printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Asks it to stop (SIGTERM) and waits up to `timeout` for it to
    /// exit; whether it exited successfully.
    pub fn terminate(&mut self, timeout: Duration) -> Result<bool> {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let pid = i32::try_from(self.child.id()).context("a pid")?;
        // `ip netns exec` execs the program: the child is the program.
        kill(Pid::from_raw(pid), Signal::SIGTERM).context("sending SIGTERM")?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status.success());
            }
            ensure!(
                Instant::now() < deadline,
                "still running {timeout:?} after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Pings `to` from `ns` until one answer (the first packets may wait for
/// a handshake) within 20 s, then `count` more that must all come back.
pub fn ping(ns: &NetNs, to: &str, count: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while ns.run("ping", &["-c", "1", "-W", "1", to]).is_err() {
        ensure!(Instant::now() < deadline, "no answer from {to} within 20 s");
    }
    ns.run(
        "ping",
        &["-c", &count.to_string(), "-i", "0.2", "-W", "2", to],
    )
    .with_context(|| format!("pinging {to}"))
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The byte at `i` of the test stream: a pattern that a shifted, dropped
/// or repeated chunk does not reproduce.
fn pattern(i: u64) -> u8 {
    let x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8 ^ (i >> 12) as u8
}

/// Sends `len` bytes of a known pattern over TCP from namespace `from`
/// to a listener at `to` in namespace `at`, within `timeout`, and checks
/// every byte that arrives. Returns how long the transfer took.
pub fn transfer(
    from: &NetNs,
    at: &NetNs,
    to: SocketAddr,
    len: u64,
    timeout: Duration,
) -> Result<Duration> {
    transfer_seen(from, at, to, to, len, timeout).map(|(took, _)| took)
}

/// [`transfer`] to a listener bound at `bind` in `at` that the sender
/// reaches at `to` (they differ across NAT), also returning the address
/// the receiver saw the sender connect from.
pub fn transfer_seen(
    from: &NetNs,
    at: &NetNs,
    bind: SocketAddr,
    to: SocketAddr,
    len: u64,
    timeout: Duration,
) -> Result<(Duration, SocketAddr)> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let receiver = at.within(move || {
        let listener = TcpListener::bind(bind).with_context(|| format!("listening on {bind}"))?;
        let _ = ready_tx.send(());
        // Bounded: a sender that never connects must not hang the test.
        listener.set_nonblocking(true)?;
        let deadline = Instant::now() + timeout;
        let (mut stream, seen) = loop {
            match listener.accept() {
                Ok(accepted) => break accepted,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e).context("waiting for the sender"),
            }
        };
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(timeout))?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut got = 0u64;
        while got < len {
            let n = stream.read(&mut buf).context("receiving")?;
            if n == 0 {
                bail!("the stream ended after {got} of {len} bytes");
            }
            for (k, b) in buf[..n].iter().enumerate() {
                let i = got + k as u64;
                ensure!(*b == pattern(i), "byte {i} is corrupt");
            }
            got += n as u64;
        }
        Ok((got, seen))
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .context("the receiver did not start")?;
    let sender = from.within(move || {
        let started = Instant::now();
        let mut stream = TcpStream::connect_timeout(&to, timeout)
            .with_context(|| format!("connecting to {to}"))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut sent = 0u64;
        while sent < len {
            let n = (len - sent).min(buf.len() as u64) as usize;
            for (k, b) in buf[..n].iter_mut().enumerate() {
                *b = pattern(sent + k as u64);
            }
            stream.write_all(&buf[..n]).context("sending")?;
            sent += n as u64;
        }
        stream.flush()?;
        Ok(started)
    });
    let started = sender
        .join()
        .map_err(|_| anyhow::anyhow!("the sender panicked"))??;
    let (got, seen) = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("the receiver panicked"))??;
    ensure!(got == len, "received {got} of {len} bytes");
    Ok((started.elapsed(), seen))
}

/// A cluster: a node namespace that forwards, with strict reverse-path
/// filtering (a packet must come in where its source is routed), and pods.
#[derive(Debug)]
pub struct Cluster {
    pub node: NetNs,
    pub pods: Vec<NetNs>,
}

impl Cluster {
    /// `pods`: each pod's address; its /24's first address is the node's
    /// end of its veth and its default route.
    pub fn new(label: &str, pods: &[&str]) -> Result<Self> {
        let node = NetNs::new(&format!("{label}node"))?;
        for setting in [
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=1",
            "net.ipv4.conf.default.rp_filter=1",
        ] {
            node.run("sysctl", &["-qw", setting])?;
        }
        let mut made = Vec::new();
        for (i, pod_addr) in pods.iter().enumerate() {
            let pod = NetNs::new(&format!("{label}pod{i}"))?;
            let gateway = {
                let mut octets: Vec<&str> = pod_addr.split('.').collect();
                octets[3] = "1";
                octets.join(".")
            };
            link(
                &pod,
                &format!("{pod_addr}/24"),
                &node,
                &format!("{gateway}/24"),
            )?;
            pod.ip(&["route", "add", "default", "via", &gateway])?;
            made.push(pod);
        }
        Ok(Self { node, pods: made })
    }
}
