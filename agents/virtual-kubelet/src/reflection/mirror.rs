//! Objects copied into the twins: every ConfigMap, Secret, Service and
//! EndpointSlice of an offloaded namespace (but what its kind's
//! [`Reflected::content`] leaves out, or what is opted out) has a copy of
//! the same name in the twin namespace on the provider, created, updated
//! and deleted with it. A copy changed or deleted on the provider by
//! someone else is put back. Only copies that carry our managed-by and
//! origin labels are followed, changed or deleted: an object of the same
//! name that someone else made in the twin is left alone (and the key
//! keeps failing, said in the log). One [`Reflector`] runs per kind; the
//! key is the local namespace and the name.
//!
//! Both sides are followed per namespace ([`super::stores`]): the
//! consumer's offloaded namespaces, the provider's twins.

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::watcher;
use tokio::sync::{Notify, watch};

use super::namespace::{PeeringContext, Twins};
use super::stores::{Clients, PerNamespace, follow_twins, keys_in_twins};
use super::{Error, Kind, Next, NotYet, ObjectKey};
use crate::forge::reflected::{self, Reflected};

/// The reflection of one kind.
#[allow(missing_debug_implementations)]
pub struct Reflector<K: Reflected> {
    peering: PeeringContext,
    twins: watch::Receiver<Twins>,
    /// The consumer's objects, per offloaded namespace; shared with the
    /// pods' reflection, which checks that what a pod needs exists.
    pub local: Arc<PerNamespace<K>>,
    /// The copies in the twins; shared with the names server.
    pub remote: Arc<PerNamespace<K>>,
    clients: Clients,
}

impl<K: Reflected> Reflector<K> {
    /// `wake` is woken by either side's stores; `also` by the local ones
    /// only (the pods that wait for them).
    pub fn new(
        peering: PeeringContext,
        twins: watch::Receiver<Twins>,
        wake: &Arc<Notify>,
        also: &Arc<Notify>,
    ) -> Self {
        let local = Arc::new(PerNamespace::new(
            "local reflected objects",
            watcher::Config::default(),
            vec![wake.clone(), also.clone()],
        ));
        let remote = Arc::new(PerNamespace::new(
            "remote reflected objects",
            watcher::Config::default().labels(&reflected::remote_selector()),
            vec![wake.clone()],
        ));
        let clients = Clients::new(peering.provider.clone());
        Self {
            peering,
            twins,
            local,
            remote,
            clients,
        }
    }

    fn twin_of(&self, local_ns: &str) -> Option<String> {
        self.twins.borrow().get(local_ns).cloned()
    }
}

impl<K: Reflected> Kind for Reflector<K> {
    type Key = ObjectKey;
    const NAME: &'static str = K::NAME;

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
        keys_in_twins(&self.local, &self.remote, &self.twins.borrow())
    }

    async fn converge(&self, (ns, name): &Self::Key) -> Result<Next, Error> {
        // No ready twin: the twin's deletion takes every copy.
        let Some(twin) = self.twin_of(ns) else {
            return Ok(Next::Done);
        };
        let not_yet = |side: &'static str| NotYet::Mirrored {
            side,
            kind: K::NAME,
            namespace: ns.to_string(),
        };
        let local = self.local.current(ns).ok_or_else(|| not_yet("local"))?;
        let remote = self
            .remote
            .current(&twin)
            .ok_or_else(|| not_yet("remote"))?;
        let local = local.store.get(ns, name);
        let have = remote.store.get(&twin, name);
        let want = local.as_deref().and_then(|l| {
            let target = reflected::Target {
                node_name: &self.peering.node_name,
                seen: *self.peering.seen_there.borrow(),
            };
            reflected::remote(l, &twin, target)
        });
        let provider = self.peering.provider_client()?;
        let api: Api<K> = Api::namespaced(provider, &twin);
        // Which copy a failed request was about.
        let copy = || (K::NAME, twin.clone(), name.clone());
        match (want, have) {
            (None, None) => Ok(Next::Done),
            (Some(want), None) => match api.create(&PostParams::default(), &want).await {
                Ok(_) => {
                    tracing::debug!(kind = K::NAME, namespace = %ns, %name, "reflected");
                    Ok(Next::Done)
                }
                // Not in our store: someone else's object of that name (or
                // ours, created a moment ago, on its way to the store).
                Err(kube::Error::Api(s)) if s.code == 409 => Err(NotYet::NotOurs {
                    twin: twin.clone(),
                    name: name.to_string(),
                }
                .into()),
                Err(source) => {
                    let (kind, twin, name) = copy();
                    Err(Error::CreateCopy {
                        kind,
                        twin,
                        name,
                        source,
                    })
                }
            },
            (Some(mut want), Some(have)) => {
                if !reflected::is_ours(have.meta(), ns) || reflected::in_sync(&want, &have) {
                    return Ok(Next::Done);
                }
                want.meta_mut().resource_version = have.resource_version();
                match api.replace(name, &PostParams::default(), &want).await {
                    Ok(_) => {
                        tracing::debug!(kind = K::NAME, namespace = %ns, %name, "remote copy updated");
                        Ok(Next::Done)
                    }
                    // An immutable copy (or a Secret whose type changed)
                    // cannot be updated: it is replaced whole.
                    Err(kube::Error::Api(s)) if s.code == 422 => {
                        delete(&api, &have, |source| {
                            let (kind, twin, name) = copy();
                            Error::ReplaceCopy {
                                kind,
                                twin,
                                name,
                                source,
                            }
                        })
                        .await?;
                        Ok(Next::Done)
                    }
                    Err(source) => {
                        let (kind, twin, name) = copy();
                        Err(Error::UpdateCopy {
                            kind,
                            twin,
                            name,
                            source,
                        })
                    }
                }
            }
            (None, Some(have)) => {
                if reflected::is_ours(have.meta(), ns) {
                    delete(&api, &have, |source| {
                        let (kind, twin, name) = copy();
                        Error::DeleteCopy {
                            kind,
                            twin,
                            name,
                            source,
                        }
                    })
                    .await?;
                    tracing::debug!(kind = K::NAME, namespace = %ns, %name, "remote copy deleted");
                }
                Ok(Next::Done)
            }
        }
    }
}

/// Deletes `have` (that very object: UID precondition) unless gone.
async fn delete<K: Reflected>(
    api: &Api<K>,
    have: &K,
    failed: impl FnOnce(kube::Error) -> Error,
) -> Result<(), Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: have.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&have.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(failed(e)),
    }
}
