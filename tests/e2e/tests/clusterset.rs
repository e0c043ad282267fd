//! The Multi-Cluster Services API on one cluster, which is its own
//! clusterset: its gateway, under the RBAC install gives it, imports what
//! the cluster exports, says why an export is not valid, and leaves alone
//! what it did not make. Across peered clusters, the sig-multicluster
//! conformance suite judges it (`tests/mcs.sh`, docs/services.md).

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use liqo_api::clusterset::{ServiceExport, ServiceImport};
use liqo_e2e::fixture::{One, spec};
use liqo_e2e::wait_for;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

async fn create<K>(api: &Api<K>, object: serde_json::Value) -> Result<()>
where
    K: kube::Resource
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + k8s_openapi::serde::Serialize
        + std::fmt::Debug,
{
    api.create(&PostParams::default(), &serde_json::from_value(object)?)
        .await?;
    Ok(())
}

/// A ServiceExport of Service `name`, without a spec (as most are).
fn export(name: &str) -> serde_json::Value {
    json!({ "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport", "metadata": { "name": name } })
}

/// The status of condition `type_` of export `name`, and its reason.
async fn condition(
    exports: &Api<ServiceExport>,
    name: &str,
    type_: &str,
) -> Result<Option<(String, String)>> {
    Ok(exports
        .get(name)
        .await?
        .status
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == type_))
        .map(|c| (c.status, c.reason)))
}

/// The cluster `home-1`, liqo-rs installed, with the namespace `shop`.
async fn home() -> Result<One> {
    let home = One::start(spec("home", 1, 1)).await?;
    liqo_e2e::install(home.cluster(), "home-1", "10.201.0.0/16", &[]).success();
    namespace(&home.client, "shop").await?;
    Ok(home)
}

async fn namespace(client: &kube::Client, name: &str) -> Result<()> {
    create(
        &Api::<Namespace>::all(client.clone()),
        json!({ "metadata": { "name": name } }),
    )
    .await
}

/// Service `name` of `shop` whose one endpoint is at `address`.
async fn service_at(client: &kube::Client, name: &str, address: &str) -> Result<()> {
    create(&Api::<Service>::namespaced(client.clone(), "shop"),
        json!({ "metadata": { "name": name }, "spec": { "ports": [{ "name": "http", "port": 80, "targetPort": 8080 }] } }),
    )
    .await?;
    create(&Api::<EndpointSlice>::namespaced(client.clone(), "shop"),
        json!({
            "metadata": { "name": format!("{name}-1"), "labels": { "kubernetes.io/service-name": name } },
            "addressType": "IPv4",
            "endpoints": [{ "addresses": [address], "conditions": { "ready": true } }],
            "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
        }),
    )
    .await
}

/// A ServiceExport in `namespace` of each of `names`.
async fn export_each(client: &kube::Client, namespace: &str, names: &[&str]) -> Result<()> {
    for name in names {
        create(
            &Api::<ServiceExport>::namespaced(client.clone(), namespace),
            export(name),
        )
        .await?;
    }
    Ok(())
}

/// The EndpointSlices of the import of `name`.
async fn import_slices(slices: &Api<EndpointSlice>, name: &str) -> Result<Vec<EndpointSlice>> {
    Ok(slices
        .list(
            &ListParams::default()
                .labels(&format!("multicluster.kubernetes.io/service-name={name}")),
        )
        .await?
        .items)
}

/// The export of `shop/web` is imported: a clusterset IP, which is the
/// cluster IP of the Service kept beside it; its ports; its endpoint; this
/// cluster in its status; and it says so in its conditions.
async fn web_is_imported_as_exported(client: &kube::Client) -> Result<()> {
    let exports: Api<ServiceExport> = Api::namespaced(client.clone(), "shop");
    let imports: Api<ServiceImport> = Api::namespaced(client.clone(), "shop");
    let services: Api<Service> = Api::namespaced(client.clone(), "shop");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "shop");
    wait_for("the import of shop/web", WAIT, || async {
        Ok(imports
            .get_opt("web")
            .await?
            .is_some_and(|i| !i.spec.ips.is_empty()))
    })
    .await?;
    let import = imports.get("web").await?;
    assert_eq!(import.spec.type_, "ClusterSetIP");
    assert_eq!(import.spec.ports.len(), 1);
    assert_eq!(
        (
            import.spec.ports[0].port,
            import.spec.ports[0].protocol.as_str()
        ),
        (80, "TCP")
    );
    assert_eq!(import.spec.ip_families, ["IPv4"]);
    let derived = services.get("liqo-mcs-web").await?;
    assert_eq!(
        derived.spec.as_ref().and_then(|s| s.cluster_ip.clone()),
        Some(import.spec.ips[0].clone()),
        "the clusterset IP is the derived Service's"
    );
    assert!(
        derived
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .is_none()
    );
    wait_for("the import's status", WAIT, || async {
        Ok(imports
            .get("web")
            .await?
            .status
            .is_some_and(|s| s.clusters.iter().any(|c| c.cluster == "home-1")))
    })
    .await?;
    let mcs = import_slices(&slices, "web").await?;
    let [slice] = &mcs[..] else {
        anyhow::bail!("one EndpointSlice of the import: {mcs:?}");
    };
    let labels = slice.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("multicluster.kubernetes.io/source-cluster")
            .map(String::as_str),
        Some("home-1")
    );
    assert_eq!(
        labels.get("kubernetes.io/service-name").map(String::as_str),
        Some("liqo-mcs-web")
    );
    assert_eq!(
        labels
            .get("endpointslice.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("gateway.liqo.io")
    );
    assert_eq!(slice.endpoints[0].addresses, ["10.201.0.9"]);
    assert_eq!(slice.ports.as_ref().context("ports")?[0].port, Some(8080));
    for (type_, status, reason) in [
        ("Valid", "True", "Valid"),
        ("Ready", "True", "Exported"),
        ("Conflict", "False", "NoConflicts"),
    ] {
        wait_for(&format!("web's {type_}"), WAIT, || async {
            Ok(condition(&exports, "web", type_).await?
                == Some((status.to_owned(), reason.to_owned())))
        })
        .await?;
    }
    Ok(())
}

/// An export is imported (its clusterset IP the cluster IP of the Service
/// kept beside it, its ports, its endpoints, this cluster in its status),
/// and unexported, it goes; an import made by hand and an export in a
/// peer's namespace are none of the gateway's.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_imports_what_it_exports_and_leaves_alone_what_it_did_not_make() -> Result<()> {
    let home = home().await?;
    let client = home.client.clone();
    // A Service whose one endpoint is a pod of this cluster, and one that
    // someone imports by hand.
    service_at(&client, "web", "10.201.0.9").await?;
    create(
        &Api::<Service>::namespaced(client.clone(), "shop"),
        json!({ "metadata": { "name": "manual" }, "spec": { "ports": [{ "port": 80 }] } }),
    )
    .await?;
    let by_hand = json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
        "metadata": { "name": "manual" },
        "spec": { "type": "ClusterSetIP", "ips": ["10.101.99.99"], "ports": [{ "port": 80, "protocol": "TCP" }] },
    });
    create(
        &Api::<ServiceImport>::namespaced(client.clone(), "shop"),
        by_hand,
    )
    .await?;
    export_each(&client, "shop", &["web", "manual"]).await?;
    // An export in a peer's namespace is none of this cluster's.
    namespace(&client, "liqo-tenant-evil").await?;
    create(
        &Api::<Service>::namespaced(client.clone(), "liqo-tenant-evil"),
        json!({ "metadata": { "name": "web" }, "spec": { "ports": [{ "port": 80 }] } }),
    )
    .await?;
    export_each(&client, "liqo-tenant-evil", &["web"]).await?;

    let exports: Api<ServiceExport> = Api::namespaced(client.clone(), "shop");
    let imports: Api<ServiceImport> = Api::namespaced(client.clone(), "shop");
    let services: Api<Service> = Api::namespaced(client.clone(), "shop");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "shop");

    web_is_imported_as_exported(&client).await?;

    // The import made by hand is left as it was.
    let manual = imports.get("manual").await?;
    assert_eq!(manual.spec.ips, ["10.101.99.99"]);
    assert!(manual.metadata.labels.unwrap_or_default().is_empty());
    // Nothing of the peer's namespace is exported or imported.
    let theirs: Api<ServiceImport> = Api::namespaced(client.clone(), "liqo-tenant-evil");
    assert!(theirs.list(&ListParams::default()).await?.items.is_empty());
    let published =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "liqo")
            .get("liqo-exports")
            .await?;
    let text = published
        .data
        .unwrap_or_default()
        .remove("exports.json")
        .unwrap_or_default();
    assert!(
        text.contains("\"web\"") && !text.contains("liqo-tenant-evil"),
        "{text}"
    );

    // Unexported: the import, its Service and its slice go.
    exports.delete("web", &DeleteParams::default()).await?;
    wait_for("the import to go", WAIT, || async {
        Ok(imports.get_opt("web").await?.is_none()
            && services.get_opt("liqo-mcs-web").await?.is_none()
            && import_slices(&slices, "web").await?.is_empty())
    })
    .await?;
    assert!(
        imports.get_opt("manual").await?.is_some(),
        "the one made by hand stays"
    );
    Ok(())
}

/// An export without a Service, or of an ExternalName, is not valid: said
/// on it, and nothing imported; an endpoint outside the pod CIDR is not
/// exported (no peer reaches it).
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_says_why_an_export_is_not_valid_and_exports_no_endpoint_outside_its_pods()
-> Result<()> {
    let home = home().await?;
    let client = home.client.clone();
    // A Service with an endpoint outside the pod CIDR, an ExternalName,
    // and an export of no Service.
    service_at(&client, "outside", "192.0.2.7").await?;
    create(&Api::<Service>::namespaced(client.clone(), "shop"),
        json!({ "metadata": { "name": "alias" }, "spec": { "type": "ExternalName", "externalName": "example.com" } }),
    )
    .await?;
    export_each(&client, "shop", &["outside", "ghost", "alias"]).await?;
    let exports: Api<ServiceExport> = Api::namespaced(client.clone(), "shop");
    let imports: Api<ServiceImport> = Api::namespaced(client.clone(), "shop");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "shop");

    for (name, reason) in [("ghost", "NoService"), ("alias", "InvalidServiceType")] {
        wait_for(&format!("{name} not valid"), WAIT, || async {
            Ok(condition(&exports, name, "Valid").await?
                == Some(("False".to_owned(), reason.to_owned())))
        })
        .await?;
        assert!(
            imports.get_opt(name).await?.is_none(),
            "{name} is not imported"
        );
    }
    wait_for("outside's import", WAIT, || async {
        Ok(imports.get_opt("outside").await?.is_some())
    })
    .await?;
    let outside = import_slices(&slices, "outside").await?;
    assert!(
        outside.iter().all(|s| s.endpoints.is_empty()),
        "{outside:?}"
    );
    Ok(())
}
