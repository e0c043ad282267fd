//! Waiting for one of our agents' Deployments to be ready, and telling at
//! once when its pods cannot start because their nodes cannot pull the
//! image, or lack a device the pod mounts (the gateway's `/dev/net/tun`):
//! waiting longer would not help, loading the image or the module would.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use liqo_api::names;

use crate::factory::ClusterClient;
use crate::kube::wait::{self, Waited};

/// How the wait for an agent ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    TimedOut,
    /// A pod's node cannot pull the image.
    CannotPull(PullFailure),
    /// A pod's node has not got a host path the pod mounts.
    CannotMount(MountFailure),
}

/// A host path a node could not give a pod, as the kubelet's event says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountFailure {
    pub node: Option<String>,
    /// The kubelet's message (`MountVolume.SetUp failed for volume …`).
    pub message: String,
}

impl MountFailure {
    /// One line for the user: what the node lacks, and what to do.
    pub fn advice(&self, again: &str) -> String {
        let node = self.node.as_deref().unwrap_or("the node");
        if self.message.contains(names::TUN_DEVICE) {
            format!(
                "node {node} has no {tun}, which the gateway's tunnel needs: load the tun module \
                 there (modprobe tun) or run the gateway on another node (--node-selector), then \
                 run {again} again",
                tun = names::TUN_DEVICE
            )
        } else {
            format!(
                "node {node} cannot give the pod a folder or device it mounts ({}); fix the node \
                 or choose another (--node-selector), then run {again} again",
                self.message
            )
        }
    }
}

/// What the kubelet says of a host path that is not what the pod asks
/// for (missing, or of another type).
const HOST_PATH_FAILURE: &str = "hostPath type check failed";

/// An image a node could not pull, as the pod's container status says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullFailure {
    pub image: String,
    /// `ErrImagePull`, `ImagePullBackOff`, `ErrImageNeverPull` or
    /// `InvalidImageName`.
    pub reason: String,
    pub node: Option<String>,
}

impl PullFailure {
    /// One line for the user: what failed, where, and what to do. `again`
    /// is the command to run once the image is there.
    pub fn advice(&self, again: &str) -> String {
        let node = self
            .node
            .as_deref()
            .map(|n| format!(" on node {n}"))
            .unwrap_or_default();
        let archive = archive_of(&self.image)
            .map(|file| format!(" (`cargo run -p liqo-images` writes it as target/images/{file})"))
            .unwrap_or_default();
        format!(
            "the image {} cannot be pulled{node} ({}): load it into the nodes' container \
             runtime{archive} or push it to a registry they reach and give --image-registry \
             (docs/install.md, \"Images\"), then run {again} again",
            self.image, self.reason
        )
    }
}

/// The archive `liqo-images` writes for `image`, if it is one of ours.
fn archive_of(image: &str) -> Option<String> {
    use liqo_api::images::{GATEWAY, LIQOCTL, VIRTUAL_KUBELET, archive_name};
    let (repository, tag) = image.rsplit_once(':')?;
    let name = repository.rsplit('/').next()?;
    [GATEWAY, VIRTUAL_KUBELET, LIQOCTL]
        .contains(&name)
        .then(|| archive_name(name, tag))
}

/// Reasons that say the node cannot get the image, not that it is slow.
const PULL_FAILURES: [&str; 4] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
];

/// Waits until the Deployment `name` in our namespace is fully available,
/// `timeout` passes, or one of its pods cannot pull its image.
pub async fn wait_ready(
    cluster: &ClusterClient,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<Readiness> {
    let api: Api<Deployment> = Api::namespaced(cluster.client.clone(), names::NAMESPACE);
    // Pods that could not pull before this run are replaced, so that the
    // image is pulled now, not after the back-off of their node (up to
    // minutes): a run after loading the image resumes at once.
    for pod in pull_failures(cluster, &api, name).await? {
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), names::NAMESPACE);
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        match pods.delete(&pod_name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(cluster.explain(e, &format!("replacing pod {pod_name}"))),
        }
    }
    let doing = format!("waiting for deployment {name}");
    let ready = wait::until(
        cluster,
        api.clone(),
        name,
        |d: Option<&Deployment>| d.is_some_and(deployment_ready),
        timeout,
        &doing,
    );
    let pull = async {
        loop {
            let pods = deployment_pods(cluster, &api, name).await?;
            if let Some(failure) = pods.iter().find_map(failure_of) {
                return anyhow::Ok(Readiness::CannotPull(failure));
            }
            if let Some(failure) = mount_failure(cluster, &pods).await? {
                return anyhow::Ok(Readiness::CannotMount(failure));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    tokio::select! {
        waited = ready => Ok(match waited? {
            Waited::Done(_) => Readiness::Ready,
            _ => Readiness::TimedOut,
        }),
        failure = pull => failure,
    }
}

/// A host-path mount that one of `pods` cannot get, from the kubelet's
/// `FailedMount` events.
async fn mount_failure(
    cluster: &ClusterClient,
    pods: &[Pod],
) -> anyhow::Result<Option<MountFailure>> {
    use k8s_openapi::api::core::v1::Event;
    if pods.is_empty() {
        return Ok(None);
    }
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), names::NAMESPACE);
    let events = events
        .list(&ListParams::default().fields("involvedObject.kind=Pod,reason=FailedMount"))
        .await
        .map_err(|e| cluster.explain(e, "listing the events of the agents' pods"))?;
    Ok(events.items.iter().find_map(|event| {
        let message = event.message.as_deref()?;
        let pod = pods
            .iter()
            .find(|p| p.metadata.uid.is_some() && p.metadata.uid == event.involved_object.uid)?;
        message.contains(HOST_PATH_FAILURE).then(|| MountFailure {
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            message: message.to_owned(),
        })
    }))
}

/// True once the Deployment's current generation is fully available.
pub fn deployment_ready(d: &Deployment) -> bool {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let generation = d.metadata.generation.unwrap_or(0);
    d.status.as_ref().is_some_and(|s| {
        s.observed_generation.unwrap_or(0) >= generation
            && s.updated_replicas.unwrap_or(0) == want
            && s.available_replicas.unwrap_or(0) == want
            && s.replicas.unwrap_or(0) == want
    })
}

/// The pods of Deployment `name` that cannot pull an image (and are not
/// being deleted).
async fn pull_failures(
    cluster: &ClusterClient,
    deployments: &Api<Deployment>,
    name: &str,
) -> anyhow::Result<Vec<Pod>> {
    Ok(deployment_pods(cluster, deployments, name)
        .await?
        .into_iter()
        .filter(|p| failure_of(p).is_some())
        .collect())
}

/// The pods of Deployment `name` that are not being deleted.
async fn deployment_pods(
    cluster: &ClusterClient,
    deployments: &Api<Deployment>,
    name: &str,
) -> anyhow::Result<Vec<Pod>> {
    let Some(deployment) = deployments
        .get_opt(name)
        .await
        .map_err(|e| cluster.explain(e, &format!("reading deployment {name}")))?
    else {
        return Ok(Vec::new());
    };
    let Some(selector) = deployment
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
        .filter(|labels| !labels.is_empty())
    else {
        return Ok(Vec::new());
    };
    let selector: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), names::NAMESPACE);
    let pods = pods
        .list(&ListParams::default().labels(&selector.join(",")))
        .await
        .map_err(|e| cluster.explain(e, &format!("listing the pods of {name}")))?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// Why `pod` cannot pull an image, if it cannot.
fn failure_of(pod: &Pod) -> Option<PullFailure> {
    let status = pod.status.as_ref()?;
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    containers.into_iter().find_map(|c| {
        let waiting = c.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.as_deref()?;
        PULL_FAILURES.contains(&reason).then(|| PullFailure {
            image: c.image.clone(),
            reason: reason.to_owned(),
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateWaiting, ContainerStatus, PodSpec, PodStatus,
    };

    fn pod(reason: &str) -> Pod {
        Pod {
            spec: Some(PodSpec {
                node_name: Some("node-1".to_owned()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    name: "gateway".to_owned(),
                    image: "ghcr.io/liqo-rs/liqo-gateway:0.1.0".to_owned(),
                    state: Some(ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some(reason.to_owned()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_pull_failure_is_told_from_a_slow_start() {
        for reason in PULL_FAILURES {
            let failure = failure_of(&pod(reason)).expect("a failure");
            assert_eq!(failure.reason, reason);
            assert_eq!(failure.node.as_deref(), Some("node-1"));
        }
        for reason in ["ContainerCreating", "PodInitializing", "CrashLoopBackOff"] {
            assert_eq!(failure_of(&pod(reason)), None, "{reason}");
        }
    }

    #[test]
    fn a_missing_tun_device_is_told_as_such_and_another_path_as_it_is() {
        let tun = MountFailure {
            node: Some("node-1".into()),
            message: "MountVolume.SetUp failed for volume \"tun\" : hostPath type check failed: \
                      /dev/net/tun is not a character device"
                .into(),
        };
        let line = tun.advice("`liqoctl install`");
        assert!(
            line.starts_with("node node-1 has no /dev/net/tun"),
            "{line}"
        );
        assert!(line.contains("modprobe tun"), "{line}");
        let other = MountFailure {
            node: None,
            message: "hostPath type check failed: /srv/x is not a directory".into(),
        };
        let line = other.advice("`liqoctl install`");
        assert!(line.contains("/srv/x is not a directory"), "{line}");
        assert!(!line.contains("modprobe"), "{line}");
    }

    #[test]
    fn the_advice_names_the_image_the_archive_and_the_command_again() {
        let failure = failure_of(&pod("ErrImageNeverPull")).expect("a failure");
        let line = failure.advice("`liqoctl install`");
        assert!(line.contains("the image ghcr.io/liqo-rs/liqo-gateway:0.1.0 cannot be pulled on node node-1 (ErrImageNeverPull)"), "{line}");
        assert!(
            line.contains("target/images/liqo-gateway-0.1.0.oci.tar"),
            "{line}"
        );
        assert!(line.ends_with("then run `liqoctl install` again"), "{line}");
        assert!(!line.contains('\n'));
        let other = PullFailure {
            image: "example.org/other:1".into(),
            ..failure
        };
        assert!(!other.advice("x").contains("target/images"));
    }
}
