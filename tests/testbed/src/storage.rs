//! The real-node cluster's storage, as k3s and kind have it: Rancher's
//! local-path-provisioner (built from its Go module,
//! `tests/toolchain/local-path-provisioner`) in the namespace
//! `local-path-storage`, with the objects of its
//! `deploy/local-path-storage.yaml`, and the default StorageClass
//! `local-path` (`WaitForFirstConsumer`, reclaim `Delete`). A claim that names no class gets a folder of the
//! node, made and removed by a pod the provisioner runs there with the
//! setup and teardown scripts of its ConfigMap.
//!
//! The node's folders live under the cluster's own (`<cluster>/storage/`,
//! [`folder`]), not in a folder of the machine: the kubelet runs on this
//! machine, so a volume's hostPath is a folder of it, and clusters must
//! not share it. Nothing is waited for here: what claims a volume waits
//! for its claim to be Bound.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use serde_json::{Value, json};

use crate::Error;
use crate::create_or_keep;

/// The image the node holds the provisioner in: upstream's name for it,
/// with the version `tests/toolchain/local-path-provisioner/go.mod` pins.
pub(crate) const PROVISIONER_IMAGE: &str = "docker.io/rancher/local-path-provisioner:v0.0.30";
/// The image of the pods that make and remove a volume's folder: the
/// name upstream's `helperPod.yaml` gives (`busybox`, as containerd
/// normalizes it), so that the ConfigMap is the one users deploy.
pub(crate) const BUSYBOX_IMAGE: &str = "docker.io/library/busybox:latest";
/// The provisioner's namespace, Deployment, ConfigMap and account.
pub const NAMESPACE: &str = "local-path-storage";
pub const DEPLOYMENT: &str = "local-path-provisioner";
pub const CONFIG_MAP: &str = "local-path-config";
const SERVICE_ACCOUNT: &str = "local-path-provisioner-service-account";
/// The name of its Role and ClusterRole, and of their bindings.
const ROLE: &str = "local-path-provisioner-role";
const BINDING: &str = "local-path-provisioner-bind";
/// The default StorageClass, and the provisioner it names.
pub const STORAGE_CLASS: &str = "local-path";
pub const PROVISIONER: &str = "rancher.io/local-path";
/// What errors call these objects.
const OBJECTS: &str = "the local-path provisioner's";

/// The folder of the cluster in `cluster_dir` that holds its volumes'
/// folders, one per claim.
pub fn folder(cluster_dir: &Path) -> PathBuf {
    cluster_dir.join("storage")
}

/// The provisioner's `config.json`: every node keeps its volumes in
/// `folder` (an absolute path of the machine).
pub fn config(folder: &Path) -> String {
    json!({
        "nodePathMap": [{
            "node": "DEFAULT_PATH_FOR_NON_LISTED_NODES",
            "paths": [folder.display().to_string()],
        }],
    })
    .to_string()
}

/// Creates the provisioner's objects and the default StorageClass;
/// returns without waiting for the provisioner to be Ready. Its pod is
/// kept on `node`, the real node: a kwok node of the same cluster would
/// report it Running and run nothing.
pub(crate) async fn deploy(client: &kube::Client, folder: &Path, node: &str) -> Result<(), Error> {
    create_or_keep::<Namespace>(
        Api::all(client.clone()),
        json!({"metadata": {"name": NAMESPACE}}),
        OBJECTS,
    )
    .await?;
    create_or_keep::<ServiceAccount>(
        Api::namespaced(client.clone(), NAMESPACE),
        json!({"metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}}),
        OBJECTS,
    )
    .await?;
    // The pods it runs on a node to make and remove folders, in its
    // namespace.
    create_or_keep::<Role>(
        Api::namespaced(client.clone(), NAMESPACE),
        json!({
            "metadata": {"name": ROLE, "namespace": NAMESPACE},
            "rules": [{"apiGroups": [""], "resources": ["pods"],
                       "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]}],
        }),
        OBJECTS,
    )
    .await?;
    create_or_keep::<ClusterRole>(
        Api::all(client.clone()),
        json!({
            "metadata": {"name": ROLE},
            "rules": [
                {"apiGroups": [""],
                 "resources": ["nodes", "persistentvolumeclaims", "configmaps", "pods", "pods/log"],
                 "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["persistentvolumes"],
                 "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
                {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"],
                 "verbs": ["get", "list", "watch"]},
            ],
        }),
        OBJECTS,
    )
    .await?;
    let subjects =
        json!([{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]);
    create_or_keep::<RoleBinding>(
        Api::namespaced(client.clone(), NAMESPACE),
        json!({
            "metadata": {"name": BINDING, "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE},
            "subjects": subjects,
        }),
        OBJECTS,
    )
    .await?;
    create_or_keep::<ClusterRoleBinding>(
        Api::all(client.clone()),
        json!({
            "metadata": {"name": BINDING},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
            "subjects": subjects,
        }),
        OBJECTS,
    )
    .await?;
    create_or_keep::<ConfigMap>(
        Api::namespaced(client.clone(), NAMESPACE),
        config_map(folder)?,
        OBJECTS,
    )
    .await?;
    create_or_keep::<Deployment>(
        Api::namespaced(client.clone(), NAMESPACE),
        deployment(node),
        OBJECTS,
    )
    .await?;
    create_or_keep::<StorageClass>(
        Api::all(client.clone()),
        json!({
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER,
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
        }),
        OBJECTS,
    )
    .await
}

/// The ConfigMap the provisioner reads (and follows): where volumes go,
/// the scripts the pods it runs on the node call with `VOL_DIR` set to
/// the volume's folder, and the spec of those pods, as upstream ships
/// them.
fn config_map(folder: &Path) -> Result<Value, Error> {
    let folder_pod = serde_yaml::to_string(&json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "volume-folder"},
        "spec": {
            "priorityClassName": "system-node-critical",
            "tolerations": [{"key": "node.kubernetes.io/disk-pressure", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "containers": [{"name": "volume-folder", "image": "busybox",
                            "imagePullPolicy": "IfNotPresent"}],
        },
    }))
    .map_err(|e| Error::Spec(format!("the local-path provisioner's pod for folders: {e}")))?;
    Ok(json!({
        "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
        "data": {
            "config.json": config(folder),
            // Open to every user: the pods that mount it run as any.
            "setup": "#!/bin/sh\nset -eu\nmkdir -m 0777 -p \"$VOL_DIR\"\n",
            "teardown": "#!/bin/sh\nset -eu\nrm -rf \"$VOL_DIR\"\n",
            "helperPod.yaml": folder_pod,
        },
    }))
}

/// Upstream's Deployment, with the image the node holds (never pulled:
/// no registry is reachable) and its pod kept on `node`.
fn deployment(node: &str) -> Value {
    let labels = json!({"app": DEPLOYMENT});
    json!({
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": SERVICE_ACCOUNT,
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{
                        "name": DEPLOYMENT,
                        "image": PROVISIONER_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["local-path-provisioner", "--debug", "start",
                                    "--config", "/etc/config/config.json"],
                        "volumeMounts": [{"name": "config-volume", "mountPath": "/etc/config/"}],
                        "env": [
                            {"name": "POD_NAMESPACE",
                             "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                            {"name": "CONFIG_MOUNT_PATH", "value": "/etc/config/"},
                        ],
                    }],
                    "volumes": [{"name": "config-volume", "configMap": {"name": CONFIG_MAP}}],
                },
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_is_named_after_the_pinned_module() {
        let go_mod = include_str!("../../toolchain/local-path-provisioner/go.mod");
        let pinned = go_mod
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("require github.com/rancher/local-path-provisioner ")
            })
            .expect("go.mod requires the module");
        assert_eq!(
            PROVISIONER_IMAGE.rsplit_once(':').map(|(_, tag)| tag),
            Some(pinned.trim())
        );
    }

    #[test]
    fn every_node_keeps_its_volumes_in_the_clusters_folder() {
        let config: Value = serde_json::from_str(&config(Path::new("/c/one/storage")))
            .expect("config.json is JSON");
        assert_eq!(
            config["nodePathMap"],
            json!([{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": ["/c/one/storage"]}])
        );
    }
}
