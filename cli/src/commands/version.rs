//! `liqoctl version`: the client's version and, when liqo-rs is installed,
//! the version running in the cluster.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde::Serialize;

use crate::cli::{GlobalArgs, VersionArgs};
use crate::factory::ClusterClient;
use crate::printer::Printer;

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Versions {
    client: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    kubernetes: Option<String>,
    /// `None` when the cluster was not asked; `Some(None)` when liqo-rs is
    /// not installed there.
    #[serde(skip_serializing_if = "Option::is_none")]
    server: Option<Option<String>>,
}

pub async fn run(args: &VersionArgs, global: &GlobalArgs, printer: Printer) -> anyhow::Result<()> {
    let mut versions = Versions {
        client: liqo_api::VERSION.to_owned(),
        kubernetes: None,
        server: None,
    };
    // Like kubectl: what is known is printed even when the cluster fails.
    let asked = if args.client {
        Ok(())
    } else {
        ask_cluster(global, &mut versions).await
    };
    print(&versions, args, printer)?;
    asked
}

async fn ask_cluster(global: &GlobalArgs, versions: &mut Versions) -> anyhow::Result<()> {
    let cluster = ClusterClient::local(global).await?;
    let info = cluster
        .client
        .apiserver_version()
        .await
        .map_err(|e| cluster.explain(e, "reading the Kubernetes version"))?;
    versions.kubernetes = Some(info.git_version);
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), liqo_api::names::NAMESPACE);
    let identity = maps
        .get_opt(liqo_api::names::IDENTITY_CONFIGMAP)
        .await
        .map_err(|e| cluster.explain(e, "reading the installed version"))?;
    versions.server =
        Some(identity.and_then(|cm| cm.data?.get(liqo_api::names::IDENTITY_VERSION_KEY).cloned()));
    Ok(())
}

fn print(versions: &Versions, args: &VersionArgs, printer: Printer) -> anyhow::Result<()> {
    if let Some(format) = args.output.output {
        return printer.structured(versions, format);
    }
    printer.result(format!("Client:     {}", versions.client));
    if let Some(kubernetes) = &versions.kubernetes {
        printer.result(format!("Kubernetes: {kubernetes}"));
    }
    match &versions.server {
        Some(Some(server)) => printer.result(format!("Server:     {server}")),
        Some(None) => printer.result("Server:     not installed"),
        None => {}
    }
    Ok(())
}
