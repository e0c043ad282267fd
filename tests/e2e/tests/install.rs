//! `liqoctl install`, `info` and `uninstall` against a real cluster, with the
//! gateway agent really running (on the testbed's host-process node) under
//! the RBAC that install gives it. Each test starts from a cluster of its
//! own ([`Home`], installed with [`install_args`]).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, verbs};
use liqo_api::core::ForeignCluster;
use liqo_api::names;
use liqo_api::offloading::NamespaceOffloading;
use liqo_e2e::fixture::{One, spec};
use liqo_e2e::{liqoctl, wait_for};
use liqo_testbed::{Cluster, HOST_PROCESS_LABEL, HOST_PROCESS_TAINT};
use serde_json::json;

/// A cluster of its own for one test, `home`, and how the test installs
/// liqo there ([`install_args`]). Prints the agents' logs if the test
/// fails while it is alive.
struct Home {
    one: One,
    install: Vec<String>,
}

impl Home {
    async fn start() -> Result<Self> {
        Ok(Self {
            one: One::start(spec("home", 1, 1)).await?,
            install: install_args(),
        })
    }

    fn cluster(&self) -> &Cluster {
        self.one.cluster()
    }

    /// The install command's arguments.
    fn install(&self) -> Vec<&str> {
        self.install.iter().map(String::as_str).collect()
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- agent logs of cluster home ---\n{}",
                self.cluster().pod_logs()
            );
        }
    }
}

/// The arguments of the installation the tests make (ID `home-1`), its
/// agents pinned to the host-process node.
fn install_args() -> Vec<String> {
    let pin = format!("--node-selector={HOST_PROCESS_LABEL}=true");
    let tolerate = format!("--toleration={HOST_PROCESS_TAINT}=true:NoSchedule");
    [
        "install",
        "--cluster-id=home-1",
        "--cluster-name=home",
        "--cluster-labels=region=eu-west,provider=testbed",
        "--pod-cidr=10.201.0.0/16",
        "--service-cidr=10.101.0.0/16",
        &pin,
        &tolerate,
        "--timeout=60",
    ]
    .map(str::to_owned)
    .into()
}

/// Can the gateway's service account do `verb` on `resource` (named, in a
/// namespace)? Asked of the real authorizer.
async fn gateway_may(
    client: &kube::Client,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> Result<bool> {
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {
            "user": format!("system:serviceaccount:{}:{}", names::NAMESPACE, names::GATEWAY),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{}", names::NAMESPACE)],
            "resourceAttributes": {
                "verb": verb, "group": group, "resource": resource,
                "namespace": namespace, "name": name,
            },
        },
    }))?;
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Every object of every listable API resource type the server offers,
/// with its resource's plural name.
async fn every_object(client: &kube::Client) -> Result<Vec<(String, DynamicObject)>> {
    // The API server's discovery lags a CRD's deletion for a moment: a
    // group it still lists can answer 404. Ask again, a few times.
    let mut tries = 0;
    let discovery = loop {
        match Discovery::new(client.clone()).run().await {
            Ok(discovery) => break discovery,
            Err(kube::Error::Api(s)) if s.code == 404 && tries < 10 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let mut found = Vec::new();
    for group in discovery.groups() {
        for (resource, caps) in group.recommended_resources() {
            if !caps.supports_operation(verbs::LIST) {
                continue;
            }
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let list = match api.list(&ListParams::default()).await {
                Ok(list) => list,
                // Some aggregated or special resources refuse a plain list.
                Err(kube::Error::Api(s)) if s.code == 405 || s.code == 404 => continue,
                Err(e) => return Err(e).with_context(|| format!("listing {}", resource.plural)),
            };
            found.extend(list.items.into_iter().map(|o| (resource.plural.clone(), o)));
        }
    }
    Ok(found)
}

fn managed_by_us(obj: &DynamicObject) -> bool {
    obj.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(names::labels::MANAGED_BY))
        .is_some_and(|v| v == names::labels::MANAGED_BY_VALUE)
}

/// Everything of ours: with our managed-by label, or ours by name (a
/// `liqo…` object, a CRD of our group, anything in our namespace).
async fn leftovers(client: &kube::Client) -> Result<Vec<String>> {
    Ok(every_object(client)
        .await?
        .into_iter()
        .filter(|(_, obj)| {
            let name = obj.metadata.name.as_deref().unwrap_or_default();
            managed_by_us(obj)
                || name.starts_with("liqo")
                || name.ends_with(&format!(".{}", names::GROUP))
                || obj.metadata.namespace.as_deref() == Some(names::NAMESPACE)
        })
        .map(|(plural, obj)| format!("{plural}/{}", obj.metadata.name.unwrap_or_default()))
        .collect())
}

/// Pids of the processes the host-process node runs for this cluster.
fn agent_processes(cluster: &Cluster) -> Vec<u32> {
    liqo_testbed::agent_processes(cluster.dir())
        .iter()
        .map(|p| p.pid)
        .collect()
}

/// resourceVersions of everything install made, to prove a re-run changes
/// nothing.
async fn versions(client: &kube::Client) -> Result<BTreeMap<String, String>> {
    Ok(every_object(client)
        .await?
        .into_iter()
        .filter(|(_, obj)| managed_by_us(obj))
        .map(|(plural, obj)| {
            let key = format!("{plural}/{}", obj.metadata.name.unwrap_or_default());
            (key, obj.metadata.resource_version.unwrap_or_default())
        })
        .collect())
}

/// Fails, naming `what`, if the objects install made are not at the
/// resourceVersions `before`.
async fn assert_unchanged(
    client: &kube::Client,
    before: &BTreeMap<String, String>,
    what: &str,
) -> Result<()> {
    assert_eq!(&versions(client).await?, before, "{what} changed objects");
    Ok(())
}

/// Fails unless `text` holds `want`, printing `text`.
fn assert_holds(text: &str, want: &str) {
    assert!(text.contains(want), "{want:?} missing from:\n{text}");
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_runs_the_gateway_with_the_rights_it_needs_and_info_reports_it() -> Result<()> {
    let home = Home::start().await?;
    let (cluster, client, install) = (home.cluster(), &home.one.client, home.install());
    let kubeconfig = cluster.kubeconfig_path();

    // A dry run prints the objects and creates none of them.
    let dry = liqoctl(Some(kubeconfig), &[&install[..], &["--dry-run"]].concat()).success();
    assert_holds(&dry.stdout, "kind: CustomResourceDefinition");
    assert_holds(&dry.stdout, "cluster-id: home-1");
    assert!(
        versions(client).await?.is_empty(),
        "a dry run created objects"
    );

    let first = liqoctl(Some(kubeconfig), &install).success();
    // Not a terminal: plain progress lines, no spinner or colour codes.
    assert!(!first.stderr.contains('\u{1b}'), "{:?}", first.stderr);
    assert!(
        first
            .stderr
            .contains("✔ Waiting for the gateway to be ready"),
        "{}",
        first.stderr
    );
    assert_holds(&first.stdout, "installed on cluster");

    // The gateway runs as a real process on the host-process node, and got
    // through its start: it read the identity with its own account.
    let pods: Api<Pod> = Api::namespaced(client.clone(), names::NAMESPACE);
    let gateway_pods = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=liqo-gateway"))
        .await?;
    let [pod] = &gateway_pods.items[..] else {
        anyhow::bail!("expected one gateway pod, got {}", gateway_pods.items.len());
    };
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        cluster.host_node_name(),
        "the node selector pins the gateway"
    );
    wait_for(
        "the gateway to log its identity",
        Duration::from_secs(20),
        || async { Ok(cluster.pod_logs().contains("home-1")) },
    )
    .await?;

    // Killed at any moment, it comes back and converges: it keeps no state
    // of its own.
    let pids = agent_processes(cluster);
    let [pid] = pids[..] else {
        anyhow::bail!("expected one gateway process, got {pids:?}");
    };
    liqo_e2e::run(std::process::Command::new("kill").args(["-9", &pid.to_string()])).success();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), names::NAMESPACE);
    wait_for(
        "the gateway to restart and be ready again",
        Duration::from_secs(30),
        || async {
            let pod = pods
                .get(&pod.metadata.name.clone().unwrap_or_default())
                .await?;
            let restarts = pod
                .status
                .and_then(|s| s.container_statuses)
                .and_then(|cs| cs.first().map(|c| c.restart_count))
                .unwrap_or(0);
            let ready = deployments
                .get(names::GATEWAY)
                .await?
                .status
                .and_then(|s| s.ready_replicas)
                == Some(1);
            Ok(restarts >= 1 && ready && !agent_processes(cluster).contains(&pid))
        },
    )
    .await?;

    // Its rights are what it needs and no more.
    let ns = Some(names::NAMESPACE);
    let identity = Some(names::IDENTITY_CONFIGMAP);
    assert!(gateway_may(client, "get", "", "configmaps", ns, identity).await?);
    assert!(gateway_may(client, "watch", names::GROUP, "foreignclusters", None, None).await?);
    assert!(!gateway_may(client, "get", "", "configmaps", ns, Some("other")).await?);
    assert!(
        !gateway_may(
            client,
            "get",
            "",
            "configmaps",
            Some("kube-system"),
            identity
        )
        .await?
    );
    assert!(!gateway_may(client, "list", "", "secrets", ns, None).await?);
    assert!(!gateway_may(client, "create", "", "pods", ns, None).await?);
    // A grant that follows the load: it reads the pods and nodes and
    // changes the Tenant records, and deletes none of them.
    assert!(gateway_may(client, "watch", "", "pods", None, None).await?);
    assert!(!gateway_may(client, "delete", "", "pods", None, None).await?);
    assert!(gateway_may(client, "patch", names::GROUP, "tenants", None, None).await?);
    assert!(!gateway_may(client, "delete", names::GROUP, "tenants", None, None).await?);
    assert!(
        !gateway_may(
            client,
            "create",
            names::GROUP,
            "foreignclusters",
            None,
            None
        )
        .await?
    );

    // info reports the identity and a ready gateway, as a table and as JSON.
    let table = liqoctl(Some(kubeconfig), &["info"]).success();
    for want in [
        "home-1",
        "region=eu-west",
        "10.201.0.0/16",
        "liqo-gateway",
        "1/1",
    ] {
        assert_holds(&table.stdout, want);
    }
    let json: serde_json::Value = serde_json::from_str(
        &liqoctl(Some(kubeconfig), &["info", "-o", "json"])
            .success()
            .stdout,
    )?;
    assert_eq!(json["identity"]["clusterId"], "home-1");
    assert_eq!(json["identity"]["labels"]["provider"], "testbed");
    assert_eq!(json["agents"][0]["ready"], true);
    let yaml = liqoctl(Some(kubeconfig), &["info", "-o", "yaml"]).success();
    assert_holds(&yaml.stdout, "clusterId: home-1");
    let version = liqoctl(Some(kubeconfig), &["version", "-o", "json"]).success();
    let version: serde_json::Value = serde_json::from_str(&version.stdout)?;
    assert_eq!(version["server"], liqo_api::VERSION);

    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn installing_again_changes_nothing_and_a_conflicting_cluster_id_is_refused() -> Result<()> {
    let home = Home::start().await?;
    let (cluster, client, install) = (home.cluster(), &home.one.client, home.install());
    let kubeconfig = cluster.kubeconfig_path();

    liqoctl(Some(kubeconfig), &install).success();

    // Installing again with the same flags changes nothing at all.
    let before = versions(client).await?;
    assert!(before.len() >= 9, "{before:?}");
    let again = liqoctl(Some(kubeconfig), &install).success();
    assert_holds(&again.stdout, "already up to date");
    assert_unchanged(client, &before, "a second install").await?;

    // Without flags, install keeps what the installation has, the agents'
    // node selector included.
    let bare = liqoctl(Some(kubeconfig), &["install", "--timeout=60"]).success();
    assert_holds(&bare.stdout, "already up to date");
    assert_unchanged(client, &before, "a bare install").await?;

    // -o json prints what was applied, still without changing anything.
    let listed = liqoctl(
        Some(kubeconfig),
        &[&install[..], &["-o", "json", "-q"]].concat(),
    )
    .success();
    let listed: serde_json::Value = serde_json::from_str(&listed.stdout)?;
    let kinds: Vec<&str> = listed["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["kind"].as_str())
        .collect();
    for kind in [
        "CustomResourceDefinition",
        "Namespace",
        "ConfigMap",
        "ClusterRole",
        "Deployment",
    ] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }
    assert_unchanged(client, &before, "install -o json").await?;

    // A conflicting cluster ID is refused, and changes nothing either.
    let conflict = liqoctl(
        Some(kubeconfig),
        &["install", "--cluster-id=other", "--timeout=5"],
    )
    .user_error(6);
    assert!(
        conflict.error_line().contains("home-1"),
        "{}",
        conflict.stderr
    );
    assert_unchanged(client, &before, "a refused install").await?;
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstall_refuses_while_in_use_and_otherwise_leaves_nothing() -> Result<()> {
    let home = Home::start().await?;
    let (cluster, client, install) = (home.cluster(), &home.one.client, home.install());
    let kubeconfig = cluster.kubeconfig_path();

    liqoctl(Some(kubeconfig), &install).success();

    // Uninstall refuses while the cluster peers or offloads, names what is
    // in the way, and deletes nothing.
    let peers: Api<ForeignCluster> = Api::all(client.clone());
    peers
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "liqo.io/v1alpha1", "kind": "ForeignCluster",
                "metadata": { "name": "foreign" },
                "spec": { "clusterId": "foreign-1", "clusterName": "foreign", "outgoing": true },
            }))?,
        )
        .await?;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "shop" } }))?,
        )
        .await?;
    let offloadings: Api<NamespaceOffloading> = Api::namespaced(client.clone(), "shop");
    offloadings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "liqo.io/v1alpha1", "kind": "NamespaceOffloading",
                "metadata": { "name": names::NAMESPACE_OFFLOADING },
                "spec": {},
            }))?,
        )
        .await?;
    let before = versions(client).await?;
    let refused = liqoctl(Some(kubeconfig), &["uninstall", "--purge", "--yes"]).user_error(6);
    assert!(
        refused.error_line().contains("foreign"),
        "{}",
        refused.stderr
    );
    assert!(refused.error_line().contains("shop"), "{}", refused.stderr);
    assert_unchanged(client, &before, "a refused uninstall").await?;
    let info = liqoctl(Some(kubeconfig), &["info", "-o", "json"]).success();
    let info: serde_json::Value = serde_json::from_str(&info.stdout)?;
    assert_eq!(info["peerings"][0]["clusterId"], "foreign-1");
    assert_eq!(info["offloadedNamespaces"][0]["namespace"], "shop");
    peers.delete("foreign", &Default::default()).await?;
    offloadings
        .delete(names::NAMESPACE_OFFLOADING, &Default::default())
        .await?;

    // Uninstall takes everything away: the walk over every resource type
    // finds nothing of ours, and the gateway process is gone.
    assert!(
        !agent_processes(cluster).is_empty(),
        "the gateway runs before uninstall"
    );
    liqoctl(
        Some(kubeconfig),
        &["uninstall", "--purge", "--yes", "--timeout=60"],
    )
    .success();
    let left = leftovers(client).await?;
    assert!(left.is_empty(), "left after uninstall --purge: {left:?}");
    let deployments: Api<Deployment> = Api::all(client.clone());
    assert!(
        deployments
            .list(&ListParams::default().labels("app.kubernetes.io/name=liqo-gateway"))
            .await?
            .items
            .is_empty()
    );
    wait_for(
        "the gateway process to end",
        Duration::from_secs(15),
        || async { Ok(agent_processes(cluster).is_empty()) },
    )
    .await?;
    liqoctl(Some(kubeconfig), &["info"]).user_error(7);

    // And the same install works again on the cleaned cluster.
    liqoctl(Some(kubeconfig), &install).success();
    uninstall_tries_a_failed_crd_removal_again(client, kubeconfig).await
}

/// The API server's CRD finalizer tries a failed removal again only after
/// a back-off of minutes; `uninstall --purge` has it try at once by
/// marking the CRD while its `Terminating` condition says the removal
/// failed. A failure is made here: a finalizer of the test's holds one
/// CRD once the API server's own is done, and the test then writes the
/// condition a failed attempt leaves.
async fn uninstall_tries_a_failed_crd_removal_again(
    client: &kube::Client,
    kubeconfig: &std::path::Path,
) -> Result<()> {
    const HELD: &str = "foreignclusters.liqo.io";
    const HOLD: &str = "liqo.io/e2e-hold";
    const RETRIED: &str = "liqo.io/removal-retried-at";
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut crd = crds.get(HELD).await?;
    crd.metadata
        .finalizers
        .get_or_insert_default()
        .push(HOLD.to_owned());
    crds.replace(HELD, &PostParams::default(), &crd).await?;
    let kubeconfig = kubeconfig.to_owned();
    let uninstall = tokio::task::spawn_blocking(move || {
        liqoctl(
            Some(&kubeconfig),
            &["uninstall", "--purge", "--yes", "--timeout=60"],
        )
    });
    wait_for(
        "the API server's finalizer to be done with the held CRD",
        Duration::from_secs(30),
        || async {
            let crd = crds.get(HELD).await?;
            Ok(crd.metadata.deletion_timestamp.is_some()
                && crd.metadata.finalizers == Some(vec![HOLD.to_owned()]))
        },
    )
    .await?;
    // The mark a real failure may have left already (the install just
    // before changed the CRDs: the case this retry is for).
    let retried_at = |crd: &CustomResourceDefinition| {
        crd.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RETRIED).cloned())
    };
    let mut crd = crds.get(HELD).await?;
    let before = retried_at(&crd);
    let conditions = crd
        .status
        .as_mut()
        .and_then(|s| s.conditions.as_mut())
        .context("the held CRD has conditions")?;
    let terminating = conditions
        .iter_mut()
        .find(|c| c.type_ == "Terminating")
        .context("the held CRD has a Terminating condition")?;
    terminating.reason = Some("InstanceDeletionFailed".into());
    terminating.message = Some("could not list instances: written by the test".into());
    crds.replace_status(HELD, &PostParams::default(), &crd)
        .await?;
    wait_for(
        "uninstall to mark the CRD whose removal failed",
        Duration::from_secs(20),
        || async {
            let marked = retried_at(&crds.get(HELD).await?);
            Ok(marked.is_some() && marked != before)
        },
    )
    .await?;
    let release = json!({ "metadata": { "finalizers": null } });
    crds.patch(HELD, &PatchParams::default(), &Patch::Merge(&release))
        .await?;
    uninstall.await?.success();
    assert!(
        crds.get_opt(HELD).await?.is_none(),
        "the held CRD is gone once released"
    );
    Ok(())
}

/// The Multi-Cluster Services API's CRDs are shared: install creates the
/// one that is missing and leaves one installed by someone else as it is;
/// `uninstall --purge` removes its own only once no object uses it, and
/// says what it left.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_shares_the_multicluster_services_crds() -> Result<()> {
    let home = Home::start().await?;
    let (cluster, client, install) = (home.cluster(), &home.one.client, home.install());
    let kubeconfig = cluster.kubeconfig_path();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    const EXPORTS: &str = "serviceexports.multicluster.x-k8s.io";
    const IMPORTS: &str = "serviceimports.multicluster.x-k8s.io";

    // Another implementation installed ServiceExport before us: the CRD
    // as install would make it, without our labels.
    let printed = liqoctl(
        Some(kubeconfig),
        &[&install[..], &["--dry-run", "-o", "json", "-q"]].concat(),
    )
    .success();
    let printed: serde_json::Value = serde_json::from_str(&printed.stdout)?;
    let mut theirs = printed["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["metadata"]["name"] == EXPORTS)
        .cloned()
        .context("install prints the ServiceExport CRD")?;
    theirs["metadata"]["labels"] = json!({ "multicluster.x-k8s.io/release-version": "v0.5.0" });
    let theirs: CustomResourceDefinition = serde_json::from_value(theirs)?;
    crds.create(&PostParams::default(), &theirs).await?;
    wait_for(
        "their CRD to be established",
        Duration::from_secs(30),
        || async {
            let crd = crds.get(EXPORTS).await?;
            Ok(crd
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                }))
        },
    )
    .await?;
    let theirs_version = crds.get(EXPORTS).await?.metadata.resource_version;

    let installed = liqoctl(Some(kubeconfig), &install).success();
    assert_holds(
        &installed.stderr,
        &format!("kept the CRDs installed already ({EXPORTS})"),
    );
    let exports = crds.get(EXPORTS).await?;
    assert_eq!(
        exports.metadata.resource_version, theirs_version,
        "theirs is left as it was"
    );
    let imports = crds.get(IMPORTS).await?;
    assert_eq!(
        imports
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(names::labels::MANAGED_BY))
            .map(String::as_str),
        Some(names::labels::MANAGED_BY_VALUE),
        "the missing one is created, as ours"
    );

    // An import in use keeps our CRD through a purge, said in one line.
    let resource = kube::discovery::ApiResource {
        group: "multicluster.x-k8s.io".to_owned(),
        version: "v1beta1".to_owned(),
        api_version: "multicluster.x-k8s.io/v1beta1".to_owned(),
        kind: "ServiceImport".to_owned(),
        plural: "serviceimports".to_owned(),
    };
    let imports_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &resource);
    let import: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
        "metadata": { "name": "web", "namespace": "default" },
        "spec": { "type": "ClusterSetIP", "ports": [{ "port": 80, "protocol": "TCP" }] },
    }))?;
    wait_for("the ServiceImport API", Duration::from_secs(30), || async {
        Ok(
            match imports_api.create(&PostParams::default(), &import).await {
                Ok(_) => true,
                Err(kube::Error::Api(s)) if s.code == 404 => false,
                Err(e) => return Err(e.into()),
            },
        )
    })
    .await?;
    let purged = liqoctl(
        Some(kubeconfig),
        &["uninstall", "--purge", "--yes", "--timeout=60"],
    )
    .success();
    assert_holds(
        &format!("{}{}", purged.stdout, purged.stderr),
        &format!("left CustomResourceDefinition/{IMPORTS} (1 serviceimports still there)"),
    );
    assert!(
        crds.get_opt(IMPORTS).await?.is_some(),
        "ours is kept while in use"
    );
    assert!(
        imports_api.get_opt("web").await?.is_some(),
        "and the import with it"
    );
    assert_eq!(
        crds.get(EXPORTS).await?.metadata.resource_version,
        theirs_version
    );

    // Once nothing uses it, it goes; theirs stays.
    imports_api.delete("web", &Default::default()).await?;
    liqoctl(
        Some(kubeconfig),
        &["uninstall", "--purge", "--yes", "--timeout=60"],
    )
    .success();
    wait_for("our CRD to go", Duration::from_secs(60), || async {
        Ok(crds.get_opt(IMPORTS).await?.is_none())
    })
    .await?;
    assert_eq!(
        crds.get(EXPORTS).await?.metadata.resource_version,
        theirs_version
    );
    Ok(())
}
