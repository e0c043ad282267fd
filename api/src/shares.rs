//! How a tenant's grant is split across the namespaces it may run pods in
//! on its provider: its tenant namespace and its twin namespaces.
//!
//! A ResourceQuota counts one namespace, and upstream Kubernetes has no
//! quota across namespaces, so the grant is enforced as one quota per
//! namespace, [`SHARE_QUOTA`], whose hards never add up to more than the
//! grant (docs/offloading.md, "The grant across twin namespaces"). The
//! provider's gateway writes them; the API server enforces them. This
//! module is the arithmetic, with no IO: what each namespace should get
//! ([`targets`]), and what may be written now without the sum ever
//! passing the grant, even while admissions race ([`step`]).
//!
//! The consumer says how much each twin needs (its virtual kubelet writes
//! [`DEMAND_ANNOTATION`] on the twin: the requests of the pods it runs
//! there). That only decides how the grant is divided: whatever a
//! consumer writes, the hards add up to at most the grant.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::admission::Admission;
use crate::sharing::{Amounts, Resources, parse_bytes, parse_cpu_millis};

/// The ResourceQuota holding a namespace's share of its tenant's grant.
pub const SHARE_QUOTA: &str = "liqo-share";

/// The kinds a peer writes in its namespaces, counted per namespace by
/// its share ([`exposure_hard`]) up to its terms' `objects`.
pub const COUNTED_OBJECTS: [&str; 6] = [
    "services",
    "configmaps",
    "secrets",
    "count/replicasets.apps",
    "count/jobs.batch",
    "count/endpointslices.discovery.k8s.io",
];

/// What a share bounds beside its part of the grant, the same in each of
/// the tenant's namespaces (not divided): the node ports and LoadBalancer
/// Services its terms allow, the objects of each kind it may hold
/// ([`COUNTED_OBJECTS`]), and, when the grant has no storage, no storage
/// at all (claims, whoever makes them: a generic ephemeral volume's claim
/// is made by the provider's controller, and is counted too). Storage
/// granted is a part of the grant, divided as the rest.
pub fn exposure_hard(terms: &Admission, grant: &Grant) -> BTreeMap<String, Quantity> {
    let objects = Quantity(terms.objects.to_string());
    let mut hard = BTreeMap::from([
        (
            "services.nodeports".to_owned(),
            Quantity(terms.node_ports.to_string()),
        ),
        (
            "services.loadbalancers".to_owned(),
            Quantity(terms.load_balancers.to_string()),
        ),
    ]);
    for (counted, granted) in [
        (Counted::Claims, grant.claims),
        (Counted::Storage, grant.storage),
    ] {
        if !granted {
            hard.insert(counted.quota_key().to_owned(), Quantity("0".to_owned()));
        }
    }
    // Each class the terms allow, counted on its own (what the claims of
    // each take shows in the quota's status), within the grant; the
    // others are refused by admission (`liqo-peer-claims`), which also
    // knows classes made later.
    for class in &terms.storage_classes {
        let key = |k: &str| format!("{class}.storageclass.storage.k8s.io/{k}");
        if grant.storage {
            hard.insert(
                key("requests.storage"),
                Quantity(grant.amounts.storage_bytes.to_string()),
            );
        }
        if grant.claims {
            hard.insert(
                key("persistentvolumeclaims"),
                Quantity(grant.amounts.claims.to_string()),
            );
        }
    }
    hard.extend(
        COUNTED_OBJECTS
            .iter()
            .map(|k| ((*k).to_owned(), objects.clone())),
    );
    hard
}

/// Whether `quota`, a share already holding its part of the grant, must
/// be given [`exposure_hard`] for `terms`. A quota without its part of the
/// grant gets none: these alone must never stand for a share.
pub fn exposure_to_write(quota: &ResourceQuota, terms: &Admission, grant: &Grant) -> bool {
    let hard = quota.spec.as_ref().and_then(|s| s.hard.as_ref());
    let Some(hard) = hard.filter(|h| h.contains_key(Counted::Pods.quota_key())) else {
        return false;
    };
    // As numbers: the API server writes 1000 back as 1k.
    let value = |q: &Quantity| parse_bytes(&q.0);
    exposure_hard(terms, grant)
        .iter()
        .any(|(k, v)| hard.get(k).and_then(value) != value(v))
}

/// On a twin namespace: what the consumer's pods there request, as JSON
/// of [`Resources`] (`{"cpu":"1500m","memory":"3Gi","pods":"12"}`),
/// written by the consumer's virtual kubelet.
pub const DEMAND_ANNOTATION: &str = "liqo.io/demand";

/// A resource a share bounds: what a virtual node's capacity says and
/// the scheduler counts (requests and pods; limits are not scheduled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Counted {
    Cpu,
    Memory,
    Pods,
    Storage,
    Claims,
}

impl Counted {
    pub const ALL: [Counted; 5] = [
        Counted::Cpu,
        Counted::Memory,
        Counted::Pods,
        Counted::Storage,
        Counted::Claims,
    ];

    /// Its name in a ResourceQuota's `hard` and `used`.
    pub fn quota_key(self) -> &'static str {
        match self {
            Counted::Cpu => "requests.cpu",
            Counted::Memory => "requests.memory",
            Counted::Pods => "pods",
            Counted::Storage => "requests.storage",
            Counted::Claims => "persistentvolumeclaims",
        }
    }

    pub fn of(self, a: &Amounts) -> u64 {
        match self {
            Counted::Cpu => a.cpu_millis,
            Counted::Memory => a.memory_bytes,
            Counted::Pods => a.pods,
            Counted::Storage => a.storage_bytes,
            Counted::Claims => a.claims,
        }
    }

    fn set(self, a: &mut Amounts, value: u64) {
        match self {
            Counted::Cpu => a.cpu_millis = value,
            Counted::Memory => a.memory_bytes = value,
            Counted::Pods => a.pods = value,
            Counted::Storage => a.storage_bytes = value,
            Counted::Claims => a.claims = value,
        }
    }

    pub fn parse(self, q: &str) -> Option<u64> {
        match self {
            Counted::Cpu => parse_cpu_millis(q),
            // As quantities: the API server writes 1000 as "1k".
            Counted::Memory | Counted::Storage | Counted::Claims => parse_bytes(q),
            Counted::Pods => q.parse().ok().or_else(|| parse_bytes(q)),
        }
    }

    pub fn format(self, value: u64) -> String {
        match self {
            Counted::Cpu => format!("{value}m"),
            Counted::Memory | Counted::Pods | Counted::Storage | Counted::Claims => {
                value.to_string()
            }
        }
    }

    fn granted(self, grant: &Resources) -> bool {
        match self {
            Counted::Cpu => grant.cpu.is_some(),
            Counted::Memory => grant.memory.is_some(),
            Counted::Pods => grant.pods.is_some(),
            Counted::Storage => grant.storage.is_some(),
            Counted::Claims => grant.claims.is_some(),
        }
    }
}

/// A tenant's grant as a share bounds it: only what the grant names is
/// bounded (as the tenant namespace's `liqo-grant` quota does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub amounts: Amounts,
    pub cpu: bool,
    pub memory: bool,
    pub pods: bool,
    pub storage: bool,
    pub claims: bool,
}

impl Grant {
    /// `None` when a quantity cannot be read.
    pub fn of(grant: &Resources) -> Option<Self> {
        Some(Self {
            amounts: Amounts::from_resources(grant).ok()?,
            cpu: Counted::Cpu.granted(grant),
            memory: Counted::Memory.granted(grant),
            pods: Counted::Pods.granted(grant),
            storage: Counted::Storage.granted(grant),
            claims: Counted::Claims.granted(grant),
        })
    }

    /// The resources it bounds.
    pub fn counted(&self) -> impl Iterator<Item = Counted> + '_ {
        Counted::ALL.into_iter().filter(|c| match c {
            Counted::Cpu => self.cpu,
            Counted::Memory => self.memory,
            Counted::Pods => self.pods,
            Counted::Storage => self.storage,
            Counted::Claims => self.claims,
        })
    }
}

/// One namespace of a tenant, as a round of the split sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holder {
    /// A twin namespace (the tenant namespace is not one).
    pub twin: bool,
    /// What the consumer says its pods there request (twins only).
    pub demand: Amounts,
    /// Its share quota, when it has one.
    pub quota: Option<QuotaState>,
}

/// A share quota as read: per resource, `None` where it says nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuotaState {
    /// `spec.hard`: what we last wrote.
    pub spec: BTreeMap<Counted, u64>,
    /// `status.hard`: what admission enforces (the quota controller copies
    /// the spec there when it catches up).
    pub enforced: BTreeMap<Counted, u64>,
    /// `status.used`: what admission has counted.
    pub used: BTreeMap<Counted, u64>,
}

impl QuotaState {
    pub fn of(quota: &ResourceQuota) -> Self {
        let read = |list: Option<&BTreeMap<String, Quantity>>| {
            Counted::ALL
                .into_iter()
                .filter_map(|c| {
                    let q = list?.get(c.quota_key())?;
                    Some((c, c.parse(&q.0)?))
                })
                .collect()
        };
        let status = quota.status.as_ref();
        Self {
            spec: read(quota.spec.as_ref().and_then(|s| s.hard.as_ref())),
            enforced: read(status.and_then(|s| s.hard.as_ref())),
            used: read(status.and_then(|s| s.used.as_ref())),
        }
    }
}

impl Holder {
    fn used(&self, r: Counted) -> Option<u64> {
        self.quota.as_ref()?.used.get(&r).copied()
    }

    /// The most admission may let this namespace hold of `r` now, as far
    /// as the grant's sum is concerned: the larger of what we wrote and
    /// what is enforced, and never less than what it holds. A tenant
    /// namespace without a share is bounded by `liqo-grant` (the whole
    /// grant); a twin without one admits no pod (the admission policy
    /// `liqo-twin-share`). `None` while its use is not counted yet.
    fn bound(&self, r: Counted, grant: u64) -> Option<u64> {
        let Some(quota) = &self.quota else {
            return Some(if self.twin { 0 } else { grant });
        };
        let used = *quota.used.get(&r)?;
        let written = quota.spec.get(&r).copied().unwrap_or(grant);
        let enforced = quota.enforced.get(&r).copied().unwrap_or(written);
        Some(written.max(enforced).max(used))
    }

    /// What we last wrote, or what stands for it without a quota.
    fn written(&self, r: Counted, grant: u64) -> u64 {
        match &self.quota {
            Some(q) => q.spec.get(&r).copied().unwrap_or(grant),
            None if self.twin => 0,
            None => grant,
        }
    }
}

/// What each holder should hold: what it needs (the larger of what it
/// uses and what the consumer asks for it), plus, for twins, a part of
/// what is left in proportion to that need (equal parts while no twin
/// needs anything; the tenant namespace gets the rest only when there is
/// no twin). When needs add up to more than the grant, each gets
/// what it uses plus a part of what is free in proportion to what it
/// lacks. Never below what a namespace uses; the sum never above the
/// grant.
pub fn targets(grant: &Grant, holders: &[Holder]) -> Vec<Amounts> {
    let mut out = vec![Amounts::default(); holders.len()];
    for r in grant.counted() {
        let total = r.of(&grant.amounts);
        let used: Vec<u64> = holders.iter().map(|h| h.used(r).unwrap_or(0)).collect();
        let need: Vec<u64> = holders
            .iter()
            .zip(&used)
            .map(|(h, u)| (*u).max(if h.twin { r.of(&h.demand) } else { 0 }))
            .collect();
        let needed: u64 = need.iter().sum();
        let values: Vec<u64> = if needed <= total {
            // The part left goes to the twins (the tenant namespace is
            // not where pods are meant to run).
            let twin_need: Vec<u64> = holders
                .iter()
                .zip(&need)
                .map(|(h, n)| if h.twin { *n } else { 0 })
                .collect();
            let weights: Vec<u64> = if twin_need.iter().any(|n| *n > 0) {
                twin_need
            } else if holders.iter().any(|h| h.twin) {
                holders.iter().map(|h| u64::from(h.twin)).collect()
            } else {
                vec![1; holders.len()]
            };
            let parts = divide(total - needed, &weights);
            need.iter().zip(parts).map(|(n, p)| n + p).collect()
        } else {
            let in_use: u64 = used.iter().sum();
            let lacking: Vec<u64> = need.iter().zip(&used).map(|(n, u)| n - u).collect();
            let parts = divide(total.saturating_sub(in_use), &lacking);
            used.iter().zip(parts).map(|(u, p)| u + p).collect()
        };
        for (o, v) in out.iter_mut().zip(values) {
            r.set(o, v);
        }
    }
    out
}

/// `amount` in parts proportional to `weights`, whole units: rounded
/// down, then what rounding left goes a unit each to the largest
/// remainders (the first on a tie), so that all of it is given.
fn divide(amount: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|w| u128::from(*w)).sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<(u128, u128)> = weights
        .iter()
        .map(|w| {
            let share = u128::from(amount) * u128::from(*w);
            (share / sum, share % sum)
        })
        .collect();
    let mut parts: Vec<u64> = exact
        .iter()
        .map(|(q, _)| u64::try_from(*q).unwrap_or(u64::MAX))
        .collect();
    let given: u64 = parts.iter().sum();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|a, b| exact[*b].1.cmp(&exact[*a].1).then(a.cmp(b)));
    for i in order
        .into_iter()
        .take(usize::try_from(amount - given).unwrap_or(0))
    {
        parts[i] += 1;
    }
    parts
}

/// What to write to one holder's share quota: the whole `hard`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub holder: usize,
    pub hard: BTreeMap<Counted, u64>,
}

/// The writes of this round, from a fresh read of every share: lowering
/// first (each share down to its target, never below what it uses); and
/// only when nothing is left to lower, raising, each share up to its
/// target as far as the grant, less what every share may hold now, allows.
/// A share is raised only from counts admission has made (`status.used`
/// of every share known), and "what it may hold" is the larger of what is
/// written and what is enforced, so that a lowering not yet enforced is
/// not given away twice. Nothing to write: the split is as it should be.
pub fn step(grant: &Grant, holders: &[Holder]) -> Vec<Write> {
    let want = targets(grant, holders);
    let counted: Vec<Counted> = grant.counted().collect();
    let total = |r: Counted| r.of(&grant.amounts);
    let written: Vec<BTreeMap<Counted, u64>> = holders
        .iter()
        .map(|h| {
            counted
                .iter()
                .map(|r| (*r, h.written(*r, total(*r))))
                .collect()
        })
        .collect();
    let lower: Vec<Write> = holders
        .iter()
        .enumerate()
        .filter(|(i, _)| counted.iter().any(|r| r.of(&want[*i]) < written[*i][r]))
        .map(|(i, _)| Write {
            holder: i,
            hard: counted
                .iter()
                .map(|r| (*r, r.of(&want[i]).min(written[i][r])))
                .collect(),
        })
        .collect();
    if !lower.is_empty() {
        return lower;
    }
    // Every share is at or below its target: raise them.
    let mut raised = written.clone();
    for r in &counted {
        let bounds: Option<Vec<u64>> = holders.iter().map(|h| h.bound(*r, total(*r))).collect();
        let Some(bounds) = bounds else {
            continue;
        };
        let mut room = total(*r).saturating_sub(bounds.iter().sum());
        for (i, bound) in bounds.iter().enumerate() {
            let target = r.of(&want[i]);
            // Up to what it may hold already costs nothing more.
            let take = target.saturating_sub(*bound).min(room);
            room -= take;
            raised[i].insert(*r, target.min(*bound + take).max(written[i][r]));
        }
    }
    // Only the granted resources are compared: a share also holds zeros
    // for what is not granted (storage, claims), which no round writes.
    let granted = |spec: &BTreeMap<Counted, u64>| -> BTreeMap<Counted, u64> {
        spec.iter()
            .filter(|(r, _)| counted.contains(r))
            .map(|(r, v)| (*r, *v))
            .collect()
    };
    holders
        .iter()
        .enumerate()
        .filter(|(i, h)| h.quota.as_ref().map(|q| granted(&q.spec)) != Some(raised[*i].clone()))
        .map(|(i, _)| Write {
            holder: i,
            hard: raised[i].clone(),
        })
        .collect()
}

/// A quota's `hard` as written.
pub fn hard_quantities(hard: &BTreeMap<Counted, u64>) -> BTreeMap<String, Quantity> {
    hard.iter()
        .map(|(r, v)| (r.quota_key().to_owned(), Quantity(r.format(*v))))
        .collect()
}

/// The demand a twin's annotation states (nothing when absent or not
/// readable: the consumer only divides its own grant with it).
pub fn demand_of(annotations: Option<&BTreeMap<String, String>>) -> Amounts {
    annotations
        .and_then(|a| a.get(DEMAND_ANNOTATION))
        .and_then(|text| serde_json::from_str::<Resources>(text).ok())
        .and_then(|r| Amounts::from_resources(&r).ok())
        .unwrap_or_default()
}

/// The annotation's value for a demand.
pub fn demand_annotation(demand: &Amounts) -> String {
    let r = Resources {
        cpu: Some(Quantity(Counted::Cpu.format(demand.cpu_millis))),
        memory: Some(Quantity(Counted::Memory.format(demand.memory_bytes))),
        pods: Some(Quantity(demand.pods.to_string())),
        storage: (demand.storage_bytes > 0)
            .then(|| Quantity(Counted::Storage.format(demand.storage_bytes))),
        claims: (demand.claims > 0).then(|| Quantity(demand.claims.to_string())),
    };
    serde_json::to_string(&r).unwrap_or_default()
}

#[cfg(test)]
mod tests;
