//! Twin namespaces: for every local NamespaceOffloading that selects this
//! provider (its cluster selector matches the virtual node's labels), the
//! twin namespace on the provider, created with the consumer's identity
//! and labelled as the provider's admission policies require, and the
//! RoleBinding `liqo-tenant` in it; this provider's entry in the
//! offloading's status; and, when the offloading is deleted or stops
//! selecting this provider, the twin's deletion (only a namespace that
//! carries our tenant label). A finalizer per provider on the offloading
//! keeps it until its twin is gone, so a restarted agent still knows what
//! to delete. Publishes the ready twins for [`super::pod`].

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use liqo_agent_runtime::follow::Followed;
use liqo_api::core::ForeignCluster;
use liqo_api::names::peering;
use liqo_api::offloading::{self, NamespaceOffloading};
use serde_json::json;
use tokio::sync::watch;

use super::{Error, Kind, Next, NotYet};
use crate::forge::{self, offloading as forge_off};
use crate::provider::ProviderClient;

/// How often a twin namespace that is being deleted is looked at again.
const DELETING_POLL: Duration = Duration::from_secs(1);
/// How often a ready twin is checked on the provider (the consumer cannot
/// watch namespaces there): one deleted by someone else comes back.
const VERIFY_PERIOD: Duration = Duration::from_secs(30);

/// How often an offloaded namespace where this agent has no rights is
/// looked at again.
const UNBOUND_POLL: Duration = Duration::from_secs(3);
/// The status reason of an offloaded namespace where this agent has no
/// rights (its RoleBinding there is missing).
const AGENT_NOT_BOUND: &str = "AgentNotBound";

/// The local namespaces whose twin on this provider is ready, and the
/// twin's name.
pub type Twins = BTreeMap<String, String>;

/// What every kind needs to know about this peering: both clusters'
/// clients and identities, the tunnel's remap and the provider's terms.
#[allow(missing_debug_implementations)] // kube::Client is not Debug.
#[derive(Clone)]
pub struct PeeringContext {
    pub local: kube::Client,
    pub provider: watch::Receiver<ProviderClient>,
    pub provider_id: liqo_api::ClusterId,
    pub consumer: liqo_api::ClusterIdentity,
    pub node_name: String,
    /// The tunnel to the provider (its Connection here), when followed.
    pub tunnel: Option<Followed<liqo_api::networking::Connection>>,
    /// Where the provider sees this cluster's pods, when elsewhere than
    /// at their own addresses (from the provider's end of the tunnel).
    pub seen_there: watch::Receiver<Option<liqo_api::networking::Remap>>,
    /// What the provider admits from this cluster.
    pub terms: watch::Receiver<crate::tenancy::Terms>,
    /// How long a pod may wait unschedulable on the provider before it is
    /// failed here (`--unschedulable-timeout`).
    pub unschedulable_timeout: std::time::Duration,
    /// The provider's largest free node, once its record says it.
    pub largest_free_node: watch::Receiver<Option<liqo_api::sharing::Amounts>>,
}

impl PeeringContext {
    /// Where this cluster sees the provider's pods, when elsewhere than at
    /// their own addresses (overlapping pod CIDRs, docs/network.md).
    pub fn remap(&self) -> Option<liqo_api::networking::Remap> {
        let tunnel = self.tunnel.as_ref()?;
        let found = tunnel.store.state().into_iter().next()?;
        liqo_api::networking::Remap::of(&found)
    }

    /// Why no node of the provider can hold `pod`, if none can: it asks
    /// more than the provider's largest free node.
    pub fn unplaceable(&self, pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
        let largest = (*self.largest_free_node.borrow())?;
        liqo_api::capacity::unplaceable(pod, largest, self.provider_id.as_str())
    }

    /// The provider's terms, once read: `None` when it states none.
    pub fn admission(&self) -> Result<Option<liqo_api::admission::Admission>, Error> {
        match &*self.terms.borrow() {
            crate::tenancy::Terms::NotRead => Err(NotYet::ProviderTerms.into()),
            crate::tenancy::Terms::Stated(stated) => Ok(Some(stated.0.clone())),
            crate::tenancy::Terms::Unstated => Ok(None),
        }
    }

    /// The grant, as the provider's record last said it (nothing bounded
    /// while it was not read).
    pub fn grant(&self) -> liqo_api::sharing::Resources {
        match &*self.terms.borrow() {
            crate::tenancy::Terms::Stated(stated) => stated.1.clone(),
            _ => liqo_api::sharing::Resources::default(),
        }
    }

    pub fn provider_client(&self) -> Result<kube::Client, Error> {
        self.provider
            .borrow()
            .clone()
            .map_err(|why| NotYet::ProviderClient(why).into())
    }
}

/// A ready twin as last checked: its name, the offloading's generation
/// then, and when.
pub type Verified = (String, Option<i64>, tokio::time::Instant);

#[allow(missing_debug_implementations)]
pub struct TwinNamespaces {
    pub peering: PeeringContext,
    pub offloadings: Followed<NamespaceOffloading>,
    pub peers: Followed<ForeignCluster>,
    pub fc_ref: ObjectRef<ForeignCluster>,
    pub twins: watch::Sender<Twins>,
    /// Set once every offloading has been looked at with a current store:
    /// until then, a namespace without a known twin may still have one.
    pub synced: watch::Sender<bool>,
    pub passed_once: std::sync::atomic::AtomicBool,
    /// When each ready twin (local namespace → twin, offloading
    /// generation) was last checked on the provider: a cache, not state;
    /// a restarted agent checks each once.
    pub verified: Mutex<BTreeMap<String, Verified>>,
}

impl TwinNamespaces {
    fn set_twin(&self, local_ns: &str, twin: Option<&str>) {
        self.twins.send_if_modified(|t| match twin {
            Some(twin) if t.get(local_ns).map(String::as_str) != Some(twin) => {
                t.insert(local_ns.to_owned(), twin.to_owned());
                true
            }
            None => t.remove(local_ns).is_some(),
            Some(_) => false,
        });
    }

    fn forget(&self, local_ns: &str) {
        if let Ok(mut v) = self.verified.lock() {
            v.remove(local_ns);
        }
    }

    /// Writes this provider's entry (or removes it, for `None`) when the
    /// status does not already say so. The whole list is written with
    /// the resourceVersion it was read at, so that two providers' agents
    /// never overwrite each other's entries (a conflict is retried).
    async fn write_status(
        &self,
        off: &NamespaceOffloading,
        entry: Option<offloading::ClusterOffloadingStatus>,
    ) -> Result<(), Error> {
        let have = off
            .status
            .as_ref()
            .map(|s| s.clusters.clone())
            .unwrap_or_default();
        let want = forge_off::with_entry(&have, &self.peering.provider_id, entry);
        if want == have {
            return Ok(());
        }
        let api: Api<NamespaceOffloading> = Api::namespaced(
            self.peering.local.clone(),
            &off.namespace().unwrap_or_default(),
        );
        let patch = json!({
            "metadata": { "resourceVersion": off.resource_version() },
            "status": { "clusters": want },
        });
        api.patch_status(
            &off.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(Error::WriteOffloadingStatus)?;
        Ok(())
    }

    /// Adds or removes this provider's finalizer on the offloading.
    async fn set_finalizer(&self, off: &NamespaceOffloading, present: bool) -> Result<(), Error> {
        let ours = forge_off::finalizer(&self.peering.provider_id);
        let mut finalizers = off.finalizers().to_vec();
        let has = finalizers.contains(&ours);
        if has == present {
            return Ok(());
        }
        if present {
            finalizers.push(ours);
        } else {
            finalizers.retain(|f| *f != ours);
        }
        let api: Api<NamespaceOffloading> = Api::namespaced(
            self.peering.local.clone(),
            &off.namespace().unwrap_or_default(),
        );
        // With the resourceVersion read: another provider's agent may be
        // changing the same list.
        let patch = json!({
            "metadata": { "resourceVersion": off.resource_version(), "finalizers": finalizers },
        });
        api.patch(
            &off.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(Error::UpdateOffloadingFinalizers)?;
        Ok(())
    }

    /// Whether this agent may read what it reflects from `local_ns` here:
    /// its rights there come from the RoleBinding `liqoctl offload` makes
    /// in each offloaded namespace (an offloading applied by hand has
    /// none). `Err((reason, message))` when it may not, which the status
    /// reports with what to do.
    async fn local_rights(
        &self,
        local_ns: &str,
    ) -> Result<Result<(), (&'static str, String)>, Error> {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(local_ns.to_owned()),
                    verb: Some("list".to_owned()),
                    resource: Some("secrets".to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let answer = Api::<SelfSubjectAccessReview>::all(self.peering.local.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|source| Error::ReviewRights {
                namespace: local_ns.to_owned(),
                source,
            })?;
        if answer.status.is_some_and(|s| s.allowed) {
            return Ok(Ok(()));
        }
        Ok(Err((
            AGENT_NOT_BOUND,
            format!(
                "the virtual kubelet may not read namespace {local_ns} on this cluster \
                 (no RoleBinding {} there); run `liqoctl offload namespace {local_ns}`",
                peering::virtual_kubelet(&self.peering.provider_id)
            ),
        )))
    }

    /// Makes the twin and its RoleBinding exist; `Err((reason, message))`
    /// when the provider says it cannot be (it is someone else's, or
    /// refused), which the status reports.
    async fn ensure_twin(
        &self,
        provider: &kube::Client,
        local_ns: &str,
        twin: &str,
    ) -> Result<Result<(), (&'static str, String)>, Error> {
        let consumer = &self.peering.consumer.cluster_id;
        let namespaces: Api<Namespace> = Api::all(provider.clone());
        let existing = match namespaces.get_opt(twin).await {
            Err(kube::Error::Api(s)) if s.code == 403 => {
                return Ok(Err(("Forbidden", s.message)));
            }
            other => other.map_err(|source| Error::ReadTwin {
                twin: twin.to_owned(),
                source,
            })?,
        };
        match existing {
            Some(ns) if !forge_off::is_our_twin(&ns, consumer, local_ns) => {
                return Ok(Err((
                    "AlreadyExists",
                    format!(
                        "the provider already has a namespace {twin} that is not this cluster's twin of {local_ns}"
                    ),
                )));
            }
            Some(ns) if ns.metadata.deletion_timestamp.is_some() => {
                return Err(NotYet::TwinDeleting(twin.to_owned()).into());
            }
            Some(_) => {}
            None => {
                let admission = self.peering.admission()?;
                let ns = forge_off::twin_namespace(twin, consumer, local_ns, admission.as_ref());
                match namespaces.create(&PostParams::default(), &ns).await {
                    Ok(_) => tracing::info!(%local_ns, %twin, "twin namespace created"),
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => {
                        return Ok(Err(("Forbidden", s.message)));
                    }
                    Err(e) => {
                        return Err(Error::CreateTwin {
                            twin: twin.to_owned(),
                            source: e,
                        });
                    }
                }
            }
        }
        let bindings: Api<RoleBinding> = Api::namespaced(provider.clone(), twin);
        let rb = forge_off::tenant_role_binding(twin, consumer);
        match bindings.create(&PostParams::default(), &rb).await {
            Ok(_) => Ok(Ok(())),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Ok(())),
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => {
                Ok(Err(("Forbidden", s.message)))
            }
            Err(e) => Err(Error::BindTwin {
                binding: peering::TWIN_ROLE_BINDING,
                twin: twin.to_owned(),
                source: e,
            }),
        }
    }

    /// Empties our twin of everything the consumer put there but the
    /// claims it keeps (docs/storage.md, "Nothing lost by surprise"), and
    /// leaves it for a later offload to find; `false` when it holds no
    /// claim of ours (it is deleted as usual).
    async fn empty_twin_keeping_claims(
        &self,
        provider: &kube::Client,
        local_ns: &str,
        twin: &str,
    ) -> Result<bool, Error> {
        use k8s_openapi::api::apps::v1::ReplicaSet;
        use k8s_openapi::api::batch::v1::Job;
        use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        use kube::api::ListParams;

        let failed = |source| Error::DeleteTwin {
            twin: twin.to_owned(),
            source,
        };
        // A twin already going (or gone, or not ours) is deleted as usual.
        let namespaces: Api<Namespace> = Api::all(provider.clone());
        match namespaces.get_opt(twin).await {
            Ok(Some(ns))
                if ns.metadata.deletion_timestamp.is_none()
                    && forge_off::is_our_twin(&ns, &self.peering.consumer.cluster_id, local_ns) => {
            }
            Ok(_) => return Ok(false),
            Err(source) => {
                return Err(Error::ReadTwin {
                    twin: twin.to_owned(),
                    source,
                });
            }
        }
        let ours = ListParams::default().labels(&crate::forge::reflected::remote_selector());
        let claims = Api::<PersistentVolumeClaim>::namespaced(provider.clone(), twin)
            .list(&ours)
            .await
            .map_err(failed)?;
        if claims.items.is_empty() {
            return Ok(false);
        }
        let everything = ListParams::default();
        let of_ours = ListParams::default().labels(&format!(
            "{}={}",
            liqo_api::names::labels::MANAGED_BY,
            liqo_api::names::labels::MANAGED_BY_VALUE
        ));
        let params = DeleteParams::background();
        // The workloads first, then what they used.
        Api::<ReplicaSet>::namespaced(provider.clone(), twin)
            .delete_collection(&params, &everything)
            .await
            .map_err(failed)?;
        Api::<Job>::namespaced(provider.clone(), twin)
            .delete_collection(&params, &everything)
            .await
            .map_err(failed)?;
        Api::<Pod>::namespaced(provider.clone(), twin)
            .delete_collection(&params, &everything)
            .await
            .map_err(failed)?;
        Api::<Service>::namespaced(provider.clone(), twin)
            .delete_collection(&params, &of_ours)
            .await
            .map_err(failed)?;
        Api::<EndpointSlice>::namespaced(provider.clone(), twin)
            .delete_collection(&params, &of_ours)
            .await
            .map_err(failed)?;
        Api::<ConfigMap>::namespaced(provider.clone(), twin)
            .delete_collection(&params, &of_ours)
            .await
            .map_err(failed)?;
        Api::<Secret>::namespaced(provider.clone(), twin)
            .delete_collection(&params, &of_ours)
            .await
            .map_err(failed)?;
        tracing::info!(%local_ns, %twin, claims = claims.items.len(), "twin namespace emptied, its claims kept");
        Ok(true)
    }

    /// Deletes our twin; `true` once it is gone (or is not ours).
    async fn delete_twin(
        &self,
        provider: &kube::Client,
        local_ns: &str,
        twin: &str,
    ) -> Result<bool, Error> {
        let namespaces: Api<Namespace> = Api::all(provider.clone());
        let existing = namespaces
            .get_opt(twin)
            .await
            .map_err(|source| Error::ReadTwin {
                twin: twin.to_owned(),
                source,
            })?;
        match existing {
            None => Ok(true),
            // Never someone else's, whatever the status says.
            Some(ns)
                if !forge_off::is_our_twin(&ns, &self.peering.consumer.cluster_id, local_ns) =>
            {
                Ok(true)
            }
            Some(ns) if ns.metadata.deletion_timestamp.is_some() => Ok(false),
            Some(_) => {
                match namespaces.delete(twin, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => {
                        return Err(Error::DeleteTwin {
                            twin: twin.to_owned(),
                            source: e,
                        });
                    }
                }
                tracing::info!(%local_ns, %twin, "twin namespace deleted");
                Ok(false)
            }
        }
    }
}

impl Kind for TwinNamespaces {
    /// The offloading's namespace and name.
    type Key = (String, String);
    const NAME: &'static str = "twin namespace";

    fn keys(&self) -> Vec<Self::Key> {
        let keys: Vec<_> = self
            .offloadings
            .store
            .state()
            .iter()
            .map(|o| (o.namespace().unwrap_or_default(), o.name_any()))
            .collect();
        // Twins of offloadings that are gone from the store (deleted with
        // our finalizer removed) are not ready any more.
        if self.offloadings.is_current() {
            // The second pass with a current store starts after every key
            // of the first has converged once.
            if self
                .passed_once
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                self.synced
                    .send_if_modified(|s| !std::mem::replace(s, true));
            }
            let present: Vec<_> = keys.iter().map(|(ns, _)| ns.clone()).collect();
            self.twins.send_if_modified(|t| {
                let before = t.len();
                t.retain(|ns, _| present.contains(ns));
                before != t.len()
            });
        }
        keys
    }

    async fn converge(&self, (ns, name): &Self::Key) -> Result<Next, Error> {
        let Some(off) = self.offloadings.store.get(ns, name) else {
            return Ok(Next::Done);
        };
        let local_ns = off.namespace().unwrap_or_default();
        let fc = self
            .peers
            .store
            .get("", &self.fc_ref.name)
            .ok_or_else(|| NotYet::ForeignCluster(self.fc_ref.name.clone()))?;
        let node_labels = forge::node_labels(&self.peering.node_name, &fc);
        let wanted =
            off.meta().deletion_timestamp.is_none() && offloading::selects(&off.spec, &node_labels);
        let provider_id = &self.peering.provider_id;
        let entry = off
            .status
            .as_ref()
            .and_then(|s| s.clusters.iter().find(|c| c.cluster_id == *provider_id));
        // The name we created stays the twin's, even if the spec's mapping
        // changed since: the old twin is what must be found again.
        let twin = entry.map_or_else(
            || {
                offloading::remote_namespace(
                    &local_ns,
                    &off.spec,
                    &self.peering.consumer.cluster_name,
                )
            },
            |e| e.remote_namespace.clone(),
        );
        let has_finalizer = off
            .finalizers()
            .contains(&forge_off::finalizer(provider_id));

        if !wanted {
            self.set_twin(&local_ns, None);
            self.forget(&local_ns);
            if !has_finalizer {
                // Never ours, or already cleaned: only a stale entry.
                if entry.is_some() && off.meta().deletion_timestamp.is_none() {
                    self.write_status(&off, None).await?;
                }
                return Ok(Next::Done);
            }
            let provider = self.peering.provider_client()?;
            let keep = off.meta().deletion_timestamp.is_some()
                && off
                    .annotations()
                    .get(liqo_api::names::KEEP_REMOTE_DATA_ANNOTATION)
                    .is_some_and(|v| v == "true");
            let kept = keep
                && self
                    .empty_twin_keeping_claims(&provider, &local_ns, &twin)
                    .await?;
            if !kept && !self.delete_twin(&provider, &local_ns, &twin).await? {
                return Ok(Next::After(DELETING_POLL));
            }
            if off.meta().deletion_timestamp.is_none() {
                self.write_status(&off, None).await?;
                // The status write changed the resourceVersion: the
                // finalizer goes on the next pass, with the new one.
                return Ok(Next::After(Duration::ZERO));
            }
            self.set_finalizer(&off, false).await?;
            return Ok(Next::Done);
        }

        // The finalizer first: a twin must never exist that a restarted
        // agent would not know to delete.
        if !has_finalizer {
            self.set_finalizer(&off, true).await?;
            return Ok(Next::Done);
        }
        let generation = off.meta().generation;
        let fresh = self.verified.lock().ok().is_some_and(|v| {
            v.get(&local_ns).is_some_and(|(t, g, at)| {
                *t == twin && *g == generation && at.elapsed() < VERIFY_PERIOD
            })
        });
        if fresh && entry.is_some_and(|e| e.ready) {
            self.set_twin(&local_ns, Some(&twin));
            return Ok(Next::Done);
        }
        let provider = self.peering.provider_client()?;
        let outcome = match self.local_rights(&local_ns).await? {
            Ok(()) => self.ensure_twin(&provider, &local_ns, &twin).await?,
            Err(why) => Err(why),
        };
        let ready = outcome.is_ok();
        let unbound = matches!(outcome, Err((AGENT_NOT_BOUND, _)));
        let entry = forge_off::status_entry(provider_id, &twin, outcome);
        self.write_status(&off, Some(entry)).await?;
        if ready {
            self.set_twin(&local_ns, Some(&twin));
            if let Ok(mut v) = self.verified.lock() {
                v.insert(local_ns, (twin, generation, tokio::time::Instant::now()));
            }
            Ok(Next::Done)
        } else {
            self.set_twin(&local_ns, None);
            // Refused: the provider may change its mind (a clashing
            // namespace deleted), so look again now and then; soon when
            // the binding here is what is missing (`liqoctl offload` is
            // likely under way).
            Ok(Next::After(if unbound {
                UNBOUND_POLL
            } else {
                VERIFY_PERIOD
            }))
        }
    }
}
