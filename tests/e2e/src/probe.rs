//! The least-privilege probe: the requests a peer's own credential makes
//! on its provider, each allowed one paired with refused ones.

/// Real requests with the consumer's identity on the provider: what
/// offloading needs succeeds, everything else is refused with 403. Returns
/// how many allowed requests succeeded.
pub async fn least_privilege_probe(peer: &kube::Client, tenant_ns: &str) -> anyhow::Result<usize> {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    use k8s_openapi::api::core::v1::{
        ConfigMap, Namespace, Pod, ResourceQuota, Secret as CoreSecret,
    };
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
    use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
    use liqo_api::names;
    use serde_json::json;

    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({ "metadata": { "name": name } })).expect("configmap")
    };
    let forbidden = |what: &str, r: Result<(), kube::Error>| {
        assert!(
            matches!(&r, Err(kube::Error::Api(s)) if s.code == 403),
            "the peer identity may {what}: {r:?}"
        );
    };
    // What it needs, in its tenant namespace (its end of the tunnel), on
    // the provider's identity, and its own Tenant record.
    let mut allowed = 0;
    let connections: Api<liqo_api::networking::Connection> =
        Api::namespaced(peer.clone(), tenant_ns);
    connections.list(&ListParams::default()).await?;
    allowed += 1;
    Api::<ConfigMap>::namespaced(peer.clone(), names::NAMESPACE)
        .get(names::IDENTITY_CONFIGMAP)
        .await?;
    allowed += 1;
    let tenant = tenant_ns
        .strip_prefix(names::peering::TENANT_NAMESPACE_PREFIX)
        .unwrap_or_default();
    Api::<liqo_api::authentication::Tenant>::all(peer.clone())
        .get(tenant)
        .await?;
    allowed += 1;
    // Nothing else in its tenant namespace: pods, ConfigMaps and Secrets
    // run and live in its twin namespaces, under their rules.
    let in_tenant: Api<ConfigMap> = Api::namespaced(peer.clone(), tenant_ns);
    forbidden(
        "create a configmap in its tenant namespace",
        in_tenant
            .create(&PostParams::default(), &cm("probe"))
            .await
            .map(|_| ()),
    );
    forbidden(
        "list pods in its tenant namespace",
        Api::<Pod>::namespaced(peer.clone(), tenant_ns)
            .list(&ListParams::default())
            .await
            .map(|_| ()),
    );
    forbidden(
        "read secrets in its tenant namespace",
        Api::<CoreSecret>::namespaced(peer.clone(), tenant_ns)
            .list(&ListParams::default())
            .await
            .map(|_| ()),
    );
    forbidden(
        "read another tenant's record",
        Api::<liqo_api::authentication::Tenant>::all(peer.clone())
            .get("someone-else")
            .await
            .map(|_| ()),
    );

    // Everything else: other namespaces, cluster-scoped writes, other
    // tenants, certificates, secrets outside its namespace, its own RBAC.
    fn r<T>(x: Result<T, kube::Error>) -> Result<(), kube::Error> {
        x.map(|_| ())
    }
    forbidden(
        "list pods cluster-wide",
        r(Api::<Pod>::all(peer.clone())
            .list(&ListParams::default())
            .await),
    );
    forbidden(
        "list pods in default",
        r(Api::<Pod>::namespaced(peer.clone(), "default")
            .list(&ListParams::default())
            .await),
    );
    forbidden(
        "list pods in kube-system",
        r(Api::<Pod>::namespaced(peer.clone(), "kube-system")
            .list(&ListParams::default())
            .await),
    );
    forbidden(
        "create a configmap in default",
        r(Api::<ConfigMap>::namespaced(peer.clone(), "default")
            .create(&PostParams::default(), &cm("x"))
            .await),
    );
    forbidden(
        "read secrets in kube-system",
        r(Api::<CoreSecret>::namespaced(peer.clone(), "kube-system")
            .list(&ListParams::default())
            .await),
    );
    forbidden(
        "read secrets in liqo",
        r(
            Api::<CoreSecret>::namespaced(peer.clone(), names::NAMESPACE)
                .list(&ListParams::default())
                .await,
        ),
    );
    forbidden(
        "read other configmaps in liqo",
        r(Api::<ConfigMap>::namespaced(peer.clone(), names::NAMESPACE)
            .list(&ListParams::default())
            .await),
    );
    forbidden(
        "change the provider's identity",
        r(Api::<ConfigMap>::namespaced(peer.clone(), names::NAMESPACE)
            .patch(
                names::IDENTITY_CONFIGMAP,
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"cluster-id": "evil"}})),
            )
            .await),
    );
    forbidden(
        "list namespaces",
        r(Api::<Namespace>::all(peer.clone())
            .list(&ListParams::default())
            .await),
    );
    let ns: Namespace = serde_json::from_value(json!({ "metadata": { "name": "peer-made" } }))?;
    forbidden(
        "create a namespace",
        r(Api::<Namespace>::all(peer.clone())
            .create(&PostParams::default(), &ns)
            .await),
    );
    forbidden(
        "delete its tenant namespace",
        r(Api::<Namespace>::all(peer.clone())
            .delete(tenant_ns, &Default::default())
            .await),
    );
    forbidden(
        "list nodes",
        r(Api::<k8s_openapi::api::core::v1::Node>::all(peer.clone())
            .list(&ListParams::default())
            .await),
    );
    forbidden(
        "list CSRs",
        r(Api::<CertificateSigningRequest>::all(peer.clone())
            .list(&ListParams::default())
            .await),
    );
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": { "name": "peer-made" },
        "spec": { "request": "", "signerName": "kubernetes.io/kube-apiserver-client", "usages": ["client auth"] },
    }))?;
    forbidden(
        "create a CSR",
        r(Api::<CertificateSigningRequest>::all(peer.clone())
            .create(&PostParams::default(), &csr)
            .await),
    );
    forbidden(
        "approve a CSR",
        r(Api::<CertificateSigningRequest>::all(peer.clone())
            .patch_approval(
                "anything",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"conditions": [{"type": "Approved", "status": "True"}]}}),
                ),
            )
            .await),
    );
    forbidden(
        "list rolebindings in its namespace",
        r(Api::<RoleBinding>::namespaced(peer.clone(), tenant_ns)
            .list(&ListParams::default())
            .await),
    );
    let rb: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "escalate" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "kind": "User", "name": "liqo.io:peer:consumer-1", "apiGroup": "rbac.authorization.k8s.io" }],
    }))?;
    forbidden(
        "bind itself cluster-admin in its namespace",
        r(Api::<RoleBinding>::namespaced(peer.clone(), tenant_ns)
            .create(&PostParams::default(), &rb)
            .await),
    );
    forbidden(
        "list clusterrolebindings",
        r(Api::<ClusterRoleBinding>::all(peer.clone())
            .list(&ListParams::default())
            .await),
    );
    forbidden(
        "read another tenant's namespace",
        r(
            Api::<Pod>::namespaced(peer.clone(), "liqo-tenant-someone-else")
                .list(&ListParams::default())
                .await,
        ),
    );
    forbidden(
        "list tenants",
        r(Api::<liqo_api::authentication::Tenant>::all(peer.clone())
            .list(&ListParams::default())
            .await),
    );
    forbidden(
        "change its grant",
        r(Api::<ResourceQuota>::namespaced(peer.clone(), tenant_ns)
            .patch(
                "liqo-grant",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"hard": {"pods": "1000"}}})),
            )
            .await),
    );
    forbidden(
        "read the sharing policies",
        r(Api::<liqo_api::sharing::SharingPolicy>::all(peer.clone())
            .list(&ListParams::default())
            .await),
    );

    // The clusterset (docs/services.md): it carries its exports in its
    // own Connection, and that is all. It may neither export nor import
    // on the provider, read what the provider exports or imports, nor
    // write what the provider's gateway publishes to it.
    if let Some(connection) = connections
        .list(&ListParams::default())
        .await?
        .items
        .first()
    {
        let name = connection.metadata.name.clone().unwrap_or_default();
        let exports = json!({ "clusterId": connection.spec.cluster_id, "services": [] });
        connections
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "exports": exports } })),
            )
            .await?;
        allowed += 1;
        forbidden(
            "write what the provider publishes to it",
            r(connections
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": { "exports": exports } })),
                )
                .await),
        );
    }
    let export: liqo_api::clusterset::ServiceExport = serde_json::from_value(json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport", "metadata": { "name": "probe" },
    }))?;
    for namespace in [tenant_ns, "default"] {
        forbidden(
            &format!("export a Service in {namespace}"),
            r(
                Api::<liqo_api::clusterset::ServiceExport>::namespaced(peer.clone(), namespace)
                    .create(&PostParams::default(), &export)
                    .await,
            ),
        );
    }
    forbidden(
        "read the provider's exports",
        r(
            Api::<liqo_api::clusterset::ServiceExport>::all(peer.clone())
                .list(&ListParams::default())
                .await,
        ),
    );
    forbidden(
        "read the provider's imports",
        r(
            Api::<liqo_api::clusterset::ServiceImport>::all(peer.clone())
                .list(&ListParams::default())
                .await,
        ),
    );
    forbidden(
        "read the provider's published exports",
        r(Api::<ConfigMap>::namespaced(peer.clone(), names::NAMESPACE)
            .get(names::CLUSTERSET_EXPORTS)
            .await),
    );
    Ok(allowed)
}
