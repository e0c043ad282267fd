//! `liqoctl uninstall`: refuses while the cluster peers or offloads, then
//! deletes what install created, the namespace last but the CRDs, and waits
//! until it is gone. It deletes only what liqoctl made: a namesake of one
//! of our objects, or someone else's object inside our namespace, is left
//! and named.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::wait::conditions;
use liqo_api::authentication::Tenant;
use liqo_api::core::ForeignCluster;
use liqo_api::names;
use liqo_api::offloading::NamespaceOffloading;

use crate::cli::{GlobalArgs, UninstallArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::apply::{self, Deletion};
use crate::kube::ownership::{self, Ownership};
use crate::kube::wait::{self, Waited};
use crate::manifests::{self, Manifest};
use crate::printer::Printer;

pub async fn run(
    args: &UninstallArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let cluster = ClusterClient::local(global).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let step = printer.step(format!("Checking cluster {}", cluster.name));
    let in_use = InUse::read(&cluster).await?;
    if let Some(why) = in_use.refusal() {
        step.fail("in use");
        return Err(UserError::Refused(format!(
            "cannot uninstall from cluster {}: {why}",
            cluster.name
        ))
        .into());
    }
    // Everything install makes, named as install names it.
    let all = manifests::every_object();
    let (crds, rest): (Vec<&Manifest>, Vec<&Manifest>) =
        all.iter().partition(|m| matches!(m, Manifest::Crd(_)));
    let mcs_crds = manifests::mcs::crds();
    let namespace = rest
        .iter()
        .find(|m| matches!(m, Manifest::Namespace(_)))
        .expect("invariant: install makes the liqo namespace");
    let namespace_ownership = ownership::of(&cluster, namespace).await?;
    // Someone else's objects in our namespace would go with it.
    let foreign_inside = match namespace_ownership {
        Ownership::Ours { .. } => {
            ownership::foreign_in_namespace(&cluster, names::NAMESPACE).await?
        }
        _ => Vec::new(),
    };
    step.done("");

    let installed = matches!(namespace_ownership, Ownership::Ours { .. });
    if !installed && !args.purge {
        printer.result(format!(
            "liqo-rs is not installed on cluster {}",
            cluster.name
        ));
        return Ok(());
    }
    if !printer.confirm(
        &format!(
            "Remove liqo-rs{} from cluster {}?",
            if args.purge { " and its CRDs" } else { "" },
            cluster.name
        ),
        global.yes,
    )? {
        return Err(UserError::Refused("cancelled; nothing was changed".to_owned()).into());
    }

    let step = printer.step("Removing the agents, RBAC and namespace");
    let mut deleted = 0;
    let mut left = Vec::new();
    for manifest in rest.iter().rev() {
        if matches!(manifest, Manifest::Namespace(_)) && !foreign_inside.is_empty() {
            continue;
        }
        match apply::delete(&cluster, manifest).await? {
            Deletion::Deleted { .. } => deleted += 1,
            Deletion::Absent => {}
            Deletion::Foreign => left.push(manifest.describe()),
        }
    }
    if let Ownership::Ours { uid } = &namespace_ownership
        && foreign_inside.is_empty()
    {
        let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
        let waited = wait::until(
            &cluster,
            namespaces,
            names::NAMESPACE,
            conditions::is_deleted(uid),
            wait::left(deadline),
            "waiting for the liqo namespace to be deleted",
        )
        .await?;
        if let Waited::TimedOut = waited {
            step.fail("timed out");
            return Err(UserError::Timeout(format!(
                "the namespace {ns} is still terminating after {}s; see `kubectl get namespace {ns} -o yaml`, \
                 then run uninstall again",
                args.timeout,
                ns = names::NAMESPACE,
            ))
            .into());
        }
    }
    step.done(format!("{deleted} objects deleted"));
    for object in &left {
        printer.info(format!("  left {object}: liqoctl did not create it"));
    }
    if !foreign_inside.is_empty() {
        printer.info(format!(
            "  left namespace {}: it holds objects liqoctl did not create ({}); \
             move or delete them, then run uninstall again",
            names::NAMESPACE,
            foreign_inside.join(", ")
        ));
    }

    if args.purge {
        let step = printer.step("Removing the CRDs");
        let mut removed = Vec::new();
        let mut foreign_crds = Vec::new();
        for manifest in &crds {
            match apply::delete(&cluster, manifest).await? {
                Deletion::Deleted { uid } => removed.push((manifest.name(), uid)),
                Deletion::Absent => {}
                Deletion::Foreign => foreign_crds.push(manifest.describe()),
            }
        }
        // The MCS API's CRDs are shared: ours go only when nothing uses
        // them (deleting a CRD deletes every object of it).
        let mut kept_in_use = Vec::new();
        for manifest in &mcs_crds {
            if ownership::of(&cluster, manifest).await? == Ownership::Absent {
                continue;
            }
            if let Some(used) = mcs_objects(&cluster, manifest).await? {
                kept_in_use.push(format!("{} ({used})", manifest.describe()));
                continue;
            }
            match apply::delete(&cluster, manifest).await? {
                Deletion::Deleted { uid } => removed.push((manifest.name(), uid)),
                Deletion::Absent => {}
                Deletion::Foreign => foreign_crds.push(manifest.describe()),
            }
        }
        let api: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
        for (name, uid) in &removed {
            let doing = format!("waiting for the CRD {name} to be deleted");
            let waited = tokio::select! {
                waited = wait::until(
                    &cluster,
                    api.clone(),
                    name,
                    conditions::is_deleted(uid),
                    wait::left(deadline),
                    &doing,
                ) => waited?,
                never = retry_failed_removal(&api, name) => match never {},
            };
            if let Waited::TimedOut = waited {
                step.fail("timed out");
                // The API server's own account of where the removal stands
                // (its CRD finalizer deletes every instance first).
                let why = api
                    .get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|crd| crd.status)
                    .and_then(|status| status.conditions)
                    .and_then(|conditions| {
                        conditions
                            .into_iter()
                            .find(|c| c.type_ == "Terminating")
                            .map(|c| {
                                format!(
                                    " ({}: {})",
                                    c.reason.unwrap_or_default(),
                                    c.message.unwrap_or_default()
                                )
                            })
                    })
                    .unwrap_or_default();
                return Err(UserError::Timeout(format!(
                    "the CRD {name} is still being removed after {}s{why}; run uninstall --purge again",
                    args.timeout
                ))
                .into());
            }
        }
        step.done(format!("{} CRDs deleted", removed.len()));
        for object in &foreign_crds {
            printer.info(format!("  left {object}: liqoctl did not create it"));
        }
        for object in &kept_in_use {
            printer.info(format!(
                "  left {object}: delete those first to remove it, or keep it for another implementation"
            ));
        }
        left.extend(foreign_crds);
        left.extend(kept_in_use);
    }
    let outcome = if left.is_empty() && foreign_inside.is_empty() {
        String::new()
    } else {
        " (objects liqoctl did not create were left in place)".to_owned()
    };
    printer.result(format!(
        "liqo-rs uninstalled from cluster {}{outcome}",
        cluster.name
    ));
    Ok(())
}

/// How many objects of the CRD `manifest` the cluster holds, said for a
/// user (`3 objects`), or none.
async fn mcs_objects(
    cluster: &ClusterClient,
    manifest: &Manifest,
) -> anyhow::Result<Option<String>> {
    let Manifest::Crd(crd) = manifest else {
        return Ok(None);
    };
    let Some(version) = crd.spec.versions.iter().find(|v| v.storage) else {
        return Ok(None);
    };
    let resource = kube::discovery::ApiResource {
        group: crd.spec.group.clone(),
        version: version.name.clone(),
        api_version: format!("{}/{}", crd.spec.group, version.name),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    };
    let api: Api<kube::core::DynamicObject> = Api::all_with(cluster.client.clone(), &resource);
    match api.list_metadata(&ListParams::default()).await {
        Ok(list) if list.items.is_empty() => Ok(None),
        Ok(list) => Ok(Some(format!(
            "{} {} still there",
            list.items.len(),
            crd.spec.names.plural
        ))),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(cluster.explain(e, &format!("listing the {}", crd.spec.names.plural))),
    }
}

/// Peerings and offloaded namespaces, which must go before liqo-rs does.
#[derive(Debug, Default)]
pub struct InUse {
    pub peerings: Vec<String>,
    /// Consumers of this cluster (it is their provider).
    pub tenants: Vec<String>,
    pub offloaded: Vec<String>,
}

impl InUse {
    pub async fn read(cluster: &ClusterClient) -> anyhow::Result<Self> {
        let peers: Api<ForeignCluster> = Api::all(cluster.client.clone());
        let offloadings: Api<NamespaceOffloading> = Api::all(cluster.client.clone());
        let tenants: Api<Tenant> = Api::all(cluster.client.clone());
        Ok(Self {
            tenants: names_of(
                cluster,
                tenants.list(&ListParams::default()).await,
                "listing tenants",
            )?,
            peerings: names_of(
                cluster,
                peers.list(&ListParams::default()).await,
                "listing peerings",
            )?,
            offloaded: names_of(
                cluster,
                offloadings.list(&ListParams::default()).await.map(|list| {
                    // An offloading is known by its namespace.
                    let mut list = list;
                    for o in &mut list.items {
                        o.metadata.name = o.metadata.namespace.clone();
                    }
                    list
                }),
                "listing offloaded namespaces",
            )?,
        })
    }

    fn refusal(&self) -> Option<String> {
        let mut parts = Vec::new();
        if !self.peerings.is_empty() {
            parts.push(format!(
                "it peers with {} (unpeer first)",
                self.peerings.join(", ")
            ));
        }
        if !self.tenants.is_empty() {
            parts.push(format!(
                "clusters {} consume its resources (unpeer them first, or end their tenancy with \
                 `liqoctl unpeer --tenant ID` here)",
                self.tenants.join(", ")
            ));
        }
        if !self.offloaded.is_empty() {
            parts.push(format!(
                "it offloads the namespaces {} (unoffload first)",
                self.offloaded.join(", ")
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// The names in a list; a missing CRD means there are none.
fn names_of<K: kube::Resource + Clone>(
    cluster: &ClusterClient,
    list: Result<kube::core::ObjectList<K>, kube::Error>,
    doing: &str,
) -> anyhow::Result<Vec<String>> {
    match list {
        Ok(list) => Ok(list
            .items
            .iter()
            .filter_map(|o| o.meta().name.clone())
            .collect()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(cluster.explain(e, doing)),
    }
}

/// Set on a CRD being removed to have its removal tried again.
const REMOVAL_RETRIED_AT: &str = "liqo.io/removal-retried-at";

/// How often a failed removal is tried again.
const REMOVAL_RETRY: Duration = Duration::from_secs(3);

/// The API server's CRD finalizer deletes every instance before the CRD,
/// and tries a failed attempt again after a back-off that doubles up to
/// minutes. An attempt fails while the resource's watch cache is
/// (re)initializing, as it is right after the CRD changed (an `install`
/// just before); that alone held a removal for over two minutes. A
/// change of the CRD's metadata queues it again at once, so while its
/// `Terminating` condition says `InstanceDeletionFailed`, the CRD gets a
/// new time in an annotation every few seconds. Never returns; errors
/// are left to the wait beside it.
async fn retry_failed_removal(
    api: &Api<CustomResourceDefinition>,
    name: &str,
) -> std::convert::Infallible {
    loop {
        tokio::time::sleep(REMOVAL_RETRY).await;
        let failed = api.get_opt(name).await.ok().flatten().is_some_and(|crd| {
            crd.metadata.deletion_timestamp.is_some()
                && crd
                    .status
                    .and_then(|s| s.conditions)
                    .into_iter()
                    .flatten()
                    .any(|c| {
                        c.type_ == "Terminating"
                            && c.reason.as_deref() == Some("InstanceDeletionFailed")
                    })
        });
        if failed {
            tracing::debug!(crd = name, "its removal failed: trying again");
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            let patch =
                serde_json::json!({ "metadata": { "annotations": { REMOVAL_RETRIED_AT: now } } });
            let _ = api
                .patch(
                    name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await;
        }
    }
}
