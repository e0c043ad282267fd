//! `liqoctl peer` failing in the middle of each of its steps, for real: the
//! API server's own ValidatingAdmissionPolicy refuses one object of the
//! step after earlier objects were made. Each failure must name the
//! cluster and the object, and leave both clusters exactly as they were
//! (the rollback journal). A virtual node that does not come up in time is
//! not rolled back, and the same command resumes once the cause is gone.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use kube::api::{Api, ListParams};
use liqo_api::authentication::Tenant;
use liqo_api::core::ForeignCluster;
use liqo_api::names::{self, peering};
use liqo_api::{ClusterId, names::GROUP};
use liqo_e2e::fixture::{Pair, Stage};
use liqo_e2e::refusal::{Refusal, TEST_POLICIES, allow, refuse};
use liqo_e2e::{Run, liqoctl, wait_for};
use liqo_testbed::Cluster;
use serde_json::json;

/// Where the tests of a failing peer start: the pair installed, and the
/// names of what a peering makes.
struct Start {
    pair: Pair,
    /// The provider's kubeconfig.
    remote: String,
    consumer_id: ClusterId,
    provider_id: ClusterId,
    /// The virtual kubelet's Deployment, and the identity's Secret.
    vk: String,
    secret: String,
}

impl Start {
    async fn new() -> Result<Self> {
        let pair = Pair::with_nodes(1, 1, Stage::Installed).await?;
        let provider_id = ClusterId::new("provider-1")?;
        Ok(Self {
            remote: pair.remote(),
            consumer_id: ClusterId::new("consumer-1")?,
            vk: peering::virtual_kubelet(&provider_id),
            secret: peering::identity_secret(&provider_id),
            provider_id,
            pair,
        })
    }
}

/// `liqoctl peer` with the provider's kubeconfig `remote`, asking a small
/// grant.
fn peer_args(remote: &str) -> [&str; 7] {
    [
        "peer",
        "--remote-kubeconfig",
        remote,
        "--cpu=2",
        "--memory=1Gi",
        "--pods=10",
        "--timeout=90",
    ]
}

/// Waits until no namespace is terminating: a rolled-back tenant
/// namespace takes the namespace controller a while.
async fn no_terminating_namespace(client: &kube::Client) -> Result<()> {
    wait_for(
        "terminating namespaces to be gone",
        Duration::from_secs(90),
        || {
            let api: Api<Namespace> = Api::all(client.clone());
            async move {
                Ok(api
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .all(|n| {
                        n.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Terminating")
                    }))
            }
        },
    )
    .await
}

/// Asserts one `error:` line, exit 6 (refused by the cluster: an admission
/// policy is not a missing right), and that the line names every one of
/// `names`.
#[track_caller]
fn failed_naming(out: &Run, names: &[&str]) {
    assert_eq!(out.code, 6, "wrong exit code:\n{}", out.stderr);
    assert!(
        !out.stderr.contains("Status {"),
        "a debug dump in the message:\n{}",
        out.stderr
    );
    let errors: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "expected one error line:\n{}", out.stderr);
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    for name in names {
        assert!(
            errors[0].contains(name),
            "the error does not name {name}:\n{}",
            out.stderr
        );
    }
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_failing_at_any_step_leaves_both_clusters_as_they_were() -> Result<()> {
    let Start {
        pair,
        remote,
        consumer_id,
        provider_id,
        vk,
        secret,
    } = Start::new().await?;
    let (consumer, provider) = (pair.consumer(), pair.provider());
    let (consumer_client, provider_client) =
        (pair.consumer_client.clone(), pair.provider_client.clone());
    let peer_args = peer_args(&remote);
    let csr = format!("liqo-peer-{consumer_id}");

    struct Case {
        step: &'static str,
        on_provider: bool,
        refusal: Refusal,
        /// What the error line must name besides the cluster.
        object: String,
    }
    let quota_default_reason = Refusal {
        reason: None,
        ..Refusal::named("", "resourcequotas", "liqo-grant")
    };
    // In the order `peer` makes them: the virtual kubelet first, which
    // waits for the identity made after it.
    let cases = [
        Case {
            step: "virtual kubelet: the ForeignCluster, the first object made",
            on_provider: false,
            refusal: Refusal::named(GROUP, "foreignclusters", provider_id.as_str()),
            object: provider_id.to_string(),
        },
        Case {
            step: "virtual kubelet: the Deployment",
            on_provider: false,
            refusal: Refusal::named("apps", "deployments", &vk),
            object: vk.clone(),
        },
        Case {
            step: "tenant: the ResourceQuota (422 Invalid)",
            on_provider: true,
            refusal: quota_default_reason,
            object: "liqo-grant".into(),
        },
        Case {
            step: "tenant: the Tenant record",
            on_provider: true,
            refusal: Refusal::named(GROUP, "tenants", consumer_id.as_str()),
            object: consumer_id.to_string(),
        },
        Case {
            step: "identity: the CSR",
            on_provider: true,
            refusal: Refusal::named("certificates.k8s.io", "certificatesigningrequests", &csr),
            object: csr.clone(),
        },
        Case {
            step: "identity: the Secret",
            on_provider: false,
            refusal: Refusal::named("", "secrets", &secret),
            object: secret.clone(),
        },
        Case {
            step: "network: the provider's end of the tunnel",
            on_provider: true,
            refusal: Refusal::named(GROUP, "connections", consumer_id.as_str()),
            object: consumer_id.to_string(),
        },
        Case {
            step: "network: the consumer's end of the tunnel",
            on_provider: false,
            refusal: Refusal::named(GROUP, "connections", provider_id.as_str()),
            object: provider_id.to_string(),
        },
    ];

    let mut timings = Vec::new();
    for case in &cases {
        let started = Instant::now();
        let before = pair.holdings().await?;
        let (client, cluster): (&kube::Client, &Cluster) = if case.on_provider {
            (&provider_client, provider)
        } else {
            (&consumer_client, consumer)
        };
        refuse(client, &case.refusal).await?;
        let peer_started = Instant::now();
        let out = liqoctl(Some(consumer.kubeconfig_path()), &peer_args);
        let peer_took = peer_started.elapsed();
        allow(client).await?;
        failed_naming(&out, &[cluster.name(), &case.object]);
        // Earlier objects of the run were made, but for the first: the
        // rollback ran, and says it removed everything.
        let first = std::ptr::eq(case, &cases[0]);
        assert_eq!(
            out.stderr.contains("✔ Rolling back what this run created"),
            !first,
            "{}: a complete rollback only when something was made:\n{}",
            case.step,
            out.stderr
        );
        eprintln!("{}: exit {}, {}", case.step, out.code, out.error_line());
        no_terminating_namespace(&provider_client).await?;
        no_terminating_namespace(&consumer_client).await?;
        pair.assert_as_before(
            &before,
            &format!("the peer failed at {}", case.step),
            &[TEST_POLICIES],
        )
        .await?;
        timings.push((case.step, peer_took, started.elapsed()));
    }

    for (step, peer, total) in timings {
        eprintln!("{step}: peer {peer:.1?}, case {total:.1?}");
    }
    drop(pair);
    Ok(())
}

/// The virtual kubelet cannot start: its pods are refused. Everything
/// else is in place, so the timeout is not rolled back, and the same
/// command finishes the job once the pods are allowed; with nothing
/// refused, unpeer then leaves both clusters as they were.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_node_late_is_kept_and_the_same_peer_resumes() -> Result<()> {
    let Start {
        pair,
        remote,
        consumer_id,
        provider_id,
        vk,
        secret,
    } = Start::new().await?;
    let consumer = pair.consumer();
    let (consumer_client, provider_client) =
        (pair.consumer_client.clone(), pair.provider_client.clone());
    let peer_args = peer_args(&remote);
    let tenant_ns = peering::tenant_namespace(&consumer_id);
    let before = pair.holdings().await?;
    let started = Instant::now();
    refuse(
        &consumer_client,
        &Refusal {
            group: "",
            version: "v1",
            resource: "pods",
            operation: "CREATE",
            refuse: format!(
                "request.namespace == '{ns}' && \
                 ((has(object.metadata.name) && object.metadata.name.startsWith('liqo-vk-')) || \
                  (has(object.metadata.generateName) && object.metadata.generateName.startsWith('liqo-vk-')))",
                ns = names::NAMESPACE
            ),
            reason: Some("Forbidden"),
        },
    )
    .await?;
    let mut short = peer_args.to_vec();
    short.pop();
    short.push("--timeout=3");
    let out = liqoctl(Some(consumer.kubeconfig_path()), &short).user_error(8);
    assert!(out.error_line().contains(&vk), "{}", out.stderr);
    assert!(
        !out.stderr.contains("Rolling back"),
        "a timeout rolled back:\n{}",
        out.stderr
    );
    Api::<ForeignCluster>::all(consumer_client.clone())
        .get(provider_id.as_str())
        .await
        .context("the ForeignCluster is kept")?;
    Api::<Secret>::namespaced(consumer_client.clone(), names::NAMESPACE)
        .get(&secret)
        .await
        .context("the identity is kept")?;
    Api::<Deployment>::namespaced(consumer_client.clone(), names::NAMESPACE)
        .get(&vk)
        .await
        .context("the virtual kubelet is kept")?;
    Api::<Tenant>::all(provider_client.clone())
        .get(consumer_id.as_str())
        .await
        .context("the tenant is kept")?;
    allow(&consumer_client).await?;
    let resumed = Instant::now();
    let out = liqoctl(Some(consumer.kubeconfig_path()), &peer_args);
    if out.code != 0 {
        eprintln!("--- agent logs ---\n{}", consumer.pod_logs());
    }
    out.success();
    let resume_took = resumed.elapsed();
    let node = Api::<Node>::all(consumer_client.clone())
        .get(&peering::virtual_node(&provider_id))
        .await?;
    assert!(node.status.is_some());
    eprintln!(
        "virtual node timeout, then resumed: peer {resume_took:.1?}, case {:.1?}",
        started.elapsed()
    );

    // With nothing refused, unpeer leaves both clusters as they were.
    liqoctl(
        Some(consumer.kubeconfig_path()),
        &["unpeer", "--remote-kubeconfig", &remote],
    )
    .success();
    no_terminating_namespace(&provider_client).await?;
    pair.assert_as_before(&before, "peer and unpeer", &[TEST_POLICIES])
        .await?;
    assert!(
        !pair
            .holdings()
            .await?
            .1
            .iter()
            .any(|o| o.contains(&tenant_ns)),
        "the tenant namespace is left"
    );
    drop(pair);
    Ok(())
}

/// A peer run again over an existing peering changes the tenant's quota
/// and record (a smaller request); when a later phase then fails, the
/// rollback puts them back as they were, not merely deletes what it made.
/// Once the failure's cause is gone, the same command changes them for
/// good (so the change did happen, and was undone).
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_peer_puts_back_what_it_changed() -> Result<()> {
    use k8s_openapi::api::core::v1::ResourceQuota;
    use liqo_e2e::fixture::{CONSUMER_ID, PROVIDER_ID, Pair, Stage};

    let pair = Pair::at(Stage::Peered).await?;
    let remote = pair.remote();
    let tenant_ns = peering::tenant_namespace(&ClusterId::new(CONSUMER_ID)?);
    let quotas: Api<ResourceQuota> = Api::namespaced(pair.provider_client.clone(), &tenant_ns);
    let tenants: Api<Tenant> = Api::all(pair.provider_client.clone());
    let granted = || async {
        let quota = quotas
            .get("liqo-grant")
            .await?
            .spec
            .unwrap_or_default()
            .hard;
        let tenant = tenants.get(CONSUMER_ID).await?.spec;
        anyhow::Ok((serde_json::to_value(quota)?, serde_json::to_value(tenant)?))
    };
    let before = granted().await?;

    let csr = format!("liqo-peer-{CONSUMER_ID}");
    refuse(
        &pair.provider_client,
        &Refusal::named("certificates.k8s.io", "certificatesigningrequests", &csr),
    )
    .await?;
    let smaller = [
        "peer",
        "--remote-kubeconfig",
        &remote,
        "--cpu=1",
        "--renew",
        "--timeout=90",
    ];
    let out = pair.on_consumer(&smaller);
    allow(&pair.provider_client).await?;
    failed_naming(&out, &[pair.provider().name(), &csr]);
    assert!(
        out.stderr.contains("✔ Creating the tenant"),
        "the tenant phase did not run before the failure:\n{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("✔ Rolling back what this run created"),
        "no complete rollback:\n{}",
        out.stderr
    );
    assert_eq!(
        granted().await?,
        before,
        "the tenant's quota and record are not as they were before the failed peer"
    );
    Api::<Node>::all(pair.consumer_client.clone())
        .get(&peering::virtual_node(&ClusterId::new(PROVIDER_ID)?))
        .await
        .context("the virtual node of the existing peering is kept")?;

    // Allowed, the same command changes the quota for good.
    pair.on_consumer(&smaller).success();
    let after = granted().await?;
    assert_ne!(after, before, "a smaller request changed nothing");
    assert_eq!(
        after.0["requests.cpu"],
        json!("1"),
        "the quota does not grant the smaller request: {}",
        after.0
    );
    Ok(())
}
