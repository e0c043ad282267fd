//! This cluster's exports: every ServiceExport outside a peer's (or
//! liqo's) namespaces, whether it is valid (its Service exists and is
//! not an ExternalName), and what a valid one exports; and the conditions
//! each ServiceExport is given once the clusterset's exports are merged.

use ipnet::IpNet;
use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use liqo_api::ClusterIdentity;
use liqo_api::clusterset::{
    ConflictReport, ExportedEndpoint, ExportedService, Exports, Import, Port, ServiceExport,
    conditions,
};
use serde_json::json;

/// One ServiceExport of this cluster and what it says of itself.
#[derive(Debug)]
pub struct Export {
    pub export: ServiceExport,
    /// `Valid`: its reason and message.
    pub valid: Result<(), (&'static str, String)>,
}

/// This cluster's exports, and each ServiceExport.
#[derive(Debug)]
pub struct Local {
    pub exports: Exports,
    pub all: Vec<Export>,
}

/// Reads this cluster's exports, those of the namespaces in `open`.
pub async fn read(
    client: &kube::Client,
    me: &ClusterIdentity,
    open: &BTreeSet<String>,
) -> anyhow::Result<Local> {
    let exports: Api<ServiceExport> = Api::all(client.clone());
    let mut all = Vec::new();
    let mut services = Vec::new();
    for export in exports.list(&ListParams::default()).await?.items {
        let ns = export.namespace().unwrap_or_default();
        if !open.contains(&ns) {
            continue;
        }
        let name = export.name_any();
        let service = Api::<Service>::namespaced(client.clone(), &ns)
            .get_opt(&name)
            .await?;
        let valid = match &service {
            None => Err((
                conditions::REASON_NO_SERVICE,
                format!("there is no Service {ns}/{name} to export"),
            )),
            Some(s) if s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName") => {
                Err((
                    conditions::REASON_INVALID_TYPE,
                    "an ExternalName Service cannot be exported".to_owned(),
                ))
            }
            Some(_) => Ok(()),
        };
        if let (Some(service), Ok(())) = (&service, &valid) {
            let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
            let slices = slices
                .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={name}")))
                .await?
                .items;
            services.push(exported(&export, service, &slices, &me.pod_cidr));
        }
        all.push(Export { export, valid });
    }
    services.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(Local {
        exports: Exports {
            cluster_id: me.cluster_id.to_string(),
            services,
        },
        all,
    })
}

/// What `export` of `service` exports: the Service's properties and its
/// endpoints that are this cluster's pods (the only addresses its peers
/// reach through the tunnels).
fn exported(
    export: &ServiceExport,
    service: &Service,
    slices: &[EndpointSlice],
    pod_cidr: &IpNet,
) -> ExportedService {
    let spec = service.spec.clone().unwrap_or_default();
    let ports = spec
        .ports
        .iter()
        .flatten()
        .map(|p| Port {
            name: p.name.clone().filter(|n| !n.is_empty()),
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
            app_protocol: p.app_protocol.clone(),
            port: p.port,
        })
        .collect();
    let mut endpoints = Vec::new();
    for slice in slices {
        let ports: Vec<Port> = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                Some(Port {
                    name: p.name.clone().filter(|n| !n.is_empty()),
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
                    app_protocol: p.app_protocol.clone(),
                    port: p.port?,
                })
            })
            .collect();
        for endpoint in &slice.endpoints {
            let addresses: Vec<String> = endpoint
                .addresses
                .iter()
                .filter(|a| {
                    a.parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| pod_cidr.contains(&ip))
                })
                .cloned()
                .collect();
            if addresses.is_empty() {
                continue;
            }
            endpoints.push(ExportedEndpoint {
                addresses,
                hostname: endpoint.hostname.clone(),
                ready: endpoint
                    .conditions
                    .as_ref()
                    .and_then(|c| c.ready)
                    .unwrap_or(true),
                ports: ports.clone(),
            });
        }
    }
    ExportedService {
        namespace: export.namespace().unwrap_or_default(),
        name: export.name_any(),
        since: export
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        headless: spec.cluster_ip.as_deref() == Some("None"),
        ports,
        session_affinity: spec.session_affinity.clone(),
        session_affinity_config: spec.session_affinity_config.clone(),
        internal_traffic_policy: spec.internal_traffic_policy.clone(),
        traffic_distribution: spec.traffic_distribution.clone(),
        ip_families: spec.ip_families.clone().unwrap_or_default(),
        labels: export.spec.exported_labels.clone(),
        annotations: export.spec.exported_annotations.clone(),
        endpoints,
    }
}

/// Writes each ServiceExport's conditions: `Valid`, `Ready` (its import is
/// made) and `Conflict`.
pub async fn report(
    client: &kube::Client,
    me: &ClusterIdentity,
    local: &Local,
    merged: &[Import],
    conflicts: &ConflictReport,
) -> anyhow::Result<()> {
    let cluster = me.cluster_id.to_string();
    for Export { export, valid } in &local.all {
        let ns = export.namespace().unwrap_or_default();
        let name = export.name_any();
        let generation = export.metadata.generation;
        let condition = |type_: &str, ok: bool, reason: &str, message: String| Condition {
            type_: type_.to_owned(),
            status: if ok { "True" } else { "False" }.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: generation,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        };
        let mut want = Vec::new();
        match valid {
            Ok(()) => {
                want.push(condition(
                    conditions::VALID,
                    true,
                    conditions::REASON_VALID,
                    "the Service is exported".to_owned(),
                ));
                let imported = merged.iter().any(|i| i.namespace == ns && i.name == name);
                want.push(condition(
                    conditions::READY,
                    imported,
                    if imported {
                        conditions::REASON_EXPORTED
                    } else {
                        "Pending"
                    },
                    if imported {
                        "the Service is in the clusterset".to_owned()
                    } else {
                        "the Service is not in the clusterset yet".to_owned()
                    },
                ));
                let conflict = conflicts.get(&(cluster.clone(), ns.clone(), name.clone()));
                want.push(match conflict {
                    Some((reason, message)) => {
                        condition(conditions::CONFLICT, true, reason, message.clone())
                    }
                    None => condition(
                        conditions::CONFLICT,
                        false,
                        conditions::REASON_NO_CONFLICT,
                        "no export of the clusterset differs".to_owned(),
                    ),
                });
            }
            Err((reason, message)) => {
                want.push(condition(conditions::VALID, false, reason, message.clone()));
            }
        }
        let have = export
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        // A condition that did not change keeps the time it last changed.
        let mut changed = have.len() != want.len();
        for c in &mut want {
            match have.iter().find(|h| h.type_ == c.type_) {
                Some(h)
                    if h.status == c.status
                        && h.reason == c.reason
                        && h.message == c.message
                        && h.observed_generation == c.observed_generation =>
                {
                    c.last_transition_time = h.last_transition_time.clone();
                }
                _ => changed = true,
            }
        }
        if !changed {
            continue;
        }
        let api: Api<ServiceExport> = Api::namespaced(client.clone(), &ns);
        let patch = json!({ "status": { "conditions": want } });
        if let Err(error) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(%error, export = %format!("{ns}/{name}"), "writing the export's conditions");
        }
    }
    Ok(())
}
