//! The agents' images as `liqoctl install` names them: another registry,
//! tag and pull policy, kept by later runs; an image the nodes cannot pull
//! told in one line, and the same command resuming once it is there.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use liqo_api::names;
use liqo_testbed::{ClusterSpec, Testbed};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_the_nodes_cannot_pull_is_told_and_loading_it_resumes_the_install() -> Result<()> {
    let bin = tempfile::tempdir()?;
    let mut spec = ClusterSpec::new("images", 1);
    spec.nodes = 0;
    spec.agent_bin_dir = Some(bin.path().to_owned());
    spec.host_images = BTreeMap::from([(
        format!("{REGISTRY}/{}", liqo_api::images::GATEWAY),
        LATE_BINARY.to_owned(),
    )]);
    let testbed = Testbed::start(vec![spec]).await?;
    let cluster = &testbed.clusters()[0];
    let client = cluster.client().await?;
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
