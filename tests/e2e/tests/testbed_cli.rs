//! The `liqo-testbed` command as people and the demo use it: `up` returns
//! usable clusters, `apiserver` stops, starts, pauses and resumes one's API
//! server, a supervisor killed outright takes its clusters with it, the
//! next `up` in the same folder starts afresh, and no command deletes a
//! folder that a testbed did not make; a real node's daemons, shims and
//! containers die with a killed supervisor, and `down` removes the rest.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use liqo_e2e::{bin_dir, process_running, run, wait_for};

fn testbed(args: &[&str]) -> liqo_e2e::Run {
    run(Command::new(bin_dir().join("liqo-testbed")).args(args))
}

fn state(dir: &std::path::Path) -> Result<serde_json::Value> {
    Ok(serde_json::from_str(&std::fs::read_to_string(
        dir.join("state.json"),
    )?)?)
}

fn pids(state: &serde_json::Value) -> Vec<u32> {
    state["clusters"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["processes"].as_array().into_iter().flatten())
        .filter_map(|p| p["pid"].as_u64().and_then(|p| u32::try_from(p).ok()))
        .collect()
}

#[liqo_e2e::test]
async fn a_killed_supervisor_takes_its_clusters_along_and_up_starts_afresh() -> Result<()> {
    let root = std::env::temp_dir().join(format!("liqo-testbed-cli-{}", std::process::id()));
    let dir = root.join("tb");
    let dir_arg = dir.to_str().context("temp path is UTF-8")?;

    let up = testbed(&["up", "--dir", dir_arg, "--cluster", "one", "--nodes", "1"]).success();
    assert!(up.stdout.contains("kubectl --kubeconfig"), "{}", up.stdout);
    testbed(&["up", "--dir", dir_arg, "--cluster", "one"]).user_error(1);

    let first = state(&dir)?;
    let supervisor = first["supervisor_pid"].as_u64().context("supervisor pid")? as u32;
    let children = pids(&first);
    assert_eq!(children.len(), 5, "{first}");
    let cidr = testbed(&["get", "--dir", dir_arg, "one", "pod-cidr"]).success();
    assert_eq!(
        cidr.stdout.trim(),
        first["clusters"][0]["pod_cidr"].as_str().unwrap_or("?")
    );
    testbed(&["get", "--dir", dir_arg, "two", "server"]).user_error(1);
    let status = testbed(&["status", "--dir", dir_arg]).success();
    assert!(status.stdout.contains("MiB"), "{}", status.stdout);

    // A crash: SIGKILL gives the supervisor no chance to clean up.
    run(Command::new("kill").args(["-9", &supervisor.to_string()])).success();
    wait_for(
        "the cluster processes to die with the supervisor",
        Duration::from_secs(10),
        || {
            let children = children.clone();
            async move { Ok(!children.iter().any(|&pid| process_running(pid))) }
        },
    )
    .await?;

    // The next run in the same folder is not wedged by the leftovers.
    testbed(&["up", "--dir", dir_arg, "--cluster", "one", "--nodes", "1"]).success();
    let second = state(&dir)?;
    let kubeconfig = second["clusters"][0]["kubeconfig"]
        .as_str()
        .context("kubeconfig")?;
    let client = liqo_testbed::client_from_kubeconfig(std::path::Path::new(kubeconfig)).await?;
    client.apiserver_version().await?;

    apiserver_commands_act_through_the_supervisor(&dir, &client).await?;
    let second = state(&dir)?;

    // A paused API server does not hold up `down`.
    testbed(&["apiserver", "pause", "one", "--dir", dir_arg]).success();
    let down = testbed(&["down", "--dir", dir_arg]).success();
    assert!(down.stdout.contains("stopped"), "{}", down.stdout);
    assert!(
        !pids(&second).iter().any(|&pid| process_running(pid)),
        "processes outlived down"
    );
    assert!(!dir.exists(), "down removes the folder");
    testbed(&["status", "--dir", dir_arg]).user_error(1);
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

/// What a test of agents across API trouble does from a shell: the API
/// server of cluster `one` stops (its port refuses), starts on the same
/// URL (the client made before works), pauses (requests hang) and resumes,
/// and the supervisor counts none of it as a crash.
async fn apiserver_commands_act_through_the_supervisor(
    dir: &Path,
    client: &kube::Client,
) -> Result<()> {
    let dir_arg = dir.to_str().context("temp path is UTF-8")?;
    let api = |action: &str| testbed(&["apiserver", action, "one", "--dir", dir_arg]);
    let server = state(dir)?["clusters"][0]["server"]
        .as_str()
        .context("server")?
        .to_owned();
    let addr = server.trim_start_matches("https://");

    let stopped = api("stop").success();
    assert_eq!(stopped.stdout.trim(), "kube-apiserver of one: stopped");
    match std::net::TcpStream::connect(addr) {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}"),
        Ok(_) => anyhow::bail!("{addr} accepts connections with its API server stopped"),
    }
    assert_eq!(state(dir)?["clusters"][0]["apiserver"], "stopped");
    let status = testbed(&["status", "--dir", dir_arg]).success();
    assert!(
        status.stdout.contains("kube-apiserver stopped"),
        "{}",
        status.stdout
    );
    // Longer than the supervisor's 2 s watch: it must not log a crash.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = std::fs::read_to_string(dir.join("testbed.log"))?;
    assert!(
        !log.contains("exited"),
        "the supervisor saw a crash:\n{log}"
    );
    api("pause").user_error(1);

    let started = api("start").success();
    assert_eq!(started.stdout.trim(), "kube-apiserver of one: running");
    assert_eq!(state(dir)?["clusters"][0]["server"], server.as_str());
    client.apiserver_version().await?;

    api("pause").success();
    let hung = tokio::time::timeout(Duration::from_secs(3), client.apiserver_version()).await;
    assert!(hung.is_err(), "a paused API server answered: {hung:?}");
    api("start").user_error(1);
    api("resume").success();
    client.apiserver_version().await?;

    api("restart").success();
    client.apiserver_version().await?;
    let unknown = testbed(&["apiserver", "stop", "two", "--dir", dir_arg]).user_error(1);
    assert!(unknown.error_line().contains("two"), "{}", unknown.stderr);
    Ok(())
}

/// A folder with a file of a user's in it, in a fresh temporary folder.
fn users_folder(name: &str) -> Result<(tempfile::TempDir, PathBuf)> {
    let root = tempfile::Builder::new().prefix(name).tempdir()?;
    let dir = root.path().join("work");
    std::fs::create_dir(&dir)?;
    std::fs::write(dir.join("notes.txt"), "the user's")?;
    Ok((root, dir))
}

fn assert_untouched(dir: &Path) {
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt"))
            .ok()
            .as_deref(),
        Some("the user's"),
        "the user's file in {} is gone",
        dir.display()
    );
    let entries: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert_eq!(entries, ["notes.txt"], "{} was changed", dir.display());
}

#[test]
fn up_refuses_a_folder_it_did_not_make() -> Result<()> {
    let (_root, dir) = users_folder("liqo-testbed-users-up")?;
    let dir_arg = dir.to_str().context("temp path is UTF-8")?;
    let up = testbed(&["up", "--dir", dir_arg, "--cluster", "one"]).user_error(1);
    assert_eq!(
        up.error_line(),
        format!(
            "error: {dir_arg} exists and was not made by liqo-testbed; choose another --dir or remove it"
        )
    );
    assert_untouched(&dir);
    // `run`, what `up` starts, refuses it too.
    testbed(&["run", "--dir", dir_arg, "--cluster", "one"]).user_error(1);
    assert_untouched(&dir);
    Ok(())
}

#[test]
fn down_deletes_nothing_in_a_folder_it_did_not_make() -> Result<()> {
    let (_root, dir) = users_folder("liqo-testbed-users-down")?;
    let dir_arg = dir.to_str().context("temp path is UTF-8")?;
    let down = testbed(&["down", "--dir", dir_arg]).user_error(1);
    assert_eq!(
        down.error_line(),
        format!(
            "error: {dir_arg} exists and was not made by liqo-testbed; choose another --dir or remove it"
        )
    );
    assert_untouched(&dir);
    testbed(&["down", "--keep", "--dir", dir_arg]).user_error(1);
    assert_untouched(&dir);
    Ok(())
}

#[test]
fn down_in_the_working_tree_deletes_nothing() -> Result<()> {
    // First in a copy of a working tree's shape, so that a regression
    // wipes a temporary folder rather than the repository...
    let (_root, tree) = users_folder("liqo-testbed-tree")?;
    let down = run(Command::new(bin_dir().join("liqo-testbed"))
        .args(["down", "--dir", "."])
        .current_dir(&tree))
    .user_error(1);
    assert_eq!(
        down.error_line(),
        "error: . exists and was not made by liqo-testbed; choose another --dir or remove it"
    );
    assert_untouched(&tree);

    // ...then in the real one.
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let before: Vec<_> = std::fs::read_dir(&workspace)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    run(Command::new(bin_dir().join("liqo-testbed"))
        .args(["down", "--dir", "."])
        .current_dir(&workspace))
    .user_error(1);
    let after: Vec<_> = std::fs::read_dir(&workspace)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert_eq!(before, after, "down --dir . changed the working tree");
    assert!(workspace.join("Cargo.toml").is_file());
    Ok(())
}

/// Processes whose command line (arguments joined by spaces) mentions `text`.
fn processes_mentioning(text: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(text)
            })
        })
        .filter(|&pid| process_running(pid))
        .collect()
}

/// Mounts under `dir` in any process's mount namespace.
fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = std::collections::BTreeSet::new();
    for pid in entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        if let Ok(info) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) {
            for point in info.lines().filter_map(|l| l.split_whitespace().nth(4)) {
                if point.starts_with(&dir) {
                    found.insert(point.to_owned());
                }
            }
        }
    }
    found.into_iter().collect()
}

#[liqo_e2e::test]
async fn a_killed_supervisor_takes_its_real_node_and_containers_along() -> Result<()> {
    let root = std::env::temp_dir().join(format!("liqo-testbed-real-{}", std::process::id()));
    let dir = root.join("tb");
    let dir_arg = dir.to_str().context("temp path is UTF-8")?;
    testbed(&[
        "up",
        "--dir",
        dir_arg,
        "--cluster",
        "one",
        "--nodes",
        "0",
        "--real-node",
    ])
    .success();
    let supervisor = state(&dir)?["supervisor_pid"]
        .as_u64()
        .context("supervisor pid")? as u32;
    let kubeconfig = dir.join("one/kubeconfig");
    let kubectl = liqo_testbed::Toolchain::locate()?.binary("kubectl");
    // A container that would run for a day.
    run(Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "run",
            "sleeper",
            "--image",
            liqo_testbed::TOOLBOX_IMAGE,
            "--command",
            "--",
            "sleep",
            "86399",
        ]))
    .success();
    run(Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "wait",
            "--for=condition=Ready",
            "pod/sleeper",
            "--timeout=60s",
        ]))
    .success();
    let node_dir = dir.join("one/node").display().to_string();
    let shims = processes_mentioning(&format!("{node_dir}/containerd.sock"));
    let containers = processes_mentioning("sleep 86399");
    let daemons = processes_mentioning(&node_dir);
    assert!(!shims.is_empty(), "no containerd shim runs for the node");
    assert!(!containers.is_empty(), "the container does not run");
    assert!(!mounts_under(&dir).is_empty(), "the node mounted nothing");
    assert!(
        !liqo_testbed::cgroups_of(supervisor).is_empty(),
        "the node made no cgroup"
    );

    run(Command::new("kill").args(["-9", &supervisor.to_string()])).success();
    let all: Vec<u32> = shims
        .iter()
        .chain(&containers)
        .chain(&daemons)
        .copied()
        .collect();
    wait_for(
        "the node's daemons, shims and containers to die with the supervisor",
        Duration::from_secs(20),
        || {
            let all = all.clone();
            async move { Ok(!all.iter().any(|&pid| process_running(pid))) }
        },
    )
    .await?;
    let mounts = mounts_under(&dir);
    assert!(
        mounts.is_empty(),
        "mounts outlived the supervisor: {mounts:?}"
    );

    // What only a living process could remove is removed by `down`.
    testbed(&["down", "--dir", dir_arg]).success();
    let cgroups = liqo_testbed::cgroups_of(supervisor);
    assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}");
    let prefix = format!("lqtb-{supervisor}-");
    let namespaces: Vec<String> = std::fs::read_dir("/run/netns")?
        .filter_map(|e| e.ok()?.file_name().to_str().map(str::to_owned))
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(namespaces.is_empty(), "namespaces left: {namespaces:?}");
    assert!(!dir.exists(), "down removes the folder");
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}
