//! The agent's readiness: ready exactly while the identity, the peers and
//! the connections are followed and current and the identity is usable.
//! It also logs what the gateway knows, and hands the identity's record
//! to the announcer.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::ObjectRef;
use liqo_agent_runtime::Readiness;
use liqo_agent_runtime::follow::Followed;
use liqo_api::ClusterIdentity;
use liqo_api::core::ForeignCluster;
use liqo_api::core::identity::IdentityError;
use liqo_api::discovery::{ApiAddress, ClusterRecord};
use liqo_api::names;
use liqo_api::networking::Connection;
use tokio::sync::watch;

/// What the gateway follows.
pub struct ReadinessInputs {
    pub identity: Followed<ConfigMap>,
    pub identity_ref: ObjectRef<ConfigMap>,
    pub peers: Followed<ForeignCluster>,
    pub connections: Followed<Connection>,
    /// With --announce: the API address, and where to send the record to
    /// announce whenever the identity changes.
    pub announcement: Option<(ApiAddress, watch::Sender<Option<ClusterRecord>>)>,
}

/// Why the gateway has no usable identity.
#[derive(Debug, thiserror::Error)]
pub enum NoIdentity {
    #[error("the ConfigMap {} does not exist", names::IDENTITY_CONFIGMAP)]
    Missing,
    #[error("the ConfigMap {} is damaged", names::IDENTITY_CONFIGMAP)]
    Damaged(#[source] IdentityError),
}

/// Told apart by what they say: a change of it is logged again.
impl PartialEq for NoIdentity {
    fn eq(&self, other: &Self) -> bool {
        liqo_agent_runtime::error_chain(self) == liqo_agent_runtime::error_chain(other)
    }
}

/// What the gateway knows, as it logs it when it changes.
#[derive(Debug, PartialEq)]
pub struct Known {
    pub identity: Result<ClusterIdentity, NoIdentity>,
    pub peers: Vec<(String, String)>,
}

impl ReadinessInputs {
    /// Re-evaluates readiness whenever either store changes: ready when
    /// both stores are current and the identity is present and valid.
    pub async fn keep_readiness(mut self, readiness: &Readiness) {
        let mut last: Option<Known> = None;
        loop {
            let known = self.known();
            if last.as_ref() != Some(&known) {
                match &known.identity {
                    Ok(id) => {
                        tracing::info!(cluster_id = %id.cluster_id, name = %id.cluster_name, "identity")
                    }
                    Err(why) => {
                        let why = liqo_agent_runtime::error_chain(why);
                        tracing::warn!(%why, "no usable identity");
                    }
                }
                tracing::info!(peers = ?known.peers, "peers");
                if let Some((api, records)) = &self.announcement {
                    // A damaged or deleted identity is no longer announced.
                    let record = known
                        .identity
                        .as_ref()
                        .ok()
                        .map(|id| ClusterRecord::of(id, api.clone()));
                    records.send_replace(record);
                }
            }
            readiness.set(
                self.identity.is_current()
                    && self.peers.is_current()
                    && self.connections.is_current()
                    && known.identity.is_ok(),
            );
            last = Some(known);
            tokio::select! {
                changed = self.identity.state.changed() => if changed.is_err() { return },
                changed = self.peers.state.changed() => if changed.is_err() { return },
                changed = self.connections.state.changed() => if changed.is_err() { return },
            }
        }
    }

    fn known(&self) -> Known {
        let identity = match self.identity.store.get(
            self.identity_ref.namespace.as_deref().unwrap_or_default(),
            &self.identity_ref.name,
        ) {
            None => Err(NoIdentity::Missing),
            Some(map) => ClusterIdentity::from_data(&map.data.clone().unwrap_or_default())
                .map_err(NoIdentity::Damaged),
        };
        let mut peers: Vec<(String, String)> = self
            .peers
            .store
            .state()
            .iter()
            .map(|fc| (fc.spec.cluster_name.clone(), fc.spec.cluster_id.to_string()))
            .collect();
        peers.sort();
        Known { identity, peers }
    }
}
