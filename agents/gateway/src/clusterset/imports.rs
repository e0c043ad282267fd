//! The clusterset's Services as this cluster imports them, in every
//! namespace of their name here (but a peer's or liqo's own):
//!
//! - the ServiceImport, with the clusterset IP of a ClusterSetIP import;
//! - for a ClusterSetIP import, a Service without selector,
//!   `liqo-mcs-<name>`, whose cluster IP is the clusterset IP (kube-proxy
//!   sends it to the EndpointSlices below, as it does any Service's);
//! - one EndpointSlice per exporting cluster, with the
//!   `multicluster.kubernetes.io/service-name` and `source-cluster`
//!   labels and the endpoints at the addresses this cluster reaches them
//!   at, which CoreDNS's `multicluster` zone serves.
//!
//! Only objects labelled as ours are changed or deleted: a ServiceImport
//! someone made by hand is left as it is (and named in the log).

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::ObjectMeta;
use liqo_api::clusterset::{
    ClusterStatus, Import, ImportedSlice, LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, Port,
    ServiceImport, ServiceImportStatus, derived_name, imported_slice_name,
};
use liqo_api::names::labels;
use serde_json::json;

use super::MANAGER;

/// The annotation holding a hash of what this wrote: an object whose hash
/// is the one wanted is not written again.
const WRITTEN: &str = "liqo.io/clusterset-written";
/// Who manages the EndpointSlices (not the cluster's own controller).
const SLICE_MANAGER: &str = "gateway.liqo.io";

fn hash<T: Hash>(value: &T) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

fn ours(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        ),
        (LABEL_SERVICE_NAME.to_owned(), name.to_owned()),
    ])
}

fn is_ours(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().is_some_and(|l| {
        l.get(labels::MANAGED_BY).map(String::as_str) == Some(labels::MANAGED_BY_VALUE)
            && l.contains_key(LABEL_SERVICE_NAME)
    })
}

/// Writes `merged` into the namespaces of `open`, and deletes what is
/// ours and no longer wanted; returns whether anything of ours was there.
pub async fn write(
    client: &kube::Client,
    merged: &[Import],
    open: &BTreeSet<String>,
) -> anyhow::Result<bool> {
    let selector = ListParams::default().labels(&format!(
        "{}={},{LABEL_SERVICE_NAME}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE
    ));
    let imports_api: Api<ServiceImport> = Api::all(client.clone());
    let services_api: Api<Service> = Api::all(client.clone());
    let slices_api: Api<EndpointSlice> = Api::all(client.clone());
    let have_imports = imports_api.list(&ListParams::default()).await?.items;
    let have_services = services_api.list(&selector).await?.items;
    let have_slices = slices_api.list(&selector).await?.items;
    let mut keep_imports = BTreeSet::new();
    let mut keep_services = BTreeSet::new();
    let mut keep_slices = BTreeSet::new();
    for import in merged.iter().filter(|i| open.contains(&i.namespace)) {
        let ns = &import.namespace;
        let existing = have_imports
            .iter()
            .find(|i| i.namespace().as_deref() == Some(ns.as_str()) && i.name_any() == import.name);
        if let Some(existing) = existing
            && !is_ours(&existing.metadata)
        {
            tracing::warn!(import = %format!("{ns}/{}", import.name), "a ServiceImport liqo did not make is in the way: left as it is");
            continue;
        }
        let derived = derived_name(&import.name);
        let mut ips = Vec::new();
        if import.spec.type_ == "ClusterSetIP" {
            let found = have_services
                .iter()
                .find(|s| s.namespace().as_deref() == Some(ns.as_str()) && s.name_any() == derived);
            let api: Api<Service> = Api::namespaced(client.clone(), ns);
            let written = apply_marked(
                &api,
                &derived,
                derived_service(import, &derived),
                found.map(|s| &s.metadata),
            )
            .await?;
            let Some(current) = written.or_else(|| found.cloned()) else {
                continue;
            };
            ips = current
                .spec
                .as_ref()
                .and_then(|s| {
                    s.cluster_ips
                        .clone()
                        .or_else(|| s.cluster_ip.clone().map(|ip| vec![ip]))
                })
                .unwrap_or_default()
                .into_iter()
                .filter(|ip| ip != "None" && !ip.is_empty())
                .collect();
            keep_services.insert((ns.clone(), derived.clone()));
        }
        let mut spec = import.spec.clone();
        spec.ips = ips;
        if spec.ip_families.is_empty() {
            spec.ip_families = spec
                .ips
                .iter()
                .map(|ip| if ip.contains(':') { "IPv6" } else { "IPv4" }.to_owned())
                .collect();
        }
        let mut meta_labels = import.labels.clone();
        meta_labels.extend(ours(&import.name));
        let object = ServiceImport {
            metadata: ObjectMeta {
                name: Some(import.name.clone()),
                namespace: Some(ns.clone()),
                labels: Some(meta_labels),
                annotations: Some(import.annotations.clone()),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        };
        let api: Api<ServiceImport> = Api::namespaced(client.clone(), ns);
        apply_marked(&api, &import.name, object, existing.map(|e| &e.metadata)).await?;
        let clusters: Vec<ClusterStatus> = import
            .clusters
            .iter()
            .map(|c| ClusterStatus { cluster: c.clone() })
            .collect();
        if existing
            .and_then(|e| e.status.as_ref())
            .map(|s| &s.clusters)
            != Some(&clusters)
        {
            let status = ServiceImportStatus { clusters };
            api.patch_status(
                &import.name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await?;
        }
        keep_imports.insert((ns.clone(), import.name.clone()));
        for part in &import.slices {
            let name = imported_slice_name(&import.name, &part.cluster_id);
            let slice = imported_slice(import, part, &derived, &name);
            let found = have_slices
                .iter()
                .find(|s| s.namespace().as_deref() == Some(ns.as_str()) && s.name_any() == name);
            let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
            apply_marked(&api, &name, slice, found.map(|s| &s.metadata)).await?;
            keep_slices.insert((ns.clone(), name));
        }
    }
    let had_any = have_imports.iter().any(|i| is_ours(&i.metadata))
        || !have_services.is_empty()
        || !have_slices.is_empty();
    // What is ours and no longer wanted.
    for import in have_imports.iter().filter(|i| is_ours(&i.metadata)) {
        let key = (import.namespace().unwrap_or_default(), import.name_any());
        if !keep_imports.contains(&key) {
            delete::<ServiceImport>(client, &key).await?;
        }
    }
    for service in &have_services {
        let key = (service.namespace().unwrap_or_default(), service.name_any());
        if !keep_services.contains(&key) {
            delete::<Service>(client, &key).await?;
        }
    }
    for slice in &have_slices {
        let key = (slice.namespace().unwrap_or_default(), slice.name_any());
        if !keep_slices.contains(&key) {
            delete::<EndpointSlice>(client, &key).await?;
        }
    }
    Ok(had_any)
}

async fn delete<K>(client: &kube::Client, (ns, name): &(String, String)) -> anyhow::Result<()>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    match Api::<K>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Applies `object` as `name` (server-side, as ours) unless `have`, what
/// is there, carries the mark of this very object; returns what the API
/// server made of it when it wrote.
async fn apply_marked<K>(
    api: &Api<K>,
    name: &str,
    mut object: K,
    have: Option<&ObjectMeta>,
) -> anyhow::Result<Option<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let mark = format!("{:016x}", hash(&serde_json::to_string(&object)?));
    let marked = have
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(WRITTEN));
    if marked == Some(&mark) {
        return Ok(None);
    }
    object
        .meta_mut()
        .annotations
        .get_or_insert_default()
        .insert(WRITTEN.to_owned(), mark);
    Ok(Some(
        api.patch(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await?,
    ))
}

/// The name of the import's port `i`, `p`, on its Service and slices: its
/// own, or one made up when it has none and is not alone (a Service with
/// several ports must name them, and a slice's match its Service's).
fn port_name(import: &Import, i: usize, p: &Port) -> Option<String> {
    let several = import.spec.ports.len() > 1;
    p.name
        .clone()
        .or_else(|| several.then(|| format!("port-{i}")))
}

/// The Service of an import's clusterset IP: no selector, the import's
/// ports and session affinity.
fn derived_service(import: &Import, name: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(import.namespace.clone()),
            labels: Some(ours(&import.name)),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            ports: Some(
                import
                    .spec
                    .ports
                    .iter()
                    .enumerate()
                    .map(|(i, p)| ServicePort {
                        name: port_name(import, i, p),
                        protocol: Some(p.protocol.clone()),
                        app_protocol: p.app_protocol.clone(),
                        port: p.port,
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            session_affinity: import.spec.session_affinity.clone(),
            session_affinity_config: import.spec.session_affinity_config.clone(),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The EndpointSlice of one exporting cluster's endpoints.
fn imported_slice(
    import: &Import,
    part: &ImportedSlice,
    derived: &str,
    name: &str,
) -> EndpointSlice {
    let mut slice_labels = ours(&import.name);
    slice_labels.insert(LABEL_SOURCE_CLUSTER.to_owned(), part.cluster_id.clone());
    slice_labels.insert("kubernetes.io/service-name".to_owned(), derived.to_owned());
    slice_labels.insert(
        "endpointslice.kubernetes.io/managed-by".to_owned(),
        SLICE_MANAGER.to_owned(),
    );
    // The ports the endpoints serve, named as the import's ports are: a
    // port of the import only where this cluster's Service has it with
    // the same number (a cluster whose port of that name is another
    // number serves none of the import's).
    let served: Vec<Port> = part
        .endpoints
        .first()
        .map(|e| e.ports.clone())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| part.ports.clone());
    let ports = import
        .spec
        .ports
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            part.ports
                .iter()
                .find(|s| s.name == p.name && s.protocol == p.protocol && s.port == p.port)?;
            let number = served
                .iter()
                .find(|s| s.name == p.name && s.protocol == p.protocol)
                .map(|s| s.port)?;
            Some(EndpointPort {
                name: port_name(import, i, p),
                protocol: Some(p.protocol.clone()),
                app_protocol: p.app_protocol.clone(),
                port: Some(number),
            })
        })
        .collect();
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(import.namespace.clone()),
            labels: Some(slice_labels),
            ..ObjectMeta::default()
        },
        address_type: if part
            .endpoints
            .first()
            .and_then(|e| e.addresses.first())
            .is_some_and(|a| a.contains(':'))
        {
            "IPv6"
        } else {
            "IPv4"
        }
        .to_owned(),
        endpoints: part
            .endpoints
            .iter()
            .map(|e| Endpoint {
                addresses: e.addresses.clone(),
                hostname: e.hostname.clone(),
                conditions: Some(EndpointConditions {
                    ready: Some(e.ready),
                    serving: Some(e.ready),
                    terminating: Some(false),
                }),
                ..Endpoint::default()
            })
            .collect(),
        ports: Some(ports),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(name: &str, number: i32) -> Port {
        Port {
            name: Some(name.to_owned()),
            protocol: "TCP".to_owned(),
            app_protocol: None,
            port: number,
        }
    }

    #[test]
    fn a_cluster_serves_only_the_ports_it_exports_with_the_imports_numbers() {
        let import = Import {
            namespace: "shop".to_owned(),
            name: "hello".to_owned(),
            spec: liqo_api::clusterset::ServiceImportSpec {
                ports: vec![port("tcp", 42), port("tcp2", 4242)],
                type_: "ClusterSetIP".to_owned(),
                ..Default::default()
            },
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            slices: Vec::new(),
            clusters: Vec::new(),
        };
        let part = |service_ports: Vec<Port>| ImportedSlice {
            cluster_id: "b".to_owned(),
            endpoints: vec![liqo_api::clusterset::ExportedEndpoint {
                addresses: vec!["10.202.0.10".to_owned()],
                hostname: None,
                ready: true,
                ports: vec![port("tcp", 8042), port("tcp2", 8042)],
            }],
            ports: service_ports,
        };
        let served = |slice: EndpointSlice| -> Vec<(Option<String>, Option<i32>)> {
            slice
                .ports
                .unwrap_or_default()
                .into_iter()
                .map(|p| (p.name, p.port))
                .collect()
        };
        // Its `tcp` is 4242, not the import's 42: it serves `tcp2` only.
        let other = imported_slice(
            &import,
            &part(vec![port("tcp", 4242), port("tcp2", 4242)]),
            "d",
            "n",
        );
        assert_eq!(served(other), [(Some("tcp2".to_owned()), Some(8042))]);
        let same = imported_slice(&import, &part(vec![port("tcp", 42)]), "d", "n");
        assert_eq!(served(same), [(Some("tcp".to_owned()), Some(8042))]);
    }
}
