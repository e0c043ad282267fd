//! `liqoctl install`: checks everything it can before it writes anything
//! (reachability, permissions, a conflicting identity), then applies the
//! manifests and waits for the agents. Applying is idempotent, so a run that
//! stops halfway is resumed by running it again.

use std::collections::BTreeMap;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Service, Toleration};
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::runtime::wait::conditions;
use liqo_api::core::identity;
use liqo_api::discovery::ApiAddress;
use liqo_api::images::{self, ImageSource, PullPolicy};
use liqo_api::names::{self, labels};
use liqo_api::networking::GatewayServiceType;
use liqo_api::{ClusterId, ClusterIdentity};
use serde_json::json;

use crate::cli::{GlobalArgs, InstallArgs, OutputFormat};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::flags::parse_pairs;
use crate::kube::apply::{self, Change};
use crate::kube::cluster::{
    installed_gateway, placement_of, read_identity, serves_mutating_admission_policy,
};
use crate::kube::ownership::{self, Ownership};
use crate::kube::rollout::{self, Readiness};
use crate::kube::wait::{self, Waited};
use crate::manifests::{self, Manifest, Options};
use crate::peering::{offloading, terms};
use crate::printer::Printer;
use liqo_api::agents::PortRange;
use liqo_api::agents::gateway::DEFAULT_TUNNEL_PORTS;

mod placement_tls;

pub async fn run(args: &InstallArgs, global: &GlobalArgs, printer: Printer) -> anyhow::Result<()> {
    let flags = Flags::parse(args)?;
    let cluster = ClusterClient::local(global).await?;
    // One deadline for every wait of the run.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);

    let step = printer.step(format!("Checking cluster {}", cluster.name));
    cluster
        .client
        .apiserver_version()
        .await
        .map_err(|e| cluster.explain(e, "reading the Kubernetes version"))?;
    if !args.dry_run {
        check_permissions(&cluster).await?;
    }
    // Nothing is written before we know every name we use is ours to use.
    let foreign = ownership::foreign(&cluster, &manifests::every_object()).await?;
    if !foreign.is_empty() {
        step.fail("not ours");
        return Err(UserError::Refused(format!(
            "cluster {} already has {}, which liqoctl did not create; \
             remove or rename {}, then install again",
            cluster.name,
            foreign.join(", "),
            if foreign.len() == 1 { "it" } else { "them" }
        ))
        .into());
    }
    let existing = read_identity(&cluster).await?;
    let mut notes = Vec::new();
    let identity = resolve_identity(&cluster, &flags, existing.as_ref(), &mut notes).await?;
    step.done("");
    // After the step, so that the notes do not tear its spinner.
    for note in notes {
        printer.info(format!("  {note}"));
    }

    // Read once: what a run without the flags that shape it keeps.
    let gateway = installed_gateway(&cluster).await?;
    let installed = gateway.as_ref().map(placement_of).unwrap_or_default();
    let placement = serves_mutating_admission_policy(&cluster).await;
    // Without MutatingAdmissionPolicy, the virtual kubelets place pods
    // with a webhook, whose certificate is kept while valid.
    let placement_tls = if placement {
        None
    } else {
        printer.info(
            "  note: this cluster does not serve MutatingAdmissionPolicy \
             (admissionregistration.k8s.io/v1beta1): the virtual kubelets place the pods \
             of offloaded namespaces with a webhook instead (docs/offloading.md)",
        );
        Some(placement_tls::current_or_new(&cluster).await?)
    };
    let installed_gateway = gateway
        .as_ref()
        .map(manifests::agents::gateway_args_of)
        .unwrap_or_default();
    let announce = flags.announce.unwrap_or(installed_gateway.announce);
    let kept = installed_gateway.tunnels.clone();
    let tunnels = manifests::agents::TunnelSettings {
        endpoint_address: flags
            .tunnels
            .endpoint_address
            .clone()
            .or(kept.endpoint_address),
        ports: flags.tunnels.ports.or(kept.ports),
        remap_pool: if flags.tunnels.remap_pool.is_empty() {
            kept.remap_pool
        } else {
            flags.tunnels.remap_pool.clone()
        },
        service_type: flags.service_type.unwrap_or(kept.service_type),
    };
    let advertise_address = advertise_address(&cluster, &flags, installed_gateway, announce)?;
    let manifests = manifests::render(&Options {
        identity: Some(identity.clone()),
        node_selector: flags.node_selector.unwrap_or(installed.node_selector),
        tolerations: flags.tolerations.unwrap_or(installed.tolerations),
        images: ImageSource {
            registry: flags.image_registry.unwrap_or(installed.images.registry),
            tag: flags.image_tag.unwrap_or(installed.images.tag),
            pull_policy: flags
                .image_pull_policy
                .unwrap_or(installed.images.pull_policy),
        },
        without_placement_policy: !placement,
        placement_webhook_ca: placement_tls
            .as_ref()
            .map(placement_tls::PlacementTls::ca_bundle),
        advertise_address: advertise_address.clone(),
        announce,
        tunnels: tunnels.clone(),
    });
    if args.dry_run {
        // The key is never printed, so a pair made for this print is of
        // no use once applied: say so rather than let the webhook trust
        // a CA whose certificate exists nowhere.
        if placement_tls.as_ref().is_some_and(|t| t.fresh) {
            printer.info(format!(
                "  note: the placement webhook's caBundle is of a CA made for this print only: \
                 its Secret {}/{} (which holds the key) is not printed; apply with \
                 `liqoctl install`, which makes both, or make that Secret yourself \
                 (ca.crt, tls.crt, tls.key for liqo-placement.liqo.svc) and set its CA \
                 as the webhook's caBundle",
                names::NAMESPACE,
                manifests::webhook::PLACEMENT_TLS_SECRET,
            ));
        }
        // The MCS API's CRDs follow ours: install creates them where
        // they are missing.
        let mut printed = manifests.clone();
        let ours = printed
            .iter()
            .filter(|m| matches!(m, Manifest::Crd(_)))
            .count();
        printed.splice(ours..ours, manifests::mcs::crds());
        return print_manifests(
            &printer,
            &printed,
            args.output.output.unwrap_or(OutputFormat::Yaml),
        );
    }

    // A new certificate is written before the webhook that trusts it
    // (never printed: it holds the key).
    let mut to_apply = manifests.clone();
    if let Some(tls) = placement_tls.as_ref().filter(|t| t.fresh) {
        let at = to_apply
            .iter()
            .position(|m| matches!(m, Manifest::MutatingWebhookConfiguration(_)))
            .unwrap_or(to_apply.len());
        to_apply.insert(at, tls.secret());
    }
    let step = printer.step(format!("Applying {} objects", to_apply.len()));
    let mut changes = BTreeMap::<String, usize>::new();
    for manifest in &to_apply {
        let change = apply::apply(&cluster, manifest).await?;
        if change != Change::Unchanged {
            tracing::info!("{} {change}", manifest.describe());
        }
        *changes.entry(change.to_string()).or_default() += 1;
        if let Manifest::Crd(crd) = manifest {
            wait_established(&cluster, crd, deadline, args.timeout).await?;
        }
    }
    // A Service in front of the tunnels that is no longer wanted goes
    // (only ours: a namesake of someone else's was refused above).
    if tunnels.service_type.is_none() {
        let service = Manifest::Service(Box::new(Service {
            metadata: ObjectMeta {
                name: Some(names::GATEWAY.to_owned()),
                namespace: Some(names::NAMESPACE.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        }));
        if let apply::Deletion::Deleted { .. } = apply::delete(&cluster, &service).await? {
            *changes.entry("deleted".to_owned()).or_default() += 1;
        }
    }
    // Where MutatingAdmissionPolicy is served (again), the webhook that
    // stood in for it goes (only ours).
    if placement {
        for manifest in manifests::webhook::placement_webhook_objects() {
            if let apply::Deletion::Deleted { .. } = apply::delete(&cluster, &manifest).await? {
                *changes.entry("deleted".to_owned()).or_default() += 1;
            }
        }
    }
    let summary: Vec<String> = changes.iter().map(|(c, n)| format!("{n} {c}")).collect();
    step.done(summary.join(", "));

    let step = printer.step("Serving the Multi-Cluster Services API");
    let kept = share_mcs_crds(&cluster, deadline, args.timeout).await?;
    step.done(if kept.is_empty() {
        String::new()
    } else {
        format!("kept the CRDs installed already ({})", kept.join(", "))
    });

    // Tenants of an earlier version, or of a policy changed since, are
    // brought under the terms their policy gives them now.
    let step = printer.step("Bringing tenants under their sharing policy");
    let lines = terms::bring_all_under(&cluster).await;
    let lines = step.ended(lines)?;
    for line in lines {
        printer.info(line);
    }
    // As a consumer: namespaces offloaded by an earlier version are held
    // to their providers' Pod Security level too.
    offloading::follow_levels(&cluster, &BTreeMap::new()).await?;

    let step = printer.step("Waiting for the gateway to be ready");
    match rollout::wait_ready(&cluster, names::GATEWAY, wait::left(deadline)).await? {
        Readiness::Ready => step.done(""),
        Readiness::TimedOut => {
            step.fail("timed out");
            return Err(UserError::Timeout(format!(
                "the gateway is not ready after {}s; see `kubectl -n {ns} get pods` and \
                 `kubectl -n {ns} logs deploy/{gw}`, then run install again",
                args.timeout,
                ns = names::NAMESPACE,
                gw = names::GATEWAY
            ))
            .into());
        }
        Readiness::CannotPull(failure) => {
            step.fail("image not found");
            return Err(UserError::NotFound(failure.advice("`liqoctl install`")).into());
        }
        Readiness::CannotMount(failure) => {
            step.fail("the node lacks a device");
            return Err(UserError::NotFound(failure.advice("`liqoctl install`")).into());
        }
    }

    if let Some(format) = args.output.output {
        return print_manifests(&printer, &manifests, format);
    }
    let unchanged = changes.len() == 1 && changes.contains_key(&Change::Unchanged.to_string());
    let outcome = match (&existing, unchanged) {
        (None, _) => "installed on",
        (Some(_), true) => "already up to date on",
        (Some(_), false) => "updated on",
    };
    printer.result(format!(
        "liqo-rs {} {outcome} cluster {}",
        liqo_api::VERSION,
        cluster.name
    ));
    printer.result(format!("  cluster ID:   {}", identity.cluster_id));
    printer.result(format!("  cluster name: {}", identity.cluster_name));
    printer.result(format!("  pod CIDR:     {}", identity.pod_cidr));
    printer.result(format!("  service CIDR: {}", identity.service_cidr));
    printer.result(match (&advertise_address, announce) {
        (Some(address), true) => format!("  announced:    on the LAN (mDNS), API at {address}"),
        _ => "  announced:    no (see --announce)".to_owned(),
    });
    let reached = match (tunnels.service_type, tunnels.endpoint_address.as_deref()) {
        (Some(GatewayServiceType::NodePort), host) => format!(
            "{}, at the node ports of Service {}/{}",
            host.unwrap_or("the gateway's node address"),
            names::NAMESPACE,
            names::GATEWAY
        ),
        (Some(GatewayServiceType::LoadBalancer), None) => format!(
            "the load balancer of Service {}/{}",
            names::NAMESPACE,
            names::GATEWAY
        ),
        (_, Some(host)) => host.to_owned(),
        (None, None) => "the gateway's node address".to_owned(),
    };
    printer.result(format!(
        "  tunnels:      UDP {} on {reached}",
        tunnels.ports.unwrap_or(DEFAULT_TUNNEL_PORTS),
    ));
    Ok(())
}

/// The API server URL given to the gateway: the flag, else the installed
/// one, else the kubeconfig's server. Only announcing needs one: without
/// --announce, a kubeconfig server that is no HTTPS URL is left out.
fn advertise_address(
    cluster: &ClusterClient,
    flags: &Flags,
    installed: manifests::agents::GatewayArgs,
    announce: bool,
) -> Result<Option<ApiAddress>, UserError> {
    if let Some(address) = &flags.advertise_address {
        return Ok(Some(address.clone()));
    }
    let kept = installed
        .advertise_address
        .and_then(|a| ApiAddress::parse(&a).ok());
    match kept
        .map(Ok)
        .unwrap_or_else(|| ApiAddress::parse(&cluster.server))
    {
        Ok(address) => Ok(Some(address)),
        Err(_) if !announce => Ok(None),
        Err(e) => Err(UserError::Usage(format!(
            "cannot announce the kubeconfig's server address: {e}; pass --advertise-address"
        ))),
    }
}

/// The flags, checked before the cluster is contacted.
struct Flags {
    cluster_id: Option<ClusterId>,
    cluster_name: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    pod_cidr: Option<IpNet>,
    service_cidr: Option<IpNet>,
    /// `None` keeps the installed agents' selector; `--node-selector ''`
    /// clears it.
    node_selector: Option<BTreeMap<String, String>>,
    /// Likewise for `--toleration`.
    tolerations: Option<Vec<Toleration>>,
    /// `None` keeps the installed gateway's setting.
    announce: Option<bool>,
    advertise_address: Option<ApiAddress>,
    /// `None`s keep the installed gateway's.
    tunnels: manifests::agents::TunnelSettings,
    /// `None` keeps the installed Service type; `Some(None)` removes it.
    service_type: Option<Option<GatewayServiceType>>,
    /// `None`s keep the installed agents' registry, tag and pull policy.
    image_registry: Option<String>,
    image_tag: Option<String>,
    image_pull_policy: Option<PullPolicy>,
}

impl Flags {
    fn parse(args: &InstallArgs) -> Result<Self, UserError> {
        let usage = |e: String| UserError::Usage(e);
        let cluster_id = args
            .cluster_id
            .as_deref()
            .map(|id| ClusterId::new(id).map_err(|e| usage(format!("--cluster-id: {e}"))))
            .transpose()?;
        if let Some(name) = &args.cluster_name {
            identity::check_cluster_name(name)
                .map_err(|e| usage(format!("--cluster-name: {e}")))?;
        }
        let cidr = |flag: &'static str, v: &Option<String>| {
            v.as_deref()
                .map(|v| {
                    let net = liqo_api::networking::parse_cidr(flag, v).map_err(usage)?;
                    identity::check_cidr(flag, &net).map_err(|e| usage(e.to_string()))?;
                    Ok(net)
                })
                .transpose()
        };
        let labels = (!args.cluster_labels.is_empty())
            .then(|| parse_pairs("--cluster-labels", &args.cluster_labels))
            .transpose()?;
        if let Some(labels) = &labels {
            identity::check_labels(labels).map_err(|e| usage(format!("--cluster-labels: {e}")))?;
        }
        let placement = args.placement.parse()?;
        Ok(Self {
            cluster_id,
            cluster_name: args.cluster_name.clone(),
            labels,
            pod_cidr: cidr("--pod-cidr", &args.pod_cidr)?,
            service_cidr: cidr("--service-cidr", &args.service_cidr)?,
            node_selector: placement.node_selector,
            tolerations: placement.tolerations,
            announce: args.announce,
            advertise_address: args
                .advertise_address
                .as_deref()
                .map(|a| {
                    ApiAddress::parse(a).map_err(|e| usage(format!("--advertise-address: {e}")))
                })
                .transpose()?,
            tunnels: tunnel_settings(args)?,
            service_type: service_type(args)?,
            image_registry: args
                .image_registry
                .as_deref()
                .map(|r| {
                    let r = r.trim_end_matches('/');
                    images::check_registry(r)
                        .map(|()| r.to_owned())
                        .map_err(|e| usage(format!("--image-registry: {e}")))
                })
                .transpose()?,
            image_tag: args
                .image_tag
                .as_deref()
                .map(|t| {
                    images::check_tag(t)
                        .map(|()| t.to_owned())
                        .map_err(|e| usage(format!("--image-tag: {e}")))
                })
                .transpose()?,
            image_pull_policy: args
                .image_pull_policy
                .as_deref()
                .map(|p| {
                    p.parse()
                        .map_err(|e| usage(format!("--image-pull-policy: {e}")))
                })
                .transpose()?,
        })
    }
}

/// The tunnel flags, checked as the gateway will read them, so that a
/// mistake is told now rather than by a gateway that does not start.
fn tunnel_settings(args: &InstallArgs) -> Result<manifests::agents::TunnelSettings, UserError> {
    let usage = |e: String| UserError::Usage(e);
    if let Some(host) = &args.gateway_address {
        let valid = host.parse::<std::net::IpAddr>().is_ok()
            || liqo_api::validation::dns_subdomain(host).is_ok();
        if !valid {
            return Err(usage(format!(
                "--gateway-address {host:?} is neither an IP address nor a DNS name"
            )));
        }
    }
    let ports = match &args.tunnel_ports {
        Some(text) => Some(
            text.replace(' ', "")
                .parse::<PortRange>()
                .ok()
                .filter(|p| p.first < p.last || text.contains('-'))
                .ok_or_else(|| {
                    usage(format!(
                        "--tunnel-ports {text:?} is not FIRST-LAST with 1 <= FIRST <= LAST <= 65535"
                    ))
                })?,
        ),
        None => None,
    };
    let mut remap_pool = Vec::new();
    if let Some(pool) = &args.remap_pool {
        for cidr in pool.split(',') {
            let net = liqo_api::networking::parse_cidr("--remap-pool", cidr).map_err(usage)?;
            if let Some(what) = liqo_api::networking::reserved_overlap(&net) {
                return Err(usage(format!("--remap-pool {net} overlaps {what}")));
            }
            remap_pool.push(net);
        }
    }
    if let (Some(range), Some(kind)) = (ports, &args.gateway_service_type) {
        let width = u32::from(range.last - range.first);
        if kind != "None" && width >= MAX_SERVICE_PORTS {
            return Err(usage(format!(
                "--tunnel-ports {range} is more than {MAX_SERVICE_PORTS} ports for a Service \
                 in front of the gateway: give a narrower range"
            )));
        }
    }
    Ok(manifests::agents::TunnelSettings {
        endpoint_address: args.gateway_address.clone(),
        ports,
        remap_pool,
        service_type: None,
    })
}

/// At most this many tunnel ports behind a Service: each is a port of the
/// Service (and a node port, or a load balancer's listener).
const MAX_SERVICE_PORTS: u32 = 100;

/// `--gateway-service-type`: `None` when not given (kept), `Some(None)` to
/// have no Service.
fn service_type(args: &InstallArgs) -> Result<Option<Option<GatewayServiceType>>, UserError> {
    args.gateway_service_type
        .as_deref()
        .map(|t| match t {
            "None" => Ok(None),
            other => other
                .parse()
                .map(Some)
                .map_err(|e| UserError::Usage(format!("--gateway-service-type: {e}, nor None"))),
        })
        .transpose()
}

/// What installing needs to do, asked of the API server before doing any of
/// it, so that a user with too few rights changes nothing.
async fn check_permissions(cluster: &ClusterClient) -> anyhow::Result<()> {
    const WRITE: [&str; 3] = ["get", "create", "patch"];
    let ns = names::NAMESPACE;
    let reviews = [
        ("apiextensions.k8s.io", "customresourcedefinitions", None),
        ("", "namespaces", None),
        ("rbac.authorization.k8s.io", "clusterroles", None),
        ("rbac.authorization.k8s.io", "clusterrolebindings", None),
        ("", "serviceaccounts", Some(ns)),
        ("", "configmaps", Some(ns)),
        ("", "services", Some(ns)),
        ("rbac.authorization.k8s.io", "roles", Some(ns)),
        ("rbac.authorization.k8s.io", "rolebindings", Some(ns)),
        ("apps", "deployments", Some(ns)),
    ]
    .into_iter()
    .flat_map(|(group, resource, namespace)| {
        WRITE
            .into_iter()
            .map(move |verb| (group, resource, namespace, verb))
    });
    let api: Api<SelfSubjectAccessReview> = Api::all(cluster.client.clone());
    let checks = reviews.map(|(group, resource, namespace, verb)| {
        let api = api.clone();
        async move {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(group.to_owned()),
                        resource: Some(resource.to_owned()),
                        verb: Some(verb.to_owned()),
                        namespace: namespace.map(str::to_owned),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let answer = api.create(&PostParams::default(), &review).await?;
            let allowed = answer.status.is_some_and(|s| s.allowed);
            let qualified = if group.is_empty() {
                resource.to_owned()
            } else {
                format!("{resource}.{group}")
            };
            Ok::<_, kube::Error>((!allowed).then(|| format!("{verb} {qualified}")))
        }
    });
    let mut missing = Vec::new();
    for result in futures::future::join_all(checks).await {
        if let Some(m) = result.map_err(|e| cluster.explain(e, "checking permissions"))? {
            missing.push(m);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(UserError::Forbidden(format!(
        "the kubeconfig's user cannot install liqo-rs on cluster {}: it may not {}; use a cluster-admin kubeconfig",
        cluster.name,
        missing.join(", ")
    ))
    .into())
}

async fn resolve_identity(
    cluster: &ClusterClient,
    flags: &Flags,
    existing: Option<&ClusterIdentity>,
    notes: &mut Vec<String>,
) -> anyhow::Result<ClusterIdentity> {
    let cluster_id = match (existing, &flags.cluster_id) {
        (Some(old), Some(new)) if &old.cluster_id != new => {
            return Err(UserError::Refused(format!(
                "cluster {} is already installed with cluster ID {}; a cluster ID never changes: \
                 drop --cluster-id, or uninstall first",
                cluster.name, old.cluster_id
            ))
            .into());
        }
        (Some(old), _) => old.cluster_id.clone(),
        (None, Some(new)) => new.clone(),
        (None, None) => ClusterId::new(uuid::Uuid::new_v4().to_string())
            .expect("invariant: a UUID is a DNS label"),
    };
    let cluster_name = match (&flags.cluster_name, existing) {
        (Some(name), _) => name.clone(),
        (None, Some(old)) => old.cluster_name.clone(),
        (None, None) => default_name(&cluster.name, &cluster_id),
    };
    let pod_cidr = match (flags.pod_cidr, existing) {
        (Some(cidr), _) => cidr,
        (None, Some(old)) => old.pod_cidr,
        (None, None) => {
            let (cidr, source) = detect_pod_cidr(cluster).await?;
            notes.push(format!(
                "pod CIDR {cidr} found from {source} (set it with --pod-cidr)"
            ));
            cidr
        }
    };
    let service_cidr = match (flags.service_cidr, existing) {
        (Some(cidr), _) => cidr,
        (None, Some(old)) => old.service_cidr,
        (None, None) => detect_service_cidr(cluster).await?,
    };
    let identity = ClusterIdentity {
        cluster_id,
        cluster_name,
        labels: flags
            .labels
            .clone()
            .or_else(|| existing.map(|e| e.labels.clone()))
            .unwrap_or_default(),
        pod_cidr,
        service_cidr,
        version: liqo_api::VERSION.to_owned(),
    };
    // What was found in the cluster is checked like what was given.
    identity.validate().map_err(|e| {
        UserError::Usage(format!(
            "the identity for cluster {} is not valid: {e}; set it with \
             --cluster-name, --cluster-labels, --pod-cidr or --service-cidr",
            cluster.name
        ))
    })?;
    Ok(identity)
}

/// The context's name made a DNS label, or one made from the cluster ID.
fn default_name(context: &str, id: &ClusterId) -> String {
    let mut name: String = context
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    name.truncate(63);
    let name = name.trim_matches('-').to_owned();
    if identity::check_cluster_name(&name).is_ok() && !name.starts_with("https") {
        name
    } else {
        format!("cluster-{}", &id.as_str()[..id.as_str().len().min(8)])
    }
}

/// Where the pod CIDR is found, best source first: the controller-manager's
/// `--cluster-cidr` (a kubeadm-style static pod), kubeadm's
/// `networking.podSubnet` (its `kubeadm-config` ConfigMap, as kind
/// clusters have it), kube-proxy's `clusterCIDR` (its kubeadm ConfigMap),
/// else the smallest network holding every node's pod CIDR (virtual nodes
/// stand for other clusters and do not count). Returns the CIDR and where
/// it came from.
async fn detect_pod_cidr(cluster: &ClusterClient) -> anyhow::Result<(IpNet, &'static str)> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "kube-system");
    // Reading kube-system is a courtesy: without the right, look elsewhere.
    if let Ok(list) = pods
        .list(&ListParams::default().labels("component=kube-controller-manager"))
        .await
    {
        let flags = list
            .items
            .iter()
            .filter_map(|p| p.spec.as_ref())
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.command.iter().flatten().chain(c.args.iter().flatten()));
        if let Some(cidr) = flags
            .filter_map(|f| f.strip_prefix("--cluster-cidr="))
            .find_map(first_cidr)
        {
            return Ok((cidr, "the controller-manager's --cluster-cidr"));
        }
    }
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "kube-system");
    if let Ok(Some(kubeadm)) = maps.get_opt("kubeadm-config").await
        && let Some(cidr) = kubeadm
            .data
            .unwrap_or_default()
            .get("ClusterConfiguration")
            .and_then(|c| kubeadm_pod_subnet(c))
    {
        return Ok((cidr, "kubeadm's networking.podSubnet"));
    }
    if let Ok(Some(proxy)) = maps.get_opt("kube-proxy").await
        && let Some(cidr) = proxy
            .data
            .unwrap_or_default()
            .values()
            .find_map(|c| kube_proxy_cidr(c))
    {
        return Ok((cidr, "kube-proxy's clusterCIDR"));
    }
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let list = nodes
        .list(&ListParams::default().labels(&format!("!{}", labels::VIRTUAL_NODE)))
        .await
        .map_err(|e| cluster.explain(e, "listing nodes to find the pod CIDR"))?;
    let cidrs = list
        .items
        .iter()
        .filter_map(|n| n.spec.as_ref()?.pod_cidr.as_deref())
        .filter_map(|c| c.parse::<IpNet>().ok());
    let nodes = cidrs.clone().count();
    match covering(cidrs) {
        // One node's range is not the cluster's: the next node's is
        // another.
        Some(net) if nodes == 1 => Ok((
            net,
            "its only node's pod CIDR, which a node added later would not cover",
        )),
        Some(net) => Ok((net, "the nodes' pod CIDRs")),
        None => Err(UserError::NotFound(format!(
            "cannot find the pod CIDR of cluster {}: no kube-controller-manager pod with \
             --cluster-cidr, no kube-proxy ConfigMap with clusterCIDR, and no node with \
             spec.podCIDR; give it with --pod-cidr",
            cluster.name
        ))
        .into()),
    }
}

/// `networking.podSubnet` of a kubeadm ClusterConfiguration document (the
/// `ClusterConfiguration` key of its `kubeadm-config` ConfigMap).
fn kubeadm_pod_subnet(config: &str) -> Option<IpNet> {
    let doc: serde_yaml::Value = serde_yaml::from_str(config).ok()?;
    first_cidr(doc.get("networking")?.get("podSubnet")?.as_str()?)
}

/// `clusterCIDR` of a KubeProxyConfiguration document (the `config.conf`
/// key of kubeadm's kube-proxy ConfigMap), parsed as YAML.
fn kube_proxy_cidr(config: &str) -> Option<IpNet> {
    let doc: serde_yaml::Value = serde_yaml::from_str(config).ok()?;
    first_cidr(doc.get("clusterCIDR")?.as_str()?)
}

/// The first CIDR of a comma-separated list (dual-stack clusters list one
/// per family), normalised.
fn first_cidr(list: &str) -> Option<IpNet> {
    let first = list.split(',').next()?;
    liqo_api::networking::parse_cidr("", first).ok()
}

/// The smallest network containing all of `nets` (all of one family).
fn covering(mut nets: impl Iterator<Item = IpNet>) -> Option<IpNet> {
    let first = nets.next()?;
    nets.try_fold(first.trunc(), |acc, net| {
        let mut acc = acc;
        while !acc.contains(&net) {
            acc = acc.supernet()?;
        }
        Some(acc)
    })
}

async fn detect_service_cidr(cluster: &ClusterClient) -> anyhow::Result<IpNet> {
    let cidrs: Api<ServiceCIDR> = Api::all(cluster.client.clone());
    let found = match cidrs.get_opt("kubernetes").await {
        Ok(cidr) => cidr.and_then(|c| c.spec?.cidrs?.into_iter().next()),
        // Clusters older than the ServiceCIDR API, or that hide it.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => None,
        Err(e) => return Err(cluster.explain(e, "reading the service CIDR")),
    };
    found.as_deref().and_then(first_cidr).ok_or_else(|| {
        UserError::Config(format!(
            "cannot find the service CIDR of cluster {}; pass --service-cidr",
            cluster.name
        ))
        .into()
    })
}

/// The MCS API's CRDs: created where missing, updated where ours, and
/// someone else's left as they are; returns the names of those left.
async fn share_mcs_crds(
    cluster: &ClusterClient,
    deadline: tokio::time::Instant,
    timeout_flag: u64,
) -> anyhow::Result<Vec<String>> {
    let mut kept = Vec::new();
    for manifest in manifests::mcs::crds() {
        if ownership::of(cluster, &manifest).await? == Ownership::Foreign {
            kept.push(manifest.name().to_owned());
            continue;
        }
        let change = apply::apply(cluster, &manifest).await?;
        if change != Change::Unchanged {
            tracing::info!("{} {change}", manifest.describe());
        }
        if let Manifest::Crd(crd) = &manifest {
            wait_established(cluster, crd, deadline, timeout_flag).await?;
        }
    }
    Ok(kept)
}

async fn wait_established(
    cluster: &ClusterClient,
    crd: &CustomResourceDefinition,
    deadline: tokio::time::Instant,
    timeout_flag: u64,
) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    let name = crd.metadata.name.as_deref().unwrap_or_default();
    let waited = wait::until(
        cluster,
        api,
        name,
        conditions::is_crd_established(),
        wait::left(deadline),
        &format!("waiting for the CRD {name}"),
    )
    .await?;
    match waited {
        Waited::Done(_) => Ok(()),
        Waited::TimedOut => Err(UserError::Timeout(format!(
            "the CRD {name} is not established after {timeout_flag}s; see `kubectl get crd {name} -o yaml`, then run install again"
        ))
        .into()),
    }
}

fn print_manifests(
    printer: &Printer,
    manifests: &[Manifest],
    format: OutputFormat,
) -> anyhow::Result<()> {
    match format {
        OutputFormat::Yaml => printer.result(manifests::to_yaml(manifests)?.trim_end()),
        OutputFormat::Json => printer.structured(
            &json!({ "apiVersion": "v1", "kind": "List", "items": manifests }),
            OutputFormat::Json,
        )?,
    }
    Ok(())
}

#[cfg(test)]
mod tests;
