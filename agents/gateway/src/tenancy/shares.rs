//! On a provider: each tenant's grant, split across the namespaces it may
//! run pods in (its tenant namespace and its twins) as one ResourceQuota
//! `liqo-share` each, which the API server then enforces on its own
//! (docs/offloading.md, "The grant across twin namespaces"). The
//! arithmetic is `liqo_api::shares`; this is its IO.
//!
//! Every round reads the shares fresh from the API (a quorum list, never
//! the store, which may not have our own last write yet), decides with
//! `shares::step` and writes; a round that wrote is followed by another
//! shortly, until nothing is left to write. The stores of tenants, twins
//! and shares only say when to look. One gateway runs per cluster (its
//! Deployment is `Recreate`), so it is the only writer of the shares.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use liqo_agent_runtime::follow::{Followed, follow};
use liqo_api::authentication::Tenant;
use liqo_api::names::labels;
use liqo_api::shares::{self, Grant, Holder, QuotaState, SHARE_QUOTA};

use super::Tenants;
use crate::control;
use liqo_agent_runtime::error_chain as chain;

/// Why a round could not read or write the shares. Where the API's error
/// alone said it, it still does (`transparent`).
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    List(kube::Error),
    #[error("writing {quota} in {namespace}", quota = SHARE_QUOTA)]
    Write {
        namespace: String,
        #[source]
        error: kube::Error,
    },
    #[error("writing the Services bounds of {quota} in {namespace}", quota = SHARE_QUOTA)]
    WriteBounds {
        namespace: String,
        #[source]
        error: kube::Error,
    },
}

/// The field manager of the shares.
const MANAGER: &str = "liqo-gateway";
/// The field manager of the shares' Services bounds.
const EXPOSURE_MANAGER: &str = "liqo-gateway-exposure";
/// Changes closer together than this are looked at once.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// After a round that wrote: the next one, to go on (raise after a
/// lowering) once the quota controller has caught up.
const AGAIN: Duration = Duration::from_millis(300);
/// Without any change: a full round now and then.
const PERIOD: Duration = Duration::from_secs(30);

/// The labels of a share quota: the gateway's (the admission policy
/// `liqo-twin-share` finds a share by them) and its tenant's ID.
fn share_labels(tenant: &str) -> BTreeMap<String, String> {
    let mut l = control::our_labels();
    l.insert(labels::PEER_CLUSTER_ID.to_owned(), tenant.to_owned());
    l
}

/// The share quota of `tenant` in `namespace` bounding `hard`, as one
/// field manager applies it (the grant's parts, or the exposure bounds).
fn share_quota(namespace: &str, tenant: &str, hard: BTreeMap<String, Quantity>) -> ResourceQuota {
    ResourceQuota {
        metadata: ObjectMeta {
            name: Some(SHARE_QUOTA.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(share_labels(tenant)),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(hard),
            ..ResourceQuotaSpec::default()
        }),
        status: None,
    }
}

fn is_ours(quota: &ResourceQuota) -> bool {
    quota.metadata.labels.as_ref().is_some_and(control::is_ours)
}

/// Keeps every tenant's shares as `shares::step` says, for ever.
pub async fn keep(client: kube::Client, tenants: Tenants) {
    let (quotas, follow_quotas) = follow(
        Api::<ResourceQuota>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={SHARE_QUOTA}")),
        "shares",
    );
    let keeper = Keeper {
        client,
        tenants: tenants.tenants,
        twins: tenants.twins,
        quotas,
        failing: None,
    };
    tokio::join!(follow_quotas, keeper.run());
}

struct Keeper {
    client: kube::Client,
    tenants: Followed<Tenant>,
    twins: Followed<Namespace>,
    quotas: Followed<ResourceQuota>,
    /// The last failure, logged once until it changes.
    failing: Option<String>,
}

impl Keeper {
    async fn run(mut self) {
        let mut tenants = self.tenants.state.clone();
        let mut twins = self.twins.state.clone();
        let mut quotas = self.quotas.state.clone();
        let mut wait = PERIOD;
        loop {
            tokio::select! {
                _ = tenants.changed() => {}
                _ = twins.changed() => {}
                _ = quotas.changed() => {}
                () = tokio::time::sleep(wait) => {}
            }
            tokio::time::sleep(DEBOUNCE).await;
            if !(self.tenants.is_current() && self.twins.is_current() && self.quotas.is_current()) {
                wait = PERIOD;
                continue;
            }
            wait = match self.round().await {
                Ok(wrote) => {
                    if self.failing.take().is_some() {
                        tracing::info!("shares written again");
                    }
                    if wrote { AGAIN } else { PERIOD }
                }
                Err(error) => {
                    let text = chain(&error);
                    if self.failing.as_ref() != Some(&text) {
                        tracing::warn!(error = %text, "cannot keep the tenants' shares");
                        self.failing = Some(text);
                    }
                    AGAIN * 4
                }
            };
        }
    }

    /// One round for every tenant; whether anything was written.
    async fn round(&self) -> Result<bool, RoundError> {
        let tenants = self.tenants.store.state();
        let twins = self.twins.store.state();
        // From the stores first: a round that would write nothing costs
        // no read (most changes are admissions counted in a share).
        let stored = self.quotas.store.state();
        let stored: Vec<&ResourceQuota> = stored.iter().map(|q| &**q).collect();
        if !tenants.iter().any(|t| {
            let due = tenant_shares(t, &twins, &stored);
            !due.writes.is_empty() || !due.exposure.is_empty()
        }) {
            return Ok(false);
        }
        let fresh = Api::<ResourceQuota>::all(self.client.clone())
            .list(&ListParams::default().fields(&format!("metadata.name={SHARE_QUOTA}")))
            .await
            .map_err(RoundError::List)?
            .items;
        let fresh: Vec<&ResourceQuota> = fresh.iter().collect();
        let mut wrote = false;
        let mut failed = None;
        // One tenant's failure (its namespace not made yet) does not hold
        // back the others.
        for tenant in &tenants {
            let due = tenant_shares(tenant, &twins, &fresh);
            for write in &due.writes {
                let (namespace, existing) = &due.holders[write.holder];
                if existing.as_ref().is_some_and(|q| !is_ours(q)) {
                    tracing::warn!(%namespace, "a ResourceQuota {SHARE_QUOTA} that is not ours: left as it is");
                    continue;
                }
                let id = tenant.spec.cluster_id.to_string();
                match self.write(namespace, &id, &write.hard).await {
                    // Unpeering: the tenant namespace (or a twin) is being
                    // deleted with its share; the tenant goes next.
                    Err(error) if liqo_agent_runtime::namespace_terminating(&error) => {
                        tracing::info!(tenant = %id, %namespace, "namespace being deleted: its share goes with it");
                        break;
                    }
                    // The rest of this tenant's writes may depend on it.
                    Err(error) => {
                        failed.get_or_insert(RoundError::Write {
                            namespace: namespace.clone(),
                            error,
                        });
                        break;
                    }
                    Ok(()) => {
                        tracing::info!(
                            tenant = %id,
                            %namespace,
                            hard = ?shares::hard_quantities(&write.hard),
                            "share written"
                        );
                        wrote = true;
                    }
                }
            }
        }
        // The node ports and LoadBalancers its terms allow, beside each
        // part of the grant already written (under a manager of their own,
        // so that neither write takes the other's keys).
        for tenant in &tenants {
            let due = tenant_shares(tenant, &twins, &fresh);
            // Exposure is due only beside a grant that can be read.
            let Some(grant) = Grant::of(&tenant.spec.grant) else {
                continue;
            };
            for holder in due.exposure {
                let (namespace, _) = &due.holders[holder];
                let id = tenant.spec.cluster_id.to_string();
                let quota = share_quota(
                    namespace,
                    &id,
                    shares::exposure_hard(&tenant.spec.admission, &grant),
                );
                let written = Api::<ResourceQuota>::namespaced(self.client.clone(), namespace)
                    .patch(
                        SHARE_QUOTA,
                        &PatchParams::apply(EXPOSURE_MANAGER).force(),
                        &Patch::Apply(&quota),
                    )
                    .await;
                match written {
                    Ok(_) => wrote = true,
                    Err(error) if liqo_agent_runtime::namespace_terminating(&error) => {}
                    Err(error) => {
                        failed.get_or_insert(RoundError::WriteBounds {
                            namespace: namespace.clone(),
                            error,
                        });
                    }
                }
            }
        }
        match failed {
            Some(error) => Err(error),
            None => Ok(wrote),
        }
    }

    async fn write(
        &self,
        namespace: &str,
        tenant: &str,
        hard: &BTreeMap<shares::Counted, u64>,
    ) -> Result<(), kube::Error> {
        let quota = share_quota(namespace, tenant, shares::hard_quantities(hard));
        Api::<ResourceQuota>::namespaced(self.client.clone(), namespace)
            .patch(
                SHARE_QUOTA,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&quota),
            )
            .await?;
        Ok(())
    }
}

/// One tenant's namespaces with their share quotas, and what to write.
struct TenantShares {
    holders: Vec<(String, Option<ResourceQuota>)>,
    writes: Vec<shares::Write>,
    /// The holders whose share lacks the Services bounds of the terms.
    exposure: Vec<usize>,
}

/// The tenant namespace first, then the twins by name: the oldest, up
/// to the terms' number of namespaces. A twin being deleted keeps its
/// share (its pods are still counted) and gets no new one.
fn tenant_shares(
    tenant: &Tenant,
    twins: &[std::sync::Arc<Namespace>],
    quotas: &[&ResourceQuota],
) -> TenantShares {
    let id = tenant.spec.cluster_id.to_string();
    let grant =
        Grant::of(&tenant.spec.grant).filter(|_| tenant.meta().deletion_timestamp.is_none());
    let Some(grant) = grant else {
        return TenantShares {
            holders: Vec::new(),
            writes: Vec::new(),
            exposure: Vec::new(),
        };
    };
    let quota_in = |ns: &str| {
        quotas
            .iter()
            .find(|q| q.meta().namespace.as_deref() == Some(ns))
            .map(|q| (*q).clone())
    };
    let mut mine: Vec<&Namespace> = super::twins_of(twins, &id).collect();
    // The oldest twins, up to the terms' number, get a share; one beyond
    // it holds nothing (it keeps a share it has: a number lowered stops
    // nothing that runs).
    mine.sort_by_key(|n| (n.creation_timestamp().map(|t| t.0), n.name_any()));
    let allowed = usize::try_from(tenant.spec.admission.namespaces).unwrap_or(usize::MAX);
    let mut mine: Vec<&Namespace> = mine
        .into_iter()
        .enumerate()
        .filter(|(i, n)| *i < allowed || quota_in(&n.name_any()).is_some())
        .map(|(_, n)| n)
        .collect();
    mine.sort_by_key(|n| n.name_any());
    let mut holders = vec![(tenant.spec.namespace.clone(), false, Default::default())];
    for ns in mine {
        let deleting = ns.meta().deletion_timestamp.is_some();
        let demand = if deleting {
            Default::default()
        } else {
            shares::demand_of(ns.metadata.annotations.as_ref())
        };
        if deleting && quota_in(&ns.name_any()).is_none() {
            continue;
        }
        holders.push((ns.name_any(), true, demand));
    }
    let holders: Vec<(String, Option<ResourceQuota>, Holder)> = holders
        .into_iter()
        .map(|(ns, twin, demand)| {
            let quota = quota_in(&ns);
            let holder = Holder {
                twin,
                demand,
                quota: quota.as_ref().map(QuotaState::of),
            };
            (ns, quota, holder)
        })
        .collect();
    let states: Vec<Holder> = holders.iter().map(|(_, _, h)| h.clone()).collect();
    let writes = shares::step(&grant, &states)
        .into_iter()
        // Never into a namespace being deleted (the API refuses it).
        .filter(|w| {
            w.holder == 0
                || twins.iter().any(|n| {
                    n.name_any() == holders[w.holder].0 && n.meta().deletion_timestamp.is_none()
                })
        })
        .collect();
    let exposure = holders
        .iter()
        .enumerate()
        .filter(|(_, (_, quota, _))| {
            quota.as_ref().is_some_and(|q| {
                is_ours(q)
                    && q.meta().deletion_timestamp.is_none()
                    && shares::exposure_to_write(q, &tenant.spec.admission, &grant)
            })
        })
        .map(|(i, _)| i)
        .collect();
    TenantShares {
        holders: holders.into_iter().map(|(ns, q, _)| (ns, q)).collect(),
        writes,
        exposure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use liqo_api::authentication::TenantSpec;
    use serde_json::json;

    fn tenant(namespaces: u32) -> Tenant {
        let spec: TenantSpec = serde_json::from_value(json!({
            "clusterId": "c1", "clusterName": "c1", "namespace": "liqo-tenant-c1",
            "user": "liqo.io:peer:c1", "grant": { "pods": "10" },
            "admission": { "namespaces": namespaces },
        }))
        .expect("spec");
        Tenant::new("c1", spec)
    }

    fn twin(name: &str, age: i64) -> std::sync::Arc<Namespace> {
        let mut n = Namespace::default();
        n.metadata.name = Some(name.to_owned());
        n.metadata.labels = Some(BTreeMap::from([(
            labels::TENANT.to_owned(),
            "c1".to_owned(),
        )]));
        n.metadata.creation_timestamp = Some(Time(
            Timestamp::from_second(1_700_000_000 + age).expect("time"),
        ));
        std::sync::Arc::new(n)
    }

    fn names(due: &TenantShares) -> Vec<&str> {
        due.holders.iter().map(|(ns, _)| ns.as_str()).collect()
    }

    #[test]
    fn only_the_oldest_twins_up_to_the_terms_number_get_a_share() {
        let twins = [twin("b-new", 3), twin("a-old", 1), twin("c-mid", 2)];
        let due = tenant_shares(&tenant(2), &twins, &[]);
        assert_eq!(names(&due), ["liqo-tenant-c1", "a-old", "c-mid"]);
        assert!(
            due.writes.iter().all(|w| w.holder < 3),
            "nothing for the newest: {:?}",
            due.writes
        );
        // A twin beyond the number that holds a share keeps it.
        let mut kept = ResourceQuota::default();
        kept.metadata.name = Some(SHARE_QUOTA.to_owned());
        kept.metadata.namespace = Some("b-new".to_owned());
        let due = tenant_shares(&tenant(2), &twins, &[&kept]);
        assert_eq!(names(&due), ["liqo-tenant-c1", "a-old", "b-new", "c-mid"]);
        let due = tenant_shares(&tenant(100), &twins, &[]);
        assert_eq!(due.holders.len(), 4);
    }
}
