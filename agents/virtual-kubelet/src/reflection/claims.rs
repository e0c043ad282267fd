//! Claims kept on the provider (docs/storage.md): for each claim of the
//! class `liqo` this node keeps ([`crate::forge::claim::keeps`]), a claim
//! of the same name in the twin, of the provider's class, and a volume
//! here that binds the consumer's claim to this node. The key is the local
//! namespace and the claim's name.
//!
//! - A claim scheduled here gets its claim in the twin, then its volume
//!   (the PersistentVolume controller binds them; the scheduler then binds
//!   the pod). A claim the provider refuses (its quota, its classes) is
//!   said with a Warning Event on the claim, and stays unbound.
//! - A claim that grows grows in the twin; once the provider's claim has
//!   the size, the volume and the claim's status say so.
//! - A claim deleted here (its volume released) deletes its claim in the
//!   twin, then its volume: the class's reclaim policy is `Delete`.
//!
//! Only claims in the twin labelled ours, from this namespace, with the
//! consumer claim's UID, are changed or deleted; only volumes labelled
//! with this node's provider.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use liqo_agent_runtime::follow::Followed;
use serde_json::json;
use tokio::sync::{Notify, watch};

use super::namespace::{PeeringContext, Twins};
use super::stores::{Clients, PerNamespace, follow_twins, keys_in_twins};
use super::{Error, Kind, Next, NotYet, ObjectKey};
use crate::forge::claim;
use crate::forge::reflected;
use crate::tenancy::Terms;

/// The most Events of a provider's claim copied onto the consumer's.
const COPIED_WARNINGS: usize = 10;
/// The field manager of what this writes on claims and volumes.
const FIELD_MANAGER: &str = "liqo-virtual-kubelet-claims";

/// The claims of this node.
#[allow(missing_debug_implementations)]
pub struct Claims {
    peering: PeeringContext,
    twins: watch::Receiver<Twins>,
    /// The consumer's claims, per offloaded namespace.
    local: Arc<PerNamespace<PersistentVolumeClaim>>,
    /// The claims in the twins (ours only).
    remote: Arc<PerNamespace<PersistentVolumeClaim>>,
    /// This node's volumes.
    volumes: Followed<PersistentVolume>,
    clients: Clients,
    /// Woken whenever a local claim changes, for the demand.
    demand_wake: Arc<Notify>,
}

/// What the claims this node keeps ask, per local namespace, for the
/// twins' demand ([`super::demand`]).
#[allow(missing_debug_implementations)]
#[derive(Clone)]
pub struct ClaimDemand {
    local: Arc<PerNamespace<PersistentVolumeClaim>>,
    volumes: Followed<PersistentVolume>,
    node_name: String,
    /// Woken whenever a local claim changes.
    pub changed: Arc<Notify>,
}

impl ClaimDemand {
    /// The storage and claims of the claims this node keeps in `local_ns`
    /// (those scheduled here and not yet kept included: the twin's share
    /// must hold them before they are made there).
    pub fn of(&self, local_ns: &str) -> liqo_api::sharing::Amounts {
        let Some(local) = self.local.current(local_ns) else {
            return liqo_api::sharing::Amounts::default();
        };
        let ours = |volume: &str| self.volumes.store.get("", volume).is_some();
        claim::demand(
            local.store.state().iter().map(|c| &**c),
            &self.node_name,
            ours,
        )
    }
}

impl Claims {
    pub fn new(
        peering: PeeringContext,
        twins: watch::Receiver<Twins>,
        volumes: Followed<PersistentVolume>,
        wake: &Arc<Notify>,
    ) -> Self {
        let demand_wake = Arc::new(Notify::new());
        let local = Arc::new(PerNamespace::new(
            "local claims",
            watcher::Config::default(),
            vec![wake.clone(), demand_wake.clone()],
        ));
        let remote = Arc::new(PerNamespace::new(
            "remote claims",
            watcher::Config::default().labels(&reflected::remote_selector()),
            vec![wake.clone()],
        ));
        let clients = Clients::new(peering.provider.clone());
        Self {
            peering,
            twins,
            local,
            remote,
            volumes,
            clients,
            demand_wake,
        }
    }

    /// What the claims this node keeps ask, for the twins' demand.
    pub fn demand(&self) -> ClaimDemand {
        ClaimDemand {
            local: self.local.clone(),
            volumes: self.volumes.clone(),
            node_name: self.peering.node_name.clone(),
            changed: self.demand_wake.clone(),
        }
    }

    fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        // Cluster-scoped: stored without a namespace.
        self.volumes.store.get("", name)
    }

    /// The classes the provider allows this cluster's claims, while its
    /// terms are read.
    fn allowed_classes(&self) -> Option<Vec<String>> {
        match &*self.peering.terms.borrow() {
            Terms::Stated(stated) => Some(stated.0.storage_classes.clone()),
            Terms::Unstated => Some(Vec::new()),
            Terms::NotRead => None,
        }
    }

    /// Says `why` once on the consumer's `claim`.
    async fn warn(&self, local: &PersistentVolumeClaim, reason: &str, why: &str) {
        let ns = local.namespace().unwrap_or_default();
        let event = claim::warning(
            local,
            reason,
            why,
            &self.peering.node_name,
            Time(Timestamp::now()),
        );
        let events: Api<Event> = Api::namespaced(self.peering.local.clone(), &ns);
        match events.create(&PostParams::default(), &event).await {
            Ok(_) => {
                tracing::warn!(claim = %local.name_any(), namespace = %ns, %reason, %why, "claim not kept");
            }
            // Said already.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(error) => tracing::warn!(%error, "saying why a claim is not kept"),
        }
    }

    /// Copies the provider's Warning Events about its claim `name` in
    /// `twin` onto the consumer's `local` claim, each once.
    async fn copy_warnings(
        &self,
        local: &PersistentVolumeClaim,
        provider: kube::Client,
        twin: &str,
        name: &str,
    ) {
        let remote_events: Api<Event> = Api::namespaced(provider, twin);
        let about = ListParams::default().fields(&format!(
            "involvedObject.kind=PersistentVolumeClaim,involvedObject.name={name},type=Warning"
        ));
        let Ok(list) = remote_events.list(&about).await else {
            return;
        };
        let ns = local.namespace().unwrap_or_default();
        let events: Api<Event> = Api::namespaced(self.peering.local.clone(), &ns);
        for remote in list.items.iter().take(COPIED_WARNINGS) {
            let copy = claim::copied_warning(local, remote, &self.peering.node_name);
            match events.create(&PostParams::default(), &copy).await {
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(error) => tracing::debug!(%error, "copying a claim's Event"),
            }
        }
    }

    /// Keeps the consumer's claim `local` in `twin`: its claim there, its
    /// volume here, its size both ways.
    async fn keep(
        &self,
        local: &PersistentVolumeClaim,
        remote: Option<&PersistentVolumeClaim>,
        twin: &str,
    ) -> Result<Next, Error> {
        let ns = local.namespace().unwrap_or_default();
        let name = local.name_any();
        let uid = local.uid().unwrap_or_default();
        let failed = |what: &'static str| {
            let claim = format!("{ns}/{name}");
            move |source| Error::Claim {
                what,
                claim,
                source,
            }
        };
        let refused = |why: String| Error::ClaimRefused {
            claim: format!("{ns}/{name}"),
            why,
        };
        let provider = self.peering.provider_client()?;
        let api: Api<PersistentVolumeClaim> = Api::namespaced(provider.clone(), twin);
        let Some(remote) = remote else {
            let Some(allowed) = self.allowed_classes() else {
                return Err(NotYet::Mirrored {
                    side: "remote",
                    kind: "storage classes",
                    namespace: ns.clone(),
                }
                .into());
            };
            let class = match claim::remote_class(local, &allowed) {
                Ok(class) => class,
                Err(why) => {
                    let why = why.to_string();
                    self.warn(local, "ProvisioningFailed", &why).await;
                    return Err(refused(why));
                }
            };
            let want = claim::remote(local, twin, &class);
            return match api.create(&PostParams::default(), &want).await {
                Ok(_) => {
                    tracing::info!(claim = %name, namespace = %ns, %twin, %class, "claim kept on the provider");
                    Ok(Next::Done)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Err(NotYet::NotOurs {
                    twin: twin.to_owned(),
                    name,
                }
                .into()),
                Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => {
                    let why = format!("the provider refuses it: {}", s.message);
                    self.warn(local, "ProvisioningFailed", &why).await;
                    Err(refused(why))
                }
                Err(source) => Err(failed("creating the provider's copy")(source)),
            };
        };
        if !claim::is_ours(remote, &ns, Some(&uid)) {
            return Err(NotYet::NotOurs {
                twin: twin.to_owned(),
                name,
            }
            .into());
        }
        // While the provider's claim waits, what the provider says of it
        // (a provisioner that fails) is said here too.
        let pending = remote.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound");
        if pending {
            self.copy_warnings(local, provider, twin, &name).await;
        }
        let asked = claim::requested(local).unwrap_or(0);
        // Grown here: grown there (a claim never shrinks).
        if asked > claim::requested(remote).unwrap_or(0) {
            let grow = json!({ "spec": { "resources": { "requests": { "storage": liqo_api::sharing::format_bytes(asked) } } } });
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&grow))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => {
                    let why = format!("the provider refuses to grow it: {}", s.message);
                    self.warn(local, "VolumeResizeFailed", &why).await;
                    return Err(refused(why));
                }
                Err(source) => return Err(failed("growing the provider's copy")(source)),
            }
        }
        // The volume here, as big as the provider says (or as asked,
        // while the provider's claim waits for its first pod).
        let volumes: Api<PersistentVolume> = Api::all(self.peering.local.clone());
        let size = claim::given(remote).unwrap_or(asked);
        let volume_name = claim::volume_name(&uid);
        let unbound = local
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .is_none_or(str::is_empty);
        match self.volume(&volume_name) {
            None if unbound => {
                let volume = claim::volume(
                    local,
                    &self.peering.node_name,
                    self.peering.provider_id.as_str(),
                    twin,
                    size,
                );
                match volumes.create(&PostParams::default(), &volume).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(source) => return Err(failed("creating the volume")(source)),
                }
            }
            None => {}
            Some(volume) => {
                let have = volume
                    .spec
                    .as_ref()
                    .and_then(|s| s.capacity.as_ref())
                    .and_then(|c| c.get("storage"))
                    .and_then(|q| liqo_api::sharing::parse_bytes(&q.0))
                    .unwrap_or(0);
                let given = claim::given(remote).unwrap_or(0);
                if given > have {
                    let grown = json!({ "spec": { "capacity": { "storage": liqo_api::sharing::format_bytes(given) } } });
                    volumes
                        .patch(&volume_name, &PatchParams::default(), &Patch::Merge(&grown))
                        .await
                        .map_err(failed("growing the volume"))?;
                }
                // The claim's status says the size once it is bound.
                let bound = local.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
                if bound && given > claim::given(local).unwrap_or(0) {
                    let status = json!({ "status": { "capacity": { "storage": liqo_api::sharing::format_bytes(given) } } });
                    Api::<PersistentVolumeClaim>::namespaced(self.peering.local.clone(), &ns)
                        .patch_status(
                            &name,
                            &PatchParams {
                                field_manager: Some(FIELD_MANAGER.to_owned()),
                                ..PatchParams::default()
                            },
                            &Patch::Merge(&status),
                        )
                        .await
                        .map_err(failed("writing the size"))?;
                }
            }
        }
        Ok(Next::Done)
    }

    /// The consumer's claim `name` of `ns` is gone: its claim in the twin
    /// goes, then its volume here.
    async fn release(
        &self,
        ns: &str,
        name: &str,
        remote: Option<&PersistentVolumeClaim>,
        twin: &str,
    ) -> Result<Next, Error> {
        let failed = |what: &'static str| {
            move |source| Error::Claim {
                what,
                claim: format!("{ns}/{name}"),
                source,
            }
        };
        if let Some(remote) = remote.filter(|r| claim::is_ours(r, ns, None)) {
            let provider = self.peering.provider_client()?;
            let api: Api<PersistentVolumeClaim> = Api::namespaced(provider, twin);
            delete(&api, name, remote.uid())
                .await
                .map_err(failed("deleting the provider's copy"))?;
            tracing::info!(claim = %name, namespace = %ns, %twin, "claim deleted on the provider");
        }
        let volumes: Api<PersistentVolume> = Api::all(self.peering.local.clone());
        for volume in self.volumes.store.state() {
            if claim::claim_of(&volume).is_some_and(|(n, c)| n == ns && c == name) {
                delete(&volumes, &volume.name_any(), volume.uid())
                    .await
                    .map_err(failed("deleting the volume"))?;
            }
        }
        Ok(Next::Done)
    }
}

impl Kind for Claims {
    type Key = ObjectKey;
    const NAME: &'static str = "claims";

    fn prepare(&self) {
        let twins = self.twins.borrow().clone();
        follow_twins(
            &self.local,
            &self.remote,
            &self.peering.local,
            &self.clients,
            &twins,
        );
    }

    fn keys(&self) -> Vec<Self::Key> {
        let twins = self.twins.borrow().clone();
        let mut keys = keys_in_twins(&self.local, &self.remote, &twins);
        // Volumes whose claims are gone from a namespace still offloaded.
        for volume in self.volumes.store.state() {
            if let Some((ns, name)) = claim::claim_of(&volume)
                && twins.contains_key(&ns)
            {
                keys.push((Arc::from(ns.as_str()), Arc::from(name.as_str())));
            }
        }
        keys.sort();
        keys.dedup();
        keys
    }

    async fn converge(&self, (ns, name): &Self::Key) -> Result<Next, Error> {
        let Some(twin) = self.twins.borrow().get(&**ns).cloned() else {
            return Ok(Next::Done);
        };
        let not_yet = |side: &'static str| NotYet::Mirrored {
            side,
            kind: "claims",
            namespace: ns.to_string(),
        };
        let local = self.local.current(ns).ok_or_else(|| not_yet("local"))?;
        let remote = self
            .remote
            .current(&twin)
            .ok_or_else(|| not_yet("remote"))?;
        if !self.volumes.is_current() {
            return Err(NotYet::Volumes.into());
        }
        let local = local.store.get(ns, name);
        let remote = remote.store.get(&twin, name);
        match local {
            Some(local) if local.metadata.deletion_timestamp.is_none() => {
                let node = self.peering.node_name.as_str();
                let ours = |volume: &str| self.volume(volume).is_some();
                if !claim::keeps(&local, node, ours) {
                    return Ok(Next::Done);
                }
                self.keep(&local, remote.as_deref(), &twin).await
            }
            // Being deleted: its pods still use it (the protection
            // finalizer); it goes once they are gone.
            Some(_) => Ok(Next::Done),
            None => self.release(ns, name, remote.as_deref(), &twin).await,
        }
    }
}

/// Deletes `name` (that very object, when its UID is known) unless gone.
async fn delete<K>(api: &Api<K>, name: &str, uid: Option<String>) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}
