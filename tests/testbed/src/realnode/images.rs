//! The images a real node holds, built here (no registry is reachable):
//! the pause image, the tests' toolbox, CoreDNS's, local-path-provisioner's
//! and the busybox its pods run, and the agents' images made from the agent
//! folder's binaries under the names `liqoctl install` uses by default, so
//! that an install needs no image flag, as on a cluster where the archives
//! were loaded.

use std::path::{Path, PathBuf};
use std::process::Command;

use liqo_images::contents::{self, Program};
use liqo_images::oci;

use super::AddOns;
use super::config::{PAUSE_IMAGE, TOOLBOX_IMAGE};
use crate::Error;

/// The programs of the toolbox: busybox with all its applets, curl, and
/// iperf3 when the machine has it (the throughput benchmark's).
const BUSYBOX: &str = "/bin/busybox";
const CURL: &str = "/usr/bin/curl";
const IPERF3: &str = "/usr/bin/iperf3";
/// The MCS conformance suite's tools, and its images' names (as
/// containerd normalizes them: Docker Hub's).
const SOCAT: &str = "/usr/bin/socat";
const NSLOOKUP: &str = "/usr/bin/nslookup";
const NC: &str = "/usr/bin/nc.openbsd";
const SOCAT_IMAGE: &str = "docker.io/alpine/socat:1.7.4.4";
const NETSHOOT_IMAGE: &str = "docker.io/nicolaka/netshoot:v0.15";

/// Writes the node's image archives into `dir` and returns their paths:
/// pause, toolbox, the cluster's add-ons (from the toolchain's binaries),
/// and, with `agent_bin_dir`, the agents of that folder that were built.
pub(crate) fn write_all(
    dir: &Path,
    agent_bin_dir: Option<&Path>,
    add_ons: &AddOns,
) -> Result<Vec<PathBuf>, Error> {
    std::fs::create_dir_all(dir).map_err(crate::io_error(dir))?;
    let failed = |what: &str, e: &dyn std::fmt::Display| Error::Spec(format!("{what}: {e}"));
    let applets = applets()?;
    let busybox = Path::new(BUSYBOX);
    let mut toolbox = vec![busybox, Path::new(CURL)];
    if Path::new(IPERF3).exists() {
        toolbox.push(Path::new(IPERF3));
    }
    let mut images: Vec<oci::Image> = vec![
        contents::tools_image(
            PAUSE_IMAGE,
            &[busybox],
            &[],
            &[BUSYBOX, "sleep", "2147483647"],
        )
        .map_err(|e| failed("the pause image", &e))?,
        contents::tools_image(
            TOOLBOX_IMAGE,
            &toolbox,
            &[(busybox, applets.clone())],
            &["/bin/sh"],
        )
        .map_err(|e| failed("the toolbox image", &e))?,
        coredns_image(&add_ons.coredns).map_err(|e| failed("CoreDNS's image", &e))?,
        provisioner_image(&add_ons.local_path_provisioner)
            .map_err(|e| failed("local-path-provisioner's image", &e))?,
        // The image of the provisioner's pods that make and remove a
        // volume's folder: the applets their scripts call (`sh`, `mkdir`,
        // `rm`), with no entrypoint, as the pods name their command.
        contents::tools_image(
            crate::storage::BUSYBOX_IMAGE,
            &[busybox],
            &[(busybox, applets.clone())],
            &[],
        )
        .map_err(|e| failed("the local-path provisioner's busybox", &e))?,
    ];
    images.extend(conformance_images(&applets).map_err(|e| failed("the MCS suite's images", &e))?);
    for (program, binary) in agent_bin_dir
        .into_iter()
        .flat_map(|dir| Program::ALL.map(|p| (p, dir.join(p.name()))))
    {
        if !binary.exists() {
            continue;
        }
        images.push(
            contents::local_image(
                program,
                &binary,
                liqo_api::images::DEFAULT_REGISTRY,
                liqo_api::VERSION,
            )
            .map_err(|e| failed(program.name(), &e))?,
        );
    }
    let mut paths = Vec::new();
    for image in images {
        let archive = oci::pack(&image).map_err(|e| failed(&image.reference, &e))?;
        let name = image.reference.replace(['/', ':'], "_");
        let path = dir.join(format!("{name}.oci.tar"));
        std::fs::write(&path, &archive.bytes).map_err(crate::io_error(&path))?;
        paths.push(path);
    }
    Ok(paths)
}

/// The image archives of `folder` (`*.oci.tar`, as `liqo-images` writes
/// them), sorted; an error if there is none.
pub(crate) fn shipped(folder: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut archives: Vec<PathBuf> = std::fs::read_dir(folder)
        .map_err(crate::io_error(folder))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.to_string_lossy().ends_with(".oci.tar"))
        .collect();
    archives.sort();
    if archives.is_empty() {
        return Err(Error::Spec(format!(
            "{} holds no image archive (*.oci.tar); build them with `cargo run -p liqo-images`",
            folder.display()
        )));
    }
    Ok(archives)
}

/// CoreDNS's image: its static binary at `/coredns`, run as CoreDNS's
/// own image runs it (`/coredns -conf <Corefile>`, the Deployment's args).
fn coredns_image(binary: &Path) -> Result<oci::Image, contents::Error> {
    let mut image =
        contents::tools_image(crate::dns::COREDNS_IMAGE, &[binary], &[], &["/coredns"])?;
    if let Some(file) = image.files.remove(&binary.display().to_string()) {
        image.files.insert("/coredns".to_owned(), file);
    }
    Ok(image)
}

/// local-path-provisioner's image: its static binary where upstream's
/// image has it, `/usr/bin/local-path-provisioner`, on the `PATH` the
/// Deployment's command relies on.
fn provisioner_image(binary: &Path) -> Result<oci::Image, contents::Error> {
    const AT: &str = "/usr/bin/local-path-provisioner";
    let mut image =
        contents::tools_image(crate::storage::PROVISIONER_IMAGE, &[binary], &[], &[AT])?;
    if let Some(file) = image.files.remove(&binary.display().to_string()) {
        image.files.insert(AT.to_owned(), file);
    }
    Ok(image)
}

/// The images the Multi-Cluster Services conformance suite runs, under
/// the names it gives them, with the tools it calls: `alpine/socat`
/// (a shell and socat) and `nicolaka/netshoot` (a shell, `nslookup` and
/// `nc` with `-4`/`-6`), from Debian's socat, bind9-dnsutils and
/// netcat-openbsd, with busybox for the shell and the text tools. None
/// when the machine lacks those packages (tests/setup.sh installs them).
fn conformance_images(applets: &[String]) -> Result<Vec<oci::Image>, contents::Error> {
    let programs = [SOCAT, NSLOOKUP, NC];
    if programs.iter().any(|p| !Path::new(p).exists()) {
        return Ok(Vec::new());
    }
    let busybox = Path::new(BUSYBOX);
    // Busybox's own nslookup and nc stand aside for Debian's.
    let shell_tools: Vec<String> = applets
        .iter()
        .filter(|a| !["nslookup", "nc"].contains(&a.as_str()))
        .cloned()
        .collect();
    Ok(vec![
        contents::tools_image(
            SOCAT_IMAGE,
            &[busybox, Path::new(SOCAT)],
            &[(busybox, shell_tools.clone())],
            &["/bin/sh"],
        )?,
        contents::tools_image(
            NETSHOOT_IMAGE,
            &[busybox, Path::new(NSLOOKUP), Path::new(NC)],
            &[
                (busybox, shell_tools),
                (Path::new(NC), vec!["nc".to_owned()]),
            ],
            // No entrypoint, as the image it stands for: a pod's args are
            // its command.
            &[],
        )?,
    ])
}

/// The names busybox answers to, but `busybox` itself.
fn applets() -> Result<Vec<String>, Error> {
    let out = Command::new(BUSYBOX)
        .arg("--list")
        .output()
        .map_err(crate::io_error(Path::new(BUSYBOX)))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .filter(|a| a != "busybox")
        .collect())
}
