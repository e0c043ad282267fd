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
use liqo_testbed::Testbed;
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

/// consumer-2, on the same provider, under the terms it was given (and
/// given later), while consumer-1 stays under its own.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_consumer_is_held_to_the_terms_its_provider_gave_it_alone() -> Result<()> {
    let (testbed, prov, one, two) = two_consumers().await?;
    let consumer = testbed.cluster("consumer");
    let provider = testbed.cluster("provider");
    let on_provider = |args: &[&str]| liqoctl(Some(provider.kubeconfig_path()), args);
    let pp = PostParams::default();
    let mut t = Tally::default();

    // Each peering's terms in `liqoctl info`, on both sides.
    let compact = |text: &str| text.split_whitespace().collect::<String>();
    let info = compact(&on_provider(&["info", "-o", "json"]).success().stdout);
    assert!(
        info.contains("\"podSecurity\":\"baseline\"")
            && info.contains("\"podSecurity\":\"restricted\""),
        "{info}"
    );
    wait_for("the consumer's info to show its terms", WAIT, || async {
        let out = liqoctl(Some(consumer.kubeconfig_path()), &["info", "-o", "json"]);
        Ok(compact(&out.stdout).contains("\"podSecurity\":\"restricted\""))
    })
    .await?;

    // consumer-1's twin, beside consumer-2's.
    make_twin(&mut t, &one, &prov, T1, "consumer-1", "restricted").await?;
    let pods: Api<Pod> = Api::namespaced(one.clone(), T1);

    const T2: &str = "probe-consumer-2";
    make_twin(&mut t, &two, &prov, T2, "consumer-2", "baseline").await?;
    t.refused(
        "consumer-2 making a privileged namespace",
        NS_SECURITY,
        Api::<Namespace>::all(two.clone())
            .create(
                &pp,
                &twin("esc-two", "consumer-2", ["privileged"; 3], json!({})),
            )
            .await,
    );
    Api::<PriorityClass>::all(prov.clone())
        .create(
            &pp,
            &from(json!({ "metadata": { "name": "peer-low" }, "value": 10 })),
        )
        .await?;
    let pods_two: Api<Pod> = Api::namespaced(two.clone(), T2);
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
            .create(
                &pp,
                &pod("esc-privileged", |p| {
                    p["spec"]["containers"][0]["securityContext"]["privileged"] = json!(true);
                    p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] =
                        json!(true);
                }),
            )
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
    let services_two: Api<Service> = Api::namespaced(two.clone(), T2);
    // Counted by its share's quota: two node ports per namespace. The
    // quota counts a Service when it is admitted only once its status
    // holds the limit; one admitted before waits for the quota
    // controller's full resync (minutes).
    let quotas: Api<ResourceQuota> = Api::namespaced(prov.clone(), T2);
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

    // The provider grants consumer-2 privileged, and it applies at once
    // to its existing twin; consumer-1 stays restricted.
    let set = on_provider(&[
        "sharing-policy",
        "set",
        "--peer=consumer-2",
        "--pod-security=privileged",
    ])
    .success();
    assert!(set.stdout.contains("tenant/consumer-2"), "{}", set.stdout);
    let privileged = |name: &str| {
        pod(name, |p| {
            p["spec"]["containers"][0]["securityContext"]["privileged"] = json!(true);
            p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = json!(true);
        })
    };
    t.allowed(
        "a privileged pod of consumer-2, once granted",
        pods_two.create(&pp, &privileged("ok-privileged")).await,
    );
    t.refused(
        "a privileged pod of consumer-1, still",
        PSA,
        pods.create(&pp, &privileged("esc-privileged-2")).await,
    );
    let t2: Namespace = Api::<Namespace>::all(prov.clone()).get(T2).await?;
    assert_eq!(
        t2.metadata.labels.unwrap_or_default()["pod-security.kubernetes.io/enforce"],
        "privileged"
    );

    // Nodes set aside for peers, and a runtime class, for consumer-2.
    Api::<k8s_openapi::api::node::v1::RuntimeClass>::all(prov.clone())
        .create(
            &pp,
            &from(json!({ "metadata": { "name": "sandboxed" }, "handler": "runsc" })),
        )
        .await?;
    on_provider(&[
        "sharing-policy",
        "set",
        "--peer=consumer-2",
        "--node-selector=pool=peers",
        "--runtime-class=sandboxed",
    ])
    .success();
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

    t.at_least(8, 10);
    Ok(())
}
