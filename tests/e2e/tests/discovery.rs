//! Peer discovery with real packets, only on networks the test made.
//!
//! LAN: two network namespaces joined by a veth pair; `liqo-gateway
//! announce` runs in one for two clusters (and a malformed announcement
//! is made there with mdns-sd directly); `liqoctl discover --lan` browses
//! from the other. It prints how long `discover --lan --expect 2` took to
//! list both clusters (the figure in docs/discovery.md). After the
//! announcers stop (goodbye packets), a new browse finds nothing.
//!
//! The agent: the gateway agent with `--announce`, in a namespace, against
//! a real test cluster: announces the identity, and follows its changes.
//!
//! DNS: `liqoctl generate dns-records` against a real test cluster, those
//! very lines served by a DNS server on loopback (hickory's, in the test),
//! and `liqoctl discover --domain` against it. Also the bad inputs and an
//! unreachable DNS server, each one `error:` line with its exit code.
//!
//! Needs root and iproute2 (tests/setup.sh).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use liqo_e2e::fixture::{One, spec};
use liqo_e2e::netns::{NetNs, Process, link};
use liqo_e2e::{Run, liqoctl};
use serde_json::Value;

/// The clusters that `discover` printed, by cluster ID.
fn clusters(run: &Run) -> Result<BTreeMap<String, Value>> {
    let report: Value = serde_json::from_str(&run.stdout)
        .with_context(|| format!("discover's JSON:\n{}", run.stdout))?;
    let list = report["clusters"].as_array().context("no clusters list")?;
    Ok(list
        .iter()
        .map(|c| {
            (
                c["clusterId"].as_str().unwrap_or_default().to_owned(),
                c.clone(),
            )
        })
        .collect())
}

/// A LAN of two namespaces joined by a veth pair, `<net>.1` and `<net>.2`:
/// the announcers' (and the name of its end), and the browser's.
fn lan(net: &str) -> Result<(NetNs, String, NetNs)> {
    let a = NetNs::new("ann")?;
    let b = NetNs::new("brw")?;
    let (a_end, b_end) = link(&a, &format!("{net}.1/24"), &b, &format!("{net}.2/24"))?;
    // Namespaces have no default route: multicast goes out the veth.
    a.ip(&["route", "add", "224.0.0.0/4", "dev", &a_end])?;
    b.ip(&["route", "add", "224.0.0.0/4", "dev", &b_end])?;
    Ok((a, a_end, b))
}

fn announcer(ns: &NetNs, args: &[&str], log: PathBuf) -> Result<Process> {
    let bin = liqo_e2e::bin_dir().join("liqo-gateway");
    let mut all = vec!["announce"];
    all.extend_from_slice(args);
    ns.spawn(&bin, &all, &log)
}

#[test]
fn lan_discovery_finds_announced_clusters_and_forgets_withdrawn_ones() -> Result<()> {
    let liqoctl = liqo_e2e::bin_dir().join("liqoctl");
    let dir = tempfile::tempdir()?;
    let (a, a_end, b) = lan("192.168.79")?;

    let mut one = announcer(
        &a,
        &[
            "--cluster-id=cluster-one",
            "--cluster-name=one",
            "--label=region=eu-west",
            "--label=topology.kubernetes.io/zone=z1",
            "--api-address=https://192.168.79.1:6443",
            "--interface",
            &a_end,
        ],
        dir.path().join("one.log"),
    )?;
    let mut two = announcer(
        &a,
        &[
            "--cluster-id=cluster-two",
            "--cluster-name=two",
            "--api-address=https://api.two.example:8443",
        ],
        dir.path().join("two.log"),
    )?;
    // A third, malformed one (a cluster ID that is no DNS label), made
    // with mdns-sd itself, as liqo-gateway refuses to announce it.
    let malformed = a
        .within(|| {
            let daemon = mdns_sd::ServiceDaemon::new()?;
            let service = mdns_sd::ServiceInfo::new(
                "_liqo._tcp.local.",
                "broken",
                "broken-host.local.",
                "",
                6443,
                &[
                    ("id", "Not_A_Label"),
                    ("name", "broken"),
                    ("api", "https://x"),
                ][..],
            )?
            .enable_addr_auto();
            daemon.register(service)?;
            Ok(daemon)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the malformed announcer panicked"))??;

    let logs = |one: &Process, two: &Process| format!("one:\n{}\ntwo:\n{}", one.log(), two.log());
    // The figure: how long a browse takes to list both. The first browse
    // starts with the announcers (which probe for their names first); the
    // next ones each a while after the last, as responders hold back
    // records they multicast less than a second ago (RFC 6762, 6).
    let browse = |one: &Process, two: &Process| -> Result<(Duration, BTreeMap<String, Value>)> {
        let started = Instant::now();
        let run = b.output(
            &liqoctl,
            &[
                "discover",
                "--lan",
                "--expect",
                "2",
                "--timeout",
                "10s",
                "-o",
                "json",
            ],
        )?;
        let took = started.elapsed();
        ensure!(
            run.code == 0,
            "discover failed: {run:?}\n{}",
            logs(one, two)
        );
        let found = clusters(&run)?;
        ensure!(found.len() == 2, "found {found:?}\n{}", logs(one, two));
        Ok((took, found))
    };
    let ms = |d: Duration| format!("{:.0}", d.as_secs_f64() * 1000.0);
    let (cold, mut found) = browse(&one, &two)?;
    let mut warm = Vec::new();
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(1500));
        let (took, again) = browse(&one, &two)?;
        warm.push(took);
        found = again;
    }
    let listed: Vec<String> = warm.iter().copied().map(ms).collect();
    warm.sort();
    eprintln!(
        "FIGURE: `liqoctl discover --lan --expect 2 --timeout 10s -o json` listed 2 clusters: \
         {} ms as the announcers started; then [{}] ms, median {} ms",
        ms(cold),
        listed.join(", "),
        ms(warm[warm.len() / 2])
    );
    let c1 = &found["cluster-one"];
    assert_eq!(c1["name"], "one");
    assert_eq!(c1["apiAddress"], "https://192.168.79.1:6443");
    assert_eq!(c1["labels"]["region"], "eu-west");
    assert_eq!(c1["labels"]["topology.kubernetes.io/zone"], "z1");
    assert_eq!(c1["foundVia"], serde_json::json!(["lan"]));
    assert_eq!(c1["authenticated"], false);
    assert_eq!(c1["version"], liqo_api::VERSION);
    let c2 = &found["cluster-two"];
    assert_eq!(c2["name"], "two");
    assert_eq!(c2["apiAddress"], "https://api.two.example:8443");
    assert_eq!(c2["labels"], serde_json::json!({}));

    // The table, browsing its whole timeout: the malformed announcement is
    // skipped with a warning naming it; the notice says nothing here is
    // authenticated.
    let run = b.output(&liqoctl, &["discover", "--timeout", "2s"])?;
    ensure!(run.code == 0, "discover failed: {run:?}");
    for want in [
        "NAME",
        "CLUSTER ID",
        "FOUND VIA",
        "one",
        "cluster-two",
        "region=eu-west",
    ] {
        assert!(run.stdout.contains(want), "{want} missing:\n{}", run.stdout);
    }
    assert!(!run.stdout.contains("broken"), "{}", run.stdout);
    assert!(
        run.stderr
            .contains("warning: skipped broken._liqo._tcp.local.")
            && run.stderr.contains("does not authenticate"),
        "{}",
        run.stderr
    );
    drop(malformed);

    // Announcers that stop say goodbye: a browse that saw them forgets
    // them as they go, well before their records would expire.
    let browse = std::process::Command::new("ip")
        .args(["netns", "exec", &b.name])
        .arg(&liqoctl)
        .args(["-v", "discover", "--lan", "--timeout", "5s", "-o", "json"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        one.terminate(Duration::from_secs(5))?,
        "{}",
        logs(&one, &two)
    );
    assert!(
        two.terminate(Duration::from_secs(5))?,
        "{}",
        logs(&one, &two)
    );
    assert!(one.log().contains("withdrawing"), "{}", one.log());
    let run = liqo_e2e::run_output(
        "liqoctl -v discover --lan --timeout 5s -o json (in a namespace)",
        browse.wait_with_output()?,
    );
    ensure!(run.code == 0, "discover failed: {run:?}");
    assert!(
        run.stderr.contains("found on the LAN") && run.stderr.contains("gone from the LAN"),
        "the browse did not see them come and go:\n{}",
        run.stderr
    );
    let left = clusters(&run)?;
    assert!(
        !left.contains_key("cluster-one") && !left.contains_key("cluster-two"),
        "{left:?}"
    );

    // Fewer than --expect within the timeout: exit 8, one error line.
    let run = b.output(
        &liqoctl,
        &["discover", "--lan", "--expect", "1", "--timeout", "500ms"],
    )?;
    let run = run.user_error(8);
    assert!(
        run.error_line().contains("found 0 of the 1"),
        "{}",
        run.stderr
    );
    Ok(())
}

/// A DNS server on loopback answering for `origin` from `records` (zone
/// file lines), with the SOA and NS a zone needs added.
async fn dns_server(origin: &str, records: &str) -> Result<SocketAddr> {
    use hickory_proto::rr::{LowerName, Name};
    use hickory_server::ServerFuture;
    use hickory_server::authority::{Catalog, ZoneType};
    use hickory_server::store::in_memory::InMemoryAuthority;

    let zone = format!(
        "$ORIGIN {origin}.\n\
         @ 300 IN SOA ns.{origin}. admin.{origin}. 1 3600 600 86400 300\n\
         @ 300 IN NS ns.{origin}.\n\
         {records}\n"
    );
    let name = Name::from_ascii(format!("{origin}."))?;
    let (name, records) = hickory_proto::serialize::txt::Parser::new(zone, None, Some(name))
        .parse()
        .context("parsing the generated records")?;
    let authority = InMemoryAuthority::new(name.clone(), records, ZoneType::Primary, false)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut catalog = Catalog::new();
    catalog.upsert(LowerName::from(&name), vec![Arc::new(authority)]);
    let mut server = ServerFuture::new(catalog);
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
    let addr = socket.local_addr()?;
    server.register_socket(socket);
    tokio::spawn(async move { server.block_until_done().await });
    Ok(addr)
}

/// `liqoctl`, blocking this runtime thread only (the DNS server runs on
/// the other).
fn liqoctl_here(kubeconfig: Option<&Path>, args: &[&str]) -> Run {
    tokio::task::block_in_place(|| liqoctl(kubeconfig, args))
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_records_generated_from_a_cluster_are_found_by_discover() -> Result<()> {
    let one = One::start(spec("dns", 1, 1)).await?;
    let cluster = one.cluster();
    let kubeconfig = cluster.kubeconfig_path();

    // Not installed yet: nothing to describe.
    liqoctl_here(
        Some(kubeconfig),
        &["generate", "dns-records", "--domain", "example.test"],
    )
    .user_error(7);

    tokio::task::block_in_place(|| {
        liqo_e2e::install(
            cluster,
            "dns-cluster-1",
            "10.201.0.0/16",
            &["--cluster-labels=region=eu-west,tier=gold"],
        )
    })
    .success();

    let generated = liqoctl_here(
        Some(kubeconfig),
        &[
            "generate",
            "dns-records",
            "--domain",
            "example.test",
            "--ttl",
            "60",
        ],
    )
    .success();
    let zone = generated.stdout;
    assert!(
        zone.contains("_liqo._tcp.example.test.\t60\tIN\tPTR\tdns._liqo._tcp.example.test."),
        "{zone}"
    );
    assert!(zone.contains("\"id=dns-cluster-1\""), "{zone}");

    let server = dns_server("example.test", &zone).await?;
    let found = liqoctl_here(
        None,
        &[
            "discover",
            "--domain",
            "example.test",
            "--dns-server",
            &server.to_string(),
            "-o",
            "json",
        ],
    )
    .success();
    let found = clusters(&found)?;
    assert_eq!(found.len(), 1, "{found:?}");
    let c = &found["dns-cluster-1"];
    assert_eq!(c["name"], "dns");
    assert_eq!(c["labels"]["region"], "eu-west");
    assert_eq!(c["labels"]["tier"], "gold");
    // The kubeconfig's server URL, as the installation advertises it.
    let api = c["apiAddress"].as_str().unwrap_or_default();
    assert_eq!(
        api.trim_end_matches('/'),
        cluster.server().trim_end_matches('/')
    );
    assert_eq!(c["foundVia"], serde_json::json!(["dns:example.test"]));
    assert_eq!(c["authenticated"], false);

    // A domain without records: nothing found, exit 0.
    let empty = liqoctl_here(
        None,
        &[
            "discover",
            "--domain",
            "other.example.test",
            "--dns-server",
            &server.to_string(),
        ],
    )
    .success();
    assert!(
        empty.stderr.contains("No clusters found"),
        "{}",
        empty.stderr
    );

    // Nobody answers on that port: one line, exit 4 (unreachable).
    let silent = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let silent_addr = silent.local_addr()?.to_string();
    let run = liqoctl_here(
        None,
        &[
            "discover",
            "--domain",
            "example.test",
            "--dns-server",
            &silent_addr,
            "--timeout",
            "1s",
        ],
    )
    .user_error(4);
    assert!(run.error_line().contains(&silent_addr), "{}", run.stderr);
    drop(silent);

    // Bad input: exit 2, one line each, nothing sent.
    for args in [
        &["discover", "--timeout", "0s"][..],
        &["discover", "--domain", "bad_domain.test"],
        &[
            "discover",
            "--domain",
            "example.test",
            "--dns-server",
            "nowhere",
        ],
        &["discover", "--expect", "0"],
    ] {
        liqoctl_here(None, args).user_error(2);
    }
    liqoctl_here(
        Some(kubeconfig),
        &[
            "generate",
            "dns-records",
            "--domain",
            "example.test",
            "--api-address",
            "http://x",
        ],
    )
    .user_error(2);

    // Install --announce is only planned here (announcing for real would
    // multicast on this machine's networks): the gateway would get the
    // flag, the node's network, and the kubeconfig's server to announce.
    let planned = liqoctl_here(
        Some(kubeconfig),
        &["install", "--announce", "--dry-run", "-o", "json"],
    )
    .success();
    let plan: Value = serde_json::from_str(&planned.stdout)?;
    let gateway = plan["items"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["kind"] == "Deployment"))
        .context("no gateway Deployment")?;
    let pod = &gateway["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    let args = pod["containers"][0]["args"].to_string();
    assert!(args.contains("--announce"), "{args}");
    assert!(args.contains("--advertise-address=https://"), "{args}");
    // Without the flag, the installation's setting (off) is kept.
    let planned = liqoctl_here(Some(kubeconfig), &["install", "--dry-run", "-o", "json"]).success();
    assert!(
        !planned.stdout.contains("\"--announce\""),
        "{}",
        planned.stdout
    );
    Ok(())
}

/// Relays the TCP connections made to `listen` inside `ns` to `to`, out
/// here: the API server of a testbed cluster listens on this namespace's
/// loopback, which a namespace of its own cannot reach. A socket stays in
/// the namespace it was made in, so the listener is made in `ns` and
/// served from here.
fn relay(ns: &NetNs, listen: SocketAddr, to: SocketAddr) -> Result<()> {
    use std::net::{TcpListener, TcpStream};
    let listener = ns
        .within(move || Ok(TcpListener::bind(listen)?))
        .join()
        .map_err(|_| anyhow::anyhow!("the relay's listener panicked"))??;
    std::thread::spawn(move || {
        for inside in listener.incoming() {
            let (Ok(inside), Ok(outside)) = (inside, TcpStream::connect(to)) else {
                continue;
            };
            for (mut from, mut into) in [
                (inside.try_clone(), outside.try_clone()),
                (Ok(outside), Ok(inside)),
            ]
            .into_iter()
            .filter_map(|(a, b)| Some((a.ok()?, b.ok()?)))
            {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut into);
                    let _ = into.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
    Ok(())
}

/// The gateway agent with `--announce`, as `liqoctl install --announce`
/// runs it, but in a network namespace of the test's: it announces the
/// cluster's identity and re-announces it when the identity changes.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_agent_announces_the_identity_and_follows_it() -> Result<()> {
    let one = One::start(spec("lan", 2, 1)).await?;
    let cluster = one.cluster();
    let install = |labels: &str| {
        tokio::task::block_in_place(|| {
            liqo_e2e::install(cluster, "lan-cluster-1", "10.202.0.0/16", &[labels])
        })
        .success();
    };
    install("--cluster-labels=region=eu-west");

    let (a, _, b) = lan("192.168.80")?;
    let server: SocketAddr = cluster
        .server()
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .parse()
        .context("the testbed's API server is an IP address and port")?;
    relay(&a, server, server)?;

    let dir = tempfile::tempdir()?;
    let kubeconfig = cluster.kubeconfig_path().display().to_string();
    let agent = a.spawn_with_env(
        &liqo_e2e::bin_dir().join("liqo-gateway"),
        &[
            "--announce",
            "--advertise-address=https://192.168.80.1:6443",
            "--health-addr=127.0.0.1:0",
        ],
        &[("KUBECONFIG", &kubeconfig), ("RUST_LOG", "info")],
        &dir.path().join("agent.log"),
    )?;

    let liqoctl = liqo_e2e::bin_dir().join("liqoctl");
    // Until the cluster is listed with `labels`, or 30 s.
    let listed_with = |labels: Value| -> Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let run = b.output(
                &liqoctl,
                &["discover", "--expect", "1", "--timeout", "3s", "-o", "json"],
            )?;
            if run.code == 0
                && let Some(c) = clusters(&run)?.remove("lan-cluster-1")
                && c["labels"] == labels
            {
                return Ok(c);
            }
            ensure!(
                Instant::now() < deadline,
                "not listed with {labels} within 30 s: {run:?}\nagent:\n{}",
                agent.log()
            );
        }
    };
    let c = listed_with(serde_json::json!({ "region": "eu-west" }))?;
    assert_eq!(c["name"], "lan");
    assert_eq!(c["apiAddress"], "https://192.168.80.1:6443");

    // New labels: the agent withdraws the old announcement and makes one
    // with them.
    install("--cluster-labels=region=us-east,tier=gold");
    listed_with(serde_json::json!({ "region": "us-east", "tier": "gold" }))?;
    assert!(agent.log().contains("withdrawing"), "{}", agent.log());
    Ok(())
}
