//! The shipped images on real nodes: which image an agent's container runs.

use super::*;

/// The folder of the shipped image archives the nodes hold, if the mission
/// runs with them.
pub(super) fn shipped_images() -> Option<PathBuf> {
    std::env::var_os("LIQO_AGENT_IMAGES").map(PathBuf::from)
}

/// Checks that the container of pod `pod` (a JSON object) runs the shipped
/// image of `program`, when the mission runs with the shipped images.
pub(super) fn runs_the_shipped_image(pod: &serde_json::Value, program: &str) -> Result<()> {
    let Some(folder) = shipped_images() else {
        return Ok(());
    };
    let archive = folder.join(format!("{program}-{}.oci.tar", liqo_api::VERSION));
    let digest = crate::images::archive_image_id(&archive)?;
    let image_id = pod["status"]["containerStatuses"][0]["imageID"]
        .as_str()
        .unwrap_or_default();
    ensure!(
        image_id.ends_with(&digest),
        "{program} runs {image_id:?}, not the shipped image {digest}"
    );
    Ok(())
}

/// The pod of namespace `liqo` of `cluster` whose name starts with
/// `prefix`, as kubectl prints it in JSON.
pub(super) fn liqo_pod(cluster: &Cluster, prefix: &str) -> Result<serde_json::Value> {
    let listed = kubectl(cluster, &["-n", "liqo", "get", "pods", "-o", "json"])?.success();
    let pods: serde_json::Value = serde_json::from_str(&listed.stdout)?;
    pods["items"]
        .as_array()
        .and_then(|a| {
            a.iter().find(|p| {
                p["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(prefix))
            })
        })
        .cloned()
        .with_context(|| format!("no pod {prefix}… in namespace liqo"))
}
