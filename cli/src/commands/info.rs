//! `liqoctl info`: the local identity, the agents' health, the peerings and
//! the offloaded namespaces, as tables or as JSON/YAML.

use comfy_table::{Table, presets::UTF8_BORDERS_ONLY};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::ListParams;
use liqo_api::ClusterIdentity;
use liqo_api::core::ForeignCluster;
use liqo_api::names::{self, labels};
use liqo_api::offloading::NamespaceOffloading;
use serde::Serialize;

use crate::cli::{GlobalArgs, InfoArgs};
use crate::commands::install::{deployment_ready, read_identity};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::printer::Printer;

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Info {
    identity: ClusterIdentity,
    agents: Vec<Agent>,
    peerings: Vec<Peering>,
    offloaded_namespaces: Vec<Offloaded>,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Agent {
    name: String,
    ready: bool,
    ready_replicas: i32,
    replicas: i32,
    image: String,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Peering {
    name: String,
    cluster_id: String,
    outgoing: bool,
    incoming: bool,
    conditions: Vec<String>,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Offloaded {
    namespace: String,
    pod_offloading_strategy: String,
    remote_namespace: Option<String>,
}

pub async fn run(args: &InfoArgs, global: &GlobalArgs, printer: Printer) -> anyhow::Result<()> {
    let cluster = ClusterClient::local(global).await?;
    let Some(identity) = read_identity(&cluster).await? else {
        return Err(UserError::NotFound(format!(
            "liqo-rs is not installed on cluster {}; run `liqoctl install`",
            cluster.name
        ))
        .into());
    };
    let info = Info {
        identity,
        agents: agents(&cluster).await?,
        peerings: peerings(&cluster).await?,
        offloaded_namespaces: offloaded(&cluster).await?,
    };
    if let Some(format) = args.output.output {
        return printer.structured(&info, format);
    }
    printer.result(render(&info));
    Ok(())
}

async fn agents(cluster: &ClusterClient) -> anyhow::Result<Vec<Agent>> {
    let api: Api<Deployment> = Api::namespaced(cluster.client.clone(), names::NAMESPACE);
    let selector = format!("{}={}", labels::MANAGED_BY, labels::MANAGED_BY_VALUE);
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| cluster.explain(e, "listing the agents"))?;
    Ok(list
        .items
        .iter()
        .map(|d| Agent {
            name: d.metadata.name.clone().unwrap_or_default(),
            ready: deployment_ready(d),
            ready_replicas: d
                .status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0),
            replicas: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            image: d
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|p| p.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_default(),
        })
        .collect())
}

async fn peerings(cluster: &ClusterClient) -> anyhow::Result<Vec<Peering>> {
    let api: Api<ForeignCluster> = Api::all(cluster.client.clone());
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.explain(e, "listing peerings"))?;
    Ok(list
        .items
        .into_iter()
        .map(|fc| Peering {
            name: fc.metadata.name.unwrap_or_default(),
            cluster_id: fc.spec.cluster_id.to_string(),
            outgoing: fc.spec.outgoing,
            incoming: fc.spec.incoming,
            conditions: fc
                .status
                .unwrap_or_default()
                .conditions
                .into_iter()
                .map(|c| format!("{}={}", c.type_, c.status))
                .collect(),
        })
        .collect())
}

async fn offloaded(cluster: &ClusterClient) -> anyhow::Result<Vec<Offloaded>> {
    let api: Api<NamespaceOffloading> = Api::all(cluster.client.clone());
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.explain(e, "listing offloaded namespaces"))?;
    Ok(list
        .items
        .into_iter()
        .map(|o| Offloaded {
            namespace: o.metadata.namespace.unwrap_or_default(),
            pod_offloading_strategy: format!("{:?}", o.spec.pod_offloading_strategy),
            remote_namespace: o.status.and_then(|s| s.remote_namespace),
        })
        .collect())
}

fn render(info: &Info) -> String {
    let table = |header: &[&str]| {
        let mut t = Table::new();
        t.load_style(UTF8_BORDERS_ONLY).set_header(header.to_vec());
        t
    };
    let id = &info.identity;
    let mut identity = table(&["Local cluster", ""]);
    identity.add_row(vec!["Cluster ID", id.cluster_id.as_str()]);
    identity.add_row(vec!["Name", &id.cluster_name]);
    let labels: Vec<String> = id.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    identity.add_row(vec!["Labels".to_owned(), labels.join("\n")]);
    identity.add_row(vec!["Pod CIDR".to_owned(), id.pod_cidr.to_string()]);
    identity.add_row(vec!["Service CIDR".to_owned(), id.service_cidr.to_string()]);
    identity.add_row(vec!["Version", &id.version]);

    let mut agents = table(&["Agent", "Ready", "Image"]);
    for a in &info.agents {
        let state = format!(
            "{}/{}{}",
            a.ready_replicas,
            a.replicas,
            if a.ready { "" } else { " (not ready)" }
        );
        agents.add_row(vec![a.name.clone(), state, a.image.clone()]);
    }

    let mut out = format!("{identity}\n\n{agents}\n\n");
    if info.peerings.is_empty() {
        out.push_str("No peerings.\n");
    } else {
        let mut peerings = table(&["Peer", "Cluster ID", "Direction", "Conditions"]);
        for p in &info.peerings {
            let direction = match (p.outgoing, p.incoming) {
                (true, true) => "both",
                (true, false) => "outgoing",
                (false, true) => "incoming",
                (false, false) => "none",
            };
            peerings.add_row(vec![
                p.name.clone(),
                p.cluster_id.clone(),
                direction.into(),
                p.conditions.join(" "),
            ]);
        }
        out.push_str(&format!("{peerings}\n"));
    }
    if info.offloaded_namespaces.is_empty() {
        out.push_str("No offloaded namespaces.");
    } else {
        let mut offloaded = table(&["Offloaded namespace", "Pods", "Remote namespace"]);
        for o in &info.offloaded_namespaces {
            offloaded.add_row(vec![
                o.namespace.clone(),
                o.pod_offloading_strategy.clone(),
                o.remote_namespace.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        out.push_str(&format!("\n{offloaded}"));
    }
    out
}
