//! Applies and deletes [`Manifest`]s with server-side apply, reporting what
//! changed the way `kubectl apply` does.

use std::fmt::Debug;
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::factory::ClusterClient;
use crate::manifests::Manifest;

/// The field manager of everything liqoctl applies.
pub const FIELD_MANAGER: &str = "liqoctl";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Created,
    Configured,
    Unchanged,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Created => "created",
            Self::Configured => "configured",
            Self::Unchanged => "unchanged",
        })
    }
}

/// Applies one object; ours to own, so conflicts with other managers are
/// forced.
pub async fn apply(cluster: &ClusterClient, manifest: &Manifest) -> anyhow::Result<Change> {
    let c = cluster.client.clone();
    let result = match manifest {
        Manifest::Crd(o) => apply_to(Api::all(c), o.as_ref()).await,
        Manifest::Namespace(o) => apply_to(Api::all(c), o).await,
        Manifest::ClusterRole(o) => apply_to(Api::all(c), o).await,
        Manifest::ClusterRoleBinding(o) => apply_to(Api::all(c), o).await,
        Manifest::ServiceAccount(o) => apply_to(namespaced(c, o), o).await,
        Manifest::Role(o) => apply_to(namespaced(c, o), o).await,
        Manifest::RoleBinding(o) => apply_to(namespaced(c, o), o).await,
        Manifest::ConfigMap(o) => apply_to(namespaced(c, o), o).await,
        Manifest::Deployment(o) => apply_to(namespaced(c, o.as_ref()), o.as_ref()).await,
    };
    result.map_err(|e| cluster.explain(e, &format!("applying {}", manifest.describe())))
}

/// Deletes one object if it exists; true if it did.
pub async fn delete(cluster: &ClusterClient, manifest: &Manifest) -> anyhow::Result<bool> {
    let c = cluster.client.clone();
    let result = match manifest {
        Manifest::Crd(o) => delete_from(Api::all(c), o.as_ref()).await,
        Manifest::Namespace(o) => delete_from(Api::all(c), o).await,
        Manifest::ClusterRole(o) => delete_from(Api::all(c), o).await,
        Manifest::ClusterRoleBinding(o) => delete_from(Api::all(c), o).await,
        Manifest::ServiceAccount(o) => delete_from(namespaced(c, o), o).await,
        Manifest::Role(o) => delete_from(namespaced(c, o), o).await,
        Manifest::RoleBinding(o) => delete_from(namespaced(c, o), o).await,
        Manifest::ConfigMap(o) => delete_from(namespaced(c, o), o).await,
        Manifest::Deployment(o) => delete_from(namespaced(c, o.as_ref()), o.as_ref()).await,
    };
    result.map_err(|e| cluster.explain(e, &format!("deleting {}", manifest.describe())))
}

fn namespaced<K>(client: kube::Client, obj: &K) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope>,
    K::DynamicType: Default,
{
    let ns = obj
        .meta()
        .namespace
        .as_deref()
        .unwrap_or(liqo_api::names::NAMESPACE);
    Api::namespaced(client, ns)
}

async fn apply_to<K>(api: Api<K>, obj: &K) -> Result<Change, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let name = obj.name_any();
    let before = api.get_opt(&name).await?.and_then(|o| o.resource_version());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let after = api.patch(&name, &params, &Patch::Apply(obj)).await?;
    Ok(match before {
        None => Change::Created,
        Some(rv) if after.resource_version().as_ref() == Some(&rv) => Change::Unchanged,
        Some(_) => Change::Configured,
    })
}

async fn delete_from<K>(api: Api<K>, obj: &K) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match api
        .delete(&obj.name_any(), &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Polls `check` every 200 ms until it is true or `timeout` passes;
/// false on timeout.
pub async fn poll_until<F, Fut>(timeout: Duration, mut check: F) -> anyhow::Result<bool>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await? {
            return Ok(true);
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
