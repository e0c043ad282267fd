//! Routing and remapping with real packets: two "clusters", each a node
//! network namespace (where `liqo-gateway tunnel` runs) with pod
//! namespaces behind it (a veth each, an address from the cluster's pod
//! CIDR, the default route via the node), the two nodes joined by a veth
//! "internet". With identical pod CIDRs each side sees the other's pods
//! under a remapped CIDR: pings and byte-checked TCP both ways, the
//! receiver seeing the sender at its remapped address with the host part
//! kept, the NAT table replaced (not duplicated) by a restart after a
//! crash, and removed when the gateway stops. With disjoint CIDRs: routes
//! only, no table. Needs root, iproute2, nftables, ping and
//! wireguard-tools (`wg genkey`; tests/setup.sh installs them).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use liqo_e2e::netns::{Cluster, NetNs, Process, link, ping, transfer_seen};

/// Every wait and transfer here is bounded by this.
const TIMEOUT: Duration = Duration::from_secs(60);
/// Our table in each node (the tunnel's device is `wg0`).
const TABLE: &str = "liqo-gw-wg0";

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("address")
}

fn tables(node: &NetNs) -> Result<String> {
    node.stdout("nft", &["list", "tables"])
}

/// Our table's rules as nft prints them, or None without the table.
fn table(node: &NetNs) -> Result<Option<String>> {
    tables(node)?
        .contains(TABLE)
        .then(|| node.stdout("nft", &["list", "table", "inet", TABLE]))
        .transpose()
}

/// `liqo-gateway tunnel` in a node, with its own key.
struct Gateway<'a> {
    ns: &'a NetNs,
    args: Vec<String>,
    log: PathBuf,
    process: Option<Process>,
}

impl<'a> Gateway<'a> {
    fn start(&mut self) -> Result<()> {
        let bin = liqo_e2e::bin_dir().join("liqo-gateway");
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.process = Some(self.ns.spawn(&bin, &args, &self.log)?);
        // Up once its route is: the table (if any) comes before it.
        let ns = self.ns;
        wait("the gateway's route", || {
            ns.stdout("ip", &["route", "show", "dev", "wg0"])
                .is_ok_and(|r| r.lines().count() > 1)
        })
        .with_context(|| format!("the gateway did not start: {}", self.log()))
    }

    /// SIGTERM, and a clean exit within 10 s.
    fn stop(&mut self) -> Result<()> {
        let process = self.process.as_mut().context("not running")?;
        let clean = process.terminate(Duration::from_secs(10))?;
        ensure!(clean, "the gateway failed on SIGTERM: {}", self.log());
        self.process = None;
        Ok(())
    }

    /// SIGKILL: nothing cleaned.
    fn crash(&mut self) {
        self.process = None;
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Two gateways, a in `a.node` and b in `b.node`, joined over the veth
/// "internet" (192.168.77.1 and .2); `extra_a` and `extra_b` say what
/// each knows of the pod CIDRs.
fn gateways<'a>(
    dir: &Path,
    a: &'a Cluster,
    b: &'a Cluster,
    extra_a: &[&str],
    extra_b: &[&str],
) -> Result<(Gateway<'a>, Gateway<'a>)> {
    link(&a.node, "192.168.77.1/24", &b.node, "192.168.77.2/24")?;
    let (ka, pa) = key(dir, "a")?;
    let (kb, pb) = key(dir, "b")?;
    let gateway =
        |ns: &'a NetNs, name: &str, address: &str, key: &Path, peer: &str, extra: &[&str]| {
            let mut args: Vec<String> = [
                "tunnel",
                "--interface",
                "wg0",
                "--address",
                address,
                "--listen",
                "0.0.0.0:51820",
                "--private-key-file",
                &key.display().to_string(),
                "--peer-public-key",
                peer,
            ]
            .map(str::to_owned)
            .to_vec();
            args.extend(extra.iter().map(|s| (*s).to_owned()));
            Gateway {
                ns,
                args,
                log: dir.join(format!("{name}.log")),
                process: None,
            }
        };
    let mut ga = gateway(&a.node, "a", "10.99.0.1/24", &ka, &pb, extra_a);
    ga.args.extend(
        [
            "--peer-endpoint",
            "192.168.77.2:51820",
            "--persistent-keepalive",
            "1",
        ]
        .map(str::to_owned),
    );
    let gb = gateway(&b.node, "b", "10.99.0.2/24", &kb, &pa, extra_b);
    Ok((ga, gb))
}

/// A private key file (from `wg genkey`) and its public key.
fn key(dir: &Path, name: &str) -> Result<(PathBuf, String)> {
    let private = Command::new("wg")
        .arg("genkey")
        .output()
        .context("running wg")?;
    ensure!(private.status.success(), "wg genkey");
    let path = dir.join(format!("{name}.key"));
    std::fs::write(&path, &private.stdout)?;
    let out = Command::new("sh")
        .args(["-c", "wg pubkey < \"$0\"", &path.display().to_string()])
        .output()?;
    ensure!(out.status.success(), "wg pubkey");
    Ok((path, String::from_utf8(out.stdout)?.trim().to_owned()))
}

fn wait(what: &str, mut ok: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        ensure!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// 2 MiB from `from` to the listener at `bind` in `at`, reached at `to`;
/// returns the address the listener saw.
fn tcp(from: &NetNs, at: &NetNs, bind: &str, to: &str) -> Result<std::net::IpAddr> {
    let (_, seen) = transfer_seen(from, at, addr(bind), addr(to), 2 << 20, TIMEOUT)
        .with_context(|| format!("TCP to {to}"))?;
    Ok(seen.ip())
}

fn on_failure<T>(result: Result<T>, gateways: [&Gateway<'_>; 2]) -> Result<T> {
    if result.is_err() {
        for g in gateways {
            eprintln!("--- gateway in {} ---\n{}", g.ns.name, g.log());
        }
    }
    result
}

#[test]
fn identical_pod_cidrs_are_remapped_both_ways_keeping_the_host_part() -> Result<()> {
    // Both clusters use 10.200.0.0/16; a2 and b0 even have the same
    // address. a sees b's pods as 10.201.0.0/16 (given); b sees a's from
    // its pool 10.202.0.0/15, where the first /16 free is 10.202.0.0/16.
    let a = Cluster::new("a", &["10.200.1.2", "10.200.2.3"])?;
    let b = Cluster::new("b", &["10.200.2.3"])?;
    let dir = tempfile::tempdir()?;
    let (mut ga, mut gb) = gateways(
        dir.path(),
        &a,
        &b,
        &[
            "--local-cidr",
            "10.200.0.0/16",
            "--peer-cidr",
            "10.200.0.0/16",
            "--peer-remapped-cidr",
            "10.201.0.0/16",
        ],
        &[
            "--local-cidr",
            "10.200.0.0/16",
            "--avoid",
            "10.96.0.0/12",
            "--peer-cidr",
            "10.200.0.0/16",
            "--remap-pool",
            "10.202.0.0/15",
        ],
    )?;
    ga.start()?;
    gb.start()?;
    let checked = (|| -> Result<()> {
        let (a1, a2, b0) = (&a.pods[0], &a.pods[1], &b.pods[0]);
        ping(a1, "10.201.2.3", 3).context("a1 to b0")?;
        ping(b0, "10.202.1.2", 3).context("b0 to a1")?;
        ping(b0, "10.202.2.3", 3).context("b0 to a2, its own address in a")?;
        ping(a2, "10.201.2.3", 3).context("a2 to b0, its own address in b")?;

        // Each receiver sees the sender under the remapped CIDR of its own
        // side, host part kept.
        let seen = tcp(a1, b0, "10.200.2.3:5001", "10.201.2.3:5001")?;
        ensure!(seen.to_string() == "10.202.1.2", "b0 saw a1 as {seen}");
        let seen = tcp(b0, a2, "10.200.2.3:5002", "10.202.2.3:5002")?;
        ensure!(seen.to_string() == "10.201.2.3", "a2 saw b0 as {seen}");
        let seen = tcp(a2, b0, "10.200.2.3:5003", "10.201.2.3:5003")?;
        ensure!(seen.to_string() == "10.202.2.3", "b0 saw a2 as {seen}");

        // The routes and the tables each side installed.
        let route_a = a.node.stdout("ip", &["route", "show", "10.201.0.0/16"])?;
        ensure!(route_a.contains("dev wg0"), "a's route: {route_a}");
        let route_b = b.node.stdout("ip", &["route", "show", "10.202.0.0/16"])?;
        ensure!(route_b.contains("dev wg0"), "b's route: {route_b}");
        let table_b = table(&b.node)?.context("b has no table")?;
        ensure!(
            table_b.contains("ip saddr 10.200.0.0/16 ip saddr set")
                && table_b.contains("ip daddr 10.202.0.0/16 ip daddr set"),
            "b's table:\n{table_b}"
        );

        // A crash leaves the table; the restart replaces it: one table,
        // the same rules, and traffic again.
        gb.crash();
        ensure!(
            table(&b.node)?.as_ref() == Some(&table_b),
            "the table after a crash"
        );
        gb.start()?;
        ensure!(
            table(&b.node)?.as_ref() == Some(&table_b),
            "the table after a restart:\n{}",
            tables(&b.node)?
        );
        ping(a1, "10.201.2.3", 2).context("after b restarted")?;

        // Stopping removes the table (and the device takes the route).
        ga.stop()?;
        ensure!(
            table(&a.node)?.is_none(),
            "a's table after stopping: {}",
            tables(&a.node)?
        );
        let route_a = a.node.stdout("ip", &["route", "show", "10.201.0.0/16"])?;
        ensure!(
            route_a.trim().is_empty(),
            "a's route after stopping: {route_a}"
        );
        ensure!(table(&b.node)?.is_some(), "b's table went with a");
        gb.stop()?;
        ensure!(table(&b.node)?.is_none(), "b's table after stopping");
        Ok(())
    })();
    on_failure(checked, [&ga, &gb])
}

#[test]
fn disjoint_pod_cidrs_are_routed_without_nat() -> Result<()> {
    let a = Cluster::new("a", &["10.200.1.2"])?;
    let b = Cluster::new("b", &["10.210.4.5"])?;
    let dir = tempfile::tempdir()?;
    let (mut ga, mut gb) = gateways(
        dir.path(),
        &a,
        &b,
        &[
            "--local-cidr",
            "10.200.0.0/16",
            "--peer-cidr",
            "10.210.0.0/16",
        ],
        &[
            "--local-cidr",
            "10.210.0.0/16",
            "--peer-cidr",
            "10.200.0.0/16",
        ],
    )?;
    ga.start()?;
    gb.start()?;
    let checked = (|| -> Result<()> {
        let (a1, b1) = (&a.pods[0], &b.pods[0]);
        for node in [&a.node, &b.node] {
            ensure!(
                table(node)?.is_none(),
                "a table without overlap: {}",
                tables(node)?
            );
        }
        let route = a.node.stdout("ip", &["route", "show", "10.210.0.0/16"])?;
        ensure!(route.contains("dev wg0"), "a's route: {route}");
        ping(a1, "10.210.4.5", 3)?;
        ping(b1, "10.200.1.2", 3)?;
        let seen = tcp(a1, b1, "10.210.4.5:5001", "10.210.4.5:5001")?;
        ensure!(seen.to_string() == "10.200.1.2", "b1 saw a1 as {seen}");
        let seen = tcp(b1, a1, "10.200.1.2:5002", "10.200.1.2:5002")?;
        ensure!(seen.to_string() == "10.210.4.5", "a1 saw b1 as {seen}");
        ga.stop()?;
        gb.stop()?;
        Ok(())
    })();
    on_failure(checked, [&ga, &gb])
}

#[test]
fn remapping_flags_that_cannot_work_are_refused_with_what_to_do() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (key, public) = key(dir.path(), "k")?;
    let key = key.display().to_string();
    let bin = liqo_e2e::bin_dir().join("liqo-gateway");
    let base = [
        "tunnel",
        "--private-key-file",
        &key,
        "--peer-public-key",
        &public,
        "--address",
        "10.99.0.1/24",
    ];
    // (extra flags, what the error must say)
    let cases: [(&[&str], &str); 3] = [
        (
            &["--local-cidr", "10.0.0.0/8", "--peer-cidr", "10.0.0.0/8"],
            "no prefix of the remapping pool (100.64.0.0/10) is as large as it: add a pool of at least /8",
        ),
        (
            &[
                "--peer-cidr",
                "10.200.0.0/16",
                "--peer-remapped-cidr",
                "10.201.0.0/24",
            ],
            "must be of the family and length of --peer-cidr 10.200.0.0/16",
        ),
        (
            &[
                "--local-cidr",
                "10.200.0.0/16",
                "--peer-cidr",
                "10.200.0.0/16",
                "--peer-remapped-cidr",
                "10.200.0.0/16",
            ],
            "overlaps 10.200.0.0/16, which this cluster uses",
        ),
    ];
    for (extra, expected) in cases {
        let out = Command::new(&bin)
            .args(base)
            .args(extra)
            .output()
            .context("running liqo-gateway")?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success(), "{extra:?} accepted");
        ensure!(stderr.contains(expected), "{extra:?}: {stderr}");
    }
    Ok(())
}
