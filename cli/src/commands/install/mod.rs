//! `liqoctl install`: checks everything it can before it writes anything
//! (reachability, permissions, a conflicting identity), then applies the
//! manifests and waits for the agents. Applying is idempotent, so a run that
//! stops halfway is resumed by running it again.
//!
//! A run is a list of phases, each a method of [`Install`]:
//!
//! | phase | does |
//! | --- | --- |
//! | check | reads the cluster's version, checks the rights install needs and that every name it uses is ours; keeps or makes the identity ([`resolve`]) |
//! | plan | each setting from its flag, else as installed ([`flags`]), rendered as manifests |
//! | print | `--dry-run` only, and the run ends there |
//! | apply | the manifests, and what is no longer wanted removed |
//! | serve-mcs | the Multi-Cluster Services API's CRDs where missing ([`mcs`]) |
//! | tenants | tenants and offloaded namespaces of an earlier version under their terms |
//! | gateway | waits for the gateway to be ready |
//! | report | what was installed, and how peers reach it |

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

mod flags;
mod mcs;
mod placement_tls;
mod resolve;

use flags::Flags;
use mcs::{share_mcs_crds, wait_established};
use resolve::resolve_identity;

pub async fn run(args: &InstallArgs, global: &GlobalArgs, printer: Printer) -> anyhow::Result<()> {
    let flags = Flags::parse(args)?;
    let cluster = ClusterClient::local(global).await?;
    // One deadline for every wait of the run.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let install = Install {
        cluster: &cluster,
        printer: &printer,
        deadline,
        timeout: args.timeout,
    };
    let checked = install.check(&flags, args.dry_run).await?;
    let plan = install.plan(&flags, &checked.identity).await?;
    if args.dry_run {
        return install.print(&plan, args.output.output.unwrap_or(OutputFormat::Yaml));
    }
    let changes = install.apply(&plan).await?;
    install.serve_mcs().await?;
    install.bring_tenants_under().await?;
    install.wait_for_gateway().await?;
    if let Some(format) = args.output.output {
        return print_manifests(&printer, &plan.manifests, format);
    }
    install.report(&checked, &plan, &changes);
    Ok(())
}

/// One run of `install` on one cluster: its phases, in the order [`run`]
/// takes them, each a method. Everything a phase writes is applied
/// idempotently, so a run that stops halfway is resumed by running it
/// again.
struct Install<'a> {
    cluster: &'a ClusterClient,
    printer: &'a Printer,
    /// The end of every wait of the run.
    deadline: tokio::time::Instant,
    /// `--timeout`, as errors say it.
    timeout: u64,
}

/// What the check found: the identity installed before (if any) and the
/// one this run installs.
struct Checked {
    existing: Option<ClusterIdentity>,
    identity: ClusterIdentity,
}

/// What this run installs: the flags given over what is installed.
struct Plan {
    manifests: Vec<Manifest>,
    /// Whether the cluster serves MutatingAdmissionPolicy (else the
    /// placement webhook stands in, with `placement_tls`).
    placement: bool,
    placement_tls: Option<placement_tls::PlacementTls>,
    tunnels: manifests::agents::TunnelSettings,
    advertise_address: Option<ApiAddress>,
    announce: bool,
}

/// How many objects each kind of change touched.
type Changes = BTreeMap<String, usize>;

impl Install<'_> {
    /// Reachability, permissions, and names that are not ours: nothing is
    /// written before every name we use is known to be ours to use. Then
    /// the identity, kept or made.
    async fn check(&self, flags: &Flags, dry_run: bool) -> anyhow::Result<Checked> {
        let (cluster, printer) = (self.cluster, self.printer);
        let step = printer.step(format!("Checking cluster {}", cluster.name));
        cluster
            .client
            .apiserver_version()
            .await
            .map_err(|e| cluster.explain(e, "reading the Kubernetes version"))?;
        if !dry_run {
            check_permissions(cluster).await?;
        }
        // Nothing is written before we know every name we use is ours to use.
        let foreign = ownership::foreign(cluster, &manifests::every_object()).await?;
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
        let existing = read_identity(cluster).await?;
        let mut notes = Vec::new();
        let identity = resolve_identity(cluster, flags, existing.as_ref(), &mut notes).await?;
        step.done("");
        // After the step, so that the notes do not tear its spinner.
        for note in notes {
            printer.info(format!("  {note}"));
        }
        Ok(Checked { existing, identity })
    }

    /// What to install: each setting from its flag, else as installed.
    async fn plan(&self, flags: &Flags, identity: &ClusterIdentity) -> anyhow::Result<Plan> {
        let (cluster, printer) = (self.cluster, self.printer);
        // Read once: what a run without the flags that shape it keeps.
        let gateway = installed_gateway(cluster).await?;
        let installed = gateway.as_ref().map(placement_of).unwrap_or_default();
        let placement = serves_mutating_admission_policy(cluster).await;
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
            Some(placement_tls::current_or_new(cluster).await?)
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
        let advertise_address = advertise_address(cluster, flags, installed_gateway, announce)?;
        let manifests = manifests::render(&Options {
            identity: Some(identity.clone()),
            node_selector: flags
                .node_selector
                .clone()
                .unwrap_or(installed.node_selector),
            tolerations: flags.tolerations.clone().unwrap_or(installed.tolerations),
            images: ImageSource {
                registry: flags
                    .image_registry
                    .clone()
                    .unwrap_or(installed.images.registry),
                tag: flags.image_tag.clone().unwrap_or(installed.images.tag),
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
        Ok(Plan {
            manifests,
            placement,
            placement_tls,
            tunnels,
            advertise_address,
            announce,
        })
    }

    /// `--dry-run`: the manifests, as they would be applied.
    fn print(&self, plan: &Plan, format: OutputFormat) -> anyhow::Result<()> {
        let printer = self.printer;
        let placement_tls = &plan.placement_tls;
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
        let mut printed = plan.manifests.clone();
        let ours = printed
            .iter()
            .filter(|m| matches!(m, Manifest::Crd(_)))
            .count();
        printed.splice(ours..ours, manifests::mcs::crds());
        print_manifests(printer, &printed, format)
    }

    /// The manifests applied (a new webhook certificate before the
    /// webhook that trusts it), and what is no longer wanted removed.
    async fn apply(&self, plan: &Plan) -> anyhow::Result<Changes> {
        let (cluster, printer) = (self.cluster, self.printer);
        let Plan {
            placement,
            placement_tls,
            tunnels,
            ..
        } = plan;
        // A new certificate is written before the webhook that trusts it
        // (never printed: it holds the key).
        let mut to_apply = plan.manifests.clone();
        if let Some(tls) = placement_tls.as_ref().filter(|t| t.fresh) {
            let at = to_apply
                .iter()
                .position(|m| matches!(m, Manifest::MutatingWebhookConfiguration(_)))
                .unwrap_or(to_apply.len());
            to_apply.insert(at, tls.secret());
        }
        let step = printer.step(format!("Applying {} objects", to_apply.len()));
        let mut changes = Changes::new();
        for manifest in &to_apply {
            let change = apply::apply(cluster, manifest).await?;
            if change != Change::Unchanged {
                tracing::info!("{} {change}", manifest.describe());
            }
            *changes.entry(change.to_string()).or_default() += 1;
            if let Manifest::Crd(crd) = manifest {
                wait_established(cluster, crd, self.deadline, self.timeout).await?;
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
            if let apply::Deletion::Deleted { .. } = apply::delete(cluster, &service).await? {
                *changes.entry("deleted".to_owned()).or_default() += 1;
            }
        }
        // Where MutatingAdmissionPolicy is served (again), the webhook that
        // stood in for it goes (only ours).
        if *placement {
            for manifest in manifests::webhook::placement_webhook_objects() {
                if let apply::Deletion::Deleted { .. } = apply::delete(cluster, &manifest).await? {
                    *changes.entry("deleted".to_owned()).or_default() += 1;
                }
            }
        }
        let summary: Vec<String> = changes.iter().map(|(c, n)| format!("{n} {c}")).collect();
        step.done(summary.join(", "));
        Ok(changes)
    }

    /// The Multi-Cluster Services API's CRDs, where they are missing.
    async fn serve_mcs(&self) -> anyhow::Result<()> {
        let step = self.printer.step("Serving the Multi-Cluster Services API");
        let kept = share_mcs_crds(self.cluster, self.deadline, self.timeout).await?;
        step.done(if kept.is_empty() {
            String::new()
        } else {
            format!("kept the CRDs installed already ({})", kept.join(", "))
        });
        Ok(())
    }

    /// Tenants of an earlier version, or of a policy changed since, are
    /// brought under the terms their policy gives them now; as a
    /// consumer, namespaces offloaded by an earlier version are held to
    /// their providers' Pod Security level too.
    async fn bring_tenants_under(&self) -> anyhow::Result<()> {
        let (cluster, printer) = (self.cluster, self.printer);
        let step = printer.step("Bringing tenants under their sharing policy");
        let lines = terms::bring_all_under(cluster).await;
        let lines = step.ended(lines)?;
        for line in lines {
            printer.info(line);
        }
        offloading::follow_levels(cluster, &BTreeMap::new()).await?;
        Ok(())
    }

    /// The gateway ready, or why it cannot be.
    async fn wait_for_gateway(&self) -> anyhow::Result<()> {
        let step = self.printer.step("Waiting for the gateway to be ready");
        match rollout::wait_ready(self.cluster, names::GATEWAY, wait::left(self.deadline)).await? {
            Readiness::Ready => step.done(""),
            Readiness::TimedOut => {
                step.fail("timed out");
                return Err(UserError::Timeout(format!(
                    "the gateway is not ready after {}s; see `kubectl -n {ns} get pods` and \
                     `kubectl -n {ns} logs deploy/{gw}`, then run install again",
                    self.timeout,
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
        Ok(())
    }

    /// What was installed, and how peers reach it.
    fn report(&self, checked: &Checked, plan: &Plan, changes: &Changes) {
        let (cluster, printer) = (self.cluster, self.printer);
        let Checked { existing, identity } = checked;
        let Plan {
            tunnels,
            advertise_address,
            announce,
            ..
        } = plan;
        let unchanged = changes.len() == 1 && changes.contains_key(&Change::Unchanged.to_string());
        let outcome = match (existing, unchanged) {
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
        printer.result(match (advertise_address, announce) {
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
    }
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

/// At most this many tunnel ports behind a Service: each is a port of the
/// Service (and a node port, or a load balancer's listener).
const MAX_SERVICE_PORTS: u32 = 100;

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
