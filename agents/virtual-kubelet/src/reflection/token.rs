//! Service account tokens of offloaded pods ([`crate::forge::token`]
//! says what and why): for every local pod bound to the virtual node that
//! mounts its token, a Secret of ours in the twin holds a token of the
//! pod's account from the consumer's TokenRequest API, bound to the local
//! pod, with the consumer's CA and the local namespace; it is renewed at
//! 80% of its life, put back if changed or deleted on the provider, and
//! deleted once the local pod is gone. The key is the local pod's
//! namespace and name. Tokens are never logged.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::core::ObjectMeta;
use kube::runtime::watcher;
use liqo_agent_runtime::compact::{Uid, Version};
use liqo_agent_runtime::follow::{Changes, Followed, Options};
use liqo_api::names::labels;
use tokio::sync::{Notify, watch};

use super::namespace::{PeeringContext, Twins};
use super::pod::LocalPod;
use super::stores::{Clients, PerNamespace};
use super::{Error, Gathered, Kind, Next, NotYet, ObjectKey, Unjournaled, in_local_namespaces};
use crate::forge::pod as forge_pod;
use crate::forge::reflected::ROOT_CA_CONFIGMAP;
use crate::forge::token::{self as forge_token, StoredToken};

#[allow(missing_debug_implementations)]
pub struct Tokens {
    peering: PeeringContext,
    twins: watch::Receiver<Twins>,
    /// Local pods bound to the virtual node.
    local: Followed<LocalPod>,
    /// The local ConfigMaps of the offloaded namespaces (for the CA).
    config_maps: Arc<PerNamespace<ConfigMap>>,
    /// Our token Secrets, per twin.
    remote: PerNamespace<Secret, StoredToken>,
    clients: Clients,
    /// The local pods that changed, by namespace and name. The CA
    /// ConfigMap is not journaled: the sweep finds it by its fingerprint.
    changed_local: Changes<ObjectKey>,
    /// The token Secrets that changed, by twin and local pod name.
    changed_remote: Changes<ObjectKey>,
    unjournaled: Unjournaled,
}

impl Tokens {
    pub fn new(
        peering: PeeringContext,
        twins: watch::Receiver<Twins>,
        local: Followed<LocalPod>,
        config_maps: Arc<PerNamespace<ConfigMap>>,
        wake: &Arc<Notify>,
    ) -> Self {
        let selector = format!(
            "{}={},{}",
            labels::MANAGED_BY,
            labels::MANAGED_BY_VALUE,
            forge_pod::LOCAL_POD_UID
        );
        let remote = PerNamespace::stored_as(
            "remote token secrets",
            watcher::Config::default().labels(&selector),
            vec![wake.clone()],
            Options::converted(StoredToken::new),
        );
        let changed_local = Changes::new();
        local.record_into(&changed_local, |p| {
            Some((p.namespace.clone(), p.name.clone()))
        });
        let changed_remote = Changes::new();
        remote.record_into(&changed_remote, |s: &StoredToken| {
            let pod = forge_token::pod_name(&s.name)?;
            Some((s.namespace.clone(), Arc::from(pod)))
        });
        let clients = Clients::new(peering.provider.clone());
        Self {
            peering,
            twins,
            local,
            config_maps,
            remote,
            clients,
            changed_local,
            changed_remote,
            unjournaled: Unjournaled::default(),
        }
    }
}

impl Kind for Tokens {
    type Key = ObjectKey;
    const NAME: &'static str = "service account tokens";

    fn prepare(&self) {
        let twins: Vec<String> = self.twins.borrow().values().cloned().collect();
        self.remote.follow_only(self.clients.current(), twins);
    }

    fn keys(&self) -> Vec<Self::Key> {
        let twins = self.twins.borrow().clone();
        let mut keys = Gathered::from_first(
            self.local
                .store
                .state()
                .iter()
                .filter(|p| token_account(p).is_some())
                .filter(|p| twins.contains_key(&*p.namespace))
                .map(|p| (p.namespace.clone(), p.name.clone()))
                .collect(),
        );
        for (local_ns, twin) in &twins {
            let local_ns: Arc<str> = Arc::from(local_ns.as_str());
            for secret in self.remote.names(twin) {
                if let Some(pod) = forge_token::pod_name(&secret) {
                    keys.add(&local_ns, pod, || Arc::from(pod));
                }
            }
        }
        keys.into_keys()
    }

    /// The local pods and token Secrets that changed; any when the twins
    /// did.
    fn changed(&self) -> Option<Vec<Self::Key>> {
        let local = self.changed_local.take();
        let remote = self.changed_remote.take();
        let twins = self.twins.borrow().clone();
        let mut h = DefaultHasher::new();
        twins.hash(&mut h);
        if self.unjournaled.changed(h.finish()) {
            return None;
        }
        let mut keys = local?;
        keys.extend(in_local_namespaces(&twins, remote?));
        Some(keys)
    }

    /// The twin, whether its Secrets are current, the token Secret's and
    /// the local pod's versions and the CA ConfigMap's: what converging the
    /// key reads (the token's age is its own: it asks to be looked at
    /// again when due).
    fn fingerprint(&self, (ns, name): &Self::Key) -> Option<u64> {
        let mut h = DefaultHasher::new();
        let version = |m: &ObjectMeta| (m.uid.clone(), m.resource_version.clone());
        let twin = self.twins.borrow().get(&**ns).cloned();
        twin.hash(&mut h);
        let remote = twin.as_ref().and_then(|t| self.remote.current(t));
        remote.is_some().hash(&mut h);
        if let (Some(remote), Some(twin)) = (&remote, &twin) {
            let secret = forge_token::secret_name(name);
            remote
                .store
                .get(twin, &secret)
                .map(|s| (s.uid.clone(), s.version.clone()))
                .hash(&mut h);
        }
        self.local
            .store
            .get(ns, name)
            .map(|p| p.identity())
            .hash(&mut h);
        self.config_maps
            .current(ns)
            .and_then(|cms| cms.store.get(ns, ROOT_CA_CONFIGMAP))
            .map(|cm| version(&cm.metadata))
            .hash(&mut h);
        Some(h.finish())
    }

    async fn converge(&self, (ns, name): &Self::Key) -> Result<Next, Error> {
        // A pod missing from a store still being listed is not gone: its
        // token Secret would be deleted under its remote pod.
        if !self.local.is_current() {
            return Err(NotYet::LocalPods.into());
        }
        let Some(twin) = self.twins.borrow().get(&**ns).cloned() else {
            return Ok(Next::Done);
        };
        let remote = self
            .remote
            .current(&twin)
            .ok_or_else(|| NotYet::TokenSecrets(twin.clone()))?;
        let secret_name = forge_token::secret_name(name);
        let have = remote.store.get(&twin, &secret_name);
        let pod = self
            .local
            .store
            .get(ns, name)
            .filter(|p| token_account(p).is_some())
            .filter(|p| !forge_pod::given_up(p.reason.as_deref()));
        let provider = self.peering.provider_client()?;
        let api: Api<Secret> = Api::namespaced(provider, &twin);
        let Some(pod) = pod else {
            // The pod is gone (a pod being deleted keeps its token until
            // its remote pod is gone: the local one goes after it).
            if let Some(have) = have {
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: have.uid.as_ref().map(Uid::to_string),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match api.delete(&secret_name, &params).await {
                    Ok(_) => {
                        tracing::debug!(pod = %name, namespace = %ns, "token secret deleted");
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(e) => {
                        return Err(Error::DeleteTokenSecret {
                            twin,
                            secret: secret_name,
                            source: e,
                        });
                    }
                }
            }
            return Ok(Next::Done);
        };
        // The consumer's CA as published in the pod's namespace.
        let ca = self
            .config_maps
            .current(ns)
            .and_then(|cms| cms.store.get(ns, ROOT_CA_CONFIGMAP))
            .and_then(|cm| cm.data.as_ref()?.get(forge_token::ROOT_CA_KEY).cloned())
            .ok_or_else(|| NotYet::RootCa(ns.to_string()))?;
        let now = Timestamp::now();
        if let Some(have) = &have
            && let Some(refresh) = forge_token::still_good(have, &pod.metadata(), &ca, now)
        {
            return Ok(Next::After(refresh.duration_since(now).unsigned_abs()));
        }
        let account = token_account(&pod).unwrap_or("default");
        let accounts: Api<ServiceAccount> = Api::namespaced(self.peering.local.clone(), ns);
        let issued = Timestamp::now();
        let response: TokenRequest = accounts
            .create_subresource(
                "token",
                account,
                &PostParams::default(),
                &forge_token::token_request(&pod.metadata()),
            )
            .await
            .map_err(|source| Error::RequestToken {
                namespace: ns.to_string(),
                account: account.to_string(),
                source,
            })?;
        let status = response.status.ok_or(NotYet::TokenStatus)?;
        let refresh = forge_token::refresh_at(issued, status.expiration_timestamp.0);
        let mut want =
            forge_token::token_secret(&pod.metadata(), &twin, &status.token, &ca, refresh);
        let written = match &have {
            None => api.create(&PostParams::default(), &want).await,
            Some(have) => {
                want.metadata.resource_version = have.version.as_ref().map(Version::to_string);
                api.replace(&secret_name, &PostParams::default(), &want)
                    .await
            }
        };
        match written {
            Ok(_) => {}
            // Someone else's Secret of that name: never taken over.
            Err(kube::Error::Api(s)) if s.code == 409 && have.is_none() => {
                return Err(NotYet::NotOurs {
                    twin,
                    name: secret_name,
                }
                .into());
            }
            Err(e) => {
                return Err(Error::WriteTokenSecret {
                    twin,
                    secret: secret_name,
                    source: e,
                });
            }
        }
        tracing::debug!(pod = %name, namespace = %ns, %refresh, "token secret written");
        Ok(Next::After(
            refresh.duration_since(Timestamp::now()).unsigned_abs(),
        ))
    }
}

/// The service account whose token `pod` mounts, if it mounts one.
fn token_account(pod: &LocalPod) -> Option<&str> {
    pod.token_account.as_deref()
}

/// The token Secrets' store filled as the agent fills it, for
/// [`super::footprint`].
#[cfg(test)]
pub mod footprint {
    use super::*;

    pub fn secrets(secrets: impl Iterator<Item = Secret>) -> Followed<StoredToken> {
        liqo_agent_runtime::follow::filled(secrets, Options::converted(StoredToken::new))
    }
}
