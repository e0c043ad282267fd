//! A Service and its endpoints, seen on both sides.

use super::*;

/// A Service gets its remote copy, and its endpoints on either cluster
/// appear in the other's EndpointSlices.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_is_copied_and_its_endpoints_are_seen_on_both_sides() -> Result<()> {
    let shop = Shop::at(Stage::Offloaded(NS)).await?;
    let (pods, local, prov) = (&shop.pods, shop.local(), shop.provider());
    let pp = PostParams::default();
    let node_name = peering::virtual_node(&ClusterId::new(PROVIDER_ID)?);

    // A Service with one endpoint on the consumer's own node and one
    // offloaded pod.
    let mut on_local_node = pod("local-web", json!([]), json!([]))?;
    let spec = on_local_node.spec.as_mut().context("spec")?;
    // On the consumer's kwok node: in an offloaded namespace, a pod the
    // placement leaves free may land on either side.
    spec.node_selector = Some(BTreeMap::from([("type".to_owned(), "kwok".to_owned())]));
    spec.tolerations = None;
    on_local_node.metadata.labels = Some(BTreeMap::from([("app".to_owned(), "web".to_owned())]));
    let mut offloaded = pod("remote-web", json!([]), json!([]))?;
    offloaded.metadata.labels = Some(BTreeMap::from([("app".to_owned(), "web".to_owned())]));
    pods.create(&pp, &on_local_node).await?;
    pods.create(&pp, &offloaded).await?;
    let services: Api<Service> = Api::namespaced(local.clone(), NS);
    services
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": "web", "namespace": NS },
                "spec": {
                    "type": "NodePort",
                    "selector": { "app": "web" },
                    "ports": [{ "name": "http", "port": 80, "targetPort": 8080 }],
                },
            }))?,
        )
        .await?;
    wait_for("both web pods Running with IPs", WAIT, || async {
        let l = pods.get("local-web").await?;
        let r = pods.get("remote-web").await?;
        Ok(running(&l) && running(&r) && ip(&l).is_some() && ip(&r).is_some())
    })
    .await?;
    let local_ip = ip(&pods.get("local-web").await?).context("ip")?;
    let offloaded_ip = ip(&pods.get("remote-web").await?).context("ip")?;
    let local_node = pods
        .get("local-web")
        .await?
        .spec
        .and_then(|s| s.node_name)
        .context("node")?;
    assert_ne!(local_node, node_name, "local-web runs on a real node");
    let slice_ips = |api: Api<EndpointSlice>, selector: String| async move {
        let ips: Vec<String> = api
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .into_iter()
            .flat_map(|s| s.endpoints)
            .flat_map(|e| e.addresses)
            .collect();
        Ok::<_, anyhow::Error>(ips)
    };
    let local_slices: Api<EndpointSlice> = Api::namespaced(local.clone(), NS);
    let remote_slices: Api<EndpointSlice> = Api::namespaced(prov.clone(), TWIN);
    let ours = format!(
        "kubernetes.io/service-name=web,endpointslice.kubernetes.io/managed-by=virtual-kubelet.liqo.io,{}={}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE
    );
    let providers = "kubernetes.io/service-name=web,endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io".to_owned();
    let seen = std::sync::Mutex::new((Vec::new(), Vec::new(), Vec::new()));
    let waited = wait_for("the endpoints on both sides", WAIT, || {
        let (seen, local_slices, remote_slices) = (&seen, &local_slices, &remote_slices);
        let (ours, providers, local_ip, offloaded_ip) =
            (&ours, &providers, &local_ip, &offloaded_ip);
        async move {
            let now = (
                slice_ips(
                    local_slices.clone(),
                    "kubernetes.io/service-name=web".to_owned(),
                )
                .await?,
                slice_ips(remote_slices.clone(), ours.clone()).await?,
                slice_ips(remote_slices.clone(), providers.clone()).await?,
            );
            let done = now.0.contains(local_ip)
                && now.0.contains(offloaded_ip)
                && now.1 == vec![local_ip.clone()]
                && now.2 == vec![offloaded_ip.clone()];
            *seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))? = now;
            Ok(done)
        }
    })
    .await;
    waited.with_context(|| format!("local-web {local_ip}, remote-web {offloaded_ip}; (local slices, our remote slices, the provider's slices): {seen:?}"))?;
    let remote_svc = Api::<Service>::namespaced(prov.clone(), TWIN)
        .get("web")
        .await?;
    assert!(is_ours(&remote_svc.metadata));
    let spec = remote_svc.spec.context("spec")?;
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(
        spec.selector,
        Some(BTreeMap::from([("app".to_owned(), "web".to_owned())]))
    );
    let ports = spec.ports.context("ports")?;
    assert_eq!((ports[0].port, ports[0].node_port), (80, None));
    let local_cluster_ip = services.get("web").await?.spec.and_then(|s| s.cluster_ip);
    assert!(spec.cluster_ip.is_some());
    eprintln!(
        "service web: local {local_cluster_ip:?}, remote {:?}",
        spec.cluster_ip
    );
    Ok(())
}
