//! `liqoctl test network`: checks, with real traffic between pods, that the
//! pod networks of the consumer and its providers are linked, pod to pod
//! and pod to Service, both ways; and says what failed where.
//!
//! It uses only what a user of liqo-rs uses: a namespace of its own,
//! offloaded to the providers checked; in it a netcheck server pod and a
//! Service on each side (the provider's pods are offloaded ones, the
//! provider's Service the reflected one), then a client pod on each side
//! that connects to the other side's pod and Service and leaves its report
//! in its termination message (`liqo-gateway netcheck`, api::netcheck).
//! Everything is removed afterwards, also when the check fails or is
//! interrupted: deleting the namespace removes its offloading, whose
//! finalizer holds until the virtual kubelets have removed the twins.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerState, EnvVar, EnvVarSource, Namespace, NodeAffinity,
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector, Pod, PodSpec,
    Probe, SeccompProfile, SecurityContext, Service, ServicePort, ServiceSpec, TCPSocketAction,
    Toleration,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::names::{self, labels};
use liqo_api::netcheck::{self, Report, Target};
use liqo_api::networking::{Connection, Remap, translate};
use liqo_api::offloading::{
    LabelSelector, NamespaceMappingStrategy, NamespaceOffloading, NamespaceOffloadingSpec,
    PodOffloadingStrategy,
};
use serde::Serialize;
use tokio::time::Instant;

use crate::cli::{GlobalArgs, TestNetworkArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::flags::{node_selector_flag, tolerations_flag};
use crate::kube::cluster::{installed, installed_pod_placement};
use crate::peering::consumer::bind_virtual_kubelets;
use crate::peering::outgoing::Peering;
use crate::printer::Printer;

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
        Ok(Self {
            cluster_ids,
            node_selector: node_selector_flag(&args.node_selector)?,
            tolerations: tolerations_flag(&args.tolerations)?,
        })
    }
}

/// What the check makes, and where.
struct Plan {
    namespace: String,
    image: String,
    node_selector: BTreeMap<String, String>,
    tolerations: Vec<Toleration>,
}

/// A provider to check, with both ends of its tunnel.
struct Peer {
    peering: Peering,
    /// The consumer's end (in `liqo`): where the consumer sees the
    /// provider's pods.
    here: Connection,
    /// The provider's end (in the tenant namespace): where the provider
    /// sees the consumer's pods.
    there: Connection,
}

impl Peer {
    fn id(&self) -> &str {
        self.peering.provider_id.as_str()
    }

    /// The provider's name, for people to read.
    fn name(&self) -> &str {
        &self.peering.provider_name
    }
}

/// The outgoing peerings to check: those named, or every one whose
/// networks are linked. A peering without a tunnel, or whose tunnel is
/// down, is refused before anything is made.
async fn peers(
    consumer: &ClusterClient,
    consumer_id: &ClusterId,
    named: &[ClusterId],
) -> anyhow::Result<Vec<Peer>> {
    let connections: Api<Connection> = Api::namespaced(consumer.client.clone(), names::NAMESPACE);
    let ids: Vec<ClusterId> = if named.is_empty() {
        let list = Api::<liqo_api::core::ForeignCluster>::all(consumer.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| consumer.explain(e, "listing the peerings"))?;
        list.items
            .into_iter()
            .filter(|fc| fc.spec.outgoing)
            .filter_map(|fc| ClusterId::new(fc.metadata.name?).ok())
            .collect()
    } else {
        named.to_vec()
    };
    if ids.is_empty() {
        return Err(UserError::NotFound(format!(
            "cluster {} has no outgoing peering to check; `liqoctl peer` makes one",
            consumer.name
        ))
        .into());
    }
    let mut peers = Vec::new();
    for id in ids {
        let peering = Peering::reach(consumer.clone(), id.clone()).await?;
        let here = connections
            .get_opt(id.as_str())
            .await
            .map_err(|e| consumer.explain(e, &format!("reading the tunnel to {id}")))?
            .ok_or_else(|| {
                UserError::Refused(format!(
                    "the pod networks of clusters {} and {id} are not linked: `liqoctl network \
                     connect --cluster-id {id}` links them",
                    consumer.name
                ))
            })?;
        if !here.is_established() {
            return Err(UserError::Refused(format!(
                "the tunnel between clusters {} and {id} is down ({}); see `liqoctl info peer {id}`",
                consumer.name,
                condition_message(&here)
            ))
            .into());
        }
        let there = Api::<Connection>::namespaced(
            peering.provider.client.clone(),
            &peering.tenant_namespace,
        )
        .get_opt(consumer_id.as_str())
        .await
        .map_err(|e| {
            peering
                .provider
                .explain(e, "reading the provider's end of the tunnel")
        })?
        .ok_or_else(|| {
            UserError::Refused(format!(
                "cluster {id} has no end of the tunnel with {}: `liqoctl network connect \
                 --cluster-id {id}` writes it again",
                consumer.name
            ))
        })?;
        peers.push(Peer {
            peering,
            here,
            there,
        });
    }
    Ok(peers)
}

fn condition_message(connection: &Connection) -> String {
    connection
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Established"))
        .map(|c| c.message.clone())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "no status from the gateway yet".into())
}

/// One connection attempted by a client pod, and how it went.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Check {
    /// The cluster the client ran on.
    from: String,
    /// The cluster of the pod or Service it reached for.
    to: String,
    /// `pod` or `service`.
    kind: &'static str,
    /// The server pod, or its Service, by name.
    name: String,
    address: String,
    passed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    rtt_ms: Option<f64>,
    /// The client's address as the server saw it.
    #[serde(skip_serializing_if = "Option::is_none")]
    seen_from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// Where the failure lies, as far as the other checks tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    hint: Option<String>,
    /// The provider of the peering crossed (an index into the peers).
    #[serde(skip)]
    peer: usize,
    /// Whether the client ran on the consumer.
    #[serde(skip)]
    outbound: bool,
}

#[derive(Serialize)]
struct Summary<'a> {
    passed: bool,
    checks: &'a [Check],
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

    let step = printer.step("Connecting from each side to the other");
    let clients = start_clients(consumer, peers, plan, &servers, &twins, deadline).await;
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
        .all(|(_, r)| r.as_ref().is_ok_and(Report::passed))
    {
        vec![None; peers.len()]
    } else {
        tunnels_down(consumer, peers).await
    };
    let checks = judge(local, peers, &servers, &reports, &down);
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
    bind_virtual_kubelets(consumer, ns, None, &providers).await?;
    let api: Api<NamespaceOffloading> = Api::namespaced(consumer.client.clone(), ns);
    let created = api
        .create(&PostParams::default(), &offloading)
        .await
        .map_err(|e| consumer.explain(e, &format!("offloading namespace {ns}")))?;
    bind_virtual_kubelets(consumer, ns, created.metadata.uid.as_deref(), &providers).await?;
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

/// Our labels, the component saying which part of the check it is.
fn managed_labels(component: &str) -> BTreeMap<String, String> {
    crate::manifests::common_labels(&format!("test-network-{component}"))
}

/// The servers' addresses, as the cluster each runs on gives them.
struct Servers {
    /// The consumer's server pod, at its own address.
    local_pod_ip: String,
    /// Each provider's server: its pod address as the consumer sees it, and
    /// the ClusterIP of its Service on the consumer.
    remote: Vec<(String, String)>,
    /// Each provider's server pod at its own address in its cluster.
    remote_real: Vec<Option<String>>,
}

fn server_name(index: Option<usize>) -> String {
    match index {
        None => "server-local".into(),
        Some(i) => format!("server-remote-{i}"),
    }
}

fn client_name(index: Option<usize>) -> String {
    match index {
        None => "client-local".into(),
        Some(i) => format!("client-remote-{i}"),
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
        local_pod_ip: addresses[&server_name(None)].clone(),
        remote,
        remote_real,
    })
}

/// The clients, each named and given its targets.
struct Client {
    name: String,
    /// `None` for the consumer's client, else the provider's index.
    side: Option<usize>,
}

async fn start_clients(
    consumer: &ClusterClient,
    peers: &[Peer],
    plan: &Plan,
    servers: &Servers,
    twins: &BTreeMap<String, String>,
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
    // the provider sees it under, and the Service reflected into its twin.
    for (i, peer) in peers.iter().enumerate() {
        let seen = Remap::of(&peer.there).map_or_else(
            || servers.local_pod_ip.clone(),
            |r| r.address(&servers.local_pod_ip),
        );
        let twin = twins
            .get(peer.id())
            .ok_or_else(|| anyhow::anyhow!("invariant: every peer has a twin"))?;
        let cluster_ip = reflected_cluster_ip(peer, twin, deadline).await?;
        clients.push((
            Some(i),
            vec![target("pod", &seen), target("service", &cluster_ip)],
        ));
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

fn target(name: &str, host: &str) -> Target {
    let address = if host.contains(':') {
        format!("[{host}]:{}", netcheck::PORT)
    } else {
        format!("{host}:{}", netcheck::PORT)
    };
    Target {
        name: name.to_owned(),
        address,
    }
}

/// The ClusterIP of the consumer's server's Service as the virtual kubelet
/// reflected it into the provider's twin namespace.
async fn reflected_cluster_ip(
    peer: &Peer,
    twin: &str,
    deadline: Instant,
) -> anyhow::Result<String> {
    let provider = &peer.peering.provider;
    let services: Api<Service> = Api::namespaced(provider.client.clone(), twin);
    let name = server_name(None);
    loop {
        let found = services.get_opt(&name).await.map_err(|e| {
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

/// A netcheck pod of the plan: on the consumer's nodes where the plan
/// says, or on a provider's virtual node.
fn test_pod(plan: &Plan, name: &str, args: Vec<String>, provider: Option<&str>) -> Pod {
    let mut tolerations = plan.tolerations.clone();
    let (node_selector, affinity) = match provider {
        Some(id) => {
            tolerations.push(Toleration {
                key: Some(names::VIRTUAL_NODE_TAINT.to_owned()),
                operator: Some("Exists".into()),
                ..Default::default()
            });
            let selector = BTreeMap::from([
                (labels::VIRTUAL_NODE.to_owned(), "true".to_owned()),
                (labels::PEER_CLUSTER_ID.to_owned(), id.to_owned()),
            ]);
            (Some(selector), None)
        }
        None => {
            // Never on a virtual node: this is the consumer's own side.
            let off_virtual_nodes = NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: labels::VIRTUAL_NODE.to_owned(),
                            operator: "DoesNotExist".into(),
                            values: None,
                        }]),
                        match_fields: None,
                    }],
                }),
                ..Default::default()
            };
            (
                (!plan.node_selector.is_empty()).then(|| plan.node_selector.clone()),
                Some(k8s_openapi::api::core::v1::Affinity {
                    node_affinity: Some(off_virtual_nodes),
                    ..Default::default()
                }),
            )
        }
    };
    let mut pod_labels = managed_labels("pod");
    pod_labels.insert(ROLE_LABEL.to_owned(), name.to_owned());
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(pod_labels),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "netcheck".into(),
                image: Some(plan.image.clone()),
                args: Some(args),
                // What Pod Security's `restricted` level asks, so that the
                // check runs in clusters that enforce it on new namespaces.
                security_context: Some(SecurityContext {
                    run_as_non_root: Some(true),
                    run_as_user: Some(65532),
                    allow_privilege_escalation: Some(false),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".into()]),
                        ..Default::default()
                    }),
                    seccomp_profile: Some(SeccompProfile {
                        type_: "RuntimeDefault".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                env: Some(vec![EnvVar {
                    name: "POD_NAME".into(),
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "metadata.name".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            node_selector,
            affinity,
            tolerations: (!tolerations.is_empty()).then_some(tolerations),
            termination_grace_period_seconds: Some(1),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Why a pod will not start by waiting longer (an image that cannot be
/// pulled, a configuration error), as its containers say.
fn cannot_start(pod: &Pod) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses.iter().find_map(|c| {
        let waiting = c.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.as_deref()?;
        matches!(
            reason,
            "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" | "CreateContainerConfigError"
        )
        .then(|| {
            format!(
                "{reason}: {} (give another image with --image)",
                waiting.message.as_deref().unwrap_or("no message")
            )
        })
    })
}

fn ready_ip(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .as_ref()?
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    ready.then(|| status.pod_ip.clone()).flatten()
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
) -> anyhow::Result<Vec<(Option<usize>, Result<Report, String>)>> {
    let pods: Api<Pod> = Api::namespaced(consumer.client.clone(), ns);
    let mut reports: BTreeMap<String, Result<Report, String>> = BTreeMap::new();
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

/// The report a client left, once it has ended.
fn report_of(pod: &Pod) -> Option<Result<Report, String>> {
    let status = pod.status.as_ref()?;
    if !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let terminated = status
        .container_statuses
        .as_ref()
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s: &ContainerState| s.terminated.as_ref());
    let Some(terminated) = terminated else {
        return Some(Err(format!(
            "the pod ended ({}) without a container status",
            status.phase.as_deref().unwrap_or_default()
        )));
    };
    let message = terminated.message.as_deref().unwrap_or_default();
    Some(serde_json::from_str::<Report>(message.trim()).map_err(|_| {
        format!(
            "the client exited {} without a report{}",
            terminated.exit_code,
            if message.is_empty() {
                String::new()
            } else {
                format!(": {}", message.trim())
            }
        )
    }))
}

/// Turns the reports into checks, each failure with where it lies as
/// far as the other checks tell.
fn judge(
    local: &str,
    peers: &[Peer],
    servers: &Servers,
    reports: &[(Option<usize>, Result<Report, String>)],
    down: &[Option<String>],
) -> Vec<Check> {
    let mut checks = Vec::new();
    for (side, report) in reports {
        // What each client was to reach: (target name, the peer crossed,
        // kind), pod then Service, in the order its targets were given.
        let expected: Vec<(String, usize, &'static str)> = match side {
            None => (0..peers.len())
                .flat_map(|i| {
                    [
                        (format!("pod-{i}"), i, "pod"),
                        (format!("service-{i}"), i, "service"),
                    ]
                })
                .collect(),
            Some(i) => vec![("pod".into(), *i, "pod"), ("service".into(), *i, "service")],
        };
        for (target, peer, kind) in expected {
            let outbound = side.is_none();
            let (from, to, server) = if outbound {
                (
                    local.to_owned(),
                    peers[peer].name().to_owned(),
                    server_name(Some(peer)),
                )
            } else {
                (
                    peers[peer].name().to_owned(),
                    local.to_owned(),
                    server_name(None),
                )
            };
            let outcome = report
                .as_ref()
                .ok()
                .and_then(|r| r.results.iter().find(|o| o.name == target));
            let error = match (report, outcome) {
                (_, Some(o)) => o.error.clone(),
                (Err(why), None) => Some(why.clone()),
                (Ok(_), None) => Some("the client's report does not mention it".into()),
            };
            checks.push(Check {
                from,
                to,
                kind,
                name: server,
                address: outcome.map(|o| o.address.clone()).unwrap_or_default(),
                passed: outcome.is_some_and(|o| o.passed()),
                rtt_ms: outcome
                    .and_then(|o| o.rtt_ms)
                    .map(|ms| (ms * 100.0).round() / 100.0),
                seen_from: outcome
                    .and_then(|o| o.answer.as_ref())
                    .map(|a| a.seen_from.clone()),
                error,
                hint: None,
                peer,
                outbound,
            });
        }
    }
    add_hints(&mut checks, peers, servers, down);
    checks
}

/// Each peering's tunnel as the consumer's gateway says it is now: `Some`
/// (its reason) when down. Read after the checks, since a tunnel that
/// broke during them is the likeliest cause of their failure.
async fn tunnels_down(consumer: &ClusterClient, peers: &[Peer]) -> Vec<Option<String>> {
    let api: Api<Connection> = Api::namespaced(consumer.client.clone(), names::NAMESPACE);
    let mut down = Vec::new();
    for peer in peers {
        down.push(match api.get_opt(peer.id()).await {
            Ok(Some(c)) if c.is_established() => None,
            Ok(Some(c)) => Some(condition_message(&c)),
            Ok(None) => Some("its Connection was removed".into()),
            // Unknown: the checks speak for themselves.
            Err(_) => None,
        });
    }
    down
}

/// Says, for each failed check, which hop is at fault as far as can be
/// told from outside: a Service that fails where its pod answers is the
/// Service's translation on the client's cluster; a pod that does not
/// answer lies across the tunnel, whose hops are named with addresses.
fn add_hints(checks: &mut [Check], peers: &[Peer], servers: &Servers, down: &[Option<String>]) {
    // Checks come in pairs per direction: the pod, then its Service.
    for pair in checks.chunks_mut(2) {
        let [pod, service] = pair else { continue };
        let peer = &peers[pod.peer];
        if let Some(why) = down.get(pod.peer).cloned().flatten()
            && !(pod.passed && service.passed)
        {
            let hint = format!(
                "the tunnel between {} and {} is down ({why}); `liqoctl info peer {}` shows it",
                if pod.outbound { &pod.from } else { &pod.to },
                peer.name(),
                peer.name()
            );
            for check in [pod, service] {
                if !check.passed {
                    check.hint = Some(hint.clone());
                }
            }
            continue;
        }
        if !pod.passed {
            // Where the client's cluster sees the server's pods, and the
            // server pod's own address in its cluster.
            let (end, real) = if pod.outbound {
                (
                    &peer.here,
                    servers.remote_real.get(pod.peer).cloned().flatten(),
                )
            } else {
                (&peer.there, Some(servers.local_pod_ip.clone()))
            };
            let seen = end
                .status
                .as_ref()
                .and_then(|s| s.peer_seen_as.clone())
                .unwrap_or_else(|| end.spec.pod_cidr.clone());
            pod.hint = Some(format!(
                "the hops: the pod on {from} to its gateway (the node must route {seen} to the \
                 gateway's node, unmasqueraded), the tunnel between the gateways, {to}'s \
                 gateway to the pod at {real} (network policies must let the peer's pods in); \
                 docs/network.md",
                from = pod.from,
                to = pod.to,
                real = real.as_deref().unwrap_or("its address"),
            ));
        }
        if !service.passed && pod.passed {
            service.hint = Some(format!(
                "the pod answers at its address, so the Service is at fault on {}: its \
                 ClusterIP {} must lead to {} (kube-proxy, and the Service's EndpointSlices \
                 there)",
                service.from, service.address, pod.address
            ));
        }
    }
}

fn table(checks: &[Check]) -> String {
    let mut table = comfy_table::Table::new();
    table
        .load_style(comfy_table::presets::UTF8_BORDERS_ONLY)
        .set_header(["FROM", "TO", "ADDRESS", "RESULT"]);
    for c in checks {
        let to = format!("{} ({} {})", c.to, c.kind, c.name);
        let result = if c.passed {
            format!(
                "ok, {:.2} ms, seen from {}",
                c.rtt_ms.unwrap_or_default(),
                c.seen_from.as_deref().unwrap_or("?")
            )
        } else {
            format!("FAILED: {}", c.error.as_deref().unwrap_or("no answer"))
        };
        table.add_row([c.from.as_str(), to.as_str(), c.address.as_str(), &result]);
    }
    let mut text = table.to_string();
    // Where each failure lies, once per distinct finding.
    let mut told = Vec::new();
    for c in checks.iter().filter(|c| !c.passed) {
        if let Some(hint) = c.hint.as_ref().filter(|h| !told.contains(h)) {
            text.push_str(&format!("\n{} to {}'s {}: {hint}", c.from, c.to, c.kind));
            told.push(hint);
        }
    }
    text
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

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, PodStatus};
    use liqo_api::netcheck::{Answer, Outcome};

    use super::*;

    fn plan() -> Plan {
        Plan {
            namespace: "liqo-test-network-x".into(),
            image: "img:1".into(),
            node_selector: BTreeMap::from([("role".into(), "edge".into())]),
            tolerations: vec![Toleration {
                key: Some("dedicated".into()),
                operator: Some("Exists".into()),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn local_pods_stay_off_virtual_nodes_and_remote_ones_go_to_their_provider() {
        let local = test_pod(&plan(), "server-local", vec![], None);
        let spec = local.spec.expect("spec");
        assert_eq!(spec.node_selector, Some(plan().node_selector));
        let security = spec.containers[0]
            .security_context
            .clone()
            .expect("restricted");
        assert_eq!(
            (
                security.run_as_non_root,
                security.allow_privilege_escalation
            ),
            (Some(true), Some(false))
        );
        let terms = spec
            .affinity
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required_during_scheduling_ignored_during_execution)
            .expect("a required affinity")
            .node_selector_terms;
        let requirement = &terms[0].match_expressions.as_ref().expect("expressions")[0];
        assert_eq!(
            (requirement.key.as_str(), requirement.operator.as_str()),
            (labels::VIRTUAL_NODE, "DoesNotExist")
        );

        let remote = test_pod(&plan(), "server-remote-0", vec![], Some("p1"));
        let spec = remote.spec.expect("spec");
        let selector = spec.node_selector.expect("a node selector");
        assert_eq!(selector[labels::PEER_CLUSTER_ID], "p1");
        assert_eq!(selector[labels::VIRTUAL_NODE], "true");
        let tolerated: Vec<_> = spec
            .tolerations
            .expect("tolerations")
            .into_iter()
            .filter_map(|t| t.key)
            .collect();
        assert_eq!(tolerated, ["dedicated", names::VIRTUAL_NODE_TAINT]);
        let pod_labels = remote.metadata.labels.expect("labels");
        assert_eq!(pod_labels[ROLE_LABEL], "server-remote-0");
        assert_eq!(pod_labels[labels::MANAGED_BY], labels::MANAGED_BY_VALUE);
    }

    #[test]
    fn targets_bracket_ipv6_addresses() {
        assert_eq!(target("pod", "10.0.0.1").address, "10.0.0.1:8080");
        assert_eq!(target("pod", "fd00::1").address, "[fd00::1]:8080");
    }

    fn ended(phase: &str, exit_code: i32, message: Option<&str>) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                container_statuses: Some(vec![ContainerStatus {
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code,
                            message: message.map(Into::into),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_report_is_read_from_the_termination_message_once_the_pod_ended() {
        let running = Pod {
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(report_of(&running).is_none());
        let report = r#"{"from":"client-local","results":[]}"#;
        let read = report_of(&ended("Succeeded", 0, Some(report))).expect("ended");
        assert_eq!(read.expect("a report").from, "client-local");
        let err = report_of(&ended("Failed", 2, Some("error: bad flag")))
            .expect("ended")
            .expect_err("no report");
        assert_eq!(err, "the client exited 2 without a report: error: bad flag");
    }

    fn outcome(name: &str, address: &str, passed: bool) -> Outcome {
        Outcome {
            name: name.into(),
            address: address.into(),
            attempts: 1,
            rtt_ms: passed.then_some(0.5),
            answer: passed.then(|| Answer {
                server: "s".into(),
                seen_from: "100.64.1.2".into(),
            }),
            error: (!passed).then(|| "no answer to the connection within 2 s".into()),
        }
    }

    // A kube client (never called) needs a runtime to be made.
    #[tokio::test]
    async fn a_failed_service_whose_pod_answers_is_blamed_on_the_service() {
        let report = Report {
            from: "client-local".into(),
            results: vec![
                outcome("pod-0", "100.64.2.3:8080", true),
                outcome("service-0", "10.96.0.20:8080", false),
            ],
        };
        let peer = connection_pair();
        let servers = Servers {
            local_pod_ip: "10.200.1.2".into(),
            remote: vec![("100.64.2.3".into(), "10.96.0.20".into())],
            remote_real: vec![Some("10.200.2.3".into())],
        };
        let checks = judge("home", &[peer], &servers, &[(None, Ok(report))], &[None]);
        assert_eq!(checks.len(), 2);
        assert!(checks[0].passed && checks[0].hint.is_none());
        assert_eq!(checks[0].seen_from.as_deref(), Some("100.64.1.2"));
        let hint = checks[1].hint.as_deref().expect("a hint");
        assert!(hint.contains("the Service is at fault on home"), "{hint}");
        assert!(
            hint.contains("10.96.0.20:8080 must lead to 100.64.2.3:8080"),
            "{hint}"
        );
    }

    // A kube client (never called) needs a runtime to be made.
    #[tokio::test]
    async fn a_pod_that_does_not_answer_names_the_hops_with_their_addresses() {
        let report = Report {
            from: "client-remote-0".into(),
            results: vec![
                outcome("pod", "100.64.1.2:8080", false),
                outcome("service", "10.97.0.9:8080", false),
            ],
        };
        let servers = Servers {
            local_pod_ip: "10.200.1.2".into(),
            remote: vec![("100.64.2.3".into(), "10.96.0.20".into())],
            remote_real: vec![Some("10.200.2.3".into())],
        };
        let reports = [(Some(0), Ok(report))];
        let checks = judge("home", &[connection_pair()], &servers, &reports, &[None]);
        assert_eq!(
            (checks[0].from.as_str(), checks[0].to.as_str()),
            ("foreign", "home")
        );
        let hint = checks[0].hint.as_deref().expect("a hint");
        assert!(hint.contains("the pod on foreign to its gateway"), "{hint}");
        assert!(hint.contains("must route 100.64.0.0/16"), "{hint}");
        assert!(
            hint.contains("home's gateway to the pod at 10.200.1.2"),
            "{hint}"
        );
        // The Service failed too, and with its pod: no separate blame.
        assert!(checks[1].hint.is_none());

        // With the tunnel down now, that is what both failures are put on.
        let down = [Some(
            "no handshake with the peer's gateway at 192.0.2.1:51820".into(),
        )];
        let checks = judge("home", &[connection_pair()], &servers, &reports, &down);
        for check in &checks {
            assert_eq!(
                check.hint.as_deref(),
                Some(
                    "the tunnel between home and foreign is down (no handshake with the peer's \
                     gateway at 192.0.2.1:51820); `liqoctl info peer foreign` shows it"
                )
            );
        }
    }

    // A kube client (never called) needs a runtime to be made.
    #[tokio::test]
    async fn a_client_without_a_report_fails_each_of_its_checks() {
        let servers = Servers {
            local_pod_ip: "10.200.1.2".into(),
            remote: vec![("100.64.2.3".into(), "10.96.0.20".into())],
            remote_real: vec![None],
        };
        let checks = judge(
            "home",
            &[connection_pair()],
            &servers,
            &[(None, Err("ImagePullBackOff: nope".into()))],
            &[None],
        );
        assert_eq!(checks.len(), 2);
        assert!(checks.iter().all(|c| !c.passed));
        assert_eq!(checks[1].error.as_deref(), Some("ImagePullBackOff: nope"));
    }

    /// A peering with provider `p1` whose both ends see the other's pods
    /// as 100.64.0.0/16.
    fn connection_pair() -> Peer {
        let end = |peer: &str| {
            let mut c = Connection::new(
                peer,
                liqo_api::networking::ConnectionSpec {
                    cluster_id: ClusterId::new(peer.to_owned()).expect("id"),
                    cluster_name: peer.into(),
                    public_key: String::new(),
                    endpoint: None,
                    pod_cidr: "10.200.0.0/16".into(),
                },
            );
            c.status = Some(liqo_api::networking::ConnectionStatus {
                peer_seen_as: Some("100.64.0.0/16".into()),
                ..Default::default()
            });
            c
        };
        let client = |name: &str| ClusterClient {
            client: kube::Client::try_from(kube::Config::new(
                "https://127.0.0.1:1".parse().expect("url"),
            ))
            .expect("a client that is never called"),
            name: name.into(),
            server: "https://127.0.0.1:1".into(),
            ca_der: None,
        };
        Peer {
            peering: Peering {
                consumer: client("home"),
                provider: client("p1"),
                provider_id: ClusterId::new("p1".to_owned()).expect("id"),
                provider_name: "foreign".into(),
                tenant_namespace: "liqo-tenant-home".into(),
            },
            here: end("p1"),
            there: end("home"),
        }
    }
}
