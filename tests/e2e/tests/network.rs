//! The network of a peering, end to end with real packets: `liqoctl peer`
//! links two clusters' pod networks through their gateways, and pods of
//! each reach pods of the other, with identical pod CIDRs on both sides.
//!
//! The testbed's API servers and agents run on this machine's loopback, so
//! each cluster's node is simulated by a network namespace (as in
//! `nat.rs`): a node namespace that forwards, with a pod namespace behind
//! it, the two nodes joined by a veth "internet". Each gateway agent runs
//! as the testbed runs every agent, and is told to run its tunnels in its
//! node's namespace (`--tunnel-netns`): the tunnels' devices, sockets,
//! routes and NAT tables live there, decided by the agent from the
//! Connections `liqoctl` wrote. The Services each side exports are
//! imported on both while the networks are linked, and withdrawn by
//! `network disconnect`. Needs root, iproute2, nftables and ping.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use liqo_api::clusterset::{LABEL_SERVICE_NAME, ServiceExport, ServiceImport};
use liqo_api::names;
use liqo_api::networking::{Connection, ConnectionStatus};
use liqo_e2e::fixture::{Pair, Stage};
use liqo_e2e::netns::{Cluster as Site, NetNs, link, ping, transfer_seen};
use liqo_e2e::wait_for;
use serde_json::json;

/// Both clusters' pods.
const POD_CIDR: &str = "10.200.0.0/16";
/// Where each side sees the other's pods: the default pool's first /16.
const SEEN_AS: &str = "100.64.0.0/16";
const CONSUMER_POD: &str = "10.200.1.2";
const PROVIDER_POD: &str = "10.200.2.3";
/// The provider's pod as the consumer's pods reach it, and the other way.
const PROVIDER_POD_SEEN: &str = "100.64.2.3";
const CONSUMER_POD_SEEN: &str = "100.64.1.2";
const TIMEOUT: Duration = Duration::from_secs(60);
/// The namespace of the Services each side exports.
const CLUSTERSET_NS: &str = "shop";
/// The Services each side imports while the networks are linked, sorted.
const BOTH: [&str; 2] = ["back", "front"];

/// The clusters, installed with their gateways' tunnels in the nodes'
/// namespaces, and the namespaces of the nodes and their pods. The clusters
/// stop before the namespaces go.
struct Net {
    pair: Pair,
    /// The consumer's node and pod.
    a: Site,
    /// The provider's node and pod.
    b: Site,
    /// The consumer's end of the link between the nodes.
    internet: String,
    consumer_client: kube::Client,
    provider_client: kube::Client,
}

impl Net {
    async fn start() -> Result<Self> {
        let a = Site::new("na", &[CONSUMER_POD])?;
        let b = Site::new("nb", &[PROVIDER_POD])?;
        let (internet, _) = link(&a.node, "192.168.78.1/24", &b.node, "192.168.78.2/24")?;
        let pair = Pair::at(Stage::Started).await?;
        for (cluster, id, address, node) in [
            (pair.consumer(), "consumer-1", "192.168.78.1", &a.node),
            (pair.provider(), "provider-1", "192.168.78.2", &b.node),
        ] {
            let address = format!("--gateway-address={address}");
            liqo_e2e::install(cluster, id, POD_CIDR, &[&address]).success();
            tunnels_in(&cluster.client().await?, node).await?;
        }
        Ok(Self {
            consumer_client: pair.consumer_client.clone(),
            provider_client: pair.provider_client.clone(),
            pair,
            a,
            b,
            internet,
        })
    }

    /// The Connection of each end: the consumer's, the provider's.
    async fn ends(&self) -> Result<(Connection, Connection)> {
        let here = Api::<Connection>::namespaced(self.consumer_client.clone(), names::NAMESPACE)
            .get("provider-1")
            .await?;
        let there =
            Api::<Connection>::namespaced(self.provider_client.clone(), "liqo-tenant-consumer-1")
                .get("consumer-1")
                .await?;
        Ok((here, there))
    }

    /// Both clusters, with their names.
    fn clients(&self) -> [(&kube::Client, &'static str); 2] {
        [
            (&self.consumer_client, "consumer"),
            (&self.provider_client, "provider"),
        ]
    }
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn peered_pods_reach_each_other_through_the_gateways() -> Result<()> {
    let net = Net::start().await?;
    let status = peering_links_the_networks(&net).await?;
    the_virtual_node_says_whether_the_tunnel_is_up(&net).await?;
    the_tunnels_health_is_in_its_status_info_and_metrics(&net).await?;
    a_restarted_gateway_takes_back_its_decisions(&net, &status).await?;
    each_side_imports_the_services_the_other_exports(&net).await?;
    disconnect_unlinks_and_withdraws_imports_and_connect_brings_them_back(&net).await?;
    an_unknown_peer_is_one_clear_line(&net);
    unpeer_takes_the_tunnel_with_it(&net).await?;
    Ok(())
}

/// Peering links the networks and says how each side sees the other, and
/// pods reach pods both ways; the status of the provider's end.
async fn peering_links_the_networks(net: &Net) -> Result<ConnectionStatus> {
    let out = net
        .pair
        .on_consumer(&["peer", "--remote-kubeconfig", &net.pair.remote()])
        .success();
    assert!(
        out.stdout.contains(&format!(
            "network: tunnel to 192.168.78.2:51820; its pods are seen here as {SEEN_AS}, ours there as {SEEN_AS}"
        )),
        "{}",
        out.stdout
    );
    wait_for("both ends established", TIMEOUT, || async {
        let (here, there) = net.ends().await?;
        Ok(here.is_established() && there.is_established())
    })
    .await?;
    let (_, there) = net.ends().await?;
    let status = there.status.context("no status")?;
    assert_eq!(status.endpoint.as_deref(), Some("192.168.78.2:51820"));
    assert_eq!(status.peer_seen_as.as_deref(), Some(SEEN_AS));
    let device = status.interface.clone().context("no interface")?;
    assert!(
        net.b
            .node
            .stdout("ip", &["route", "show", "dev", &device])?
            .contains(SEEN_AS),
        "the provider's node routes the consumer's pods into {device}"
    );
    // Pods reach pods both ways, each seeing the other at its remapped
    // address, host part kept.
    reach(&net.a, &net.b).await?;
    Ok(status)
}

/// The virtual node tells whether the tunnel is up: cut the link between
/// the nodes, and NetworkUnavailable turns True once the provider's
/// gateway has gone unheard (30 s); mend it, and it turns False again.
async fn the_virtual_node_says_whether_the_tunnel_is_up(net: &Net) -> Result<()> {
    let unavailable = |status: &'static str, reason: &'static str| {
        let client = net.consumer_client.clone();
        async move {
            let node = Api::<Node>::all(client).get("liqo-provider-1").await?;
            Ok(node
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| {
                    c.type_ == "NetworkUnavailable"
                        && c.status == status
                        && c.reason.as_deref() == Some(reason)
                }))
        }
    };
    wait_for(
        "NetworkUnavailable=False (TunnelEstablished)",
        TIMEOUT,
        || unavailable("False", "TunnelEstablished"),
    )
    .await?;
    net.a.node.ip(&["link", "set", &net.internet, "down"])?;
    wait_for("NetworkUnavailable=True (TunnelDown)", TIMEOUT, || {
        unavailable("True", "TunnelDown")
    })
    .await?;
    net.a.node.ip(&["link", "set", &net.internet, "up"])?;
    wait_for("NetworkUnavailable=False again", TIMEOUT, || {
        unavailable("False", "TunnelEstablished")
    })
    .await
    .inspect_err(|_| {
        eprintln!("consumer's agents:\n{}", net.pair.consumer().pod_logs());
        eprintln!("provider's agents:\n{}", net.pair.provider().pod_logs());
    })
}

/// The tunnel's health: in the statuses, in info, in the metrics.
async fn the_tunnels_health_is_in_its_status_info_and_metrics(net: &Net) -> Result<()> {
    wait_for(
        "traffic and a probe's round trip in the status",
        TIMEOUT,
        || async {
            let (here, _) = net.ends().await?;
            Ok(here
                .status
                .is_some_and(|s| s.rx_bytes > 0 && s.tx_bytes > 0 && s.last_handshake.is_some()))
        },
    )
    .await?;
    let info = net.pair.on_consumer(&["info", "-o", "json"]).success();
    let info: serde_json::Value = serde_json::from_str(&info.stdout)?;
    let network = &info["peerings"][0]["network"];
    assert_eq!(network["established"], true, "{info:#}");
    assert_eq!(network["peerPodsSeenAs"], SEEN_AS);
    assert_eq!(network["endpoint"], "192.168.78.2:51820");
    let gateway_ip = gateway_pod_ip(&net.consumer_client).await?;
    let metrics = reqwest::Client::builder()
        .no_proxy()
        .build()?
        .get(format!(
            "http://{gateway_ip}:{}/metrics",
            names::HEALTH_PORT
        ))
        .send()
        .await?
        .text()
        .await?;
    assert!(
        metrics.contains(
            "liqo_gateway_tunnel_established{connection=\"liqo/provider-1\",peer=\"provider-1\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("liqo_gateway_tunnel_transmit_bytes_total{"),
        "{metrics}"
    );
    Ok(())
}

/// A gateway that restarts takes back the same decisions (port, remapped
/// CIDR) as `before` from the API, and traffic flows again.
async fn a_restarted_gateway_takes_back_its_decisions(
    net: &Net,
    before: &ConnectionStatus,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(net.provider_client.clone(), names::NAMESPACE);
    let gateway = gateway_pod(&net.provider_client).await?;
    let old_name = gateway.metadata.name.clone().context("nameless")?;
    // Whole seconds, as the status has them.
    let deleted_at =
        k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second())?;
    pods.delete(&old_name, &Default::default()).await?;
    // Established by the new gateway's tunnel: after the old pod is gone
    // (its tunnel with it), a handshake made since.
    wait_for(
        "the restarted provider gateway's handshake",
        TIMEOUT,
        || async {
            if pods.get_opt(&old_name).await?.is_some() {
                return Ok(false);
            }
            let (_, there) = net.ends().await?;
            let since = there
                .status
                .as_ref()
                .and_then(|s| s.last_handshake.as_deref())
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
            Ok(there.is_established() && since.is_some_and(|t| t >= deleted_at))
        },
    )
    .await?;
    let (_, there) = net.ends().await?;
    let again = there.status.context("no status")?;
    assert_eq!(again.endpoint, before.endpoint);
    assert_eq!(again.peer_seen_as, before.peer_seen_as);
    reach(&net.a, &net.b).await
}

/// The clusterset: a Service exported on each side (one endpoint, a pod
/// of its cluster) is imported on both.
async fn each_side_imports_the_services_the_other_exports(net: &Net) -> Result<()> {
    for (client, service, pod) in [
        (&net.consumer_client, "front", CONSUMER_POD),
        (&net.provider_client, "back", PROVIDER_POD),
    ] {
        export_service(client, service, pod).await?;
    }
    for (client, name) in net.clients() {
        wait_for(&format!("the {name} imports both"), TIMEOUT, || async {
            Ok(imported(client).await? == BOTH)
        })
        .await?;
    }
    Ok(())
}

/// Disconnect removes both ends and what the gateways installed, and
/// withdraws each side's imports of the other's Services with their
/// Services and slices; connect brings them back.
async fn disconnect_unlinks_and_withdraws_imports_and_connect_brings_them_back(
    net: &Net,
) -> Result<()> {
    net.pair
        .on_consumer(&["network", "disconnect", "--cluster-id", "provider-1"])
        .success();
    for (client, name, own, other) in [
        (&net.consumer_client, "consumer", "front", "back"),
        (&net.provider_client, "provider", "back", "front"),
    ] {
        wait_for(
            &format!("the {name}'s import of {other} withdrawn"),
            TIMEOUT,
            || async {
                Ok(imported(client).await? == [own]
                    && !imported_objects(client)
                        .await?
                        .iter()
                        .any(|o| o.contains(other)))
            },
        )
        .await?;
    }
    for (node, name) in [(&net.a.node, "consumer"), (&net.b.node, "provider")] {
        wait_for(
            &format!("the {name}'s tunnel device gone"),
            TIMEOUT,
            || async { Ok(!node.stdout("ip", &["link", "show"])?.contains("liqo-")) },
        )
        .await?;
        ensure!(
            !node
                .stdout("nft", &["list", "tables"])?
                .contains("liqo-gw-"),
            "the {name}'s NAT table is left"
        );
    }
    ensure!(net.ends().await.is_err(), "a Connection is left");
    let out = net
        .pair
        .on_consumer(&[
            "network",
            "connect",
            "--cluster-id",
            "provider-1",
            "-o",
            "json",
        ])
        .success();
    let linked: serde_json::Value = serde_json::from_str(&out.stdout)?;
    assert_eq!(linked["providerPodsSeenAs"], SEEN_AS);
    reach(&net.a, &net.b).await?;
    for (client, name) in net.clients() {
        wait_for(
            &format!("the {name} imports both again"),
            TIMEOUT,
            || async { Ok(imported(client).await? == BOTH) },
        )
        .await?;
    }
    Ok(())
}

/// Connecting to an unknown peer is one clear line.
fn an_unknown_peer_is_one_clear_line(net: &Net) {
    let out = net
        .pair
        .on_consumer(&["network", "connect", "--cluster-id", "nobody"])
        .user_error(7);
    assert!(
        out.error_line().contains("no outgoing peering"),
        "{}",
        out.stderr
    );
}

/// Unpeer takes the tunnel with it.
async fn unpeer_takes_the_tunnel_with_it(net: &Net) -> Result<()> {
    net.pair
        .on_consumer(&["unpeer", "--remote-kubeconfig", &net.pair.remote()])
        .success();
    wait_for("the consumer's tunnel device gone", TIMEOUT, || async {
        Ok(!net
            .a
            .node
            .stdout("ip", &["link", "show"])?
            .contains("liqo-"))
    })
    .await?;
    let left = Api::<Connection>::all(net.consumer_client.clone())
        .list(&ListParams::default())
        .await?;
    assert!(left.items.is_empty(), "{:?}", left.items);
    Ok(())
}

/// Ping both ways, and 1 MiB over TCP each way with every byte checked,
/// the receiver seeing the sender at its remapped address.
async fn reach(a: &Site, b: &Site) -> Result<()> {
    let (pa, pb) = (&a.pods[0], &b.pods[0]);
    ping(pa, PROVIDER_POD_SEEN, 3)?;
    ping(pb, CONSUMER_POD_SEEN, 3)?;
    let check = |from: &NetNs, at: &NetNs, bind: &str, to: &str, sender: &str| -> Result<()> {
        let (_, seen) = transfer_seen(
            from,
            at,
            format!("{bind}:5201").parse::<SocketAddr>()?,
            format!("{to}:5201").parse::<SocketAddr>()?,
            1 << 20,
            TIMEOUT,
        )?;
        ensure!(
            seen.ip().to_string() == sender,
            "the receiver saw {seen}, not {sender}"
        );
        Ok(())
    };
    check(pa, pb, PROVIDER_POD, PROVIDER_POD_SEEN, CONSUMER_POD_SEEN)?;
    check(pb, pa, CONSUMER_POD, CONSUMER_POD_SEEN, PROVIDER_POD_SEEN)?;
    Ok(())
}

/// Tells the cluster's gateway to run its tunnels in `node`, and waits
/// for the gateway that does.
async fn tunnels_in(client: &kube::Client, node: &NetNs) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), names::NAMESPACE);
    let gateway = deployments.get(names::GATEWAY).await?;
    let mut args = gateway
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|p| p.containers.into_iter().next())
        .and_then(|c| c.args)
        .unwrap_or_default();
    args.push(format!("--tunnel-netns=/run/netns/{}", node.name));
    let patch = serde_json::json!([{ "op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args }]);
    deployments
        .patch(
            names::GATEWAY,
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(patch)?),
        )
        .await?;
    let netns = format!("--tunnel-netns=/run/netns/{}", node.name);
    wait_for("the gateway with --tunnel-netns", TIMEOUT, || async {
        let Ok(pod) = gateway_pod(client).await else {
            return Ok(false);
        };
        let spec_has = pod.spec.as_ref().is_some_and(|s| {
            s.containers[0]
                .args
                .as_ref()
                .is_some_and(|a| a.contains(&netns))
        });
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        Ok(spec_has && ready)
    })
    .await
}

async fn gateway_pod(client: &kube::Client) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), names::NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=liqo-gateway"))
        .await?;
    let mut live: Vec<Pod> = list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    ensure!(live.len() == 1, "{} gateway pods", live.len());
    Ok(live.remove(0))
}

async fn gateway_pod_ip(client: &kube::Client) -> Result<String> {
    gateway_pod(client)
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .context("the gateway has no IP")
}

/// Exports Service `name` of namespace `shop` (made if missing), whose one
/// endpoint is the pod at `pod`.
async fn export_service(client: &kube::Client, name: &str, pod: &str) -> Result<()> {
    let made = PostParams::default();
    let namespace = serde_json::from_value(json!({ "metadata": { "name": CLUSTERSET_NS } }))?;
    match Api::<Namespace>::all(client.clone())
        .create(&made, &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let service = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "ports": [{ "name": "http", "port": 80, "protocol": "TCP" }] },
    }))?;
    Api::<Service>::namespaced(client.clone(), CLUSTERSET_NS)
        .create(&made, &service)
        .await?;
    let slice = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "kubernetes.io/service-name": name } },
        "addressType": "IPv4",
        "endpoints": [{ "addresses": [pod], "conditions": { "ready": true } }],
        "ports": [{ "name": "http", "port": 80, "protocol": "TCP" }],
    }))?;
    Api::<EndpointSlice>::namespaced(client.clone(), CLUSTERSET_NS)
        .create(&made, &slice)
        .await?;
    let export = ServiceExport::new(name, CLUSTERSET_NS);
    Api::<ServiceExport>::namespaced(client.clone(), CLUSTERSET_NS)
        .create(&made, &export)
        .await?;
    Ok(())
}

/// The names of the ServiceImports of namespace `shop`, sorted.
async fn imported(client: &kube::Client) -> Result<Vec<String>> {
    let mut names: Vec<String> = Api::<ServiceImport>::namespaced(client.clone(), CLUSTERSET_NS)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|i| i.metadata.name)
        .collect();
    names.sort();
    Ok(names)
}

/// The names of the Services and EndpointSlices the gateway keeps beside
/// the imports of namespace `shop`.
async fn imported_objects(client: &kube::Client) -> Result<Vec<String>> {
    let ours = ListParams::default().labels(LABEL_SERVICE_NAME);
    let services = Api::<Service>::namespaced(client.clone(), CLUSTERSET_NS)
        .list(&ours)
        .await?
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name);
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), CLUSTERSET_NS)
        .list(&ours)
        .await?
        .items
        .into_iter()
        .filter_map(|s| s.metadata.labels?.get(LABEL_SERVICE_NAME).cloned());
    Ok(services.chain(slices).collect())
}
