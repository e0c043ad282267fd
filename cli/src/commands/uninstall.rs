//! `liqoctl uninstall`: refuses while the cluster peers or offloads, then
//! deletes what install created, the namespace last but the CRDs, and waits
//! until it is gone.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::ListParams;
use liqo_api::names;
use liqo_api::resources::{ForeignCluster, NamespaceOffloading};

use crate::apply;
use crate::cli::{GlobalArgs, UninstallArgs};
use crate::commands::install::{NamespaceState, namespace_state};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::manifests::{self, Manifest, Options};
use crate::printer::Printer;

pub async fn run(
    args: &UninstallArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let cluster = ClusterClient::local(global).await?;
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
    let namespace = namespace_state(&cluster).await?;
    let installed = namespace == NamespaceState::Ours;
    step.done("");

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

    // Everything install makes, named as install names it; the identity
    // ConfigMap goes with the namespace.
    let all = manifests::render(&Options::default());
    let step = printer.step("Removing the agents, RBAC and namespace");
    let mut deleted = 0;
    for manifest in all.iter().rev() {
        let skip = match manifest {
            Manifest::Crd(_) => true,
            // Never someone else's namespace of the same name.
            Manifest::Namespace(_) => namespace == NamespaceState::Foreign,
            _ => false,
        };
        if !skip && apply::delete(&cluster, manifest).await? {
            deleted += 1;
        }
    }
    let timeout = Duration::from_secs(args.timeout);
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    let gone = apply::poll_until(timeout, || {
        let namespaces = namespaces.clone();
        async move {
            Ok(namespace == NamespaceState::Foreign
                || namespaces.get_opt(names::NAMESPACE).await?.is_none())
        }
    })
    .await?;
    if !gone {
        step.fail("timed out");
        return Err(UserError::Timeout(format!(
            "the namespace {} is still terminating after {}s; see `kubectl get namespace {} -o yaml`, \
             then run uninstall again",
            names::NAMESPACE,
            args.timeout,
            names::NAMESPACE
        ))
        .into());
    }
    step.done(format!("{deleted} objects deleted"));

    if args.purge {
        let step = printer.step("Removing the CRDs");
        let crds: Vec<&Manifest> = all
            .iter()
            .filter(|m| matches!(m, Manifest::Crd(_)))
            .collect();
        for manifest in &crds {
            apply::delete(&cluster, manifest).await?;
        }
        let api: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
        let gone = apply::poll_until(timeout, || {
            let api = api.clone();
            async move {
                let list = api.list(&ListParams::default()).await?;
                Ok(!list.items.iter().any(|crd| crd.spec.group == names::GROUP))
            }
        })
        .await?;
        if !gone {
            step.fail("timed out");
            return Err(UserError::Timeout(format!(
                "the {} CRDs are still being removed after {}s; run uninstall --purge again",
                names::GROUP,
                args.timeout
            ))
            .into());
        }
        step.done(format!("{} CRDs deleted", crds.len()));
    }
    printer.result(format!("liqo-rs uninstalled from cluster {}", cluster.name));
    Ok(())
}

/// Peerings and offloaded namespaces, which must go before liqo-rs does.
#[derive(Debug, Default)]
pub struct InUse {
    pub peerings: Vec<String>,
    pub offloaded: Vec<String>,
}

impl InUse {
    pub async fn read(cluster: &ClusterClient) -> anyhow::Result<Self> {
        let peers: Api<ForeignCluster> = Api::all(cluster.client.clone());
        let offloadings: Api<NamespaceOffloading> = Api::all(cluster.client.clone());
        Ok(Self {
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
