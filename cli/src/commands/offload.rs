//! `liqoctl offload namespace` and `unoffload namespace`: the declaring side
//! of namespace offloading. Writes the NamespaceOffloading of each namespace
//! and the namespace's placement labels, and waits on what the virtual
//! kubelets report; the twin namespaces and pods are theirs
//! (docs/offloading.md).

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use liqo_api::names::{self, labels};
use liqo_api::offloading::{
    LabelSelector, NamespaceMappingStrategy, NamespaceOffloading, NamespaceOffloadingSpec,
    PodOffloadingStrategy,
};
use liqo_api::validation;
use liqo_api::{ClusterId, ClusterIdentity};
use serde_json::json;

use crate::cli::{
    GlobalArgs, MappingStrategyArg, OffloadCommand, OffloadNamespaceArgs, PodStrategyArg,
    UnoffloadCommand, UnoffloadNamespaceArgs,
};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::cluster::{read_identity, serves_mutating_admission_policy};
use crate::kube::wait::{self, Waited};
use crate::manifests;
use crate::peering::kept_claims::{self, RemoteData};
use crate::peering::offloading::{self, Removed};
use crate::peering::refused;
use crate::printer::Printer;

pub async fn offload(
    command: &OffloadCommand,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let OffloadCommand::Namespace(args) = command;
    let spec = spec_of(args)?;
    let objects: Vec<NamespaceOffloading> = args
        .names
        .iter()
        .map(|ns| {
            let mut o = NamespaceOffloading::new(names::NAMESPACE_OFFLOADING, spec.clone());
            o.metadata.namespace = Some(ns.clone());
            o
        })
        .collect();
    // For GitOps: what would be applied, without a cluster.
    if let Some(format) = args.output.output {
        return match objects.as_slice() {
            [one] => printer.structured(one, format),
            many => printer.structured(
                &json!({ "apiVersion": "v1", "kind": "List", "items": many }),
                format,
            ),
        };
    }

    let cluster = ClusterClient::local(global).await?;
    let identity = installed(&cluster).await?;
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    // Every namespace must exist before anything is written.
    for ns in &args.names {
        let found = namespaces
            .get_opt(ns)
            .await
            .map_err(|e| cluster.explain(e, &format!("reading namespace {ns}")))?;
        let Some(found) = found else {
            return Err(UserError::NotFound(format!(
                "namespace {ns} does not exist on cluster {}",
                cluster.name
            ))
            .into());
        };
        // A twin: a consumer's pods, run here as its provider.
        if let Some(tenant) = found.labels().get(labels::TENANT) {
            return Err(UserError::Refused(format!(
                "namespace {ns} on cluster {} is a twin namespace of consumer {tenant} and cannot be offloaded",
                cluster.name
            ))
            .into());
        }
    }
    let agents = offloading::virtual_kubelets(&cluster).await?;
    if spec.pod_offloading_strategy != PodOffloadingStrategy::Local
        && !serves_mutating_admission_policy(&cluster).await
    {
        // The virtual kubelets' webhook places the pods: the namespaces
        // are labelled (which turns placement on) once one serves it, so
        // that no pod created meanwhile misses it and stays local.
        let step = printer.step("Waiting for a virtual kubelet to serve the placement webhook");
        match placement_served(&cluster, &agents, args.timeout.min(60)).await? {
            Ok(()) => step.done(""),
            Err(why) => {
                step.done("not yet");
                printer.info(format!(
                    "note: {why}; until one does, new pods of {} are not placed on virtual nodes \
                     (docs/offloading.md, \"Placement\")",
                    args.names.join(", ")
                ));
            }
        }
    }

    let providers = offloading::Providers::read(&cluster, &BTreeMap::new()).await?;
    let step = printer.step(format!("Offloading {}", args.names.join(", ")));
    for object in &objects {
        offloading::apply(&cluster, object, &agents, &providers).await?;
    }
    step.done("");

    let selected = providers.selected(&spec);
    if selected.is_empty() {
        printer.info("note: no outgoing peering is selected yet; the namespaces are offloaded to peers as they come");
    }
    if args.wait && !selected.is_empty() {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(args.timeout);
        for ns in &args.names {
            let step = printer.step(format!("Waiting for the twin namespaces of {ns}"));
            let api: Api<NamespaceOffloading> = Api::namespaced(cluster.client.clone(), ns);
            let want = selected.clone();
            let ready = move |o: Option<&NamespaceOffloading>| {
                let clusters = o
                    .and_then(|o| o.status.as_ref())
                    .map(|s| s.clusters.as_slice())
                    .unwrap_or_default();
                want.iter().all(|id| {
                    clusters
                        .iter()
                        .any(|c| c.cluster_id.as_str() == id && c.ready)
                })
            };
            let waited = wait::until(
                &cluster,
                api.clone(),
                names::NAMESPACE_OFFLOADING,
                ready,
                wait::left(deadline),
                "waiting for the twin namespaces",
            )
            .await?;
            if let Waited::TimedOut = waited {
                step.fail("timed out");
                let why = api
                    .get_opt(names::NAMESPACE_OFFLOADING)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|o| o.status)
                    .map(|s| {
                        s.clusters
                            .iter()
                            .filter(|c| !c.ready)
                            .map(|c| {
                                format!(
                                    "{}: {}",
                                    c.cluster_id,
                                    c.reason.as_deref().unwrap_or("not ready")
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "no provider has reported".into());
                return Err(UserError::Timeout(format!(
                    "the twin namespaces of {ns} are not ready after {}s ({why}); see `liqoctl info`",
                    args.timeout
                ))
                .into());
            }
            step.done("");
        }
    }
    let selected_terms = providers.selected_terms(&spec);
    let level = providers.level(&spec);
    for ns in &args.names {
        printer.result(format!(
            "namespace {ns} offloaded (pods: {}, twin namespaces: {}) to {}",
            spec.pod_offloading_strategy.as_str(),
            spec.namespace_mapping_strategy.as_str(),
            if selected.is_empty() {
                "no peer yet".to_owned()
            } else {
                selected.join(", ")
            }
        ));
        if let Some(level) = level {
            let how = match spec.pod_offloading_strategy {
                PodOffloadingStrategy::Remote => {
                    "enforced here: a pod below it is refused at creation"
                }
                PodOffloadingStrategy::LocalAndRemote => {
                    "warned here; a pod below it runs only at home"
                }
                PodOffloadingStrategy::Local => "not used: its pods stay here",
            };
            printer.result(format!("  pod security: {level} ({how})"));
        }
        let twin = liqo_api::offloading::remote_namespace(ns, &spec, &identity.cluster_name);
        for (provider, (terms, _)) in &selected_terms {
            if !terms.allows_namespace_name(&twin) {
                printer.info(format!(
                    "warning: {ns}: cluster {provider} reserves the name {twin}: its twin cannot be made \
                     there; offload with another --namespace-mapping-strategy or --remote-namespace-name"
                ));
            }
        }
        for r in refused::workloads(&cluster, ns, &selected_terms).await? {
            printer.info(format!(
                "warning: {ns}: {}: cluster {} would refuse its pods: {}",
                r.workload, r.provider, r.why
            ));
        }
    }
    Ok(())
}

pub async fn unoffload(
    command: &UnoffloadCommand,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let UnoffloadCommand::Namespace(args) = command;
    check_names(&args.names)?;
    let cluster = ClusterClient::local(global).await?;
    installed(&cluster).await?;
    run_unoffload(&cluster, args, &printer).await
}

async fn run_unoffload(
    cluster: &ClusterClient,
    args: &UnoffloadNamespaceArgs,
    printer: &Printer,
) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    for ns in &args.names {
        let found = namespaces
            .get_opt(ns)
            .await
            .map_err(|e| cluster.explain(e, &format!("reading namespace {ns}")))?;
        if found.is_none() {
            return Err(UserError::NotFound(format!(
                "namespace {ns} does not exist on cluster {}",
                cluster.name
            ))
            .into());
        }
    }
    // Nothing is deleted by surprise: the data of claims kept on
    // providers goes only when told.
    let data = RemoteData::of(args.keep_remote_data, args.delete_remote_data);
    let kept: Vec<_> = kept_claims::on_consumer(cluster, None, None)
        .await?
        .into_iter()
        .filter(|k| {
            args.names
                .iter()
                .any(|ns| k.claim.starts_with(&format!("{ns}/")))
        })
        .collect();
    if !kept.is_empty() && data == RemoteData::Unsaid {
        return Err(kept_claims::refusal(
            &format!("unoffloading {}", args.names.join(", ")),
            &kept,
        )
        .into());
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(args.timeout);
    for ns in &args.names {
        let step = printer.step(format!("Unoffloading {ns}"));
        if data == RemoteData::Keep {
            offloading::keep_remote_data(cluster, ns).await?;
        }
        match offloading::remove(cluster, ns, deadline).await {
            Ok(Removed::Gone) => step.done(""),
            Ok(Removed::WasNot) => {
                step.done("was not offloaded");
                continue;
            }
            Ok(Removed::TimedOut) => {
                step.fail("timed out");
                return Err(UserError::Timeout(format!(
                    "the twin namespaces of {ns} are not deleted after {}s: a provider may be \
                     unreachable; see `liqoctl info` and run unoffload again",
                    args.timeout
                ))
                .into());
            }
            Err(e) => {
                step.fail("");
                return Err(e);
            }
        }
        printer.result(format!("namespace {ns} is no longer offloaded"));
        let of_ns = kept
            .iter()
            .filter(|k| k.claim.starts_with(&format!("{ns}/")))
            .count();
        match data {
            RemoteData::Keep if of_ns > 0 => printer.info(format!(
                "  {of_ns} claims of {ns} are kept on their providers, in the twin namespaces: \
                 offload {ns} again to use them"
            )),
            RemoteData::Delete if of_ns > 0 => {
                kept_claims::forget_volumes(cluster, Some(ns), None).await?;
                printer.info(format!(
                    "  the data of {of_ns} claims of {ns} is deleted; delete the claims (their \
                     volumes here go with them; a StatefulSet makes new ones)"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// liqo-rs must be installed: the NamespaceOffloading CRD comes with it.
/// Returns the cluster's identity.
async fn installed(cluster: &ClusterClient) -> anyhow::Result<ClusterIdentity> {
    read_identity(cluster).await?.ok_or_else(|| {
        UserError::NotFound(format!(
            "liqo-rs is not installed on cluster {}; run `liqoctl install`",
            cluster.name
        ))
        .into()
    })
}

fn check_names(names: &[String]) -> anyhow::Result<()> {
    for ns in names {
        validation::dns_label(ns)
            .map_err(|e| UserError::Usage(format!("namespace name {ns:?} {e}")))?;
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(dup) = names.iter().find(|n| !seen.insert(n.as_str())) {
        return Err(UserError::Usage(format!("namespace {dup} is named twice")).into());
    }
    Ok(())
}

/// Refuses, by name, the namespaces whose pods must stay on this cluster
/// ([`liqo_api::offloading::stays_home`]).
fn check_offloadable(names: &[String]) -> anyhow::Result<()> {
    for ns in names {
        if let Some(why) = liqo_api::offloading::stays_home(ns, &BTreeMap::new()) {
            return Err(UserError::Usage(format!(
                "namespace {ns} {why} and cannot be offloaded; offload the namespaces of your workloads"
            ))
            .into());
        }
    }
    Ok(())
}

/// The spec the flags ask for, checked before any cluster is contacted.
fn spec_of(args: &OffloadNamespaceArgs) -> anyhow::Result<NamespaceOffloadingSpec> {
    check_names(&args.names)?;
    check_offloadable(&args.names)?;
    let mapping = match args.namespace_mapping_strategy {
        MappingStrategyArg::DefaultName => NamespaceMappingStrategy::DefaultName,
        MappingStrategyArg::EnforceSameName => NamespaceMappingStrategy::EnforceSameName,
        MappingStrategyArg::SelectedName => NamespaceMappingStrategy::SelectedName,
    };
    match (&args.remote_namespace_name, mapping) {
        (None, NamespaceMappingStrategy::SelectedName) => {
            return Err(UserError::Usage(
                "--namespace-mapping-strategy SelectedName needs --remote-namespace-name".into(),
            )
            .into());
        }
        (Some(_), NamespaceMappingStrategy::SelectedName) if args.names.len() > 1 => {
            return Err(UserError::Usage(
                "--remote-namespace-name names one twin namespace: offload one namespace at a time"
                    .into(),
            )
            .into());
        }
        (Some(name), NamespaceMappingStrategy::SelectedName) => {
            validation::dns_label(name)
                .map_err(|e| UserError::Usage(format!("--remote-namespace-name {name:?} {e}")))?;
        }
        (Some(_), _) => {
            return Err(UserError::Usage(
                "--remote-namespace-name goes with --namespace-mapping-strategy SelectedName"
                    .into(),
            )
            .into());
        }
        (None, _) => {}
    }
    let selectors = args
        .selectors
        .iter()
        .map(|selector| {
            selector
                .parse::<LabelSelector>()
                .map_err(|e| UserError::Usage(format!("--selector {selector:?}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(NamespaceOffloadingSpec {
        pod_offloading_strategy: match args.pod_offloading_strategy {
            PodStrategyArg::LocalAndRemote => PodOffloadingStrategy::LocalAndRemote,
            PodStrategyArg::Remote => PodOffloadingStrategy::Remote,
            PodStrategyArg::Local => PodOffloadingStrategy::Local,
        },
        namespace_mapping_strategy: mapping,
        remote_namespace_name: args.remote_namespace_name.clone(),
        cluster_selector: liqo_api::offloading::cluster_selector(&selectors),
    })
}

/// Whether the placement webhook has a virtual kubelet behind it (a ready
/// endpoint of its Service), waiting up to `timeout` seconds while there
/// is a peering whose agent may come; `Err(why)` when it has none.
async fn placement_served(
    cluster: &ClusterClient,
    agents: &[ClusterId],
    timeout: u64,
) -> anyhow::Result<Result<(), String>> {
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(cluster.client.clone());
    let installed = hooks
        .get_opt(manifests::webhook::PLACEMENT_WEBHOOK)
        .await
        .map_err(|e| cluster.explain(e, "reading the placement webhook"))?;
    if installed.is_none() {
        return Ok(Err(format!(
            "cluster {} has neither MutatingAdmissionPolicy nor the placement webhook \
             (run `liqoctl install` again)",
            cluster.name
        )));
    }
    if agents.is_empty() {
        return Ok(Err(
            "no virtual kubelet runs yet (no outgoing peering)".to_owned()
        ));
    }
    let slices: Api<EndpointSlice> = Api::namespaced(cluster.client.clone(), names::NAMESPACE);
    let of_service = ListParams::default().labels(&format!(
        "kubernetes.io/service-name={}",
        manifests::webhook::PLACEMENT_WEBHOOK
    ));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(timeout);
    loop {
        let ready = slices
            .list(&of_service)
            .await
            .map_err(|e| cluster.explain(e, "reading the placement webhook's endpoints"))?
            .items
            .iter()
            .flat_map(|s| &s.endpoints)
            .any(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false));
        if ready {
            return Ok(Ok(()));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(Err(format!(
                "no virtual kubelet is ready to serve the placement webhook after {timeout}s"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn parse(args: &[&str]) -> OffloadNamespaceArgs {
        let cli =
            crate::cli::Cli::try_parse_from(["liqoctl", "offload", "namespace"].iter().chain(args))
                .expect("parses");
        match cli.command {
            crate::cli::Command::Offload(OffloadCommand::Namespace(a)) => a,
            _ => unreachable!("offload namespace"),
        }
    }

    #[test]
    fn flags_make_the_spec_or_a_usage_error() {
        let ok = spec_of(&parse(&[
            "shop",
            "--namespace-mapping-strategy",
            "SelectedName",
            "--remote-namespace-name",
            "store",
            "--pod-offloading-strategy",
            "Remote",
            "--selector",
            "region=eu",
            "-l",
            "liqo.io/remote-cluster-id=p1",
        ]))
        .expect("valid");
        assert_eq!(ok.pod_offloading_strategy, PodOffloadingStrategy::Remote);
        assert_eq!(ok.remote_namespace_name.as_deref(), Some("store"));
        let terms = ok.cluster_selector.expect("a selector").node_selector_terms;
        assert_eq!(terms.len(), 2, "one term per --selector");
        for bad in [
            &["shop", "--namespace-mapping-strategy", "SelectedName"][..],
            &["shop", "--remote-namespace-name", "x"],
            &[
                "a",
                "b",
                "--namespace-mapping-strategy",
                "SelectedName",
                "--remote-namespace-name",
                "x",
            ],
            &[
                "shop",
                "--namespace-mapping-strategy",
                "SelectedName",
                "--remote-namespace-name",
                "Bad_Name",
            ],
            &["Shop"],
            &["shop", "shop"],
            &["shop", "--selector", "region in eu"],
        ] {
            let err = spec_of(&parse(bad)).expect_err("refused");
            assert!(
                matches!(err.downcast_ref::<UserError>(), Some(UserError::Usage(_))),
                "{bad:?}: {err}"
            );
        }
    }
}
