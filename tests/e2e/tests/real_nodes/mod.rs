//! The mission on real nodes (the testbed's real-node mode): each cluster's
//! node is a kubelet with containerd, runc and CNI, holding the agents'
//! images built from this build. `liqoctl install` with no image flag runs
//! the gateway and the virtual kubelet as real pods; a peering's offloaded
//! Deployment runs as real containers on the provider's node; a consumer
//! pod reaches it through its Service, and one of its containers reaches a
//! consumer Service back, through the two gateways' WireGuard tunnel;
//! `kubectl logs` and `exec` reach the remote containers; mounted
//! ConfigMaps and Secrets follow their changes; a Job runs to completion;
//! `liqoctl test network` is green; unpeer leaves both clusters as they
//! were before the peering. Once with
//! disjoint pod CIDRs (peered with two kubeconfigs), once with the same
//! (NAT, peered with a token). Needs root, containerd, runc, CNI plugins.
//!
//! With `LIQO_AGENT_IMAGES` naming a folder of the shipped image archives
//! (`cargo run -p liqo-images` writes them; `bash tests/images.sh` runs the
//! mission so), the nodes hold those instead of images made from this
//! build's binaries, and the mission checks that the agents run them.

mod mission;
mod shipped;
mod workloads;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams, PostParams};
use liqo_e2e::fixture::pod::ready;
use liqo_e2e::fixture::{Pair, Stage, WAIT, real_node_spec};
use liqo_e2e::{Run, liqoctl, run, snapshot, wait_for};
use liqo_testbed::{Cluster, ClusterSpec, TOOLBOX_IMAGE, Toolchain};
use serde_json::json;

use mission::Mission;
use shipped::*;
use workloads::*;

const OFFLOADED: &str = "demo";

/// The namespace both clusters have, of the clusterset's Service.
const SHARED: &str = "shared";

fn spec(name: &str, index: u8, pod_cidr: Option<&str>) -> ClusterSpec {
    let mut spec = real_node_spec(name, index);
    spec.agent_images = shipped_images();
    if let Some(cidr) = pod_cidr {
        spec.pod_cidr = cidr.to_owned();
    }
    spec
}

/// Two real-node clusters, `home` and `foreign`, with these pod CIDRs.
async fn home_and_foreign(home: &str, foreign: &str) -> Result<Pair> {
    let (home, foreign) = (
        spec("home", 1, Some(home)),
        spec("foreign", 2, Some(foreign)),
    );
    Pair::with_specs(home, foreign, Stage::Started).await
}

fn path(p: &Path) -> Result<&str> {
    p.to_str().context("a UTF-8 path")
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mission_runs_on_real_nodes_with_disjoint_pod_cidrs() -> Result<()> {
    let pair = home_and_foreign("10.201.0.0/16", "10.202.0.0/16").await?;
    let (home, foreign) = (pair.consumer(), pair.provider());
    // Another program of the foreign node holds the one port its tunnels
    // may use (the gateway pod is on the node's network): the first peer
    // is refused in one line and undone, and goes through once it is free.
    let squatter = udp_socket_in(foreign.node_netns().context("the node's netns")?)?;
    let port = squatter.local_addr()?.port();
    let mission = Mission {
        home,
        foreign,
        foreign_install: vec![format!("--tunnel-ports={port}-{port}")],
    };
    mission
        .run(|| {
            let remote = path(foreign.kubeconfig_path())?;
            let peer = || {
                liqoctl(
                    Some(home.kubeconfig_path()),
                    &["peer", "--remote-kubeconfig", remote, "--timeout=120"],
                )
            };
            let refused = peer().user_error(6);
            let line = refused.error_line();
            for part in [
                "the gateway of cluster foreign cannot run the tunnel: ",
                &format!(":{port}"),
                "in use",
                "run the same command again",
            ] {
                ensure!(line.contains(part), "{part:?} not in: {line}");
            }
            // Undone on both sides.
            for (cluster, kind) in [(home, "foreignclusters"), (foreign, "tenants")] {
                let left = kubectl(cluster, &["get", kind, "-o", "name"])?.success();
                ensure!(
                    left.stdout.trim().is_empty(),
                    "{kind} left: {}",
                    left.stdout
                );
            }
            drop(squatter);
            peer().success();
            Ok(())
        })
        .await
}

/// A UDP socket bound to a free port in the network namespace `netns`
/// (by name, as `ip netns` knows it).
fn udp_socket_in(netns: &str) -> Result<std::net::UdpSocket> {
    let path = Path::new("/run/netns").join(netns);
    std::thread::spawn(move || -> Result<std::net::UdpSocket> {
        let ns =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
        Ok(std::net::UdpSocket::bind("0.0.0.0:0")?)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the thread binding the socket panicked"))?
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mission_runs_on_real_nodes_with_identical_pod_cidrs_through_nat() -> Result<()> {
    let pair = home_and_foreign("10.200.0.0/16", "10.200.0.0/16").await?;
    let (home, foreign) = (pair.consumer(), pair.provider());
    let mission = Mission {
        home,
        foreign,
        foreign_install: Vec::new(),
    };
    mission
        .run(|| {
            let token = liqoctl(
                Some(foreign.kubeconfig_path()),
                &["generate", "peering-token"],
            )
            .success();
            let dir = tempfile::tempdir()?;
            let file = dir.path().join("token");
            std::fs::write(&file, token.stdout.trim())?;
            liqoctl(
                Some(home.kubeconfig_path()),
                &["peer", "--token-file", path(&file)?],
            )
            .success();
            Ok(())
        })
        .await
}

/// On real nodes, what a node cannot give the agents is told in one line
/// with what to do: a node without `/dev/net/tun` (the other cluster's
/// node has it, and installs), and an image no node has; the same command
/// resumes once the image is loaded.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_real_nodes_a_missing_tun_device_or_image_is_told_in_one_line() -> Result<()> {
    let mut no_tun = spec("no-tun", 1, None);
    no_tun.real_node_without_tun = true;
    let pair = Pair::with_specs(no_tun, spec("plain", 2, None), Stage::Started).await?;
    let (no_tun, plain) = (pair.consumer(), pair.provider());

    let refused =
        liqoctl(Some(no_tun.kubeconfig_path()), &["install", "--timeout=90"]).user_error(7);
    let line = refused.error_line();
    assert!(
        line.contains("node no-tun-node has no /dev/net/tun") && line.contains("modprobe tun"),
        "{line}"
    );

    let missing = format!(
        "{}/liqo-gateway:0.0.0-missing",
        liqo_api::images::DEFAULT_REGISTRY
    );
    let refused = liqoctl(
        Some(plain.kubeconfig_path()),
        &["install", "--image-tag=0.0.0-missing", "--timeout=90"],
    )
    .user_error(7);
    let line = refused.error_line();
    assert!(
        line.contains(&format!(
            "the image {missing} cannot be pulled on node plain-node"
        )),
        "{line}"
    );
    // The image loaded, the same command resumes.
    let registry = liqo_api::images::DEFAULT_REGISTRY;
    for image in ["liqo-gateway", "liqo-virtual-kubelet"] {
        plain.tag_node_image(
            &format!("{registry}/{image}:{}", liqo_api::VERSION),
            &format!("{registry}/{image}:0.0.0-missing"),
        )?;
    }
    liqoctl(
        Some(plain.kubeconfig_path()),
        &["install", "--image-tag=0.0.0-missing", "--timeout=90"],
    )
    .success();
    let pods = kubectl(plain, &["-n", "liqo", "get", "pods"])?.success();
    ensure!(
        pods.stdout
            .lines()
            .filter(|l| l.contains(" Running "))
            .count()
            == 1
            && !pods.stdout.contains("ImagePull"),
        "after the resumed install: {}",
        pods.stdout
    );
    Ok(())
}
