//! The provider's record of this cluster as its tenant (its Tenant, which
//! the tenant may read): what the provider admits from this cluster (its
//! terms, docs/offloading.md), what it grants, which follows the
//! provider's load (docs/peering.md, "A grant that follows the load"),
//! and its largest free node, which bounds what one pod may ask.
//!
//! The record is read every [`RECORD_PERIOD`]. Terms once read are never
//! loosened by a failed read: only a record read again changes them. What
//! the record says is copied into the provider's ForeignCluster
//! (`status.admission`, `status.grant`, `status.largestFreeNode` and the
//! `Granted` condition), from
//! which the node takes its capacity and `liqoctl info` its report; a
//! change of the grant is also an Event on the node. The ForeignCluster
//! is what is compared, so a restarted agent writes nothing twice.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use liqo_api::admission::Admission;
use liqo_api::authentication::Tenant;
use liqo_api::core::ForeignCluster;
use liqo_api::following;
use liqo_api::sharing::{Amounts, Resources};
use tokio::sync::watch;

use crate::provider::{ProviderClient, RETRY_PERIOD};

/// What the provider admits from this cluster, as its record of this
/// cluster as a tenant says.
#[derive(Debug, Clone, PartialEq)]
pub enum Terms {
    /// Not read yet: nothing is sent until it is.
    NotRead,
    /// The provider's terms, and the grant its policies bound limits
    /// with: twins carry its Pod Security labels, and pods it would refuse
    /// are refused here, before they are sent.
    Stated(Box<(Admission, Resources)>),
    /// The provider states none (a version without them, which refuses
    /// the read): pods are sent as they are, and it decides.
    Unstated,
}

/// How often the provider's record is read once known: a grant the
/// provider changed reaches the node within this and a write.
const RECORD_PERIOD: Duration = Duration::from_secs(5);

/// What the ForeignCluster is told of the record.
#[derive(Debug, Clone, PartialEq)]
struct Told {
    admission: Admission,
    grant: Resources,
    granted: Option<Condition>,
    largest_free_node: Option<Resources>,
}

/// Where the record is read and what it is copied into.
pub struct Record {
    pub clients: watch::Receiver<ProviderClient>,
    /// This cluster's name as the provider's tenant.
    pub tenant: liqo_api::ClusterId,
    pub local: kube::Client,
    pub foreign_cluster: String,
    pub node_name: String,
}

/// Keeps `tx` on the provider's terms, and the ForeignCluster on the
/// record, for ever.
pub async fn keep_record(
    record: Record,
    tx: watch::Sender<Terms>,
    largest_tx: watch::Sender<Option<Amounts>>,
) {
    let peers: Api<ForeignCluster> = Api::all(record.local.clone());
    let mut told: Option<Told> = None;
    loop {
        let client = record.clients.borrow().clone();
        if let Ok(client) = client {
            let api: Api<Tenant> = Api::all(client);
            let read = match api.get(record.tenant.as_str()).await {
                Ok(tenant) => Some(Ok(tenant)),
                Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 => {
                    (*tx.borrow() == Terms::NotRead).then_some(Err(Terms::Unstated))
                }
                Err(e) => {
                    tracing::debug!(error = %e, "reading the provider's record of this cluster");
                    None
                }
            };
            let terms = match &read {
                Some(Ok(tenant)) => Some(Terms::Stated(Box::new((
                    tenant.spec.admission.clone(),
                    tenant.spec.grant.clone(),
                )))),
                Some(Err(unstated)) => Some(unstated.clone()),
                None => None,
            };
            if let Some(terms) = terms {
                tx.send_if_modified(|known| {
                    let changed = *known != terms;
                    if changed {
                        tracing::info!(?terms, "what the provider admits from this cluster");
                        *known = terms;
                    }
                    changed
                });
            }
            if let Some(Ok(tenant)) = read {
                let largest_free_node = tenant
                    .status
                    .as_ref()
                    .and_then(|s| s.largest_free_node.clone());
                let largest = largest_free_node
                    .as_ref()
                    .and_then(|r| Amounts::from_resources(r).ok());
                largest_tx.send_if_modified(|known| {
                    let changed = *known != largest;
                    *known = largest;
                    changed
                });
                let now = Told {
                    admission: tenant.spec.admission.clone(),
                    grant: tenant.spec.grant.clone(),
                    granted: tenant
                        .status
                        .as_ref()
                        .and_then(|s| following::granted(&s.conditions))
                        .cloned(),
                    largest_free_node,
                };
                if told.as_ref() != Some(&now) {
                    match tell(&peers, &record, &now).await {
                        Ok(()) => told = Some(now),
                        Err(e) => tracing::debug!(error = %e, "recording the provider's record"),
                    }
                }
            }
        }
        let period = if *tx.borrow() == Terms::NotRead {
            RETRY_PERIOD
        } else {
            RECORD_PERIOD
        };
        tokio::time::sleep(period).await;
    }
}

/// Copies the record into the ForeignCluster where it says otherwise;
/// a grant that changed is an Event on the node.
async fn tell(peers: &Api<ForeignCluster>, record: &Record, now: &Told) -> Result<(), kube::Error> {
    let fc = peers.get(&record.foreign_cluster).await?;
    let status = fc.status.unwrap_or_default();
    let granted = following::granted(&status.conditions).cloned();
    let same = status.admission.as_ref() == Some(&now.admission)
        && status.grant.as_ref() == Some(&now.grant)
        && status.largest_free_node == now.largest_free_node
        // A provider that keeps no condition leaves liqoctl's.
        && (now.granted.is_none() || granted == now.granted);
    if same {
        return Ok(());
    }
    let mut patch = serde_json::json!({ "status": {
        "admission": now.admission,
        "grant": now.grant,
        "largestFreeNode": now.largest_free_node,
    }});
    if let Some(condition) = &now.granted {
        patch["status"]["conditions"] = serde_json::json!([condition]);
    }
    peers
        .patch_status(
            &record.foreign_cluster,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    let before = status.grant;
    if before.as_ref().is_some_and(|b| *b != now.grant) {
        let why = now.granted.as_ref().map(|c| c.message.clone());
        tracing::info!(grant = ?now.grant, ?before, ?why, "the provider changed the grant");
        grant_changed_event(record, &now.grant, why).await;
    }
    Ok(())
}

/// An Event on the node: its capacity follows.
async fn grant_changed_event(record: &Record, grant: &Resources, why: Option<String>) {
    let now = Timestamp::now();
    let shown = |q: &Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.as_ref().map_or("0".to_owned(), |q| q.0.clone())
    };
    let mut message = format!(
        "cluster {} now grants cpu {}, memory {}, pods {}",
        record.foreign_cluster,
        shown(&grant.cpu),
        shown(&grant.memory),
        shown(&grant.pods)
    );
    if let Some(why) = why {
        message.push_str(&format!(" ({why})"));
    }
    let node = ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Node".to_owned()),
        name: Some(record.node_name.clone()),
        ..ObjectReference::default()
    };
    let event = following::grant_changed_event(
        "default",
        node,
        "liqo-virtual-kubelet",
        &record.node_name,
        message,
        now,
    );
    let events: Api<Event> = Api::namespaced(record.local.clone(), "default");
    if let Err(error) = events.create(&PostParams::default(), &event).await {
        tracing::warn!(%error, "cannot record the grant's change as an Event");
    }
}
