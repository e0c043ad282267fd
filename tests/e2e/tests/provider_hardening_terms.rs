//! `consumer-2`, peered with the same provider as `consumer-1`, under the
//! terms its provider opted into for it alone (baseline, NodePort
//! Services, a priority class, a toleration, then privileged, then the
//! peers' nodes and a runtime class), each consumer held to its own and
//! both shown in `liqoctl info`; proven with each consumer's own
//! credential straight against the provider's API server (see
//! `provider_hardening`).

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota, Service};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, PostParams};
use liqo_api::shares::SHARE_QUOTA;
use liqo_e2e::fixture::WAIT;
use liqo_e2e::fixture::{self, spec};
use liqo_e2e::{liqoctl, wait_for};
use liqo_testbed::{Cluster, Testbed};
use serde_json::json;

use crate::provider_hardening::{
    NS_SECURITY, PODS, PSA, SERVICES, T1, Tally, from, make_twin, pod, service, twin,
};

/// The three clusters: `consumer` (consumer-1, 10.201.0.0/16), `lab`
/// (consumer-2, 10.203.0.0/16) and `provider` (provider-1, 10.202.0.0/16,
/// two nodes), consumer-2's own terms set on the provider before both
/// consumers peer with it. Returns the testbed, the provider's client, and
/// the credentials of consumer-1 and consumer-2 on the provider.
async fn two_consumers() -> Result<(Testbed, kube::Client, kube::Client, kube::Client)> {
    let specs = vec![
        spec("consumer", 1, 1),
        spec("lab", 3, 1),
        spec("provider", 2, 2),
    ];
    let testbed = fixture::start(specs).await?;
    let consumer = testbed.cluster("consumer");
    let lab = testbed.cluster("lab");
    let provider = testbed.cluster("provider");
    for (cluster, id, cidr) in [
        (consumer, "consumer-1", "10.201.0.0/16"),
        (lab, "consumer-2", "10.203.0.0/16"),
        (provider, "provider-1", "10.202.0.0/16"),
    ] {
        liqo_e2e::install(cluster, id, cidr, &[]).success();
    }
    let on_provider = |args: &[&str]| liqoctl(Some(provider.kubeconfig_path()), args);
    // Every peer at restricted by default, before they peer.
    on_provider(&["sharing-policy", "set", "--pod-security=restricted"]).success();
    // consumer-2's own terms, before it peers: baseline, two node ports,
    // a priority class and a taint of the provider's.
    on_provider(&[
        "sharing-policy",
        "set",
        "--peer=consumer-2",
        "--pod-security=baseline",
        "--node-ports=2",
        "--priority-classes=peer-low",
        "--tolerations=dedicated",
    ])
    .success();
    let remote = provider.kubeconfig_path().to_str().context("path")?;
    for cluster in [consumer, lab] {
        let out = liqoctl(
            Some(cluster.kubeconfig_path()),
            &["peer", "--remote-kubeconfig", remote, "--timeout=120"],
        );
        if out.code != 0 {
            eprintln!("--- agents ---\n{}", cluster.pod_logs());
            eprintln!("--- provider agents ---\n{}", provider.pod_logs());
        }
        out.success();
    }
    let prov = provider.client().await?;
    let one = liqo_e2e::peer_client(consumer, &consumer.client().await?, "provider-1").await?;
    let two = liqo_e2e::peer_client(lab, &lab.client().await?, "provider-1").await?;
    Ok((testbed, prov, one, two))
}

/// consumer-2's twin namespace on the provider.
const T2: &str = "probe-consumer-2";

/// The provider's client, and each consumer's credential there.
struct Peers {
    prov: kube::Client,
    one: kube::Client,
    two: kube::Client,
}

impl Peers {
    /// consumer-1's pods in its twin, and consumer-2's in its own.
    fn pods(&self) -> (Api<Pod>, Api<Pod>) {
        (
            Api::namespaced(self.one.clone(), T1),
            Api::namespaced(self.two.clone(), T2),
        )
    }
}

/// consumer-2, on the same provider, under the terms it was given (and
/// given later), while consumer-1 stays under its own.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_consumer_is_held_to_the_terms_its_provider_gave_it_alone() -> Result<()> {
    let (testbed, prov, one, two) = two_consumers().await?;
    let (consumer, provider) = (testbed.cluster("consumer"), testbed.cluster("provider"));
    let peers = Peers { prov, one, two };
    let mut t = Tally::default();
    each_peerings_terms_are_in_info_on_both_sides(consumer, provider).await?;
    // consumer-1's twin, beside consumer-2's.
    make_twin(
        &mut t,
        &peers.one,
        &peers.prov,
        T1,
        "consumer-1",
        "restricted",
    )
    .await?;
    make_twin(
        &mut t,
        &peers.two,
        &peers.prov,
        T2,
        "consumer-2",
        "baseline",
    )
    .await?;
    consumer_2_runs_at_baseline_with_its_extras_and_consumer_1_does_not(&mut t, &peers).await?;
    consumer_2_has_its_node_ports_and_no_load_balancer(&mut t, &peers).await?;
    privileged_granted_later_applies_at_once_to_consumer_2_alone(&mut t, provider, &peers).await?;
    consumer_2_runs_sandboxed_on_the_peers_nodes_once_told(&mut t, provider, &peers).await?;
    t.at_least(8, 10);
    Ok(())
}

/// Each peering's terms in `liqoctl info`, on both sides.
async fn each_peerings_terms_are_in_info_on_both_sides(
    consumer: &Cluster,
    provider: &Cluster,
) -> Result<()> {
    let compact = |text: &str| text.split_whitespace().collect::<String>();
    let info = compact(
        &liqoctl(Some(provider.kubeconfig_path()), &["info", "-o", "json"])
            .success()
            .stdout,
    );
    assert!(
        info.contains("\"podSecurity\":\"baseline\"")
            && info.contains("\"podSecurity\":\"restricted\""),
        "{info}"
    );
    wait_for("the consumer's info to show its terms", WAIT, || async {
        let out = liqoctl(Some(consumer.kubeconfig_path()), &["info", "-o", "json"]);
        Ok(compact(&out.stdout).contains("\"podSecurity\":\"restricted\""))
    })
    .await
}

/// consumer-2 makes no namespace above its level, and runs baseline pods
/// (not privileged ones) with its priority class and toleration;
/// consumer-1 runs neither.
async fn consumer_2_runs_at_baseline_with_its_extras_and_consumer_1_does_not(
    t: &mut Tally,
    peers: &Peers,
) -> Result<()> {
    let pp = PostParams::default();
    let (pods, pods_two) = peers.pods();
    t.refused(
        "consumer-2 making a privileged namespace",
        NS_SECURITY,
        Api::<Namespace>::all(peers.two.clone())
            .create(
                &pp,
                &twin("esc-two", "consumer-2", ["privileged"; 3], json!({})),
            )
            .await,
    );
    Api::<PriorityClass>::all(peers.prov.clone())
        .create(
            &pp,
            &from(json!({ "metadata": { "name": "peer-low" }, "value": 10 })),
        )
        .await?;
    let baseline_pod = |name: &str| {
        from::<Pod>(json!({
            "metadata": { "name": name },
            "spec": {
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 0,
                "containers": [{ "name": "c", "image": "nginx",
                    "resources": {
                        "requests": { "cpu": "1m", "memory": "1Mi" },
                        "limits": { "ephemeral-storage": "1Gi" },
                    } }],
            },
        }))
    };
    t.refused(
        "a baseline pod of consumer-1",
        PSA,
        pods.create(&pp, &baseline_pod("esc-baseline")).await,
    );
    t.allowed(
        "a baseline pod of consumer-2",
        pods_two.create(&pp, &baseline_pod("ok-baseline")).await,
    );
    t.refused(
        "a privileged pod of consumer-2",
        PSA,
        pods_two
            .create(&pp, &privileged_pod("esc-privileged"))
            .await,
    );
    let allowed_extras = |name: &str| {
        pod(name, |p| {
            p["spec"]["priorityClassName"] = json!("peer-low");
            p["spec"]["tolerations"] = json!([{ "key": "dedicated", "operator": "Exists" }]);
        })
    };
    t.allowed(
        "consumer-2's allowed priority class and toleration",
        pods_two.create(&pp, &allowed_extras("ok-extras")).await,
    );
    t.refused(
        "consumer-1 with consumer-2's priority class and toleration",
        PODS,
        pods.create(&pp, &allowed_extras("esc-extras")).await,
    );
    Ok(())
}

/// A pod that runs privileged.
fn privileged_pod(name: &str) -> Pod {
    pod(name, |p| {
        p["spec"]["containers"][0]["securityContext"]["privileged"] = json!(true);
        p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = json!(true);
    })
}

/// consumer-2's NodePort Services, counted by its share's quota: two node
/// ports per namespace; no LoadBalancer.
async fn consumer_2_has_its_node_ports_and_no_load_balancer(
    t: &mut Tally,
    peers: &Peers,
) -> Result<()> {
    let pp = PostParams::default();
    let services_two: Api<Service> = Api::namespaced(peers.two.clone(), T2);
    // The quota counts a Service when it is admitted only once its status
    // holds the limit; one admitted before waits for the quota
    // controller's full resync (minutes).
    let quotas: Api<ResourceQuota> = Api::namespaced(peers.prov.clone(), T2);
    wait_for("the share of T2 to limit node ports", WAIT, || async {
        let q = quotas.get(SHARE_QUOTA).await?;
        Ok(q.status
            .and_then(|s| s.hard)
            .is_some_and(|h| h.contains_key("services.nodeports")))
    })
    .await?;
    t.allowed(
        "a NodePort Service of consumer-2",
        services_two
            .create(&pp, &service("np-1", json!({ "type": "NodePort" })))
            .await,
    );
    wait_for("the share of T2 to count node ports", WAIT, || async {
        let q = quotas.get(SHARE_QUOTA).await?;
        Ok(q.status
            .and_then(|s| s.used)
            .and_then(|u| u.get("services.nodeports").cloned())
            .is_some_and(|n| n.0 == "1"))
    })
    .await?;
    t.allowed(
        "a second NodePort Service of consumer-2",
        services_two
            .create(&pp, &service("np-2", json!({ "type": "NodePort" })))
            .await,
    );
    t.refused(
        "a third NodePort Service of consumer-2, beyond its node ports",
        "exceeded quota",
        services_two
            .create(&pp, &service("np-3", json!({ "type": "NodePort" })))
            .await,
    );
    t.refused(
        "a LoadBalancer Service of consumer-2",
        SERVICES,
        services_two
            .create(&pp, &service("lb", json!({ "type": "LoadBalancer" })))
            .await,
    );
    Ok(())
}

/// `liqoctl sharing-policy set --peer=consumer-2` with `terms` on the
/// provider, which must succeed.
fn set_terms_of_consumer_2(provider: &Cluster, terms: &[&str]) -> liqo_e2e::Run {
    let args = ["sharing-policy", "set", "--peer=consumer-2"];
    liqoctl(
        Some(provider.kubeconfig_path()),
        &[&args[..], terms].concat(),
    )
    .success()
}

/// The provider grants consumer-2 privileged, and it applies at once to
/// its existing twin; consumer-1 stays restricted.
async fn privileged_granted_later_applies_at_once_to_consumer_2_alone(
    t: &mut Tally,
    provider: &Cluster,
    peers: &Peers,
) -> Result<()> {
    let pp = PostParams::default();
    let (pods, pods_two) = peers.pods();
    let set = set_terms_of_consumer_2(provider, &["--pod-security=privileged"]);
    assert!(set.stdout.contains("tenant/consumer-2"), "{}", set.stdout);
    t.allowed(
        "a privileged pod of consumer-2, once granted",
        pods_two.create(&pp, &privileged_pod("ok-privileged")).await,
    );
    t.refused(
        "a privileged pod of consumer-1, still",
        PSA,
        pods.create(&pp, &privileged_pod("esc-privileged-2")).await,
    );
    let t2: Namespace = Api::<Namespace>::all(peers.prov.clone()).get(T2).await?;
    assert_eq!(
        t2.metadata.labels.unwrap_or_default()["pod-security.kubernetes.io/enforce"],
        "privileged"
    );
    Ok(())
}

/// Nodes set aside for peers, and a runtime class, for consumer-2: its
/// pods run there, sandboxed, and nowhere else.
async fn consumer_2_runs_sandboxed_on_the_peers_nodes_once_told(
    t: &mut Tally,
    provider: &Cluster,
    peers: &Peers,
) -> Result<()> {
    Api::<k8s_openapi::api::node::v1::RuntimeClass>::all(peers.prov.clone())
        .create(
            &PostParams::default(),
            &from(json!({ "metadata": { "name": "sandboxed" }, "handler": "runsc" })),
        )
        .await?;
    set_terms_of_consumer_2(
        provider,
        &["--node-selector=pool=peers", "--runtime-class=sandboxed"],
    );
    let (_, pods_two) = peers.pods();
    let pp = PostParams::default();
    t.refused(
        "a pod of consumer-2 anywhere",
        PODS,
        pods_two.create(&pp, &pod("esc-anywhere", |_| ())).await,
    );
    t.allowed(
        "a pod of consumer-2 on the peers' nodes, sandboxed",
        pods_two
            .create(
                &pp,
                &pod("ok-sandboxed", |p| {
                    p["spec"]["nodeSelector"] = json!({ "pool": "peers" });
                    p["spec"]["runtimeClassName"] = json!("sandboxed");
                }),
            )
            .await,
    );
    Ok(())
}
