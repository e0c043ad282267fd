//! How a grant follows the provider's free capacity while a peering lasts
//! (docs/peering.md, "A grant that follows the load"). `liqoctl peer`
//! computes a grant once; on the provider, the gateway computes it again
//! whenever the free capacity changes, and writes it when [`next`] says
//! so. Pure: the caller reads the capacity and the tenant's use.
//!
//! - Only the resources the policy offers as shares (`50%`) move; an
//!   absolute offer never does.
//! - The free capacity a tenant's share is computed from counts what that
//!   tenant's own pods request as free: its pods do not shrink its grant.
//! - A grant never goes below what the tenant's pods already request, so
//!   a smaller grant evicts nothing: new pods wait.
//! - A change smaller than the policy's threshold is ignored, and the
//!   caller keeps the policy's least interval between two changes.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use crate::sharing::{self, AboveOffer, Amounts, Offer, SharingError, SharingPolicySpec};

/// The condition that says what was granted, when and why, on a Tenant
/// and on the consumer's ForeignCluster: set by `liqoctl peer` (reason
/// [`PEERED`]) and by the provider's gateway at each change (reason
/// [`FOLLOWED`]).
pub const GRANTED: &str = "Granted";
/// The reason of a grant set by `liqoctl peer`.
pub const PEERED: &str = "PolicyGranted";
/// The reason of a grant the gateway changed as the free capacity did.
pub const FOLLOWED: &str = "FreeCapacityChanged";

/// The [`GRANTED`] condition among `conditions`: what was granted, when
/// and why. A Tenant's says it on the provider; the consumer's virtual
/// kubelet copies it into the provider's ForeignCluster.
pub fn granted(conditions: &[Condition]) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == GRANTED)
}

/// The reason of the Event of a grant's change, on both sides.
pub const GRANT_CHANGED: &str = "GrantChanged";

/// The Event of a grant's change: of `object` (in `namespace`), reported
/// by `component` (`instance`), saying `message`, at `now`.
pub fn grant_changed_event(
    namespace: &str,
    object: ObjectReference,
    component: &str,
    instance: &str,
    message: String,
    now: Timestamp,
) -> Event {
    let name = object.name.clone().unwrap_or_default();
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}.grant-")),
            namespace: Some(namespace.to_owned()),
            labels: Some(std::collections::BTreeMap::from([(
                crate::names::labels::MANAGED_BY.to_owned(),
                crate::names::labels::MANAGED_BY_VALUE.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        involved_object: object,
        reason: Some(GRANT_CHANGED.to_owned()),
        message: Some(message),
        type_: Some("Normal".to_owned()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        action: Some("Resize".to_owned()),
        reporting_component: Some(component.to_owned()),
        reporting_instance: Some(instance.to_owned()),
        source: Some(EventSource {
            component: Some(component.to_owned()),
            host: None,
        }),
        ..Event::default()
    }
}

/// What decides a tenant's grant now.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub policy: &'a SharingPolicySpec,
    /// What the consumer asked for at peer time, if anything.
    pub request: Option<Amounts>,
    /// The grant in force (the Tenant record's).
    pub current: Amounts,
    /// The provider's free capacity, the tenant's own pods counted free.
    pub free: Amounts,
    /// What the tenant's pods request now.
    pub used: Amounts,
}

/// Whether a policy's grants follow the free capacity at all: some offer
/// is a share.
pub fn follows(policy: &SharingPolicySpec) -> bool {
    [
        &policy.cpu,
        &policy.memory,
        &policy.pods,
        &policy.storage,
        &policy.claims,
    ]
    .into_iter()
    .any(|o| o.as_ref().is_some_and(is_share))
}

fn is_share(offer: &Offer) -> bool {
    offer.0.ends_with('%')
}

/// The grant to write, if it should change: each resource offered as a
/// share is its share of `free` (within the floor and ceiling, capped by
/// the request), never below `used`; the rest stay as they are. `None`
/// when nothing moves by more than the policy's threshold.
pub fn next(inputs: Inputs<'_>) -> Result<Option<Amounts>, SharingError> {
    let Inputs {
        policy,
        request,
        current,
        free,
        used,
    } = inputs;
    if !follows(policy) {
        return Ok(None);
    }
    let offer = sharing::offered(policy, free)?;
    let wanted = sharing::grant(request, offer, AboveOffer::Clamp)?;
    let moving = |offer: &Option<Offer>, wanted: u64, used: u64, current: u64| {
        if offer.as_ref().is_some_and(is_share) {
            wanted.max(used)
        } else {
            current
        }
    };
    let target = Amounts {
        cpu_millis: moving(
            &policy.cpu,
            wanted.cpu_millis,
            used.cpu_millis,
            current.cpu_millis,
        ),
        memory_bytes: moving(
            &policy.memory,
            wanted.memory_bytes,
            used.memory_bytes,
            current.memory_bytes,
        ),
        pods: moving(&policy.pods, wanted.pods, used.pods, current.pods),
        storage_bytes: moving(
            &policy.storage,
            wanted.storage_bytes,
            used.storage_bytes,
            current.storage_bytes,
        ),
        claims: moving(&policy.claims, wanted.claims, used.claims, current.claims),
    };
    let threshold = u128::from(policy.following.threshold_percent());
    let significant = |target: u64, current: u64| {
        let (t, c) = (u128::from(target), u128::from(current));
        t != c && (c == 0 || t.abs_diff(c) * 100 > threshold * c || threshold == 0)
    };
    let changes = significant(target.cpu_millis, current.cpu_millis)
        || significant(target.memory_bytes, current.memory_bytes)
        || significant(target.pods, current.pods)
        || significant(target.storage_bytes, current.storage_bytes)
        || significant(target.claims, current.claims)
        // Below what runs: always raised, however small the step.
        || target.cpu_millis > current.cpu_millis && used.cpu_millis > current.cpu_millis
        || target.memory_bytes > current.memory_bytes && used.memory_bytes > current.memory_bytes
        || target.pods > current.pods && used.pods > current.pods
        || target.storage_bytes > current.storage_bytes
            && used.storage_bytes > current.storage_bytes
        || target.claims > current.claims && used.claims > current.claims;
    Ok(changes.then_some(target))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharing::{Following, Resources, default_policy};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    const GIB: u64 = 1 << 30;

    fn amounts(cpu: u64, memory_gib: u64, pods: u64) -> Amounts {
        Amounts {
            cpu_millis: cpu * 1000,
            memory_bytes: memory_gib * GIB,
            pods,
            ..Amounts::default()
        }
    }

    fn inputs(policy: &SharingPolicySpec, current: Amounts, free: Amounts) -> Inputs<'_> {
        Inputs {
            policy,
            request: None,
            current,
            free,
            used: Amounts::default(),
        }
    }

    #[test]
    fn a_share_follows_the_free_capacity_both_ways() {
        let policy = default_policy();
        let current = amounts(4, 8, 50);
        assert_eq!(
            next(inputs(&policy, current, amounts(16, 32, 200))),
            Ok(Some(amounts(8, 16, 100)))
        );
        assert_eq!(
            next(inputs(&policy, current, amounts(4, 8, 50))),
            Ok(Some(Amounts {
                cpu_millis: 2000,
                memory_bytes: 4 * GIB,
                pods: 25,
                ..Amounts::default()
            }))
        );
    }

    #[test]
    fn changes_below_the_threshold_are_ignored() {
        let mut policy = default_policy();
        let current = amounts(4, 8, 50);
        // 5% more of everything: under the default 10%.
        let free = Amounts {
            cpu_millis: 8400,
            memory_bytes: 16 * GIB + 16 * GIB / 20,
            pods: 105,
            ..Amounts::default()
        };
        assert_eq!(next(inputs(&policy, current, free)), Ok(None));
        policy.following = Following {
            threshold_percent: Some(2),
            min_interval_seconds: None,
        };
        assert_eq!(
            next(inputs(&policy, current, free)).map(|n| n.map(|g| g.cpu_millis)),
            Ok(Some(4200))
        );
        // Nothing at all changes: no write, even with no threshold.
        policy.following.threshold_percent = Some(0);
        assert_eq!(
            next(inputs(&policy, current, amounts(8, 16, 100))),
            Ok(None)
        );
    }

    #[test]
    fn an_absolute_offer_never_moves_and_a_mixed_one_moves_its_shares_only() {
        let mut policy = default_policy();
        policy.cpu = Some(Offer("2".into()));
        policy.memory = Some(Offer("4Gi".into()));
        policy.pods = Some(Offer("10".into()));
        assert!(!follows(&policy));
        assert_eq!(
            next(inputs(&policy, amounts(2, 4, 10), amounts(64, 128, 900))),
            Ok(None)
        );
        policy.pods = Some(Offer("50%".into()));
        assert_eq!(
            next(inputs(&policy, amounts(2, 4, 10), amounts(64, 128, 900))),
            Ok(Some(amounts(2, 4, 450)))
        );
    }

    #[test]
    fn a_grant_never_goes_below_what_the_tenant_uses() {
        let policy = default_policy();
        let mut i = inputs(&policy, amounts(4, 8, 50), amounts(2, 4, 20));
        i.used = amounts(3, 2, 12);
        // Half the free would be 1 CPU, 2Gi, 10 pods: the tenant's pods
        // request 3 CPU and are 12.
        assert_eq!(next(i), Ok(Some(amounts(3, 2, 12))));
    }

    #[test]
    fn the_request_caps_and_the_floor_and_ceiling_bound_a_followed_grant() {
        let mut policy = default_policy();
        let q = |s: &str| Some(Quantity(s.into()));
        policy.floor = Some(Resources {
            cpu: q("1"),
            memory: None,
            pods: None,
            ..Resources::default()
        });
        policy.ceiling = Some(Resources {
            cpu: None,
            memory: q("6Gi"),
            pods: None,
            ..Resources::default()
        });
        let mut i = inputs(&policy, amounts(4, 4, 50), amounts(1, 32, 400));
        i.request = Some(amounts(0, 0, 30));
        assert_eq!(next(i), Ok(Some(amounts(1, 6, 30))));
    }
}
