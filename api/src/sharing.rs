//! What a provider shares with its consumers: amounts of resources, their
//! cost, the provider's sharing policy, and the pure computation of a grant
//! from a request and a policy. Quantities are Kubernetes quantities, so
//! that a grant is written as it is enforced (a ResourceQuota) and shown
//! (a virtual node's capacity).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::admission::Admission;

/// CPU, memory, pods, and persistent storage (the bytes claims may
/// request, and how many claims); a missing amount means "none asked" in
/// a request and "nothing" in a grant.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<Quantity>,
    /// What the claims may request in all (`requests.storage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Quantity>,
    /// How many claims (`persistentvolumeclaims`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<Quantity>,
}

/// The price of granted resources, per hour, in a currency of the
/// provider's choice; shown to the consumer, never enforced.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cost {
    /// Price of one CPU for one hour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_hour: Option<String>,
    /// Price of one GiB of memory for one hour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gib_hour: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub currency: String,
}

/// How much of one resource a policy offers: an absolute quantity
/// (`4`, `8Gi`, `110`) or a share of the provider's free allocatable
/// capacity (`50%`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(transparent)]
pub struct Offer(pub String);

/// The provider's sharing policy: `default`, and one per consumer named by
/// its cluster ID, which takes precedence. Written by `liqoctl` on the
/// provider; read by `liqoctl peer` when it computes a grant.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "liqo.io",
    derive = "PartialEq",
    version = "v1alpha1",
    kind = "SharingPolicy",
    plural = "sharingpolicies",
    printcolumn = r#"{"name":"Accept","type":"boolean","jsonPath":".spec.acceptNewPeers"}"#,
    printcolumn = r#"{"name":"CPU","type":"string","jsonPath":".spec.cpu"}"#,
    printcolumn = r#"{"name":"Memory","type":"string","jsonPath":".spec.memory"}"#,
    printcolumn = r#"{"name":"Pods","type":"string","jsonPath":".spec.pods"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SharingPolicySpec {
    /// Whether consumers without a peering yet may peer at all.
    #[serde(default = "yes")]
    pub accept_new_peers: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Offer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Offer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<Offer>,
    /// Persistent storage, in all: a quantity, or a share of the nodes'
    /// free ephemeral storage (the disks that node-local provisioners put
    /// volumes on). None by default. The classes a peer may use are its
    /// terms' (`admission.storageClasses`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Offer>,
    /// How many claims: a number, or a share of the free pod slots (a
    /// claim is mounted by a pod). None by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<Offer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    /// The least a grant under this policy is (each resource given), even
    /// when its share of the free capacity is less.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<Resources>,
    /// The most a grant under this policy is (each resource given), even
    /// when its share of the free capacity is more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<Resources>,
    /// How a grant given as shares of the free capacity follows it while
    /// the peering lasts (`crate::following`).
    #[serde(default, skip_serializing_if = "Following::is_default")]
    pub following: Following,
    /// What the provider's API server admits from the peer beyond its
    /// quota: Pod Security level, priority classes, tolerations, nodes,
    /// runtime class, NodePort and LoadBalancer Services.
    #[serde(default)]
    pub admission: Admission,
}

/// How a grant given as shares of the provider's free capacity follows
/// it: changes smaller than a threshold are ignored, and one tenant's grant
/// changes at most once an interval, so that it does not flap.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Following {
    /// A change of less than this percentage of the current grant (of
    /// every resource) is ignored. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub threshold_percent: Option<u32>,
    /// The least time between two changes of one tenant's grant, in
    /// seconds. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_interval_seconds: Option<u64>,
}

impl Following {
    /// A change smaller than this percentage is ignored when none is set.
    pub const DEFAULT_THRESHOLD_PERCENT: u32 = 10;
    /// The least seconds between two changes when none is set.
    pub const DEFAULT_MIN_INTERVAL_SECONDS: u64 = 10;

    pub fn threshold_percent(&self) -> u32 {
        self.threshold_percent
            .unwrap_or(Self::DEFAULT_THRESHOLD_PERCENT)
            .min(100)
    }

    pub fn min_interval(&self) -> std::time::Duration {
        std::time::Duration::from_secs(
            self.min_interval_seconds
                .unwrap_or(Self::DEFAULT_MIN_INTERVAL_SECONDS),
        )
    }

    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

fn yes() -> bool {
    true
}

/// The policy that applies when none was set: accept, and offer half of
/// the free capacity.
pub fn default_policy() -> SharingPolicySpec {
    SharingPolicySpec {
        accept_new_peers: true,
        cpu: Some(Offer("50%".to_owned())),
        memory: Some(Offer("50%".to_owned())),
        pods: Some(Offer("50%".to_owned())),
        storage: None,
        claims: None,
        cost: None,
        floor: None,
        ceiling: None,
        following: Following::default(),
        admission: Admission::default(),
    }
}

/// Quantities parsed to numbers: CPU in millicores, memory and storage in
/// bytes, pods and claims as counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amounts {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub pods: u64,
    pub storage_bytes: u64,
    pub claims: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharingError {
    #[error("{what} {value:?} is not a quantity")]
    BadQuantity { what: &'static str, value: String },
    #[error("{what} {value:?} is neither a quantity nor a percentage from 0% to 100%")]
    BadOffer { what: &'static str, value: String },
    #[error("the provider does not accept new peers")]
    NotAccepting,
    #[error("the floor of {what} ({floor}) is above its ceiling ({ceiling})")]
    FloorAboveCeiling {
        what: &'static str,
        floor: String,
        ceiling: String,
    },
    #[error("asked for {asked} {what}, the provider offers {offered}")]
    AboveOffer {
        what: &'static str,
        asked: String,
        offered: String,
    },
}

impl Amounts {
    pub fn from_resources(r: &Resources) -> Result<Self, SharingError> {
        let parse = |what, q: &Option<Quantity>, f: fn(&str) -> Option<u64>| match q {
            None => Ok(0),
            Some(q) => f(&q.0).ok_or(SharingError::BadQuantity {
                what,
                value: q.0.clone(),
            }),
        };
        Ok(Self {
            cpu_millis: parse("cpu", &r.cpu, parse_cpu_millis)?,
            memory_bytes: parse("memory", &r.memory, parse_bytes)?,
            pods: parse("pods", &r.pods, |s| s.parse().ok())?,
            storage_bytes: parse("storage", &r.storage, parse_bytes)?,
            claims: parse("claims", &r.claims, |s| s.parse().ok())?,
        })
    }

    /// As Kubernetes quantities, in the units people read; storage and
    /// claims only when there are some (none is not granted).
    pub fn to_resources(self) -> Resources {
        let cpu = if self.cpu_millis.is_multiple_of(1000) {
            format!("{}", self.cpu_millis / 1000)
        } else {
            format!("{}m", self.cpu_millis)
        };
        let memory = if self.memory_bytes.is_multiple_of(1 << 20) {
            format!("{}Mi", self.memory_bytes >> 20)
        } else {
            format!("{}", self.memory_bytes)
        };
        Resources {
            cpu: Some(Quantity(cpu)),
            memory: Some(Quantity(memory)),
            pods: Some(Quantity(self.pods.to_string())),
            storage: (self.storage_bytes > 0).then(|| Quantity(format_bytes(self.storage_bytes))),
            claims: (self.claims > 0).then(|| Quantity(self.claims.to_string())),
        }
    }
}

/// Bytes as a quantity people read: in Gi or Mi where whole, else bytes.
pub fn format_bytes(bytes: u64) -> String {
    if bytes > 0 && bytes.is_multiple_of(1 << 30) {
        format!("{}Gi", bytes >> 30)
    } else if bytes.is_multiple_of(1 << 20) {
        format!("{}Mi", bytes >> 20)
    } else {
        format!("{bytes}")
    }
}

/// CPU as millicores: `2`, `1.5`, `500m`.
pub fn parse_cpu_millis(s: &str) -> Option<u64> {
    if let Some(m) = s.strip_suffix('m') {
        return m.parse().ok();
    }
    let value: f64 = s.parse().ok()?;
    (value >= 0.0 && value.is_finite()).then(|| (value * 1000.0).round() as u64)
}

/// Memory as bytes: `128974848`, `129e6`, `123Mi`, `1G`, `2Gi`.
pub fn parse_bytes(s: &str) -> Option<u64> {
    const SUFFIXES: [(&str, f64); 12] = [
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("Pi", 1125899906842624.0),
        ("Ei", 1152921504606846976.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    for (suffix, factor) in SUFFIXES {
        if let Some(n) = s.strip_suffix(suffix) {
            let n: f64 = n.parse().ok()?;
            return (n >= 0.0).then(|| (n * factor).round() as u64);
        }
    }
    let n: f64 = s.parse().ok()?;
    (n >= 0.0 && n.is_finite()).then(|| n.round() as u64)
}

/// What a policy offers, given the provider's free allocatable capacity:
/// each offer (a quantity, or a share of what is free), within the
/// policy's floor and ceiling.
pub fn offered(policy: &SharingPolicySpec, free: Amounts) -> Result<Amounts, SharingError> {
    fn one(
        what: &'static str,
        offer: &Option<Offer>,
        free: u64,
        parse: fn(&str) -> Option<u64>,
    ) -> Result<u64, SharingError> {
        let Some(Offer(text)) = offer else {
            return Ok(0);
        };
        let bad = || SharingError::BadOffer {
            what,
            value: text.clone(),
        };
        match text.strip_suffix('%') {
            Some(share) => {
                let share: f64 = share.parse().map_err(|_| bad())?;
                if !(0.0..=100.0).contains(&share) {
                    return Err(bad());
                }
                Ok((free as f64 * share / 100.0).floor() as u64)
            }
            None => parse(text).ok_or_else(bad),
        }
    }
    let (floor, ceiling) = bounds(policy)?;
    let within = |offer: u64, floor: Option<u64>, ceiling: Option<u64>| {
        let offer = offer.max(floor.unwrap_or(0));
        ceiling.map_or(offer, |c| offer.min(c))
    };
    Ok(Amounts {
        cpu_millis: within(
            one("cpu", &policy.cpu, free.cpu_millis, parse_cpu_millis)?,
            floor.cpu,
            ceiling.cpu,
        ),
        memory_bytes: within(
            one("memory", &policy.memory, free.memory_bytes, parse_bytes)?,
            floor.memory,
            ceiling.memory,
        ),
        pods: within(
            one("pods", &policy.pods, free.pods, |s| s.parse().ok())?,
            floor.pods,
            ceiling.pods,
        ),
        storage_bytes: within(
            one("storage", &policy.storage, free.storage_bytes, parse_bytes)?,
            floor.storage,
            ceiling.storage,
        ),
        claims: within(
            one("claims", &policy.claims, free.claims, |s| s.parse().ok())?,
            floor.claims,
            ceiling.claims,
        ),
    })
}

/// Some of CPU (millicores), memory (bytes) and pods: a policy's floor or
/// ceiling, where what is not given is no bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bound {
    pub cpu: Option<u64>,
    pub memory: Option<u64>,
    pub pods: Option<u64>,
    pub storage: Option<u64>,
    pub claims: Option<u64>,
}

impl Bound {
    fn of(r: Option<&Resources>) -> Result<Self, SharingError> {
        let Some(r) = r else {
            return Ok(Self::default());
        };
        let parse = |what, q: &Option<Quantity>, f: fn(&str) -> Option<u64>| {
            q.as_ref()
                .map(|q| {
                    f(&q.0).ok_or(SharingError::BadQuantity {
                        what,
                        value: q.0.clone(),
                    })
                })
                .transpose()
        };
        Ok(Self {
            cpu: parse("cpu", &r.cpu, parse_cpu_millis)?,
            memory: parse("memory", &r.memory, parse_bytes)?,
            pods: parse("pods", &r.pods, |s| s.parse().ok())?,
            storage: parse("storage", &r.storage, parse_bytes)?,
            claims: parse("claims", &r.claims, |s| s.parse().ok())?,
        })
    }
}

/// Which amount of [`Resources`] a bound is about.
type Pick = fn(&Resources) -> &Option<Quantity>;

/// The policy's floor and ceiling, checked: each a quantity, and no floor
/// above its ceiling.
pub fn bounds(policy: &SharingPolicySpec) -> Result<(Bound, Bound), SharingError> {
    let floor = Bound::of(policy.floor.as_ref())?;
    let ceiling = Bound::of(policy.ceiling.as_ref())?;
    let shown = |r: Option<&Resources>, pick: Pick| {
        r.and_then(|r| pick(r).as_ref())
            .map(|q| q.0.clone())
            .unwrap_or_default()
    };
    let pairs: [(&'static str, Option<u64>, Option<u64>, Pick); 5] = [
        ("cpu", floor.cpu, ceiling.cpu, |r| &r.cpu),
        ("memory", floor.memory, ceiling.memory, |r| &r.memory),
        ("pods", floor.pods, ceiling.pods, |r| &r.pods),
        ("storage", floor.storage, ceiling.storage, |r| &r.storage),
        ("claims", floor.claims, ceiling.claims, |r| &r.claims),
    ];
    for (what, f, c, pick) in pairs {
        if let (Some(f), Some(c)) = (f, c)
            && f > c
        {
            return Err(SharingError::FloorAboveCeiling {
                what,
                floor: shown(policy.floor.as_ref(), pick),
                ceiling: shown(policy.ceiling.as_ref(), pick),
            });
        }
    }
    Ok((floor, ceiling))
}

/// What to do with a request the policy does not cover whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AboveOffer {
    /// Grant what the policy offers.
    #[default]
    Clamp,
    /// Refuse the peering.
    Refuse,
}

/// The grant: for each resource, what was asked (or, when nothing was
/// asked, the whole offer), capped by the offer.
pub fn grant(
    request: Option<Amounts>,
    offer: Amounts,
    above: AboveOffer,
) -> Result<Amounts, SharingError> {
    let Some(request) = request else {
        return Ok(offer);
    };
    let pick = |what: &'static str, asked: u64, offered: u64, show: fn(u64) -> String| {
        if asked == 0 {
            return Ok(offered);
        }
        if asked <= offered {
            return Ok(asked);
        }
        match above {
            AboveOffer::Clamp => Ok(offered),
            AboveOffer::Refuse => Err(SharingError::AboveOffer {
                what,
                asked: show(asked),
                offered: show(offered),
            }),
        }
    };
    Ok(Amounts {
        cpu_millis: pick("cpu", request.cpu_millis, offer.cpu_millis, |m| {
            format!("{m}m")
        })?,
        memory_bytes: pick("memory", request.memory_bytes, offer.memory_bytes, |b| {
            format!("{}Mi", b >> 20)
        })?,
        pods: pick("pods", request.pods, offer.pods, |p| p.to_string())?,
        storage_bytes: pick("storage", request.storage_bytes, offer.storage_bytes, |b| {
            format_bytes(b)
        })?,
        claims: pick("claims", request.claims, offer.claims, |c| c.to_string())?,
    })
}

/// The labels every peering object of a consumer carries on a provider,
/// and of a provider on a consumer, to find them all.
pub fn peer_labels(cluster_id: &crate::ClusterId) -> BTreeMap<String, String> {
    BTreeMap::from([(
        crate::names::labels::PEER_CLUSTER_ID.to_owned(),
        cluster_id.to_string(),
    )])
}

#[cfg(test)]
mod tests {
    use super::*;

    const FREE: Amounts = Amounts {
        cpu_millis: 8000,
        memory_bytes: 16 << 30,
        pods: 220,
        storage_bytes: 100 << 30,
        claims: 220,
    };

    fn policy(cpu: &str, memory: &str, pods: &str) -> SharingPolicySpec {
        SharingPolicySpec {
            accept_new_peers: true,
            cpu: Some(Offer(cpu.into())),
            memory: Some(Offer(memory.into())),
            pods: Some(Offer(pods.into())),
            cost: None,
            floor: None,
            ceiling: None,
            following: Following::default(),
            admission: Admission::default(),
            storage: None,
            claims: None,
        }
    }

    fn resources(cpu: &str, memory: &str, pods: &str) -> Resources {
        let q = |v: &str| (!v.is_empty()).then(|| Quantity(v.to_owned()));
        Resources {
            cpu: q(cpu),
            memory: q(memory),
            pods: q(pods),
            ..Resources::default()
        }
    }

    #[test]
    fn an_offer_stays_within_its_floor_and_ceiling() {
        let free = Amounts {
            cpu_millis: 10_000,
            memory_bytes: 10 << 30,
            pods: 100,
            ..Amounts::default()
        };
        let mut p = policy("50%", "50%", "50%");
        p.floor = Some(resources("6", "", "10"));
        p.ceiling = Some(resources("", "2Gi", "20"));
        // 50% of the CPU (5) is raised to its floor, of memory (5Gi)
        // lowered to its ceiling; pods (50) are within neither, then
        // capped.
        assert_eq!(
            offered(&p, free),
            Ok(Amounts {
                cpu_millis: 6_000,
                memory_bytes: 2 << 30,
                pods: 20,
                ..Amounts::default()
            })
        );
        // Nothing free: the floor still holds.
        assert_eq!(
            offered(&p, Amounts::default()).map(|a| a.cpu_millis),
            Ok(6_000)
        );
        // Without bounds, the share alone.
        assert_eq!(
            offered(&policy("50%", "50%", "50%"), free).map(|a| a.pods),
            Ok(50)
        );
    }

    #[test]
    fn a_floor_above_its_ceiling_is_refused_and_says_which() {
        let mut p = policy("50%", "50%", "50%");
        p.floor = Some(resources("", "4Gi", ""));
        p.ceiling = Some(resources("8", "2Gi", ""));
        let e = bounds(&p).expect_err("above");
        assert_eq!(
            e.to_string(),
            "the floor of memory (4Gi) is above its ceiling (2Gi)"
        );
        assert!(offered(&p, Amounts::default()).is_err());
        // Equal is fine, and so is a bound on one side only.
        p.floor = Some(resources("", "2Gi", "5"));
        assert!(bounds(&p).is_ok());
        p.ceiling = Some(resources("one", "", ""));
        assert!(matches!(
            bounds(&p),
            Err(SharingError::BadQuantity { what: "cpu", .. })
        ));
    }

    #[test]
    fn quantities_parse_as_kubernetes_writes_them() {
        for (text, millis) in [("2", 2000), ("1.5", 1500), ("500m", 500), ("0.1", 100)] {
            assert_eq!(parse_cpu_millis(text), Some(millis), "{text}");
        }
        for (text, bytes) in [
            ("1Gi", 1 << 30),
            ("512Mi", 512 << 20),
            ("1G", 1_000_000_000),
            ("1000", 1000),
        ] {
            assert_eq!(parse_bytes(text), Some(bytes), "{text}");
        }
        for bad in ["", "x", "-1", "1Q"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
    }

    #[test]
    fn offers_are_absolute_or_a_share_of_free_capacity() {
        let offer = offered(&policy("50%", "4Gi", "10"), FREE).expect("valid");
        assert_eq!(
            offer,
            Amounts {
                cpu_millis: 4000,
                memory_bytes: 4 << 30,
                pods: 10,
                ..Amounts::default()
            }
        );
        assert!(matches!(
            offered(&policy("150%", "1Gi", "1"), FREE),
            Err(SharingError::BadOffer { what: "cpu", .. })
        ));
        assert!(offered(&policy("1", "lots", "1"), FREE).is_err());
    }

    #[test]
    fn grants_follow_the_request_within_the_offer() {
        let offer = Amounts {
            cpu_millis: 4000,
            memory_bytes: 8 << 30,
            pods: 100,
            ..Amounts::default()
        };
        // Nothing asked: the whole offer.
        assert_eq!(grant(None, offer, AboveOffer::Clamp), Ok(offer));
        // Less than offered: what was asked; unasked parts get the offer.
        let asked = Amounts {
            cpu_millis: 1000,
            memory_bytes: 0,
            pods: 10,
            ..Amounts::default()
        };
        assert_eq!(
            grant(Some(asked), offer, AboveOffer::Refuse),
            Ok(Amounts {
                cpu_millis: 1000,
                memory_bytes: 8 << 30,
                pods: 10,
                ..Amounts::default()
            })
        );
        // More than offered: clamped, or refused with what was offered.
        let greedy = Amounts {
            cpu_millis: 6000,
            memory_bytes: 1 << 30,
            pods: 1,
            ..Amounts::default()
        };
        assert_eq!(
            grant(Some(greedy), offer, AboveOffer::Clamp).map(|g| g.cpu_millis),
            Ok(4000)
        );
        let err = grant(Some(greedy), offer, AboveOffer::Refuse).expect_err("refused");
        assert_eq!(
            err.to_string(),
            "asked for 6000m cpu, the provider offers 4000m"
        );
    }

    #[test]
    fn amounts_round_trip_through_quantities() {
        let a = Amounts {
            cpu_millis: 1500,
            memory_bytes: 3 << 30,
            pods: 42,
            ..Amounts::default()
        };
        let r = a.to_resources();
        assert_eq!(r.cpu, Some(Quantity("1500m".into())));
        assert_eq!(r.memory, Some(Quantity("3072Mi".into())));
        assert_eq!(Amounts::from_resources(&r), Ok(a));
    }
}
