//! `liqoctl test network` on two peered clusters whose pods have real
//! network namespaces (the testbed's pod-network mode) and identical pod
//! CIDRs: traffic crosses pod to pod and pod to Service both ways, through
//! the gateways, the provider's behind a NodePort Service (its endpoint is
//! the node port kube-proxy maps to the tunnel's port); a peering without a
//! tunnel is refused before anything is made; a cut link fails the checks
//! with exit 9, naming the hops; nothing is left on either cluster.
//! Needs root, iproute2 and nftables.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::{Api, ListParams};
use liqo_api::names;
use liqo_api::networking::Connection;
use liqo_e2e::fixture::{self, Pair, Stage};
use liqo_e2e::{liqoctl, wait_for};
use liqo_testbed::{ClusterSpec, HOST_PROCESS_TAINT};

/// Both clusters' pods: each sees the other's under the remap pool's
/// first /16.
const POD_CIDR: &str = "10.200.0.0/16";
const SEEN_AS: &str = "100.64.";
const TIMEOUT: Duration = Duration::from_secs(90);

fn spec(name: &str, index: u8) -> ClusterSpec {
    // The provider's offloaded pods must run for real: no kwok node for
    // the scheduler to pick instead of the host-process node.
    let mut spec = fixture::spec(name, index, 0);
    spec.pod_cidr = POD_CIDR.to_owned();
    spec.pod_network = true;
    spec
}

/// The namespaces whose name says they are `test network`'s.
async fn test_namespaces(client: &kube::Client) -> Result<Vec<String>> {
    Ok(Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .filter(|n| n.starts_with("liqo-test-network-"))
        .collect())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_network_crosses_both_ways_and_tells_where_it_breaks() -> Result<()> {
    let pair = Pair::with_specs(spec("consumer", 1), spec("provider", 2), Stage::Started).await?;
    let (consumer, provider) = (pair.consumer(), pair.provider());
    liqo_e2e::install(consumer, "consumer-1", POD_CIDR, &[]).success();
    liqo_e2e::install(
        provider,
        "provider-1",
        POD_CIDR,
        &[
            "--gateway-service-type=NodePort",
            "--tunnel-ports=51820-51829",
        ],
    )
    .success();
    // The provider's only node is tainted for host processes: its terms
    // let peers' pods tolerate that taint, or they would never schedule.
    let tolerations = format!("--tolerations={HOST_PROCESS_TAINT}");
    liqoctl(
        Some(provider.kubeconfig_path()),
        &["sharing-policy", "set", &tolerations],
    )
    .success();
    let consumer_client = consumer.client().await?;
    let provider_client = provider.client().await?;
    let kubeconfig = Some(consumer.kubeconfig_path());

    // Peered without the network first: nothing to check yet.
    let remote = provider.kubeconfig_path().to_str().context("path")?;
    liqoctl(
        kubeconfig,
        &["peer", "--remote-kubeconfig", remote, "--no-network"],
    )
    .success();
    let refused = liqoctl(kubeconfig, &["test", "network"]).user_error(6);
    assert!(
        refused.error_line().contains("are not linked")
            && refused
                .error_line()
                .contains("liqoctl network connect --cluster-id provider-1"),
        "{}",
        refused.error_line()
    );
    liqoctl(kubeconfig, &["test", "network", "--cluster-id", "nobody"]).user_error(7);
    ensure!(test_namespaces(&consumer_client).await?.is_empty());

    // Linked: the provider listens behind its NodePort Service.
    liqoctl(
        kubeconfig,
        &["network", "connect", "--cluster-id", "provider-1"],
    )
    .success();
    let service = Api::<Service>::namespaced(provider_client.clone(), names::NAMESPACE)
        .get(names::GATEWAY)
        .await?;
    let node_port = service
        .spec
        .and_then(|s| s.ports)
        .and_then(|p| p.into_iter().find(|p| p.port == 51820))
        .and_then(|p| p.node_port)
        .context("no node port for 51820")?;
    let end = Api::<Connection>::namespaced(consumer_client.clone(), names::NAMESPACE)
        .get("provider-1")
        .await?;
    let node = provider.node_address().context("no node address")?;
    assert_eq!(
        end.spec.endpoint.as_deref(),
        Some(format!("{node}:{node_port}").as_str()),
        "the consumer dials the provider's node port"
    );

    // Every check passes, each side seeing the other's pods remapped.
    let run = liqoctl(kubeconfig, &["test", "network", "-o", "json"]);
    let run = run.success();
    let report: serde_json::Value = serde_json::from_str(&run.stdout)?;
    assert_eq!(report["passed"], true, "{report:#}");
    let checks = report["checks"].as_array().context("checks")?;
    assert_eq!(checks.len(), 5, "{report:#}");
    for check in checks {
        assert_eq!(check["passed"], true, "{check:#}");
        if check["kind"] == "pod" {
            let address = check["address"].as_str().unwrap_or_default();
            let seen = check["seenFrom"].as_str().unwrap_or_default();
            assert!(address.starts_with(SEEN_AS), "{check:#}");
            assert!(seen.starts_with(SEEN_AS), "{check:#}");
        }
    }
    let kinds: Vec<(&str, &str)> = checks
        .iter()
        .map(|c| {
            (
                c["from"].as_str().unwrap_or_default(),
                c["kind"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("consumer", "pod"),
            ("consumer", "service"),
            ("provider", "pod"),
            ("provider", "service"),
            ("provider", "clusterset")
        ]
    );
    // The provider's pod reached the consumer's exported Service by its
    // clusterset name.
    let by_name = &checks[4];
    assert!(
        by_name["address"]
            .as_str()
            .is_some_and(|a| a.starts_with("server-local.liqo-test-network-")
                && a.ends_with(".svc.clusterset.local:8080")),
        "{by_name:#}"
    );
    ensure!(test_namespaces(&consumer_client).await?.is_empty());
    ensure!(test_namespaces(&provider_client).await?.is_empty());

    // The provider cut off: the tunnel is still believed up (for 30 s), so
    // the check runs, fails with exit 9, says where, and cleans up.
    provider.set_internet_link(false)?;
    let failed = liqoctl(kubeconfig, &["test", "network", "--timeout=150"]).user_error(9);
    assert!(
        failed.error_line().contains("checks failed"),
        "{}",
        failed.error_line()
    );
    // The tunnel is seen down by the end of the clients' 30 s (its peer
    // unheard for 30 s); were it not yet, the hops would be named.
    assert!(
        failed
            .stdout
            .contains("the tunnel between consumer and provider is down")
            || failed
                .stdout
                .contains("the hops: the pod on consumer to its gateway"),
        "{}",
        failed.stdout
    );
    provider.set_internet_link(true)?;
    // Only the pods' network was cut, not the API servers: the namespace
    // and its twin were removed as after a success.
    ensure!(test_namespaces(&consumer_client).await?.is_empty());
    wait_for("no twin left on the provider", TIMEOUT, || async {
        Ok(test_namespaces(&provider_client).await?.is_empty())
    })
    .await?;
    Ok(())
}
