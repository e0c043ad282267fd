//! The `liqo-testbed` command as people and the demo use it: `up` returns
//! usable clusters, a supervisor killed outright takes its clusters with it,
//! and the next `up` in the same folder starts afresh.

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

#[tokio::test]
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
