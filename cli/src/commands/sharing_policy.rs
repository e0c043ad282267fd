//! `liqoctl sharing-policy set|show|delete`, run on a provider: the
//! SharingPolicy objects `liqoctl peer` reads to compute a grant (the one
//! named by a consumer's cluster ID, else `default`, else the built-in
//! default). Also owns how amounts and costs are shown to people, which
//! `info` shares.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ListParams};
use liqo_api::admission::Admission;
use liqo_api::authentication::Tenant;
use liqo_api::pod_security::Level;
use liqo_api::sharing::{
    self, Amounts, Following, Offer, Resources, SharingPolicy, SharingPolicySpec,
};
use liqo_api::{ClusterId, validation};
use serde::Serialize;

use crate::cli::{
    GlobalArgs, SharingPolicyCommand, SharingPolicyPeerArg, SharingPolicySetArgs,
    SharingPolicyShowArgs,
};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::apply::{self, Deletion};
use crate::kube::cluster::read_identity;
use crate::kube::ownership::{self, Ownership};
use crate::manifests::{Manifest, common_labels};
use crate::peering::{capacity, terms};
use crate::printer::Printer;
use crate::show::show_cost;

/// The name of the policy that applies to consumers without their own.
const DEFAULT: &str = "default";

pub async fn run(
    command: &SharingPolicyCommand,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    match command {
        SharingPolicyCommand::Set(args) => set(args, global, printer).await,
        SharingPolicyCommand::Show(args) => show(args, global, printer).await,
        SharingPolicyCommand::Delete(args) => delete(args, global, printer).await,
    }
}

/// Where the policy that applies comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
enum Source {
    /// The SharingPolicy named by the consumer's cluster ID.
    Peer,
    /// The SharingPolicy named `default`.
    Default,
    /// No SharingPolicy applies: liqo-rs's own default.
    BuiltIn,
}

/// The SharingPolicy's name: the consumer's cluster ID, or `default`.
fn policy_name(peer: &SharingPolicyPeerArg) -> Result<String, UserError> {
    match peer.peer.as_deref() {
        None => Ok(DEFAULT.to_owned()),
        // A cluster ID could be `default`, but its policy would be everyone's.
        Some(DEFAULT) => Err(UserError::Usage(
            "--peer: \"default\" names the policy of every consumer; leave --peer out for it"
                .to_owned(),
        )),
        Some(id) => ClusterId::new(id).map(|id| id.to_string()).map_err(|_| {
            UserError::Usage(format!(
                "--peer: {id:?} is not a cluster ID (a DNS label such as consumer-1)"
            ))
        }),
    }
}

/// Checks an amount a policy may offer: a quantity, or a share from 0% to
/// 100%. Checked the way `peer` will read it, on a stand-in capacity.
fn check_offer(flag: &str, value: &str) -> Result<Offer, UserError> {
    let offer = Offer(value.trim().to_owned());
    let mut policy = SharingPolicySpec {
        accept_new_peers: true,
        cpu: None,
        memory: None,
        pods: None,
        storage: None,
        claims: None,
        cost: None,
        floor: None,
        ceiling: None,
        following: Following::default(),
        admission: Admission::default(),
    };
    match flag {
        "--cpu" => policy.cpu = Some(offer.clone()),
        "--memory" => policy.memory = Some(offer.clone()),
        "--storage" => policy.storage = Some(offer.clone()),
        "--claims" => policy.claims = Some(offer.clone()),
        _ => policy.pods = Some(offer.clone()),
    }
    let stand_in = Amounts {
        cpu_millis: 1000,
        memory_bytes: 1 << 30,
        pods: 100,
        storage_bytes: 1 << 30,
        claims: 100,
    };
    if offer.0.is_empty() || sharing::offered(&policy, stand_in).is_err() {
        let example = match flag {
            "--cpu" => "4 or 500m",
            "--memory" | "--storage" => "8Gi or 512Mi",
            _ => "110",
        };
        return Err(UserError::Usage(format!(
            "{flag}: {value:?} is neither a quantity such as {example} nor a percentage from 0% to 100%"
        )));
    }
    Ok(offer)
}

/// A floor or ceiling: `cpu=Q,memory=Q,pods=N`, each optional; `""` for
/// none.
fn check_bound(flag: &str, value: &str) -> Result<Option<Resources>, UserError> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    let bad = |why: String| {
        UserError::Usage(format!(
            "{flag}: {why}; give it as cpu=QUANTITY,memory=QUANTITY,pods=COUNT (each optional), \
             such as cpu=2,memory=4Gi"
        ))
    };
    let mut bound = Resources::default();
    for pair in value.split(',').map(str::trim) {
        let (key, quantity) = pair
            .split_once('=')
            .ok_or_else(|| bad(format!("{pair:?} is not KEY=VALUE")))?;
        let (slot, valid) = match key.trim() {
            "cpu" => (
                &mut bound.cpu,
                sharing::parse_cpu_millis(quantity).is_some(),
            ),
            "memory" => (&mut bound.memory, sharing::parse_bytes(quantity).is_some()),
            "pods" => (&mut bound.pods, quantity.parse::<u64>().is_ok()),
            "storage" => (&mut bound.storage, sharing::parse_bytes(quantity).is_some()),
            "claims" => (&mut bound.claims, quantity.parse::<u64>().is_ok()),
            other => {
                return Err(bad(format!(
                    "{other:?} is none of cpu, memory, pods, storage, claims"
                )));
            }
        };
        if !valid {
            return Err(bad(format!("{pair:?} is not a quantity")));
        }
        *slot = Some(Quantity(quantity.trim().to_owned()));
    }
    Ok(Some(bound))
}

/// A price: a decimal number, zero or more.
fn check_price(flag: &str, value: &str) -> Result<String, UserError> {
    let value = value.trim();
    match value.parse::<f64>() {
        Ok(n) if n.is_finite() && n >= 0.0 && !value.contains(['e', 'E']) => Ok(value.to_owned()),
        _ => Err(UserError::Usage(format!(
            "{flag}: {value:?} is not a price such as 0.02 (a decimal number, zero or more)"
        ))),
    }
}

/// A currency code: letters and digits, such as EUR or credits.
fn check_currency(value: &str) -> Result<String, UserError> {
    let value = value.trim();
    if (1..=16).contains(&value.len()) && value.chars().all(|c| c.is_ascii_alphanumeric()) {
        Ok(value.to_owned())
    } else {
        Err(UserError::Usage(format!(
            "--currency: {value:?} is not a currency code such as EUR (1 to 16 letters or digits)"
        )))
    }
}

/// `base` with the flags of `set` applied; every value checked.
/// `--change-threshold`: a percentage from 0% to 100%; `""` for the
/// default.
fn check_threshold(value: &str) -> Result<Option<u32>, UserError> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    value
        .strip_suffix('%')
        .unwrap_or(value)
        .parse::<u32>()
        .ok()
        .filter(|p| *p <= 100)
        .map(Some)
        .ok_or_else(|| {
            UserError::Usage(format!(
                "--change-threshold: {value:?} is not a percentage from 0% to 100% such as 10%"
            ))
        })
}

/// `--min-change-interval`: a duration in whole seconds, up to a day;
/// `""` for the default.
fn check_interval(value: &str) -> Result<Option<u64>, UserError> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    humantime::parse_duration(value)
        .ok()
        .filter(|d| d.as_secs() <= 24 * 3600 && d.subsec_nanos() == 0)
        .map(|d| Some(d.as_secs()))
        .ok_or_else(|| {
            UserError::Usage(format!(
                "--min-change-interval: {value:?} is not a duration in whole seconds up to a day, such as 30s or 5m"
            ))
        })
}

fn merged(
    mut base: SharingPolicySpec,
    args: &SharingPolicySetArgs,
) -> Result<SharingPolicySpec, UserError> {
    if let Some(v) = &args.cpu {
        base.cpu = Some(check_offer("--cpu", v)?);
    }
    if let Some(v) = &args.memory {
        base.memory = Some(check_offer("--memory", v)?);
    }
    if let Some(v) = &args.pods {
        base.pods = Some(check_offer("--pods", v)?);
    }
    if let Some(v) = &args.storage {
        base.storage = Some(check_offer("--storage", v)?);
    }
    if let Some(v) = &args.claims {
        base.claims = Some(check_offer("--claims", v)?);
    }
    if let Some(v) = &args.floor {
        base.floor = check_bound("--floor", v)?;
    }
    if let Some(v) = &args.ceiling {
        base.ceiling = check_bound("--ceiling", v)?;
    }
    if let Some(v) = &args.change_threshold {
        base.following.threshold_percent = check_threshold(v)?;
    }
    if let Some(v) = &args.min_change_interval {
        base.following.min_interval_seconds = check_interval(v)?;
    }
    sharing::bounds(&base).map_err(|e| {
        UserError::Usage(format!(
            "--floor and --ceiling: {e}; lower the floor or raise the ceiling"
        ))
    })?;
    let cpu_hour = args
        .cost_cpu_hour
        .as_deref()
        .map(|v| check_price("--cost-cpu-hour", v))
        .transpose()?;
    let memory_gib_hour = args
        .cost_memory_gib_hour
        .as_deref()
        .map(|v| check_price("--cost-memory-gib-hour", v))
        .transpose()?;
    let currency = args.currency.as_deref().map(check_currency).transpose()?;
    if cpu_hour.is_some() || memory_gib_hour.is_some() || currency.is_some() {
        let mut cost = base.cost.take().unwrap_or_default();
        if let Some(p) = cpu_hour {
            cost.cpu_hour = Some(p);
        }
        if let Some(p) = memory_gib_hour {
            cost.memory_gib_hour = Some(p);
        }
        if let Some(c) = currency {
            cost.currency = c;
        }
        base.cost = Some(cost);
    }
    if let Some(accept) = args.accept_new_peers {
        base.accept_new_peers = accept;
    }
    merge_admission(&mut base.admission, args)?;
    Ok(base)
}

/// A comma-separated list; empty for "".
fn list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The admission flags of `set` applied to `a`, every value checked as
/// the API server would check it where it is used.
fn merge_admission(a: &mut Admission, args: &SharingPolicySetArgs) -> Result<(), UserError> {
    let bad =
        |flag: &str, value: &str, why: String| UserError::Usage(format!("{flag}: {value:?} {why}"));
    if let Some(v) = &args.pod_security {
        a.pod_security = v
            .trim()
            .parse::<Level>()
            .map_err(|e| UserError::Usage(format!("--pod-security: {e}")))?;
    }
    if let Some(v) = &args.storage_classes {
        a.storage_classes = list(v);
        for c in &a.storage_classes {
            validation::dns_subdomain(c).map_err(|e| {
                bad(
                    "--storage-classes",
                    c,
                    format!("is not a StorageClass name: {e}"),
                )
            })?;
        }
    }
    if let Some(v) = &args.priority_classes {
        a.priority_classes = list(v);
        for c in &a.priority_classes {
            validation::dns_subdomain(c).map_err(|e| {
                bad(
                    "--priority-classes",
                    c,
                    format!("is not a PriorityClass name: {e}"),
                )
            })?;
        }
    }
    if let Some(v) = &args.tolerations {
        a.tolerations = list(v);
        for k in &a.tolerations {
            validation::label_key(k)
                .map_err(|e| bad("--tolerations", k, format!("is not a taint key: {e}")))?;
        }
    }
    if let Some(v) = &args.node_selector {
        a.node_selector.clear();
        for pair in list(v) {
            let Some((key, value)) = pair.split_once('=') else {
                return Err(bad("--node-selector", &pair, "is not KEY=VALUE".to_owned()));
            };
            validation::label_key(key)
                .map_err(|e| bad("--node-selector", key, format!("is not a label key: {e}")))?;
            validation::label_value(value).map_err(|e| {
                bad(
                    "--node-selector",
                    value,
                    format!("is not a label value: {e}"),
                )
            })?;
            a.node_selector.insert(key.to_owned(), value.to_owned());
        }
    }
    if let Some(v) = &args.runtime_class {
        let v = v.trim();
        a.runtime_class_name = if v.is_empty() {
            None
        } else {
            validation::dns_subdomain(v).map_err(|e| {
                bad(
                    "--runtime-class",
                    v,
                    format!("is not a RuntimeClass name: {e}"),
                )
            })?;
            Some(v.to_owned())
        };
    }
    if let Some(n) = args.node_ports {
        a.node_ports = n;
    }
    if let Some(n) = args.load_balancers {
        a.load_balancers = n;
    }
    if let Some(v) = &args.ephemeral_storage {
        let v = v.trim();
        if liqo_api::sharing::parse_bytes(v).is_none() {
            return Err(bad(
                "--ephemeral-storage",
                v,
                "is not a quantity of bytes (e.g. 4Gi)".to_owned(),
            ));
        }
        a.ephemeral_storage = v.to_owned();
    }
    if let Some(n) = args.objects {
        a.objects = n;
    }
    if let Some(n) = args.namespaces {
        a.namespaces = n;
    }
    if let Some(v) = &args.reserved_namespaces {
        a.reserved_namespaces = list(v);
        for p in &a.reserved_namespaces {
            let name = p
                .strip_suffix('*')
                .or_else(|| p.strip_prefix('*'))
                .unwrap_or(p);
            let fits = !name.is_empty()
                && name.len() <= 63
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !fits {
                return Err(bad(
                    "--reserved-namespaces",
                    p,
                    "is not a namespace name, NAME* or *NAME (lowercase letters, digits, -)"
                        .to_owned(),
                ));
            }
        }
    }
    Ok(())
}

/// The cluster, once it is known to have liqo-rs and its SharingPolicy CRD.
async fn provider(global: &GlobalArgs) -> anyhow::Result<(ClusterClient, Api<SharingPolicy>)> {
    let cluster = ClusterClient::local(global).await?;
    if read_identity(&cluster).await?.is_none() {
        return Err(UserError::NotFound(format!(
            "liqo-rs is not installed on cluster {}; run `liqoctl install`",
            cluster.name
        ))
        .into());
    }
    let api: Api<SharingPolicy> = Api::all(cluster.client.clone());
    // A list answers 404 only when the type itself is unknown.
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok((cluster, api)),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(UserError::NotFound(format!(
            "cluster {} has no SharingPolicy CRD; run `liqoctl install`",
            cluster.name
        ))
        .into()),
        Err(e) => Err(cluster.explain(e, "reading the sharing policies")),
    }
}

async fn get(
    cluster: &ClusterClient,
    api: &Api<SharingPolicy>,
    name: &str,
) -> anyhow::Result<Option<SharingPolicy>> {
    api.get_opt(name)
        .await
        .map_err(|e| cluster.explain(e, &format!("reading SharingPolicy/{name}")))
}

/// The policy that applies to `name` (a consumer's ID, or `default`), and
/// where it comes from, as `peer` picks it.
async fn effective(
    cluster: &ClusterClient,
    api: &Api<SharingPolicy>,
    name: &str,
) -> anyhow::Result<(SharingPolicySpec, Source)> {
    if name != DEFAULT
        && let Some(p) = get(cluster, api, name).await?
    {
        return Ok((p.spec, Source::Peer));
    }
    Ok(match get(cluster, api, DEFAULT).await? {
        Some(p) => (p.spec, Source::Default),
        None => (sharing::default_policy(), Source::BuiltIn),
    })
}

async fn set(
    args: &SharingPolicySetArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let name = policy_name(&args.peer)?;
    // Checked before any request, so a bad value never waits on a cluster.
    merged(sharing::default_policy(), args)?;
    let (cluster, api) = provider(global).await?;
    let base = match get(&cluster, &api, &name).await? {
        Some(existing) => existing.spec,
        // A new per-peer policy starts from what that peer gets today.
        None => effective(&cluster, &api, &name).await?.0,
    };
    let spec = merged(base, args)?;
    let mut policy = SharingPolicy::new(&name, spec);
    policy.metadata.labels = Some(common_labels("sharing-policy"));
    let manifest = Manifest::SharingPolicy(Box::new(policy.clone()));
    if ownership::of(&cluster, &manifest).await? == Ownership::Foreign {
        return Err(UserError::Refused(format!(
            "SharingPolicy/{name} on cluster {} was not made by liqoctl; change it with kubectl, \
             or delete it and run set again",
            cluster.name
        ))
        .into());
    }
    let change = apply::apply(&cluster, &manifest).await?;
    printer.result(format!(
        "sharingpolicy/{name} {change} on cluster {}: {}",
        cluster.name,
        describe(&policy.spec)
    ));
    // What it admits applies at once to the tenants it governs; the
    // amounts, at their next peer.
    for id in governed(&cluster, &api, &name).await? {
        let terms = &policy.spec.admission;
        let Some(brought) = terms::bring_under(&cluster, &id, terms).await? else {
            continue;
        };
        let (changed, warnings) = brought.report(&id, terms);
        if let Some(line) = changed {
            printer.result(line);
        }
        for warning in warnings {
            printer.info(warning);
        }
    }
    Ok(())
}

/// The consumers whose tenants the policy `name` governs: the one it
/// names, or, for `default`, every tenant without a policy of its own.
async fn governed(
    cluster: &ClusterClient,
    api: &Api<SharingPolicy>,
    name: &str,
) -> anyhow::Result<Vec<ClusterId>> {
    let tenants: Api<Tenant> = Api::all(cluster.client.clone());
    let all = tenants
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.explain(e, "listing the tenants"))?;
    let own = policy_names(cluster, api).await?;
    Ok(all
        .items
        .into_iter()
        .map(|t| t.spec.cluster_id)
        .filter(|id| {
            if name == DEFAULT {
                !own.iter().any(|o| o == id.as_str())
            } else {
                id.as_str() == name
            }
        })
        .collect())
}

/// The names of every SharingPolicy.
async fn policy_names(
    cluster: &ClusterClient,
    api: &Api<SharingPolicy>,
) -> anyhow::Result<Vec<String>> {
    Ok(api
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.explain(e, "listing the sharing policies"))?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect())
}

/// What `sharing-policy show` reports (`-o json|yaml`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Shown {
    /// The consumer asked about, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    peer: Option<String>,
    /// The SharingPolicy that applies, absent for the built-in default.
    #[serde(skip_serializing_if = "Option::is_none")]
    object: Option<String>,
    source: Source,
    policy: SharingPolicySpec,
    /// The free allocatable capacity now.
    free: Resources,
    /// What the policy offers now, given `free`.
    #[serde(skip_serializing_if = "Option::is_none")]
    offer: Option<Resources>,
    /// Why the policy offers nothing: a value peer cannot read.
    #[serde(skip_serializing_if = "Option::is_none")]
    invalid: Option<String>,
    /// The consumers with a policy of their own.
    peer_policies: Vec<String>,
}

async fn show(
    args: &SharingPolicyShowArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let name = policy_name(&args.peer)?;
    let (cluster, api) = provider(global).await?;
    let (policy, source) = effective(&cluster, &api, &name).await?;
    let free = capacity::free(&cluster).await?;
    let (offer, invalid) = match sharing::offered(&policy, free) {
        Ok(o) => (Some(o.to_resources()), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let mut peer_policies: Vec<String> = policy_names(&cluster, &api)
        .await?
        .into_iter()
        .filter(|n| n != DEFAULT)
        .collect();
    peer_policies.sort();
    let shown = Shown {
        peer: args.peer.peer.is_some().then(|| name.clone()),
        object: match source {
            Source::Peer => Some(name.clone()),
            Source::Default => Some(DEFAULT.to_owned()),
            Source::BuiltIn => None,
        },
        source,
        policy,
        free: free.to_resources(),
        offer,
        invalid,
        peer_policies,
    };
    if let Some(format) = args.output.output {
        return printer.structured(&shown, format);
    }
    printer.result(render(&shown));
    Ok(())
}

fn render(s: &Shown) -> String {
    use comfy_table::{Table, presets::UTF8_BORDERS_ONLY};
    let source = match (s.source, &s.object) {
        (Source::Peer, Some(o)) => format!("SharingPolicy/{o} (the consumer's own)"),
        (Source::Default, _) => format!("SharingPolicy/{DEFAULT}"),
        _ => format!("built-in default (no SharingPolicy/{DEFAULT})"),
    };
    let mut head = Table::new();
    head.load_style(UTF8_BORDERS_ONLY)
        .set_header(vec!["Sharing policy", ""]);
    if let Some(peer) = &s.peer {
        head.add_row(vec!["Consumer", peer]);
    }
    head.add_row(vec!["From".to_owned(), source]);
    head.add_row(vec![
        "Accepts new peers",
        if s.policy.accept_new_peers {
            "yes"
        } else {
            "no"
        },
    ]);
    head.add_row(vec![
        "Cost".to_owned(),
        s.policy.cost.as_ref().map_or("-".to_owned(), show_cost),
    ]);
    if let Some(bounds) = show_bounds(&s.policy) {
        head.add_row(vec!["Bounds".to_owned(), bounds]);
    }
    if let Some(following) = show_following(&s.policy) {
        head.add_row(vec!["Follows load".to_owned(), following]);
    }
    if let Some(why) = &s.invalid {
        head.add_row(vec!["Invalid".to_owned(), why.clone()]);
    }
    let mut amounts = Table::new();
    amounts.load_style(UTF8_BORDERS_ONLY).set_header(vec![
        "Resource",
        "Policy",
        "Offered now",
        "Free now",
    ]);
    let policy = [
        &s.policy.cpu,
        &s.policy.memory,
        &s.policy.pods,
        &s.policy.storage,
        &s.policy.claims,
    ];
    let pick = |r: &Resources, i: usize| -> String {
        let q = [&r.cpu, &r.memory, &r.pods, &r.storage, &r.claims][i];
        q.as_ref().map_or("0".to_owned(), |q| q.0.clone())
    };
    for (i, what) in ["cpu", "memory", "pods", "storage", "claims"]
        .into_iter()
        .enumerate()
    {
        amounts.add_row(vec![
            what.to_owned(),
            policy[i].as_ref().map_or("0".to_owned(), |o| o.0.clone()),
            s.offer.as_ref().map_or("-".to_owned(), |o| pick(o, i)),
            pick(&s.free, i),
        ]);
    }
    let mut out = format!("{head}\n\n{amounts}");
    if !s.peer_policies.is_empty() {
        out.push_str(&format!(
            "\n\nConsumers with their own policy: {}",
            s.peer_policies.join(", ")
        ));
    }
    out
}

async fn delete(
    args: &SharingPolicyPeerArg,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let name = policy_name(args)?;
    let (cluster, _) = provider(global).await?;
    let manifest = Manifest::SharingPolicy(Box::new(SharingPolicy::new(
        &name,
        sharing::default_policy(),
    )));
    match apply::delete(&cluster, &manifest).await? {
        Deletion::Deleted { .. } => {
            printer.result(format!(
                "sharingpolicy/{name} deleted on cluster {}",
                cluster.name
            ));
            Ok(())
        }
        Deletion::Absent => Err(UserError::NotFound(format!(
            "cluster {} has no SharingPolicy/{name}",
            cluster.name
        ))
        .into()),
        Deletion::Foreign => Err(UserError::Refused(format!(
            "SharingPolicy/{name} on cluster {} was not made by liqoctl; delete it with kubectl",
            cluster.name
        ))
        .into()),
    }
}

/// The floor and ceiling of a policy, when it has either:
/// `floor cpu=1, ceiling cpu=8 memory=16Gi`.
fn show_bounds(p: &SharingPolicySpec) -> Option<String> {
    let one = |name: &str, r: &Option<Resources>| {
        let r = r.as_ref()?;
        let parts: Vec<String> = [
            ("cpu", &r.cpu),
            ("memory", &r.memory),
            ("pods", &r.pods),
            ("storage", &r.storage),
            ("claims", &r.claims),
        ]
        .into_iter()
        .filter_map(|(k, q)| Some(format!("{k}={}", q.as_ref()?.0)))
        .collect();
        (!parts.is_empty()).then(|| format!("{name} {}", parts.join(" ")))
    };
    let shown: Vec<String> = [one("floor", &p.floor), one("ceiling", &p.ceiling)]
        .into_iter()
        .flatten()
        .collect();
    (!shown.is_empty()).then(|| shown.join(", "))
}

/// How the policy's shares follow the free capacity, when it offers any:
/// `changes of 10% or more, at most every 10s`.
fn show_following(p: &SharingPolicySpec) -> Option<String> {
    liqo_api::following::follows(p).then(|| {
        format!(
            "changes of {}% or more, at most every {}",
            p.following.threshold_percent(),
            humantime::format_duration(p.following.min_interval())
        )
    })
}

/// A policy in one line, for `set`'s result.
fn describe(p: &SharingPolicySpec) -> String {
    let offer = |o: &Option<Offer>| o.as_ref().map_or("0".to_owned(), |o| o.0.clone());
    let mut out = format!(
        "{}, cpu {}, memory {}, pods {}, storage {}, claims {}",
        if p.accept_new_peers {
            "accepts new peers"
        } else {
            "accepts no new peers"
        },
        offer(&p.cpu),
        offer(&p.memory),
        offer(&p.pods),
        offer(&p.storage),
        offer(&p.claims)
    );
    if let Some(bounds) = show_bounds(p) {
        out.push_str(&format!(", {bounds}"));
    }
    if let Some(following) = show_following(p) {
        out.push_str(&format!(", follows the load ({following})"));
    }
    if let Some(cost) = &p.cost {
        out.push_str(&format!(", cost {}", show_cost(cost)));
    }
    out.push_str(&format!("; admits {}", p.admission.describe()));
    out
}

#[cfg(test)]
mod tests;
