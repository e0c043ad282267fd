//! `liqoctl test network`: checks, with real traffic between pods, that the
//! pod networks of the consumer and its providers are linked, pod to pod
//! and pod to Service, both ways; and says what failed where.
//!
//! It uses only what a user of liqo-rs uses: a namespace of its own,
//! offloaded to the providers checked; in it a netcheck server pod and a
//! Service on each side (the provider's pods are offloaded ones, the
//! provider's Service the reflected one), then a client pod on each side
//! that connects to the other side's pod and Service (a provider's also
//! to the consumer's Service by its clusterset name, exported for it) and
//! leaves its report in its termination message (`liqo-gateway
//! netcheck`, api::netcheck).
//! Everything is removed afterwards, also when the check fails or is
//! interrupted: deleting the namespace removes its offloading, whose
//! finalizer holds until the virtual kubelets have removed the twins.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Namespace, Pod, Probe, Service, ServicePort, ServiceSpec, TCPSocketAction, Toleration,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::clusterset::ServiceExport;
use liqo_api::names::{self, labels};
use liqo_api::netcheck::{self, ProbeReport};
use liqo_api::networking::{Remap, translate};
use liqo_api::offloading::{
    LabelSelector, NamespaceMappingStrategy, NamespaceOffloading, NamespaceOffloadingSpec,
    PodOffloadingStrategy,
};
use tokio::time::Instant;

use crate::cli::{GlobalArgs, TestNetworkArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::cluster::{installed, installed_pod_placement};
use crate::kube::cluster_dns::DnsState;
use crate::peering::consumer::bind_virtual_kubelets;
use crate::printer::Printer;

mod judge;
mod plan;
mod render;

use judge::{Check, cannot_start, judge, ready_ip, report_of, tunnels_down};
use plan::{
    Client, Peer, Plan, Servers, client_name, managed_labels, peers, server_name, target, test_pod,
};
use render::{Summary, table};

/// The label that says which part of the check a pod or Service is.
const ROLE_LABEL: &str = "liqo.io/netcheck-role";
/// How long a client retries each target before it counts as failed.
const PROBE_TIMEOUT_SECONDS: u64 = 30;
/// How long the removal of what the check made may take.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_secs(1);

pub async fn run(
    args: &TestNetworkArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let flags = Flags::parse(args)?;
    let consumer = ClusterClient::local(global).await?;
    let identity = installed(&consumer).await?;
    let peers = peers(&consumer, &identity.cluster_id, &flags.cluster_ids).await?;
    let placement = match (&flags.node_selector, &flags.tolerations) {
        (None, None) => {
            let installed = installed_pod_placement(&consumer).await?;
            (installed.node_selector, installed.tolerations)
        }
        (selector, tolerations) => (
            selector.clone().unwrap_or_default(),
            tolerations.clone().unwrap_or_default(),
        ),
    };
    let plan = Plan {
        namespace: format!("liqo-test-network-{}", suffix()),
        image: args
            .image
            .clone()
            .unwrap_or_else(|| format!("{}:{}", names::GATEWAY_IMAGE, liqo_api::VERSION)),
        node_selector: placement.0,
        tolerations: placement.1,
    };
    let deadline = Instant::now() + Duration::from_secs(args.timeout);

    let checked = tokio::select! {
        checked = check(&consumer, &identity.cluster_name, &peers, &plan, deadline, &printer) => checked,
        _ = tokio::signal::ctrl_c() => Err(UserError::Refused("interrupted".into()).into()),
    };
    if args.keep {
        printer.info(format!(
            "left namespace {} on cluster {} (and its twins): `kubectl delete namespace {}` \
             removes them",
            plan.namespace, consumer.name, plan.namespace
        ));
    } else {
        clean_up(&consumer, &plan.namespace, &printer).await;
    }
    let checks = checked?;

    let passed = checks.iter().all(|c| c.passed);
    if let Some(format) = args.output.output {
        printer.structured(
            &Summary {
                passed,
                checks: &checks,
            },
            format,
        )?;
    } else {
        printer.result(table(&checks));
        if crate::kube::cluster_dns::dns_state(&consumer).await == DnsState::NotServed {
            printer.info(
                "  note: CoreDNS does not serve clusterset.local here: Services imported from the \
                 clusterset answer at their clusterset IP only (docs/services.md, \"DNS\")",
            );
        }
    }
    if passed {
        return Ok(());
    }
    let failed: Vec<&Check> = checks.iter().filter(|c| !c.passed).collect();
    let first = failed
        .first()
        .expect("invariant: a check failed when not all passed");
    Err(UserError::CheckFailed(format!(
        "{} of {} checks failed, the first from {} to {}'s {} at {} ({}); the table above says \
         where",
        failed.len(),
        checks.len(),
        first.from,
        first.to,
        first.kind,
        first.address,
        first.error.as_deref().unwrap_or("no answer")
    ))
    .into())
}

/// The flags, checked before any cluster is contacted.
struct Flags {
    cluster_ids: Vec<ClusterId>,
    node_selector: Option<BTreeMap<String, String>>,
    tolerations: Option<Vec<Toleration>>,
}

impl Flags {
    fn parse(args: &TestNetworkArgs) -> Result<Self, UserError> {
        let cluster_ids = args
            .cluster_ids
            .iter()
            .map(|id| {
                ClusterId::new(id.clone())
                    .map_err(|e| UserError::Usage(format!("--cluster-id: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if args.timeout == 0 {
            return Err(UserError::Usage(
                "--timeout must be at least 1 second".into(),
            ));
        }
        let placement = args.placement.parse()?;
        Ok(Self {
            cluster_ids,
            node_selector: placement.node_selector,
            tolerations: placement.tolerations,
        })
    }
}

/// Makes the namespace, the servers and the clients, and gathers what the
/// clients report.
async fn check(
    consumer: &ClusterClient,
    local: &str,
    peers: &[Peer],
    plan: &Plan,
    deadline: Instant,
    printer: &Printer,
) -> anyhow::Result<Vec<Check>> {
    let ns = plan.namespace.as_str();
    let ids: Vec<&str> = peers.iter().map(Peer::id).collect();
    let names: Vec<&str> = peers.iter().map(Peer::name).collect();
    let step = printer.step(format!(
        "Making namespace {ns}, offloaded to {}",
        names.join(", ")
    ));
    let twins = step.ended(offload(consumer, ns, &ids, deadline).await)?;

    let step = printer.step("Starting the servers on both sides");
    let servers = step.ended(start_servers(consumer, peers, plan, deadline).await)?;

    let step = printer.step(format!(
        "Exporting Service {} to the clusterset",
        server_name(None)
    ));
    let clusterset = match export_local_server(consumer, ns).await {
        Ok(true) => {
            step.done("");
            true
        }
        Ok(false) => {
            step.done(
                "skipped: the Multi-Cluster Services API is not installed here (`liqoctl install` \
                 installs it)",
            );
            false
        }
        Err(e) => return step.ended(Err(e)),
    };

    let step = printer.step("Connecting from each side to the other");
    let clients = start_clients(
        consumer, peers, plan, &servers, &twins, clusterset, deadline,
    )
    .await;
    let reports = match clients {
        Ok(clients) => wait_for_reports(consumer, ns, &clients, deadline).await,
        Err(e) => Err(e),
    };
    // Ended below with the count of what failed.
    let reports = match reports {
        Ok(reports) => reports,
        Err(e) => return step.ended(Err(e)),
    };
    let down = if reports
        .iter()
        .all(|(_, r)| r.as_ref().is_ok_and(ProbeReport::passed))
    {
        vec![None; peers.len()]
    } else {
        tunnels_down(consumer, peers).await
    };
    let checks = judge(local, peers, &servers, &reports, &down, clusterset);
    let failed = checks.iter().filter(|c| !c.passed).count();
    if failed == 0 {
        step.done(format!("{} checks passed", checks.len()));
    } else {
        step.fail(format!("{failed} of {} checks failed", checks.len()));
    }
    Ok(checks)
}

/// Makes the namespace and its offloading to exactly these providers;
/// returns each provider's twin namespace once ready.
async fn offload(
    consumer: &ClusterClient,
    ns: &str,
    ids: &[&str],
    deadline: Instant,
) -> anyhow::Result<BTreeMap<String, String>> {
    let namespaces: Api<Namespace> = Api::all(consumer.client.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.to_owned()),
            labels: Some(managed_labels("namespace")),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(|e| consumer.explain(e, &format!("creating namespace {ns}")))?;
    let selector: LabelSelector = format!("{} in ({})", labels::PEER_CLUSTER_ID, ids.join(","))
        .parse()
        .map_err(|e| anyhow::anyhow!("invariant: cluster IDs make a selector: {e}"))?;
    let mut offloading = NamespaceOffloading::new(
        names::NAMESPACE_OFFLOADING,
        NamespaceOffloadingSpec {
            pod_offloading_strategy: PodOffloadingStrategy::LocalAndRemote,
            namespace_mapping_strategy: NamespaceMappingStrategy::DefaultName,
            remote_namespace_name: None,
            cluster_selector: liqo_api::offloading::cluster_selector(&[selector]),
        },
    );
    offloading.metadata.namespace = Some(ns.to_owned());
    offloading.metadata.labels = Some(managed_labels("offloading"));
    // The agents' rights in the namespace first, as `liqoctl offload`
    // gives them, then owned by the offloading.
    let providers = ids
        .iter()
        .map(|id| ClusterId::new(*id))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("invariant: peers have valid cluster IDs: {e}"))?;
    bind_virtual_kubelets(consumer, ns, None, &providers, "test the network again").await?;
    let api: Api<NamespaceOffloading> = Api::namespaced(consumer.client.clone(), ns);
    let created = api
        .create(&PostParams::default(), &offloading)
        .await
        .map_err(|e| consumer.explain(e, &format!("offloading namespace {ns}")))?;
    bind_virtual_kubelets(
        consumer,
        ns,
        created.metadata.uid.as_deref(),
        &providers,
        "test the network again",
    )
    .await?;
    let placement = serde_json::json!({ "metadata": { "labels": {
        labels::OFFLOADING: "true",
        labels::POD_OFFLOADING_STRATEGY: PodOffloadingStrategy::LocalAndRemote.as_str(),
    } } });
    namespaces
        .patch(ns, &PatchParams::default(), &Patch::Merge(&placement))
        .await
        .map_err(|e| consumer.explain(e, &format!("labelling namespace {ns}")))?;

    loop {
        let status = api
            .get(names::NAMESPACE_OFFLOADING)
            .await
            .map_err(|e| consumer.explain(e, "reading the offloading"))?
            .status
            .unwrap_or_default();
        let twins: BTreeMap<String, String> = status
            .clusters
            .iter()
            .filter(|c| c.ready)
            .map(|c| (c.cluster_id.to_string(), c.remote_namespace.clone()))
            .collect();
        if ids.iter().all(|id| twins.contains_key(*id)) {
            return Ok(twins);
        }
        if Instant::now() >= deadline {
            let why: Vec<String> = ids
                .iter()
                .filter(|id| !twins.contains_key(**id))
                .map(|id| {
                    let entry = status
                        .clusters
                        .iter()
                        .find(|c| c.cluster_id.as_str() == *id);
                    format!(
                        "{id}: {}",
                        entry
                            .and_then(|c| c.message.clone().or_else(|| c.reason.clone()))
                            .unwrap_or_else(|| "its virtual kubelet has not reported".into())
                    )
                })
                .collect();
            return Err(UserError::Timeout(format!(
                "the twin namespaces of {ns} are not ready in time ({}); see `liqoctl info`",
                why.join(", ")
            ))
            .into());
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn start_servers(
    consumer: &ClusterClient,
    peers: &[Peer],
    plan: &Plan,
    deadline: Instant,
) -> anyhow::Result<Servers> {
    let ns = plan.namespace.as_str();
    let pods: Api<Pod> = Api::namespaced(consumer.client.clone(), ns);
    let services: Api<Service> = Api::namespaced(consumer.client.clone(), ns);
    let sides: Vec<Option<usize>> = std::iter::once(None)
        .chain((0..peers.len()).map(Some))
        .collect();
    for side in &sides {
        let name = server_name(*side);
        let args = vec![
            "netcheck".to_owned(),
            "serve".to_owned(),
            "--listen".to_owned(),
            format!("0.0.0.0:{}", netcheck::PORT),
        ];
        let mut pod = test_pod(plan, &name, args, side.map(|i| peers[i].id()));
        let container = &mut pod
            .spec
            .as_mut()
            .expect("invariant: made with a spec")
            .containers[0];
        container.readiness_probe = Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(i32::from(netcheck::PORT)),
                ..Default::default()
            }),
            period_seconds: Some(1),
            ..Default::default()
        });
        pods.create(&PostParams::default(), &pod)
            .await
            .map_err(|e| consumer.explain(e, &format!("creating pod {name}")))?;
        let service = Service {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(managed_labels("server")),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                selector: Some(BTreeMap::from([(ROLE_LABEL.to_owned(), name.clone())])),
                ports: Some(vec![ServicePort {
                    name: Some("netcheck".into()),
                    port: i32::from(netcheck::PORT),
                    target_port: Some(IntOrString::Int(i32::from(netcheck::PORT))),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        services
            .create(&PostParams::default(), &service)
            .await
            .map_err(|e| consumer.explain(e, &format!("creating Service {name}")))?;
    }

    let mut addresses = BTreeMap::new();
    loop {
        for side in &sides {
            let name = server_name(*side);
            if addresses.contains_key(&name) {
                continue;
            }
            let pod = pods
                .get(&name)
                .await
                .map_err(|e| consumer.explain(e, &format!("reading pod {name}")))?;
            if let Some(why) = cannot_start(&pod) {
                return Err(UserError::Refused(format!(
                    "the test pod {name} cannot start on {}: {why}",
                    where_runs(*side, peers, consumer)
                ))
                .into());
            }
            if let Some(ip) = ready_ip(&pod) {
                addresses.insert(name, ip);
            }
        }
        if addresses.len() == sides.len() {
            break;
        }
        if Instant::now() >= deadline {
            let waiting: Vec<String> = sides
                .iter()
                .map(|s| server_name(*s))
                .filter(|n| !addresses.contains_key(n))
                .collect();
            return Err(UserError::Timeout(format!(
                "the test servers {} are not ready in time; `kubectl -n {ns} describe pods` \
                 says why",
                waiting.join(", ")
            ))
            .into());
        }
        tokio::time::sleep(POLL).await;
    }
    let mut remote = Vec::new();
    for i in 0..peers.len() {
        let name = server_name(Some(i));
        let cluster_ip = services
            .get(&name)
            .await
            .map_err(|e| consumer.explain(e, &format!("reading Service {name}")))?
            .spec
            .and_then(|s| s.cluster_ip)
            .unwrap_or_default();
        remote.push((addresses[&name].clone(), cluster_ip));
    }
    let remote_real = peers
        .iter()
        .zip(&remote)
        .map(|(peer, (seen, _))| match Remap::of(&peer.here) {
            None => Some(seen.clone()),
            Some(remap) => seen
                .parse()
                .ok()
                .and_then(|a| translate(a, remap.seen_as, remap.real))
                .map(|a| a.to_string()),
        })
        .collect();
    Ok(Servers {
        namespace: ns.to_owned(),
        local_pod_ip: addresses[&server_name(None)].clone(),
        remote,
        remote_real,
    })
}

/// Exports the consumer's server's Service; `false` when the cluster
/// has no ServiceExports (the MCS API's CRDs are not installed).
async fn export_local_server(consumer: &ClusterClient, ns: &str) -> anyhow::Result<bool> {
    let name = server_name(None);
    let mut export = ServiceExport::new(&name, ns);
    export.metadata.labels = Some(managed_labels("export"));
    let api: Api<ServiceExport> = Api::namespaced(consumer.client.clone(), ns);
    match api.create(&PostParams::default(), &export).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(consumer.explain(e, &format!("exporting Service {name}"))),
    }
}

/// How long a provider's client waits for the consumer's exported Service
/// to be answerable by its clusterset name before it is tried anyway
/// (and the check says where the chain broke).
const CLUSTERSET_PATIENCE: Duration = Duration::from_secs(30);

async fn start_clients(
    consumer: &ClusterClient,
    peers: &[Peer],
    plan: &Plan,
    servers: &Servers,
    twins: &BTreeMap<String, String>,
    clusterset: bool,
    deadline: Instant,
) -> anyhow::Result<Vec<Client>> {
    let pods: Api<Pod> = Api::namespaced(consumer.client.clone(), &plan.namespace);
    let mut clients = Vec::new();

    // The consumer's client reaches every provider's pod and Service.
    let mut targets = Vec::new();
    for (i, (pod_ip, cluster_ip)) in servers.remote.iter().enumerate() {
        targets.push(target(&format!("pod-{i}"), pod_ip));
        targets.push(target(&format!("service-{i}"), cluster_ip));
    }
    clients.push((None, targets));

    // Each provider's client reaches the consumer's pod, at the address
    // the provider sees it under, the Service reflected into its twin,
    // and that Service by its clusterset name, which the virtual kubelet
    // answers with the copy of the Service of its clusterset IP.
    let server = server_name(None);
    for (i, peer) in peers.iter().enumerate() {
        let seen = Remap::of(&peer.there).map_or_else(
            || servers.local_pod_ip.clone(),
            |r| r.address(&servers.local_pod_ip),
        );
        let twin = twins
            .get(peer.id())
            .ok_or_else(|| anyhow::anyhow!("invariant: every peer has a twin"))?;
        let cluster_ip = reflected_cluster_ip(peer, twin, &server, deadline).await?;
        let mut targets = vec![target("pod", &seen), target("service", &cluster_ip)];
        if clusterset {
            let patience = deadline.min(Instant::now() + CLUSTERSET_PATIENCE);
            let derived = liqo_api::clusterset::derived_name(&server);
            // Tried anyway if the copy is late: the check says where.
            let _ = reflected_cluster_ip(peer, twin, &derived, patience).await;
            targets.push(target(
                "clusterset",
                &format!(
                    "{server}.{}.svc.{}",
                    plan.namespace,
                    liqo_api::clusterset::DOMAIN
                ),
            ));
        }
        clients.push((Some(i), targets));
    }

    let mut made = Vec::new();
    for (side, targets) in clients {
        let name = client_name(side);
        let mut args = vec![
            "netcheck".to_owned(),
            "probe".to_owned(),
            "--timeout".to_owned(),
            PROBE_TIMEOUT_SECONDS.to_string(),
        ];
        for t in &targets {
            args.push("--target".into());
            args.push(t.arg());
        }
        let mut pod = test_pod(plan, &name, args, side.map(|i| peers[i].id()));
        let spec = pod.spec.as_mut().expect("invariant: made with a spec");
        spec.restart_policy = Some("Never".into());
        spec.containers[0].termination_message_policy = Some("FallbackToLogsOnError".into());
        pods.create(&PostParams::default(), &pod)
            .await
            .map_err(|e| consumer.explain(e, &format!("creating pod {name}")))?;
        made.push(Client { name, side });
    }
    Ok(made)
}

/// The ClusterIP of the consumer's Service `name` as the virtual kubelet
/// reflected it into the provider's twin namespace.
async fn reflected_cluster_ip(
    peer: &Peer,
    twin: &str,
    name: &str,
    deadline: Instant,
) -> anyhow::Result<String> {
    let provider = &peer.peering.provider;
    let services: Api<Service> = Api::namespaced(provider.client.clone(), twin);
    loop {
        let found = services.get_opt(name).await.map_err(|e| {
            provider.explain(e, &format!("reading the reflected Service {twin}/{name}"))
        })?;
        if let Some(ip) = found
            .and_then(|s| s.spec?.cluster_ip)
            .filter(|ip| !ip.is_empty() && ip != "None")
        {
            return Ok(ip);
        }
        if Instant::now() >= deadline {
            return Err(UserError::Timeout(format!(
                "Service {name} was not reflected into {twin} on cluster {} in time: the \
                 provider's virtual kubelet (`liqoctl info`) reflects it",
                peer.name()
            ))
            .into());
        }
        tokio::time::sleep(POLL).await;
    }
}

fn where_runs(side: Option<usize>, peers: &[Peer], consumer: &ClusterClient) -> String {
    match side {
        None => format!("cluster {}", consumer.name),
        Some(i) => format!("cluster {} (offloaded)", peers[i].name()),
    }
}

/// Waits for every client to end, and reads its report.
async fn wait_for_reports(
    consumer: &ClusterClient,
    ns: &str,
    clients: &[Client],
    deadline: Instant,
) -> anyhow::Result<Vec<(Option<usize>, Result<ProbeReport, String>)>> {
    let pods: Api<Pod> = Api::namespaced(consumer.client.clone(), ns);
    let mut reports: BTreeMap<String, Result<ProbeReport, String>> = BTreeMap::new();
    loop {
        for client in clients {
            if reports.contains_key(&client.name) {
                continue;
            }
            let pod = pods
                .get(&client.name)
                .await
                .map_err(|e| consumer.explain(e, &format!("reading pod {}", client.name)))?;
            if let Some(why) = cannot_start(&pod) {
                reports.insert(client.name.clone(), Err(why));
                continue;
            }
            if let Some(report) = report_of(&pod) {
                reports.insert(client.name.clone(), report);
            }
        }
        if reports.len() == clients.len() {
            break;
        }
        if Instant::now() >= deadline {
            let waiting: Vec<&str> = clients
                .iter()
                .filter(|c| !reports.contains_key(&c.name))
                .map(|c| c.name.as_str())
                .collect();
            return Err(UserError::Timeout(format!(
                "the test clients {} did not finish in time; `kubectl -n {ns} describe pods` \
                 says why",
                waiting.join(", ")
            ))
            .into());
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(clients
        .iter()
        .map(|c| {
            let report = reports
                .remove(&c.name)
                .unwrap_or_else(|| Err("no report".into()));
            (c.side, report)
        })
        .collect())
}

/// Deletes the namespace and waits until it is gone: its offloading's
/// finalizer holds it until the virtual kubelets removed the twins, so
/// that nothing is left on any cluster.
async fn clean_up(consumer: &ClusterClient, ns: &str, printer: &Printer) {
    let step = printer.step(format!("Removing namespace {ns} and its twins"));
    let namespaces: Api<Namespace> = Api::all(consumer.client.clone());
    match namespaces.delete(ns, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {
            step.done("");
            return;
        }
        Err(e) => {
            step.fail(format!(
                "{}; `kubectl delete namespace {ns}` removes it",
                consumer.explain(e, "deleting the namespace")
            ));
            return;
        }
    }
    let deadline = Instant::now() + CLEANUP_TIMEOUT;
    loop {
        match namespaces.get_opt(ns).await {
            Ok(None) => {
                step.done("");
                return;
            }
            Ok(Some(_)) if Instant::now() < deadline => tokio::time::sleep(POLL).await,
            Ok(Some(_)) => {
                step.fail(format!(
                    "still being deleted after {} s (a provider may be unreachable); it goes \
                     once its twins are removed",
                    CLEANUP_TIMEOUT.as_secs()
                ));
                return;
            }
            Err(e) => {
                step.fail(consumer.explain(e, "waiting for the namespace").to_string());
                return;
            }
        }
    }
}

/// A random suffix, as generated names have, so that two checks at once
/// (or one left behind with --keep) never share a namespace.
fn suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}
