//! The agents' images as `liqoctl install` names them: another registry,
//! tag and pull policy, kept by later runs; an image the nodes cannot pull
//! told in one line, and the same command resuming once it is there. And
//! the images themselves, imported into a real containerd and run by runc
//! (`bash tests/images.sh`, which builds them first).

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use liqo_api::names;
use liqo_e2e::fixture::{One, spec};

/// The registry the test names the images under; its gateway image stands
/// for a binary that is not there until the test "loads" it.
const REGISTRY: &str = "registry.local:5000/liqo";
const LATE_BINARY: &str = "gateway-loaded-late";

/// The gateway container's image and pull policy.
async fn gateway_image(client: &kube::Client) -> Result<(String, String)> {
    let deployment = Api::<Deployment>::namespaced(client.clone(), names::NAMESPACE)
        .get(names::GATEWAY)
        .await?;
    let container = deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|p| p.containers.into_iter().find(|c| c.name == "gateway"))
        .context("no gateway container")?;
    Ok((
        container.image.unwrap_or_default(),
        container.image_pull_policy.unwrap_or_default(),
    ))
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_the_nodes_cannot_pull_is_told_and_loading_it_resumes_the_install() -> Result<()> {
    let bin = tempfile::tempdir()?;
    let mut spec = spec("images", 1, 0);
    spec.agent_bin_dir = Some(bin.path().to_owned());
    spec.host_images = BTreeMap::from([(
        format!("{REGISTRY}/{}", liqo_api::images::GATEWAY),
        LATE_BINARY.to_owned(),
    )]);
    let one = One::start(spec).await?;
    let (cluster, client) = (one.cluster(), one.client.clone());
    let install = |extra: &[&str]| liqo_e2e::install(cluster, "images-1", "10.210.0.0/16", extra);
    let registry = format!("--image-registry={REGISTRY}/");
    let flags = [registry.as_str(), "--image-tag=0.1.0"];

    // Bad values are refused before the cluster is touched.
    for bad in [
        "--image-registry=Registry.Local/Team",
        "--image-registry=host:port/x",
        "--image-tag=.hidden",
        "--image-pull-policy=Sometimes",
    ] {
        let refused = install(&[bad]).user_error(2);
        let line = refused.error_line();
        let flag = bad.split('=').next().unwrap_or_default();
        ensure!(line.starts_with(&format!("error: {flag}: ")), "{line}");
    }
    ensure!(
        Api::<Deployment>::namespaced(client.clone(), names::NAMESPACE)
            .get_opt(names::GATEWAY)
            .await?
            .is_none(),
        "a refused flag applied nothing"
    );

    // The node has no such image: one line names it, the node, the
    // archive to load and the command to run again; no waiting it out.
    let refused = install(&flags).user_error(7);
    let line = refused.error_line();
    for part in [
        "the image registry.local:5000/liqo/liqo-gateway:0.1.0 cannot be pulled on node images-host (",
        "target/images/liqo-gateway-0.1.0.oci.tar",
        "then run `liqoctl install` again",
    ] {
        ensure!(line.contains(part), "{part:?} not in: {line}");
    }
    ensure!(!line.contains("not ready after"), "{line}");

    // Loaded: the node's next pull finds it, and the same command ends the
    // installation.
    std::os::unix::fs::symlink(
        liqo_e2e::bin_dir().join(liqo_api::images::GATEWAY),
        bin.path().join(LATE_BINARY),
    )?;
    install(&flags).success();
    assert_eq!(
        gateway_image(&client).await?,
        (
            "registry.local:5000/liqo/liqo-gateway:0.1.0".to_owned(),
            "IfNotPresent".to_owned()
        )
    );

    // A run without the flags keeps them; the pull policy alone changes.
    install(&["--image-pull-policy=never"]).success();
    assert_eq!(
        gateway_image(&client).await?,
        (
            "registry.local:5000/liqo/liqo-gateway:0.1.0".to_owned(),
            "Never".to_owned()
        )
    );
    Ok(())
}

/// The digest `index.json` of the OCI archive at `path` names its image by.
fn archive_digest(path: &std::path::Path) -> Result<String> {
    let file = std::fs::File::open(path).with_context(|| {
        format!(
            "{} is missing: `bash tests/images.sh` builds it",
            path.display()
        )
    })?;
    let mut archive = tar::Archive::new(file);
    for entry in archive.entries()? {
        let entry = entry?;
        if entry.path()?.as_os_str() == "index.json" {
            let index: serde_json::Value = serde_json::from_reader(entry)?;
            return index["manifests"][0]["digest"]
                .as_str()
                .map(str::to_owned)
                .context("no manifest in index.json");
        }
    }
    anyhow::bail!("{} has no index.json", path.display())
}

/// The digest of the configuration of the image in the OCI archive at
/// `path`: the image ID a container runtime reports for a container of it
/// (`imageID` in a pod's status, where no registry digest is known).
pub(crate) fn archive_image_id(path: &std::path::Path) -> Result<String> {
    let manifest = archive_digest(path)?;
    let blob = format!("blobs/{}", manifest.replacen(':', "/", 1));
    let mut archive = tar::Archive::new(std::fs::File::open(path)?);
    for entry in archive.entries()? {
        let entry = entry?;
        if entry.path()?.as_os_str() == blob.as_str() {
            let manifest: serde_json::Value = serde_json::from_reader(entry)?;
            return manifest["config"]["digest"]
                .as_str()
                .map(str::to_owned)
                .context("no config in the manifest");
        }
    }
    anyhow::bail!("{} has no manifest {manifest}", path.display())
}

/// Needs the archives of a release build (about half an hour of the
/// test command's two cores): `bash tests/images.sh` builds them and runs it.
#[test]
#[ignore = "needs the images built: bash tests/images.sh"]
fn the_images_import_into_containerd_and_run_under_runc() -> Result<()> {
    use liqo_api::images::{GATEWAY, LIQOCTL, VIRTUAL_KUBELET, archive_name};
    let images = liqo_e2e::bin_dir()
        .parent()
        .context("no target folder")?
        .join("images");
    let dir = tempfile::tempdir()?;
    let containerd = liqo_testbed::Containerd::start(dir.path())?;
    let reference = |name: &str| format!("ghcr.io/liqo-rs/{name}:{}", liqo_api::VERSION);
    for name in [GATEWAY, VIRTUAL_KUBELET, LIQOCTL] {
        let archive = images.join(archive_name(name, liqo_api::VERSION));
        let digest = archive_digest(&archive)?;
        containerd.import(&archive)?;
        // Named as install names it, by the digest the archive gives.
        let listed = containerd.images()?;
        ensure!(
            listed
                .iter()
                .any(|i| i.reference == reference(name) && i.digest == digest),
            "{name} {digest} not in {listed:?}"
        );
    }

    let run = |image: &str, id: &str, args: &[&str]| -> Result<String> {
        let out = containerd.run(&reference(image), id, args)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let version = run(LIQOCTL, "liqoctl", &["/usr/local/bin/liqoctl", "--version"])?;
    ensure!(version.contains(liqo_api::VERSION), "{version}");
    for (image, program) in [
        (GATEWAY, "/usr/local/bin/liqo-gateway"),
        (VIRTUAL_KUBELET, "/usr/local/bin/liqo-virtual-kubelet"),
    ] {
        let said = run(image, image, &[program, "--version"])?;
        ensure!(said.contains(liqo_api::VERSION), "{program}: {said}");
    }
    // The gateway's tools run in its container; nothing else is there.
    let nft = run(GATEWAY, "nft", &["/usr/sbin/nft", "--version"])?;
    ensure!(nft.starts_with("nftables"), "{nft}");
    let ip = run(GATEWAY, "ip", &["/usr/sbin/ip", "-V"])?;
    ensure!(ip.contains("iproute2"), "{ip}");
    let shell = containerd.run(&reference(GATEWAY), "shell", &["/bin/sh", "-c", "true"]);
    ensure!(shell.is_err(), "a shell ran in the gateway's image");
    Ok(())
}
