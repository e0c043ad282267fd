//! The provider's side: a client for the provider's API built from the
//! peering's identity Secret (rebuilt whenever its kubeconfig changes, as
//! the Secret is renewed in place), and the health check that says
//! whether the provider is there and is the cluster the ForeignCluster
//! names. Pod offloading will use the same client.
//!
//! The Secret is followed through the consumer's API rather than mounted:
//! the agent's pod starts before liqoctl has made the identity (a mounted
//! Secret that does not exist yet holds the pod back), and a renewal is
//! used as soon as it is written, not when the kubelet next syncs the pod.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use liqo_agent_runtime::follow::{Followed, Options, follow_with};
use liqo_api::core::ForeignCluster;
use liqo_api::{ClusterIdentity, names};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::forge::ProviderState;

/// The key of the identity Secret that holds the kubeconfig.
const KUBECONFIG_KEY: &str = "kubeconfig";
/// How often the provider is checked, and how long one check may take.
pub const CHECK_PERIOD: Duration = Duration::from_secs(5);
/// How soon a failed check is tried again.
pub const RETRY_PERIOD: Duration = Duration::from_secs(1);
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(3);
/// The node is Ready while the last successful check is at most this old:
/// three checks in a row must fail, so that one slow answer does not flap
/// the node, and the node is NotReady well within 40 s of a loss.
pub const FRESHNESS: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("the provider's credential is not read yet")]
    NotReadYet,
    #[error(
        "the identity Secret {}/{secret} does not exist (yet)",
        names::NAMESPACE
    )]
    NoSecret { secret: String },
    #[error(
        "the identity Secret {}/{secret} has no key `{KUBECONFIG_KEY}`",
        names::NAMESPACE
    )]
    NoKey { secret: String },
    #[error("cannot load the provider kubeconfig")]
    Load(#[source] liqo_agent_runtime::kubeconfig::KubeconfigError),
    #[error("cannot build a client from the provider kubeconfig of Secret {secret}")]
    Client {
        secret: String,
        #[source]
        source: kube::Error,
    },
}

impl KubeconfigError {
    /// The error and its causes on one line.
    pub fn chain(&self) -> String {
        liqo_agent_runtime::error_chain(self)
    }
}

/// The client for the provider, or why there is none (shared: every task
/// that waits for a client reads the same reason).
pub type ProviderClient = Result<kube::Client, Arc<KubeconfigError>>;

/// The identity Secret as followed: its kubeconfig's bytes, if it has the
/// key (nothing else of the Secret is kept).
pub type Credential = Followed<Option<Vec<u8>>>;

/// Follows the identity Secret `name` in `liqo` (the agent's rights name
/// it, so the watch does too).
pub fn follow_credential(
    client: kube::Client,
    name: &str,
) -> (
    Credential,
    impl std::future::Future<Output = ()> + Send + use<>,
) {
    follow_with(
        Api::<Secret>::namespaced(client, names::NAMESPACE),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
        "provider credential",
        credential_options(),
    )
}

/// Of the identity Secret, only its kubeconfig is kept.
fn credential_options() -> Options<Secret, Option<Vec<u8>>> {
    Options::converted(|secret, _| {
        secret
            .data
            .and_then(|mut data| data.remove(KUBECONFIG_KEY))
            .map(|bytes| bytes.0)
    })
}

/// The tenant a provider kubeconfig acts as, when it impersonates a peer
/// user (a peering made with a token); `None` for a certificate, whose
/// user is this cluster's own ID.
pub fn tenant_of(kubeconfig: &[u8]) -> Option<liqo_api::ClusterId> {
    let config = liqo_agent_runtime::kubeconfig::parse(kubeconfig).ok()?;
    config
        .auth_infos
        .iter()
        .filter_map(|a| a.auth_info.as_ref()?.impersonate.as_deref())
        .find_map(liqo_api::authentication::peer_of)
}

/// The kubeconfig of the identity Secret `name`, once the Secret holds
/// one (a peering's agent may start before its identity is made).
pub async fn first_kubeconfig(credential: &Credential, name: &str) -> Vec<u8> {
    let mut state = credential.state.clone();
    loop {
        if let Some(stored) = credential.store.get(names::NAMESPACE, name)
            && let Some(kubeconfig) = stored.as_ref()
        {
            return kubeconfig.clone();
        }
        if state.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// Keeps `tx` holding a client built from the identity Secret `name`,
/// rebuilding it when its kubeconfig changes. A Secret that cannot be
/// used keeps the previous client: the old credentials may well still
/// work.
pub async fn keep_client(credential: Credential, name: String, tx: watch::Sender<ProviderClient>) {
    let mut state = credential.state.clone();
    let mut last: Option<Vec<u8>> = None;
    let mut logged_error: Option<String> = None;
    loop {
        let stored = credential.store.get(names::NAMESPACE, &name);
        match stored.as_deref() {
            Some(Some(content)) if last.as_ref() == Some(content) => {}
            Some(Some(content)) => match build_client(&name, content).await {
                Ok(client) => {
                    if last.is_some() {
                        tracing::info!(secret = %name, "reloaded the provider kubeconfig");
                    } else {
                        tracing::info!(secret = %name, "loaded the provider kubeconfig");
                    }
                    let _previous = tx.send_replace(Ok(client));
                    last = Some(content.clone());
                    logged_error = None;
                }
                Err(e) => report(&tx, &mut logged_error, e),
            },
            Some(None) => report(
                &tx,
                &mut logged_error,
                KubeconfigError::NoKey {
                    secret: name.clone(),
                },
            ),
            // Said only once the store vouches for it.
            None if credential.is_current() => report(
                &tx,
                &mut logged_error,
                KubeconfigError::NoSecret {
                    secret: name.clone(),
                },
            ),
            None => {}
        }
        if state.changed().await.is_err() {
            return;
        }
    }
}

/// Logs a kubeconfig problem once, and only replaces the client when there
/// was none usable anyway.
fn report(tx: &watch::Sender<ProviderClient>, logged: &mut Option<String>, error: KubeconfigError) {
    let why = error.chain();
    if logged.as_ref() == Some(&why) {
        return;
    }
    tracing::warn!(%why, "the provider kubeconfig cannot be used");
    *logged = Some(why);
    tx.send_if_modified(|current| match current {
        Ok(_) => false,
        Err(old) => {
            *old = Arc::new(error);
            true
        }
    });
}

async fn build_client(secret: &str, content: &[u8]) -> Result<kube::Client, KubeconfigError> {
    let origin = std::path::PathBuf::from(format!("{}/{secret}", names::NAMESPACE));
    let config = liqo_agent_runtime::kubeconfig::config(&origin, content)
        .await
        .map_err(KubeconfigError::Load)?;
    liqo_agent_runtime::client::client(config).map_err(|source| KubeconfigError::Client {
        secret: secret.to_owned(),
        source,
    })
}

/// What the health checks found: when one last succeeded, and what the
/// last failure was.
#[derive(Debug, Clone, Default)]
pub struct Health {
    pub last_success: Option<Instant>,
    pub last_failure: Option<ProviderState>,
}

impl Health {
    /// The provider's state at `now`: reachable while the last success is
    /// fresh, else what the last failure said.
    pub fn state(&self, now: Instant) -> ProviderState {
        match self.last_success {
            Some(at) if now.saturating_duration_since(at) <= FRESHNESS => ProviderState::Reachable,
            _ => self.last_failure.clone().unwrap_or_else(|| {
                ProviderState::Unreachable("the provider has not been checked yet".to_owned())
            }),
        }
    }
}

/// Checks the provider every [`CHECK_PERIOD`] while it answers, every
/// [`RETRY_PERIOD`] while it does not (so that a node comes up, and comes
/// back, without waiting a whole period), and at once when the
/// ForeignCluster or the credential changes; publishes the result.
pub async fn keep_checking(
    mut clients: watch::Receiver<ProviderClient>,
    mut peers: Followed<ForeignCluster>,
    fc_ref: ObjectRef<ForeignCluster>,
    tx: watch::Sender<Health>,
) {
    // Not before there is something to check with: the ForeignCluster
    // listed and the credential read (or found missing), which take the
    // agent's first few milliseconds.
    let started = async {
        peers.state.clone().wait_for(|s| s.current).await?;
        clients
            .clone()
            .wait_for(|c| !matches!(c, Err(why) if matches!(**why, KubeconfigError::NotReadYet)))
            .await
            .map(drop)
    };
    if started.await.is_err() {
        return;
    }
    let mut wait = Duration::ZERO;
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            changed = peers.state.changed() => if changed.is_err() { return },
            changed = clients.changed() => if changed.is_err() { return },
        }
        let expected = peers
            .store
            .get("", &fc_ref.name)
            .map(|fc| fc.spec.cluster_id.clone());
        let client = clients.borrow().clone();
        let result = match (client, expected) {
            (_, None) => Err(ProviderState::Unreachable(format!(
                "the ForeignCluster {} is not known yet",
                fc_ref.name
            ))),
            (Err(why), Some(_)) => Err(ProviderState::Unreachable(why.chain())),
            (Ok(client), Some(expected)) => check(client, &expected).await,
        };
        wait = if result.is_ok() {
            CHECK_PERIOD
        } else {
            RETRY_PERIOD
        };
        tx.send_modify(|h| match result {
            Ok(()) => {
                if h.last_failure.is_some() || h.last_success.is_none() {
                    tracing::info!("the provider answers as the expected cluster");
                }
                h.last_success = Some(Instant::now());
                h.last_failure = None;
            }
            Err(state) => {
                if h.last_failure.as_ref() != Some(&state) {
                    tracing::warn!(?state, "provider check failed");
                }
                h.last_failure = Some(state);
            }
        });
    }
}

/// How often the provider's end of the tunnel is read for where the
/// provider sees this cluster's pods: it changes only when a peering's
/// network is (re)connected.
const SEEN_THERE_PERIOD: Duration = Duration::from_secs(5);

/// Keeps `tx` on where the provider sees this cluster's pods: as its
/// gateway decided in the provider's end of the tunnel (the one
/// Connection of the tenant namespace, which the tenant may read), the
/// same CIDR when it sees them at their own addresses, none while there is
/// no tunnel. A failed read keeps the last known value.
pub async fn keep_seen_there(
    clients: watch::Receiver<ProviderClient>,
    tenant_namespace: String,
    tx: watch::Sender<Option<liqo_api::networking::Remap>>,
) {
    loop {
        let client = clients.borrow().clone();
        if let Ok(client) = client {
            let api: Api<liqo_api::networking::Connection> =
                Api::namespaced(client, &tenant_namespace);
            match api.list(&Default::default()).await {
                Ok(list) => {
                    let remap = list
                        .items
                        .first()
                        .and_then(liqo_api::networking::Remap::seen);
                    tx.send_if_modified(|known| {
                        let changed = *known != remap;
                        if changed {
                            tracing::info!(?remap, "where the provider sees this cluster's pods");
                            *known = remap;
                        }
                        changed
                    });
                }
                Err(e) => tracing::debug!(error = %e, "reading the provider's end of the tunnel"),
            }
        }
        tokio::time::sleep(SEEN_THERE_PERIOD).await;
    }
}

/// One check: the provider's identity ConfigMap, within [`CHECK_TIMEOUT`],
/// names the expected cluster.
async fn check(client: kube::Client, expected: &liqo_api::ClusterId) -> Result<(), ProviderState> {
    let maps: Api<ConfigMap> = Api::namespaced(client, names::NAMESPACE);
    let got = tokio::time::timeout(CHECK_TIMEOUT, maps.get(names::IDENTITY_CONFIGMAP)).await;
    let map = match got {
        Err(_) => {
            return Err(ProviderState::Unreachable(format!(
                "the provider's API did not answer within {}s",
                CHECK_TIMEOUT.as_secs()
            )));
        }
        Ok(Err(kube::Error::Api(s))) if s.code == 401 || s.code == 403 => {
            return Err(ProviderState::Forbidden(format!(
                "the provider's API refused the consumer's identity ({}: {})",
                s.code, s.message
            )));
        }
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => {
            return Err(ProviderState::Mismatch(format!(
                "the provider has no ConfigMap {}/{}: liqo-rs is not installed there",
                names::NAMESPACE,
                names::IDENTITY_CONFIGMAP
            )));
        }
        Ok(Err(e)) => {
            return Err(ProviderState::Unreachable(format!(
                "reading the provider's identity failed: {}",
                liqo_agent_runtime::error_chain(&e)
            )));
        }
        Ok(Ok(map)) => map,
    };
    let identity = ClusterIdentity::from_data(&map.data.unwrap_or_default())
        .map_err(|e| ProviderState::Mismatch(format!("the provider's identity is damaged: {e}")))?;
    if identity.cluster_id != *expected {
        return Err(ProviderState::Mismatch(format!(
            "the provider's API belongs to cluster {}, not {expected}",
            identity.cluster_id
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "liqo-identity-prov-1";

    /// A kubeconfig of the provider, acting as `impersonate` if given.
    fn kubeconfig(impersonate: Option<&str>) -> String {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "p", "cluster": {"server": "https://127.0.0.1:6443"}}],
            "users": [{"name": "u", "user": {"token": "t", "as": impersonate}}],
            "contexts": [{"name": "p", "context": {"cluster": "p", "user": "u"}}],
            "current-context": "p"
        })
        .to_string()
    }

    fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "namespace": names::NAMESPACE },
            "data": data
                .iter()
                .map(|(k, v)| (k.to_string(), base64_of(v)))
                .collect::<serde_json::Map<_, _>>(),
        }))
        .expect("a Secret")
    }

    fn base64_of(text: &str) -> serde_json::Value {
        serde_json::to_value(k8s_openapi::ByteString(text.as_bytes().to_vec())).expect("bytes")
    }

    /// What [`keep_client`] leaves on its channel for a store holding
    /// `secrets` (it returns once the store can change no more).
    async fn client_from(secrets: Vec<Secret>) -> ProviderClient {
        let credential = liqo_agent_runtime::follow::filled(secrets, credential_options());
        let (tx, rx) = watch::channel(Err(Arc::new(KubeconfigError::NotReadYet)));
        keep_client(credential, SECRET.to_owned(), tx).await;
        rx.borrow().clone()
    }

    #[tokio::test]
    async fn the_client_comes_from_its_own_identity_secret_or_says_why_not() {
        let usable = kubeconfig(None);
        assert!(
            client_from(vec![secret(SECRET, &[("kubeconfig", &usable)])])
                .await
                .is_ok()
        );
        // Another peering's Secret is not this one's.
        let other = client_from(vec![secret(
            "liqo-identity-prov-2",
            &[("kubeconfig", &usable)],
        )]);
        assert!(
            matches!(other.await, Err(e) if matches!(*e, KubeconfigError::NoSecret { .. })),
            "another peering's identity"
        );
        let keyless = client_from(vec![secret(SECRET, &[("token", "t")])]);
        assert!(matches!(keyless.await, Err(e) if matches!(*e, KubeconfigError::NoKey { .. })));
        let broken = client_from(vec![secret(SECRET, &[("kubeconfig", "not: json")])]);
        assert!(matches!(broken.await, Err(e) if matches!(*e, KubeconfigError::Load(_))));
    }

    #[tokio::test]
    async fn the_first_kubeconfig_is_the_secrets_and_names_a_tokens_tenant() {
        let of_token = kubeconfig(Some("liqo.io:peer:tenant-7"));
        let credential = liqo_agent_runtime::follow::filled(
            vec![secret(SECRET, &[("kubeconfig", &of_token)])],
            credential_options(),
        );
        let read = first_kubeconfig(&credential, SECRET).await;
        assert_eq!(read, of_token.as_bytes());
        assert_eq!(
            tenant_of(&read).map(|t| t.to_string()).as_deref(),
            Some("tenant-7")
        );
        assert_eq!(tenant_of(kubeconfig(None).as_bytes()), None);
    }

    #[test]
    fn ready_while_the_last_success_is_fresh() {
        let now = Instant::now();
        let fresh = Health {
            last_success: Some(now),
            last_failure: Some(ProviderState::Unreachable("slow".into())),
        };
        assert_eq!(fresh.state(now + FRESHNESS), ProviderState::Reachable);
        assert_eq!(
            fresh.state(now + FRESHNESS + Duration::from_millis(1)),
            ProviderState::Unreachable("slow".into())
        );
        assert!(matches!(
            Health::default().state(now),
            ProviderState::Unreachable(_)
        ));
    }
}
