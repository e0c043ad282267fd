//! The tenant phase, on the provider with its administrator's
//! credentials: the consumer's tenant namespace, rights, quota and Tenant
//! record (built by [`crate::manifests::tenant`]), the record's status, and
//! twin namespaces of earlier terms brought under the current ones.
//! Removed with whatever the consumer left there: twin namespaces, and a
//! certificate request of an interrupted run.

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use liqo_api::authentication::Tenant;
use liqo_api::following;
use liqo_api::names::{labels, peering};
use serde_json::json;

use super::{Administrator, Ends, Peering};
use crate::factory::ClusterClient;
use crate::manifests::tenant;
use crate::peering::journal::Journal;
use crate::peering::{PEER_AGAIN, refuse_foreign, terms};
use crate::show::show_resources;

pub(super) async fn apply(
    run: &Peering<'_>,
    admin: &Administrator<'_>,
    journal: &mut Journal,
) -> anyhow::Result<()> {
    let (provider, policy) = (admin.provider, admin.policy);
    let consumer_id = &run.consumer_id;
    let granted = &run.granted;
    let step = run
        .printer
        .step(format!("Creating the tenant on cluster {}", provider.name));
    let objects = tenant::manifests(
        consumer_id,
        granted.request.as_ref(),
        &granted.grant,
        granted.cost.as_ref(),
        &policy.admission,
    );
    let made = async {
        refuse_foreign(provider, &objects, PEER_AGAIN).await?;
        journal.apply_all(provider, objects).await?;
        record_grant(run, provider).await?;
        // Twins made under other terms (an earlier peering, or a policy
        // changed since) are labelled for these.
        let id = &consumer_id.cluster_id;
        if let Some(brought) = terms::bring_under(provider, id, &policy.admission).await? {
            for warning in brought.report(id, &policy.admission).1 {
                run.printer.info(warning);
            }
        }
        anyhow::Ok(())
    }
    .await;
    match made {
        Ok(()) => step.done(peering::tenant_namespace(&consumer_id.cluster_id)),
        Err(e) => {
            step.fail("");
            return Err(e);
        }
    }
    Ok(())
}

/// The provider's record says what was granted, and when.
async fn record_grant(run: &Peering<'_>, provider: &ClusterClient) -> anyhow::Result<()> {
    let tenants: Api<Tenant> = Api::all(provider.client.clone());
    let name = run.consumer_id.cluster_id.as_str();
    let condition = Condition {
        type_: following::GRANTED.to_owned(),
        status: "True".to_owned(),
        reason: following::PEERED.to_owned(),
        message: format!(
            "granted {} to cluster {}",
            show_resources(&run.granted.grant),
            run.consumer_id.cluster_name
        ),
        last_transition_time: Time(Timestamp::now()),
        observed_generation: None,
    };
    tenants
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "conditions": [condition] } })),
        )
        .await
        .map_err(|e| provider.explain(e, &format!("recording the grant in Tenant {name}")))?;
    Ok(())
}

/// Deletes the tenant's record, RBAC, quota and namespace, its twin
/// namespaces and any certificate request of it left over; waits until
/// the tenant namespace is gone.
pub(super) async fn remove(
    ends: &Ends<'_>,
    provider: &ClusterClient,
) -> anyhow::Result<Vec<String>> {
    let consumer = &ends.tenant;
    let left = super::delete_all(provider, &tenant::names_of(consumer)).await?;
    let csrs: Api<CertificateSigningRequest> = Api::all(provider.client.clone());
    let _ = csrs
        .delete(
            &super::certificate::request_name(consumer),
            &DeleteParams::default(),
        )
        .await;
    let namespaces: Api<Namespace> = Api::all(provider.client.clone());
    // Twin namespaces the consumer's virtual kubelets left (a forced
    // unpeer, an agent that never cleaned up): nobody could manage them any
    // more. Deleted, not awaited: their pods may take their grace period.
    // The consumer's agent may still be stopping meanwhile (both sides go
    // at once) and make one again before its rights are gone everywhere:
    // so they are looked for until none that is not already going is seen
    // twice in a row, a second apart (at most 10 s).
    let selector = ListParams::default().labels(&format!("{}={consumer}", labels::TENANT));
    let mut quiet = 0;
    for _ in 0..10 {
        let twins = namespaces
            .list(&selector)
            .await
            .map_err(|e| provider.explain(e, "listing the tenant's twin namespaces"))?;
        let mut live: Vec<String> = twins
            .items
            .into_iter()
            .filter(|n| n.metadata.deletion_timestamp.is_none())
            .filter_map(|n| n.metadata.name)
            .collect();
        // Twins that keep claims stay, with them (`--keep-remote-data`).
        if ends.keep_claims {
            let mut without = Vec::new();
            for name in live {
                if crate::peering::kept_claims::in_twin(provider, &name)
                    .await?
                    .is_empty()
                {
                    without.push(name);
                }
            }
            live = without;
        }
        quiet = if live.is_empty() { quiet + 1 } else { 0 };
        if quiet == 2 {
            break;
        }
        for name in live {
            match namespaces.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    return Err(provider.explain(e, &format!("deleting twin namespace {name}")));
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    let ns = peering::tenant_namespace(consumer);
    if let Some(uid) = namespaces
        .get_opt(&ns)
        .await
        .map_err(|e| provider.explain(e, "reading the tenant namespace"))?
        .and_then(|n| n.metadata.uid)
    {
        super::gone(ends, provider, namespaces, &ns, &uid).await?;
    }
    Ok(left)
}
