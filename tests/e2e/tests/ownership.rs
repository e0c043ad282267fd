//! liqoctl takes over and deletes only what it made: install refuses, with
//! one line naming it, a namesake of any object it would apply; uninstall
//! leaves such objects, and someone else's objects in our namespace, and
//! says so. Against a real cluster, with foreign objects of every kind.

use std::time::Duration;

use anyhow::Result;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use liqo_api::names;
use liqo_e2e::fixture::{One, spec};
use liqo_e2e::{liqoctl, wait_for};
use liqo_testbed::{HOST_PROCESS_LABEL, HOST_PROCESS_TAINT};
use serde_json::{Value, json};

/// The field manager of the foreign objects: somebody who is not liqoctl.
const SOMEONE: &str = "someone-else";

/// A kind install applies, with a body that is valid for it.
struct Kind {
    api_version: &'static str,
    kind: &'static str,
    plural: &'static str,
    name: &'static str,
    namespaced: bool,
    body: Value,
}

impl Kind {
    fn resource(&self) -> ApiResource {
        let (group, version) = self
            .api_version
            .split_once('/')
            .unwrap_or(("", self.api_version));
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, self.kind),
            self.plural,
        )
    }

    fn api(&self, client: &kube::Client) -> Api<DynamicObject> {
        if self.namespaced {
            Api::namespaced_with(client.clone(), names::NAMESPACE, &self.resource())
        } else {
            Api::all_with(client.clone(), &self.resource())
        }
    }

    fn describe(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    /// Creates the foreign namesake; returns what its owner wrote (see
    /// [`Kind::owner_view`]).
    async fn create_foreign(&self, client: &kube::Client) -> Result<String> {
        let mut object = json!({
            "apiVersion": self.api_version,
            "kind": self.kind,
            "metadata": { "name": self.name, "labels": { "owner": "someone-else" } },
        });
        if let (Some(obj), Some(body)) = (object.as_object_mut(), self.body.as_object()) {
            obj.extend(body.clone());
        }
        let params = PostParams {
            field_manager: Some(SOMEONE.to_owned()),
            ..Default::default()
        };
        self.api(client)
            .create(&params, &serde_json::from_value(object)?)
            .await?;
        Ok(self.owner_view(client).await?.unwrap_or_default())
    }

    /// Deletes it and waits until it is gone.
    async fn delete(&self, client: &kube::Client) -> Result<()> {
        let api = self.api(client);
        let _ = api.delete(self.name, &DeleteParams::foreground()).await;
        wait_for(
            &format!("{} gone", self.describe()),
            Duration::from_secs(60),
            || {
                let api = api.clone();
                async move { Ok(api.get_opt(self.name).await?.is_none()) }
            },
        )
        .await
    }

    /// What the object's owner wrote: everything but what the cluster
    /// itself updates (status, resourceVersion, managedFields, annotations), so that
    /// it changes only if someone else, liqoctl included, writes to it.
    /// Panics if liqoctl ever wrote to it.
    async fn owner_view(&self, client: &kube::Client) -> Result<Option<String>> {
        let Some(object) = self.api(client).get_opt(self.name).await? else {
            return Ok(None);
        };
        let managers: Vec<_> = object
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|f| f.manager.clone())
            .collect();
        if object
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("owner"))
            .is_some()
        {
            assert!(
                !managers.iter().any(|m| m == "liqoctl"),
                "liqoctl wrote to {}: {managers:?}",
                self.describe()
            );
        }
        let mut value = serde_json::to_value(&object)?;
        if let Some(obj) = value.as_object_mut() {
            obj.remove("status");
        }
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
            meta.remove("managedFields");
            // The deployment controller's revision.
            meta.remove("annotations");
        }
        Ok(Some(value.to_string()))
    }
}

fn crd(name: &'static str, plural: &'static str, kind: &'static str) -> Kind {
    Kind {
        api_version: "apiextensions.k8s.io/v1",
        kind: "CustomResourceDefinition",
        plural: "customresourcedefinitions",
        name,
        namespaced: false,
        body: json!({ "spec": {
            "group": names::GROUP,
            "names": { "plural": plural, "kind": kind },
            "scope": "Namespaced",
            "versions": [{ "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": { "type": "object" } } }],
        }}),
    }
}

fn cluster_scoped() -> Vec<Kind> {
    let rules =
        json!({ "rules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["get"] }] });
    let role_ref = json!({
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view" },
        "subjects": [{ "kind": "User", "name": "someone", "apiGroup": "rbac.authorization.k8s.io" }],
    });
    vec![
        crd(
            "foreignclusters.liqo.io",
            "foreignclusters",
            "ForeignCluster",
        ),
        Kind {
            api_version: "v1",
            kind: "Namespace",
            plural: "namespaces",
            name: names::NAMESPACE,
            namespaced: false,
            body: json!({}),
        },
        Kind {
            api_version: "rbac.authorization.k8s.io/v1",
            kind: "ClusterRole",
            plural: "clusterroles",
            name: names::GATEWAY,
            namespaced: false,
            body: rules,
        },
        Kind {
            api_version: "rbac.authorization.k8s.io/v1",
            kind: "ClusterRoleBinding",
            plural: "clusterrolebindings",
            name: names::GATEWAY,
            namespaced: false,
            body: role_ref,
        },
        // Someone's admission policy of the name install uses for the
        // twin-namespace rules is not replaced by ours.
        Kind {
            api_version: "admissionregistration.k8s.io/v1",
            kind: "ValidatingAdmissionPolicy",
            plural: "validatingadmissionpolicies",
            name: "liqo-peer-namespaces",
            namespaced: false,
            body: json!({ "spec": {
                "matchConstraints": { "resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["configmaps"],
                }] },
                "validations": [{ "expression": "true" }],
            } }),
        },
    ]
}

fn namespaced() -> Vec<Kind> {
    vec![
        Kind {
            api_version: "v1",
            kind: "ServiceAccount",
            plural: "serviceaccounts",
            name: names::GATEWAY,
            namespaced: true,
            body: json!({}),
        },
        Kind {
            api_version: "v1",
            kind: "ConfigMap",
            plural: "configmaps",
            name: names::IDENTITY_CONFIGMAP,
            namespaced: true,
            body: json!({ "data": { "owner": "someone else" } }),
        },
        Kind {
            api_version: "rbac.authorization.k8s.io/v1",
            kind: "Role",
            plural: "roles",
            name: names::GATEWAY,
            namespaced: true,
            body: json!({ "rules": [] }),
        },
        Kind {
            api_version: "rbac.authorization.k8s.io/v1",
            kind: "RoleBinding",
            plural: "rolebindings",
            name: names::GATEWAY,
            namespaced: true,
            body: json!({
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view" },
                "subjects": [{ "kind": "User", "name": "someone", "apiGroup": "rbac.authorization.k8s.io" }],
            }),
        },
        Kind {
            api_version: "apps/v1",
            kind: "Deployment",
            plural: "deployments",
            name: names::GATEWAY,
            namespaced: true,
            body: json!({ "spec": {
                "replicas": 0,
                "selector": { "matchLabels": { "app": "someone" } },
                "template": {
                    "metadata": { "labels": { "app": "someone" } },
                    "spec": { "containers": [{ "name": "c", "image": "example.org/someone:1" }] },
                },
            }}),
        },
    ]
}

fn install(kubeconfig: &std::path::Path) -> liqo_e2e::Run {
    let selector = format!("{HOST_PROCESS_LABEL}=true");
    let toleration = format!("{HOST_PROCESS_TAINT}=true:NoSchedule");
    liqoctl(
        Some(kubeconfig),
        &[
            "install",
            "--cluster-id",
            "owner-test",
            "--pod-cidr",
            "10.201.0.0/16",
            "--node-selector",
            &selector,
            "--toleration",
            &toleration,
            "--timeout",
            "90",
        ],
    )
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_refuses_and_uninstall_leaves_what_liqoctl_did_not_create() -> Result<()> {
    let owner = One::start(spec("owner", 1, 1)).await?;
    let (cluster, client) = (owner.cluster(), owner.client.clone());
    let kubeconfig = cluster.kubeconfig_path();
    let ours_crd = crd(
        "foreignclusters.liqo.io",
        "foreignclusters",
        "ForeignCluster",
    );

    // Before any install: a namesake of each cluster-scoped object.
    for kind in cluster_scoped() {
        let version = kind.create_foreign(&client).await?;
        let out = install(kubeconfig).user_error(6);
        assert!(
            out.error_line().contains(&kind.describe())
                && out.error_line().contains("did not create"),
            "{}: {}",
            kind.describe(),
            out.error_line()
        );
        assert_eq!(
            kind.owner_view(&client).await?,
            Some(version),
            "{} was changed",
            kind.describe()
        );
        if kind.kind != "CustomResourceDefinition" {
            assert_eq!(
                ours_crd.owner_view(&client).await?,
                None,
                "install wrote a CRD before refusing"
            );
        }
        kind.delete(&client).await?;
    }

    install(kubeconfig).success();
    // After install: a namesake of each namespaced object, in our namespace.
    for kind in namespaced() {
        kind.delete(&client).await?;
        let version = kind.create_foreign(&client).await?;
        let out = install(kubeconfig).user_error(6);
        assert!(
            out.error_line().contains(&kind.describe()),
            "{}",
            out.error_line()
        );
        assert_eq!(
            kind.owner_view(&client).await?,
            Some(version),
            "{} was changed",
            kind.describe()
        );
        kind.delete(&client).await?;
        install(kubeconfig).success();
    }

    // Uninstall leaves a foreign ClusterRole, a foreign CRD and the
    // namespace holding someone's Secret, names them, and removes the rest.
    let cluster_role = cluster_scoped().remove(2);
    cluster_role.delete(&client).await?;
    let role_version = cluster_role.create_foreign(&client).await?;
    let offloadings = crd(
        "namespaceoffloadings.liqo.io",
        "namespaceoffloadings",
        "NamespaceOffloading",
    );
    offloadings.delete(&client).await?;
    let crd_version = offloadings.create_foreign(&client).await?;
    let secret = Kind {
        api_version: "v1",
        kind: "Secret",
        plural: "secrets",
        name: "someones-secret",
        namespaced: true,
        body: json!({ "stringData": { "k": "v" } }),
    };
    secret.create_foreign(&client).await?;

    let out = liqoctl(Some(kubeconfig), &["uninstall", "--purge", "--yes"]).success();
    for expected in [
        "left ClusterRole/liqo-gateway",
        "left CustomResourceDefinition/namespaceoffloadings.liqo.io",
        "left namespace liqo",
        "Secret/someones-secret",
    ] {
        assert!(
            out.stderr.contains(expected),
            "{expected:?} not said:\n{}",
            out.stderr
        );
    }
    assert!(out.stdout.contains("left in place"), "{}", out.stdout);
    assert_eq!(cluster_role.owner_view(&client).await?, Some(role_version));
    assert_eq!(offloadings.owner_view(&client).await?, Some(crd_version));
    assert!(
        secret.owner_view(&client).await?.is_some(),
        "the foreign secret was deleted"
    );
    for kind in namespaced() {
        assert_eq!(
            kind.owner_view(&client).await?,
            None,
            "{} left behind",
            kind.describe()
        );
    }
    assert_eq!(
        ours_crd.owner_view(&client).await?,
        None,
        "our CRD left behind"
    );
    let namespace = &cluster_scoped()[1];
    assert!(
        namespace.owner_view(&client).await?.is_some(),
        "the namespace was deleted with someone's secret"
    );

    // Once the foreign secret is gone, the same command finishes the job.
    secret.delete(&client).await?;
    liqoctl(Some(kubeconfig), &["uninstall", "--purge", "--yes"]).success();
    assert_eq!(
        namespace.owner_view(&client).await?,
        None,
        "the namespace is still there"
    );
    assert!(
        cluster_role.owner_view(&client).await?.is_some(),
        "the foreign ClusterRole was deleted"
    );
    owner.stop();
    Ok(())
}
