//! Applies and deletes [`Manifest`]s with server-side apply, reporting what
//! changed the way `kubectl apply` does. Callers check [`super::ownership`]
//! first: apply forces our fields over other managers', so it must only
//! ever touch objects that are ours.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::ownership::{self, FIELD_MANAGER, Ownership};
use crate::factory::ClusterClient;
use crate::manifests::Manifest;

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

/// Applies one object; ours to own (the caller checked), so conflicts with
/// other managers are forced.
pub async fn apply(cluster: &ClusterClient, manifest: &Manifest) -> anyhow::Result<Change> {
    Ok(apply_over(cluster, manifest).await?.change)
}

/// What applying one object did, and what it applied over.
#[derive(Debug)]
pub struct Applied {
    pub change: Change,
    /// The object as it was before, when this changed it
    /// ([`Change::Configured`]): what [`restore`] puts back.
    pub prior: Option<serde_json::Value>,
    /// The object's UID, as the API server answered: what the objects it
    /// owns name.
    pub uid: String,
}

/// [`apply`], keeping what the object was before it changed.
pub async fn apply_over(cluster: &ClusterClient, manifest: &Manifest) -> anyhow::Result<Applied> {
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
        Manifest::Secret(o) => apply_to(namespaced(c, o), o).await,
        Manifest::ResourceQuota(o) => apply_to(namespaced(c, o), o).await,
        Manifest::Service(o) => apply_to(namespaced(c, o.as_ref()), o.as_ref()).await,
        Manifest::Tenant(o) => apply_to(Api::all(c), o.as_ref()).await,
        Manifest::ForeignCluster(o) => apply_to(Api::all(c), o.as_ref()).await,
        Manifest::SharingPolicy(o) => apply_to(Api::all(c), o.as_ref()).await,
        Manifest::Connection(o) => apply_to(namespaced(c, o.as_ref()), o.as_ref()).await,
        Manifest::ValidatingAdmissionPolicy(o) => apply_if_changed(Api::all(c), o.as_ref()).await,
        Manifest::ValidatingAdmissionPolicyBinding(o) => {
            apply_if_changed(Api::all(c), o.as_ref()).await
        }
        Manifest::MutatingAdmissionPolicy(o) => apply_if_changed(Api::all(c), o.as_ref()).await,
        Manifest::MutatingAdmissionPolicyBinding(o) => {
            apply_if_changed(Api::all(c), o.as_ref()).await
        }
        Manifest::MutatingWebhookConfiguration(o) => apply_to(Api::all(c), o.as_ref()).await,
        Manifest::StorageClass(o) => apply_to(Api::all(c), o.as_ref()).await,
    };
    result.map_err(|e| cluster.explain(e, &format!("applying {}", manifest.describe())))
}

/// Puts back `prior`, the object a manifest names as it was before
/// [`apply_over`] changed it. Applied with our field manager, so the
/// fields that change added go again; the server's own fields of the
/// prior object (its UID, version, managed fields) are not sent.
pub async fn restore(
    cluster: &ClusterClient,
    manifest: &Manifest,
    prior: serde_json::Value,
) -> anyhow::Result<()> {
    let mut object: DynamicObject = serde_json::from_value(prior)?;
    let meta = &mut object.metadata;
    meta.managed_fields = None;
    meta.resource_version = None;
    meta.uid = None;
    meta.creation_timestamp = None;
    meta.generation = None;
    let api = super::api_of(cluster, manifest);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(manifest.name(), &params, &Patch::Apply(&object))
        .await
        .map_err(|e| cluster.explain(e, &format!("restoring {}", manifest.describe())))?;
    Ok(())
}

/// How deleting one of our objects went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deletion {
    /// Deleted (it may still be terminating): the UID to wait on.
    Deleted { uid: String },
    /// There was nothing to delete.
    Absent,
    /// Someone else's object of that name: left alone.
    Foreign,
}

/// Deletes the object a manifest names if it is ours, and only that very
/// object (its UID), never someone else's namesake.
pub async fn delete(cluster: &ClusterClient, manifest: &Manifest) -> anyhow::Result<Deletion> {
    let uid = match ownership::of(cluster, manifest).await? {
        Ownership::Absent => return Ok(Deletion::Absent),
        Ownership::Foreign => return Ok(Deletion::Foreign),
        Ownership::Ours { uid } => uid,
    };
    let api = super::api_of(cluster, manifest);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(manifest.name(), &params).await {
        Ok(_) => Ok(Deletion::Deleted { uid }),
        // Gone meanwhile (404), or replaced by a namesake (409).
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Deletion::Absent),
        Err(e) => Err(cluster.explain(e, &format!("deleting {}", manifest.describe()))),
    }
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

async fn apply_to<K>(api: Api<K>, obj: &K) -> Result<Applied, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let name = obj.name_any();
    let before = api.get_opt(&name).await?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let after = api.patch(&name, &params, &Patch::Apply(obj)).await?;
    let uid = after.uid().unwrap_or_default();
    Ok(match before {
        None => Applied {
            change: Change::Created,
            prior: None,
            uid,
        },
        Some(b) if after.resource_version() == b.resource_version() => Applied {
            change: Change::Unchanged,
            prior: None,
            uid,
        },
        Some(b) => Applied {
            change: Change::Configured,
            prior: serde_json::to_value(&b).ok(),
            uid,
        },
    })
}

/// Applies only when the object would change. The API server rewrites an
/// admission policy on a no-op apply once its status controller has applied
/// status (it re-stamps our managedFields entry), which would make every
/// install "configure" it: a dry run tells whether anything but that would
/// change.
async fn apply_if_changed<K>(api: Api<K>, obj: &K) -> Result<Applied, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let name = obj.name_any();
    let Some(current) = api.get_opt(&name).await? else {
        return apply_to(api, obj).await;
    };
    let params = PatchParams::apply(FIELD_MANAGER).force().dry_run();
    let would_be = api.patch(&name, &params, &Patch::Apply(obj)).await?;
    let content = |o: &K| {
        let mut v = serde_json::to_value(o).unwrap_or_default();
        if let Some(meta) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            for volatile in ["managedFields", "resourceVersion", "generation"] {
                meta.remove(volatile);
            }
        }
        v
    };
    if content(&current) == content(&would_be) {
        return Ok(Applied {
            change: Change::Unchanged,
            prior: None,
            uid: current.uid().unwrap_or_default(),
        });
    }
    apply_to(api, obj).await
}
