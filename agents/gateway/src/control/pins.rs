//! The network each tenant's end of the tunnel is fixed to: the pod CIDR
//! its consumer stated when it peered, in its Tenant record
//! (`spec.podCidr`, written by `liqoctl peer`), or, for a tenant made for
//! a peering token before its consumer was known, the first one its
//! Connection named (`status.podCidr`, written here once). The consumer
//! may write its Connection; it cannot move the range routed into its
//! tunnel: the provider's admission policy `liqo-peer-connections` refuses
//! another range, and a Connection written before that policy is not run
//! with it (docs/network.md, "What a peer may name").

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use liqo_api::authentication::Tenant;
use liqo_api::names::peering::TENANT_NAMESPACE_PREFIX;
use liqo_api::networking::Connection;
use serde_json::json;

use super::MANAGER;

/// How long a tenant's pin is taken as read: its administrator may change
/// the record's spec.
const REREAD: Duration = Duration::from_secs(10);

/// The pins as last read, per tenant namespace.
pub(super) struct Pins {
    client: kube::Client,
    read: HashMap<String, (Option<String>, Instant)>,
}

impl Pins {
    pub(super) fn new(client: kube::Client) -> Self {
        Self {
            client,
            read: HashMap::new(),
        }
    }

    /// The pod CIDR each tenant namespace's Connections must name, for the
    /// namespaces of `connections`; a tenant that has none yet is pinned
    /// to its Connection's now.
    pub(super) async fn of(&mut self, connections: &[Arc<Connection>]) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for c in connections {
            let Some(namespace) = c.namespace() else {
                continue;
            };
            let Some(id) = namespace.strip_prefix(TENANT_NAMESPACE_PREFIX) else {
                continue;
            };
            if let Some((pin, at)) = self.read.get(&namespace)
                && (at.elapsed() < REREAD)
            {
                if let Some(pin) = pin {
                    out.insert(namespace, pin.clone());
                }
                continue;
            }
            let pin = match self.read_or_pin(id, &c.spec.pod_cidr).await {
                Ok(pin) => pin,
                Err(e) => {
                    tracing::warn!(tenant = id, error = %e, "cannot read the tenant's pod CIDR");
                    continue;
                }
            };
            self.read
                .insert(namespace.clone(), (pin.clone(), Instant::now()));
            if let Some(pin) = pin {
                out.insert(namespace, pin);
            }
        }
        self.read.retain(|_, (_, at)| at.elapsed() < REREAD * 6);
        out
    }

    /// Tenant `id`'s pin; `named`, the CIDR its Connection names, becomes
    /// it where it has none. `None` when there is no such tenant.
    async fn read_or_pin(&self, id: &str, named: &str) -> Result<Option<String>, kube::Error> {
        let api: Api<Tenant> = Api::all(self.client.clone());
        let Some(tenant) = api.get_opt(id).await? else {
            return Ok(None);
        };
        if let Some(pin) = tenant.pinned_pod_cidr() {
            return Ok(Some(pin.to_owned()));
        }
        let params = PatchParams {
            field_manager: Some(MANAGER.to_owned()),
            ..PatchParams::default()
        };
        api.patch_status(
            id,
            &params,
            &Patch::Merge(json!({ "status": { "podCidr": named } })),
        )
        .await?;
        tracing::info!(
            tenant = id,
            pod_cidr = named,
            "the tenant's pod CIDR is fixed"
        );
        Ok(Some(named.to_owned()))
    }
}
