//! One pod's convergence: the orphans of a pod that is gone deleted, a
//! pod being deleted deleted on the provider with its grace period (and
//! then removed locally, as a kubelet does), a new pod checked (refused,
//! or held back for its references) and made on the provider, and a
//! wrapper changed by someone else put back ([`super::put_back`]); the
//! status comes back with [`super::status`].

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams, Preconditions, PropagationPolicy};
use kube::{Resource, ResourceExt};

use super::Pods;
use super::remote::{Found, TwinStores};
use super::stored::{LocalPod, RemotePod};
use crate::forge::pod::{self as forge_pod, Wrapper};
use crate::node::FIELD_MANAGER;
use crate::reflection::nameserver::Nameserver;
use crate::reflection::{Error, Next, NotYet, ObjectKey};

/// How soon a pod that waits for the twins to be known is looked at again.
const NOT_SYNCED_POLL: Duration = Duration::from_millis(500);

/// Where one pod stands on the provider, as the stores have it: what
/// [`Pods::converge_pod`] decides from.
struct Sides {
    twin: String,
    twin_stores: Arc<TwinStores>,
    provider: kube::Client,
    pod_api: Api<Pod>,
    /// The wrappers named for a local pod of this name.
    wrappers: Vec<Found>,
    /// The remote pods of this local pod.
    remote_pods: Vec<Arc<RemotePod>>,
    /// Remote pods named for a local pod of this name that is gone, or an
    /// older one of the same name.
    stale: Vec<Arc<RemotePod>>,
    local_uid: Option<String>,
}

/// What is to be done for one pod, each state converged by a method of
/// its own.
enum State {
    /// What a local pod that is gone (or an older one) left remotely.
    Orphans,
    /// No local pod, nothing of it remotely.
    Gone,
    /// The local pod is being deleted: its remote objects go, then it.
    Deleting(Arc<LocalPod>),
    /// The pod was given up on here: what was sent goes.
    GivenUp,
    /// No wrapper yet: the pod is checked and made on the provider.
    Unmade(Arc<LocalPod>),
    /// Its wrapper exists: it is kept as made and its status comes back.
    Made(Arc<LocalPod>),
}

impl Sides {
    fn state(&self, local: Option<Arc<LocalPod>>) -> State {
        let orphans = self.wrappers.iter().any(|w| w.for_pod != self.local_uid);
        if orphans || !self.stale.is_empty() {
            return State::Orphans;
        }
        let Some(pod) = local else {
            return State::Gone;
        };
        if pod.deleting() {
            State::Deleting(pod)
        } else if forge_pod::given_up(pod.reason.as_deref()) {
            State::GivenUp
        } else if self.wrappers.is_empty() {
            State::Unmade(pod)
        } else {
            State::Made(pod)
        }
    }
}

impl Pods {
    /// Makes the pod at `key` (its namespace and name) as it should be on
    /// both sides: [`crate::reflection::Kind::converge`] for pods.
    pub(super) async fn converge_pod(&self, key: &ObjectKey) -> Result<Next, Error> {
        let (ns, name) = key;
        // A local pod missing from a store still being listed (after a
        // start, or a failed watch) is not a pod that is gone: its wrapper
        // would be taken for an orphan and deleted.
        if !self.local.is_current() {
            return Err(NotYet::LocalPods.into());
        }
        let local = self.local.store.get(ns, name);
        let Some(twin) = self.twin_of(ns) else {
            return self.without_twin(local.as_deref()).await;
        };
        let twin_stores = self
            .twin_stores(&twin)
            .filter(|s| s.is_current())
            .ok_or_else(|| NotYet::RemotePods(twin.clone()))?;
        let provider = self.peering.provider_client()?;
        let local_uid = local.as_ref().and_then(|p| p.uid());
        // The remote pods named for a local pod of this name: of this one,
        // or of one that is gone (or an older one of the same name).
        let (remote_pods, stale) = twin_stores
            .pods_named_for(&twin, name)
            .into_iter()
            .partition(|p| local_uid.is_some() && p.id.for_pod() == local_uid);
        let sides = Sides {
            pod_api: Api::namespaced(provider.clone(), &twin),
            wrappers: twin_stores.wrappers(&twin, name),
            twin,
            twin_stores,
            provider,
            remote_pods,
            stale,
            local_uid,
        };
        match sides.state(local) {
            State::Orphans => self.remove_orphans(key, &sides).await,
            State::Gone => {
                self.made.seen(key);
                Ok(Next::Done)
            }
            State::Deleting(pod) => self.delete_everywhere(&sides, &pod).await,
            State::GivenUp => self.take_back(name, &sides).await,
            State::Unmade(pod) => self.make(key, &sides, &pod).await,
            State::Made(pod) => self.keep_made(key, &sides, &pod).await,
        }
    }

    /// No ready twin: nothing of this pod can exist remotely that the
    /// twin's deletion does not take. A local pod being deleted has
    /// nothing to wait for.
    async fn without_twin(&self, local: Option<&LocalPod>) -> Result<Next, Error> {
        let Some(pod) = local.filter(|p| p.deleting()) else {
            return Ok(Next::Done);
        };
        // Unless the twins are not known yet (a restart): the pod may
        // still run remotely, and its grace is to be honoured.
        if !*self.synced.borrow() {
            return Ok(Next::After(NOT_SYNCED_POLL));
        }
        self.delete_local(pod).await
    }

    /// A wrapper of a pod that is gone (or of an older pod of that name)
    /// goes, its pod with it; so does a pod made before its wrapper
    /// ([`forge_pod::first_pod`]) whose local pod went first.
    async fn remove_orphans(&self, key: &ObjectKey, sides: &Sides) -> Result<Next, Error> {
        let (ns, name) = key;
        let Sides { twin, provider, .. } = sides;
        for w in sides
            .wrappers
            .iter()
            .filter(|w| w.for_pod != sides.local_uid && !w.deleting)
        {
            let params = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                preconditions: Some(Preconditions {
                    uid: w.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            delete_wrapper(provider, twin, w.kind, name, &params).await?;
            tracing::info!(pod = %name, namespace = %ns, kind = ?w.kind, "orphan remote wrapper deleted");
        }
        for p in sides.stale.iter().filter(|p| !p.id.deleting) {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: p.id.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match sides.pod_api.delete(&p.id.name, &params).await {
                Ok(_) => {
                    tracing::info!(pod = %name, namespace = %ns, remote = %p.id.name, "orphan remote pod deleted");
                }
                // Gone already, or taken by its wrapper's deletion.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => {
                    return Err(Error::DeleteOrphanPod {
                        twin: twin.clone(),
                        name: p.id.name.to_string(),
                        source: e,
                    });
                }
            }
        }
        Ok(Next::Done)
    }

    /// The local pod is being deleted: its wrappers and pods are deleted
    /// on the provider with its grace period, and once they are gone, it
    /// is removed here, as a kubelet does.
    async fn delete_everywhere(&self, sides: &Sides, pod: &LocalPod) -> Result<Next, Error> {
        let grace = pod.grace();
        let params = DeleteParams {
            grace_period_seconds: grace.and_then(|g| u32::try_from(g).ok()),
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        let name = pod.name_any();
        for w in sides.wrappers.iter().filter(|w| !w.deleting) {
            delete_wrapper(&sides.provider, &sides.twin, w.kind, &name, &params).await?;
        }
        // The pods directly too, so that they get the local grace period
        // rather than their spec's.
        for p in sides.remote_pods.iter().filter(|p| !p.id.deleting) {
            delete_remote(&sides.pod_api, "pod", &p.id.name, &params).await?;
        }
        if sides.wrappers.is_empty() && sides.remote_pods.is_empty() {
            return self.delete_local(pod).await;
        }
        Ok(Next::Done)
    }

    /// What was sent before the pod was given up on goes (a refused pod
    /// sent nothing).
    async fn take_back(&self, name: &str, sides: &Sides) -> Result<Next, Error> {
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        for w in sides
            .wrappers
            .iter()
            .filter(|w| !w.deleting && w.for_pod == sides.local_uid)
        {
            delete_wrapper(&sides.provider, &sides.twin, w.kind, name, &params).await?;
        }
        for p in sides.remote_pods.iter().filter(|p| !p.id.deleting) {
            delete_remote(&sides.pod_api, "pod", &p.id.name, &params).await?;
        }
        Ok(Next::Done)
    }

    /// No wrapper yet: the pod is checked (refused, or held back for its
    /// references) and made on the provider, its pod first and then the
    /// ReplicaSet that adopts it, or its Job.
    async fn make(&self, key: &ObjectKey, sides: &Sides, pod: &LocalPod) -> Result<Next, Error> {
        let (ns, name) = key;
        let Sides {
            twin,
            twin_stores,
            provider,
            pod_api,
            remote_pods,
            local_uid,
            ..
        } = sides;
        // A pod that ended never runs again, even if its Job was deleted
        // by someone else.
        if pod.ended() {
            return Ok(Next::Done);
        }
        // A pod made before its ReplicaSet: what it says first (the user
        // waits for it), then the ReplicaSet (below).
        self.bring_back_status(pod, twin_stores, provider, remote_pods)
            .await?;
        if let Some(left) = self.made.waiting(key, local_uid) {
            return Ok(Next::After(left));
        }
        // The wrapper is made from the pod as the API has it (the store
        // keeps it whole only while it is pending).
        let Some(pod) = self.whole(pod).await? else {
            return Ok(Next::Done);
        };
        if let Some(why) = pod.spec.as_ref().and_then(forge_pod::refusal) {
            return self.refuse(&pod, &why).await;
        }
        // What the provider would refuse is refused here, with its
        // reason on the pod, rather than sent to fail there.
        let terms = self.peering.admission()?;
        let grant = self.peering.grant();
        if let Some(why) = terms
            .as_ref()
            .and_then(|t| forge_pod::terms_refusal(&pod, t, &grant))
        {
            return self.refuse(&pod, &why).await;
        }
        // What no node of the provider has room for would wait there
        // for ever while this cluster takes it for placed.
        if let Some(why) = self.peering.unplaceable(&pod) {
            return self.refuse(&pod, &why).await;
        }
        // A missing ConfigMap or Secret it needs: it waits, as on a
        // kubelet.
        if let Some(references) = &self.references
            && let Some(next) = references.hold(&pod).await?
        {
            return Ok(next);
        }
        let kind = pod
            .spec
            .as_ref()
            .map_or(Wrapper::ReplicaSet, forge_pod::wrapper);
        let token = |remote: Option<&mut PodSpec>| self.mount_token(&pod, name, remote);
        // Whether what is made is the wrapper (not the pod made first).
        let mut wrapper_made = true;
        let created = match kind {
            Wrapper::ReplicaSet => {
                let mut want = forge_pod::replica_set(&pod, twin, terms.as_ref());
                token(template_spec(&mut want));
                self.resolve_names(&pod, template_spec(&mut want))?;
                // Its pod first, then the ReplicaSet once the pod is
                // seen: the ReplicaSet adopts the pod it finds.
                if remote_pods.is_empty()
                    && let Some(first) = forge_pod::first_pod(&want)
                {
                    wrapper_made = false;
                    pod_api
                        .create(&PostParams::default(), &first)
                        .await
                        .map(|_| ())
                } else {
                    let api: Api<ReplicaSet> = Api::namespaced(provider.clone(), twin);
                    api.create(&PostParams::default(), &want).await.map(|_| ())
                }
            }
            Wrapper::Job => {
                let mut want = forge_pod::job(&pod, twin, terms.as_ref());
                token(want.spec.as_mut().and_then(|s| s.template.spec.as_mut()));
                self.resolve_names(
                    &pod,
                    want.spec.as_mut().and_then(|s| s.template.spec.as_mut()),
                )?;
                let api: Api<Job> = Api::namespaced(provider.clone(), twin);
                api.create(&PostParams::default(), &want).await.map(|_| ())
            }
        };
        match created {
            Ok(()) if wrapper_made => {
                self.made.made(key, local_uid.clone());
                tracing::debug!(pod = %name, namespace = %ns, ?kind, "remote wrapper created");
            }
            Ok(()) => tracing::debug!(pod = %name, namespace = %ns, "remote pod created"),
            // Created by our previous pass, not yet in the store.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => {
                return Err(Error::CreateWrapper {
                    kind,
                    twin: twin.clone(),
                    name: name.to_string(),
                    source: e,
                });
            }
        }
        Ok(Next::Done)
    }

    /// Its wrapper is made: the wrapper is put back if someone else
    /// changed it, the status comes back, and a pod the provider cannot
    /// place is given up on in time.
    async fn keep_made(
        &self,
        key: &ObjectKey,
        sides: &Sides,
        pod: &Arc<LocalPod>,
    ) -> Result<Next, Error> {
        let (ns, name) = key;
        self.made.seen(key);
        // Nothing more is made from the pod whole (what is put back is read
        // from the API), so the store keeps it no longer, though the pod
        // may wait on the provider for a while (a scale-up of 10,000 pods
        // held thousands of them).
        if let Some(settled) = pod.without_whole() {
            self.local.store.settle(ns, name, pod, settled);
        }
        // A pod that ended is left as it is: its Job is over.
        let changed = sides
            .wrappers
            .iter()
            .find(|w| w.changed && !w.deleting && w.for_pod == sides.local_uid);
        let (provider, twin) = (&sides.provider, &sides.twin);
        match changed.map(|w| w.kind) {
            Some(Wrapper::ReplicaSet) => {
                self.put_back(
                    provider,
                    twin,
                    pod,
                    Wrapper::ReplicaSet,
                    Self::replica_set_as_made,
                )
                .await?;
            }
            Some(Wrapper::Job) if !pod.ended() => {
                self.put_back(provider, twin, pod, Wrapper::Job, Self::job_as_made)
                    .await?;
            }
            _ => {}
        }
        self.bring_back_status(pod, &sides.twin_stores, provider, &sides.remote_pods)
            .await?;
        self.unschedulable(pod, &sides.remote_pods).await
    }

    /// A pod the provider's scheduler cannot place: looked at again when
    /// it has waited `--unschedulable-timeout`, and then failed here with
    /// the provider's reason (its wrapper on the provider goes on the next
    /// pass), so that its controller makes a new one and nothing waits
    /// there unseen.
    async fn unschedulable(
        &self,
        pod: &LocalPod,
        remote_pods: &[Arc<RemotePod>],
    ) -> Result<Next, Error> {
        let current = forge_pod::current_remote_pod(remote_pods.iter().map(AsRef::as_ref));
        let Some((since, why)) = current.and_then(|p| p.unschedulable.as_deref()) else {
            return Ok(Next::Done);
        };
        let waited =
            Duration::try_from(Timestamp::now().duration_since(*since)).unwrap_or_default();
        let timeout = self.peering.unschedulable_timeout;
        if waited < timeout {
            return Ok(Next::After(timeout - waited));
        }
        let Some(pod) = self.whole(pod).await? else {
            return Ok(Next::Done);
        };
        let message = format!(
            "cluster {} could not place it for {}s: {why}",
            self.peering.provider_id,
            timeout.as_secs()
        );
        self.give_up(&pod, forge_pod::UNSCHEDULABLE_REASON, &message)
            .await?;
        // The next pass takes its wrapper away.
        Ok(Next::After(Duration::ZERO))
    }

    /// The local pod `stored` whole, as the API has it: from the store
    /// while it is pending (kept whole then, without what is kept in
    /// memory only), else read from the API; `None` when it is gone, or
    /// another pod of that name now (the store will say so, and the key be
    /// looked at again).
    pub(super) async fn whole(&self, stored: &LocalPod) -> Result<Option<Pod>, Error> {
        if let Some(pod) = stored.kept_whole() {
            return Ok(Some(pod));
        }
        let api: Api<Pod> = Api::namespaced(
            self.peering.local.clone(),
            &stored.namespace().unwrap_or_default(),
        );
        let pod = api
            .get_opt(&stored.name_any())
            .await
            .map_err(|source| Error::ReadLocalPod {
                name: stored.name_any(),
                source,
            })?;
        Ok(pod.filter(|p| p.metadata.uid == stored.uid()))
    }

    async fn delete_local(&self, pod: &LocalPod) -> Result<Next, Error> {
        let api: Api<Pod> = Api::namespaced(
            self.peering.local.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&pod.name_any(), &params).await {
            Ok(_) => {
                tracing::info!(pod = %pod.name_any(), namespace = ?pod.namespace(), "remote pod gone; local pod removed");
                Ok(Next::Done)
            }
            // Gone already, or another pod of that name now.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Next::Done),
            Err(e) => Err(Error::RemoveLocalPod(e)),
        }
    }

    async fn refuse(&self, pod: &Pod, why: &str) -> Result<Next, Error> {
        self.give_up(pod, forge_pod::REFUSED_REASON, why).await?;
        Ok(Next::Done)
    }

    /// Fails `pod` here with `reason` and `why`, said once with an Event.
    async fn give_up(&self, pod: &Pod, reason: &str, why: &str) -> Result<(), Error> {
        let ns = pod.namespace().unwrap_or_default();
        let event = crate::forge::event::warning(
            pod,
            None,
            reason,
            why,
            FIELD_MANAGER,
            &self.peering.node_name,
            Time(Timestamp::now()),
        );
        let events: Api<Event> = Api::namespaced(self.peering.local.clone(), &ns);
        events
            .create(&PostParams::default(), &event)
            .await
            .map_err(Error::RecordRefusal)?;
        tracing::warn!(pod = %pod.name_any(), namespace = %ns, %reason, %why, "pod given up on");
        self.patch_local_status(&pod.metadata, &forge_pod::given_up_status(reason, why))
            .await
    }

    /// Its service account token, where the pod mounts one.
    /// Where the remote pod of `pod` resolves names, set in `remote`;
    /// `Err` while that is not decided for its namespace.
    pub(super) fn resolve_names(
        &self,
        pod: &Pod,
        remote: Option<&mut PodSpec>,
    ) -> Result<(), Error> {
        let (Some((nameservers, domain)), Some(remote)) = (&self.names, remote) else {
            return Ok(());
        };
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let nameserver = nameservers.borrow().get(&namespace).copied();
        match nameserver {
            Some(Nameserver::At(ip)) => {
                crate::forge::pod::dns::resolve_at_home(remote, &namespace, domain, ip);
                Ok(())
            }
            Some(Nameserver::Provider) => Ok(()),
            None => Err(NotYet::Nameserver(namespace).into()),
        }
    }

    pub(super) fn mount_token(&self, pod: &Pod, name: &str, remote: Option<&mut PodSpec>) {
        if let (Some(api), Some(local), Some(remote)) = (&self.token_api, pod.spec.as_ref(), remote)
        {
            crate::forge::token::mount_in(remote, local, name, api);
        }
    }
}

/// The pod spec of a remote ReplicaSet's template.
fn template_spec(rs: &mut ReplicaSet) -> Option<&mut PodSpec> {
    rs.spec
        .as_mut()
        .and_then(|s| s.template.as_mut())
        .and_then(|t| t.spec.as_mut())
}

/// Deletes a remote wrapper unless it is gone already.
async fn delete_wrapper(
    provider: &kube::Client,
    twin: &str,
    kind: Wrapper,
    name: &str,
    params: &DeleteParams,
) -> Result<(), Error> {
    match kind {
        Wrapper::ReplicaSet => {
            let api: Api<ReplicaSet> = Api::namespaced(provider.clone(), twin);
            delete_remote(&api, "replica set", name, params).await
        }
        Wrapper::Job => {
            let api: Api<Job> = Api::namespaced(provider.clone(), twin);
            delete_remote(&api, "job", name, params).await
        }
    }
}

/// Deletes a remote object unless it is gone already.
async fn delete_remote<K>(
    api: &Api<K>,
    what: &'static str,
    name: &str,
    params: &DeleteParams,
) -> Result<(), Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::DeleteRemote {
            what,
            name: name.to_owned(),
            source: e,
        }),
    }
}
