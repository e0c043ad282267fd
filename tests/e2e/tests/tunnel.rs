//! The gateway's tunnel with real packets: two network namespaces joined
//! by a veth "internet", `liqo-gateway tunnel` in each (or standard
//! WireGuard on one side: Debian's wireguard-go, and the current one built
//! from its Go module, configured with `wg`),
//! and pings and TCP transfers whose every byte is checked, across the
//! tunnel. Also: a restart of one side, the other side moving to a new
//! address, 20 % packet loss on the link (nftables), and garbage sent to
//! the gateway's port. Needs root, iproute2, nftables, wireguard-tools and
//! wireguard-go (tests/setup.sh installs them).

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use liqo_e2e::netns::{NetNs, Process, link, ping, run, transfer};

const PORT: &str = "51820";
/// Every wait and transfer here is bounded by this.
const TIMEOUT: Duration = Duration::from_secs(60);

struct Keys {
    dir: tempfile::TempDir,
}

impl Keys {
    fn new() -> Result<Self> {
        Ok(Self {
            dir: tempfile::tempdir()?,
        })
    }

    /// A private key file (from `wg genkey`) and its public key.
    fn pair(&self, name: &str) -> Result<(PathBuf, String)> {
        let private = wg(&["genkey"], None)?;
        let path = self.dir.path().join(name);
        std::fs::write(&path, &private)?;
        let public = wg(&["pubkey"], Some(&private))?;
        Ok((path, public.trim().to_owned()))
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }
}

fn wg(args: &[&str], input: Option<&str>) -> Result<String> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("wg")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("running wg (wireguard-tools)")?;
    if let Some(input) = input {
        child
            .stdin
            .take()
            .context("wg's stdin")?
            .write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    ensure!(out.status.success(), "wg {}", args.join(" "));
    Ok(String::from_utf8(out.stdout)?)
}

/// `liqo-gateway tunnel` in `ns`.
struct Gateway<'a> {
    ns: &'a NetNs,
    args: Vec<String>,
    log: PathBuf,
    process: Option<Process>,
}

impl<'a> Gateway<'a> {
    fn new(ns: &'a NetNs, address: &str, key: &Path, peer: &str, log: PathBuf) -> Self {
        let args = [
            "tunnel",
            "--interface",
            "wg0",
            "--address",
            address,
            "--listen",
            &format!("0.0.0.0:{PORT}"),
            "--private-key-file",
            &key.display().to_string(),
            "--peer-public-key",
            peer,
            "--allowed-ips",
            "10.99.0.0/24",
        ]
        .map(str::to_owned)
        .to_vec();
        Self {
            ns,
            args,
            log,
            process: None,
        }
    }

    fn arg(mut self, flag: &str, value: &str) -> Self {
        self.args.extend([flag.to_owned(), value.to_owned()]);
        self
    }

    fn start(&mut self) -> Result<()> {
        let bin = liqo_e2e::bin_dir().join("liqo-gateway");
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.process = Some(self.ns.spawn(&bin, &args, &self.log)?);
        // Up once its device exists.
        wait("the gateway's device", || {
            self.ns.ip(&["link", "show", "wg0"]).is_ok()
        })
    }

    fn stop(&mut self) {
        self.process = None;
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn wait(what: &str, mut ok: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        ensure!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("address")
}

/// Two namespaces joined by a veth pair: 192.168.77.1 and .2.
fn internet() -> Result<(NetNs, NetNs)> {
    let a = NetNs::new("a")?;
    let b = NetNs::new("b")?;
    link(&a, "192.168.77.1/24", &b, "192.168.77.2/24")?;
    Ok((a, b))
}

#[test]
fn two_gateways_carry_traffic_both_ways_and_survive_trouble() -> Result<()> {
    let (a, b) = internet()?;
    let keys = Keys::new()?;
    let (ka, pa) = keys.pair("a")?;
    let (kb, pb) = keys.pair("b")?;
    let mut ga = Gateway::new(&a, "10.99.0.1/24", &ka, &pb, keys.log("a"))
        .arg("--peer-endpoint", "192.168.77.2:51820")
        .arg("--persistent-keepalive", "1");
    let mut gb = Gateway::new(&b, "10.99.0.2/24", &kb, &pa, keys.log("b"));
    ga.start()?;
    gb.start()?;
    let checked = (|| -> Result<()> {
        ping(&a, "10.99.0.2", 3)?;
        ping(&b, "10.99.0.1", 3)?;
        transfer(&a, &b, addr("10.99.0.2:5001"), 16 << 20, TIMEOUT).context("a to b")?;
        transfer(&b, &a, addr("10.99.0.1:5002"), 16 << 20, TIMEOUT).context("b to a")?;

        // Garbage, truncated and replayed datagrams at b's port: dropped,
        // and the tunnel goes on.
        let junk = a.within(|| {
            let socket = UdpSocket::bind("192.168.77.1:0")?;
            let target = "192.168.77.2:51820";
            let handshake_init = {
                let mut m = vec![0u8; 148];
                m[0] = 1;
                m
            };
            let data = {
                let mut m = vec![0u8; 64];
                m[0] = 4;
                m
            };
            for datagram in [
                &b"garbage"[..],
                &[],
                &handshake_init[..100],
                &handshake_init,
                &data,
                &data,
                &[0xff; 1400],
            ] {
                socket.send_to(datagram, target)?;
            }
            Ok(())
        });
        junk.join()
            .map_err(|_| anyhow::anyhow!("junk sender panicked"))??;
        ping(&a, "10.99.0.2", 2)?;

        // b restarts: a new handshake, and traffic again.
        gb.stop();
        gb.start()?;
        ping(&a, "10.99.0.2", 2).context("after b restarted")?;
        transfer(&a, &b, addr("10.99.0.2:5003"), 4 << 20, TIMEOUT).context("after a restart")?;

        // a moves to another address: b follows its authenticated packets
        // (a keeps sending keepalives every second).
        move_address(&a, "192.168.77.1/24", "192.168.77.9/24")?;
        ping(&b, "10.99.0.1", 2).context("after a moved")?;

        // 20 % of the link's packets dropped at b: TCP recovers, every
        // byte intact.
        lossy(&b, 20)?;
        let took = transfer(&a, &b, addr("10.99.0.2:5004"), 2 << 20, TIMEOUT)
            .context("over a lossy link")?;
        eprintln!("2 MiB over a link that drops 20 %: {took:?}");
        Ok(())
    })();
    if checked.is_err() {
        eprintln!(
            "--- gateway a ---\n{}\n--- gateway b ---\n{}",
            ga.log(),
            gb.log()
        );
    }
    checked
}

/// Replaces the veth address `old` in `ns` with `new`.
fn move_address(ns: &NetNs, old: &str, new: &str) -> Result<()> {
    let dev = device_with(ns, old)?;
    // Deleting a primary address takes its subnet's secondaries with it:
    // the old one goes first.
    ns.ip(&["addr", "del", old, "dev", &dev])?;
    ns.ip(&["addr", "add", new, "dev", &dev])
}

/// The device holding `addr` in `ns`.
fn device_with(ns: &NetNs, addr: &str) -> Result<String> {
    let out = std::process::Command::new("ip")
        .args(["-n", &ns.name, "-o", "addr", "show"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains(addr))
        .and_then(|l| l.split_whitespace().nth(1))
        .map(str::to_owned)
        .with_context(|| format!("no device with {addr} in {}", ns.name))
}

/// Drops `percent` % of the packets arriving in `ns` (random), with
/// nftables: this kernel has no netem.
fn lossy(ns: &NetNs, percent: u32) -> Result<()> {
    let rules = format!(
        "table inet loss {{\n chain input {{\n  type filter hook input priority 0;\n  \
         udp dport {PORT} numgen random mod 100 < {percent} drop\n }}\n}}\n"
    );
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .context("running nft (nftables)")?;
    {
        use std::io::Write as _;
        child
            .stdin
            .take()
            .context("nft's stdin")?
            .write_all(rules.as_bytes())?;
    }
    ensure!(child.wait()?.success(), "nft refused the rules");
    Ok(())
}

#[test]
fn our_gateway_and_debians_wireguard_go_understand_each_other() -> Result<()> {
    let wireguard_go = std::env::var("LIQO_WIREGUARD_GO").unwrap_or_else(|_| "wireguard-go".into());
    interoperate(Path::new(&wireguard_go))
}

/// The current wireguard-go, built from the Go module pinned in
/// `tests/wireguard-go` (with its TUN and UDP offloads, which change how
/// it batches and what it sends).
#[test]
fn our_gateway_and_the_current_wireguard_go_understand_each_other() -> Result<()> {
    let build = concat!(env!("CARGO_MANIFEST_DIR"), "/../wireguard-go/build.sh");
    let out = std::process::Command::new("bash")
        .arg(build)
        .output()
        .context("running tests/wireguard-go/build.sh")?;
    ensure!(
        out.status.success(),
        "building wireguard-go: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8(out.stdout)?;
    interoperate(Path::new(path.trim()))
}

/// Our gateway at one end, `wireguard_go` configured with `wg` and `ip` at
/// the other: ping both ways, and 8 MiB checked each way.
fn interoperate(wireguard_go: &Path) -> Result<()> {
    let (a, b) = internet()?;
    let keys = Keys::new()?;
    let (ka, pa) = keys.pair("a")?;
    let (kb, pb) = keys.pair("b")?;
    let mut ga = Gateway::new(&a, "10.99.0.1/24", &ka, &pb, keys.log("a"))
        .arg("--peer-endpoint", "192.168.77.2:51820");
    ga.start()?;
    // b: wireguard-go, configured with wg and ip. WireGuard's userspace
    // implementation refuses to start on a kernel that has the module
    // unless asked.
    // Its control socket is named after the device in a folder shared by
    // every namespace: a name of this test's own.
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nth = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dev = format!("wgt{}x{nth}", std::process::id() % 100_000);
    let wg_go = b.spawn_with_env(
        wireguard_go,
        &["-f", &dev],
        &[("WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD", "1")],
        &keys.log("wireguard-go"),
    )?;
    wait("wireguard-go's device", || {
        b.ip(&["link", "show", &dev]).is_ok()
    })
    .with_context(|| format!("wireguard-go did not start: {}", wg_go.log()))?;
    let kb_path = kb.display().to_string();
    run(
        "ip",
        &[
            "netns",
            "exec",
            &b.name,
            "wg",
            "set",
            &dev,
            "listen-port",
            PORT,
            "private-key",
            &kb_path,
            "peer",
            &pa,
            "allowed-ips",
            "10.99.0.0/24",
        ],
    )?;
    b.ip(&["addr", "add", "10.99.0.2/24", "dev", &dev])?;
    b.ip(&["link", "set", &dev, "mtu", "1420", "up"])?;
    let checked = (|| -> Result<()> {
        ping(&a, "10.99.0.2", 3)?;
        ping(&b, "10.99.0.1", 3)?;
        transfer(&a, &b, addr("10.99.0.2:5001"), 8 << 20, TIMEOUT)
            .context("ours to wireguard-go")?;
        transfer(&b, &a, addr("10.99.0.1:5002"), 8 << 20, TIMEOUT)
            .context("wireguard-go to ours")?;
        Ok(())
    })();
    if checked.is_err() {
        eprintln!("--- gateway ---\n{}", ga.log());
    }
    checked
}
