//! The node's heartbeat Lease in `kube-node-lease`, renewed as a kubelet
//! renews its own, and owned by the Node so that it goes with it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::watch;

use super::FIELD_MANAGER;
use crate::forge;

/// A kubelet renews every quarter of the lease's duration.
const RENEW: Duration = Duration::from_secs(10);
/// After a failed renewal, try again sooner.
const RETRY: Duration = Duration::from_secs(2);

/// Renews the Lease while the Node is registered (`registered` holds its
/// UID).
pub async fn keep_lease(
    client: kube::Client,
    node_name: String,
    mut registered: watch::Receiver<Option<String>>,
) {
    let leases: Api<Lease> = Api::namespaced(client, forge::LEASE_NAMESPACE);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut failing = false;
    loop {
        let uid = registered.borrow_and_update().clone();
        let Some(uid) = uid else {
            if registered.changed().await.is_err() {
                return;
            }
            continue;
        };
        let lease = forge::lease(&node_name, &uid, &MicroTime(Timestamp::now()));
        let body = serde_json::to_value(&lease).map(|mut v| {
            v["apiVersion"] = "coordination.k8s.io/v1".into();
            v["kind"] = "Lease".into();
            v
        });
        let result = match body {
            Ok(body) => leases
                .patch(&node_name, &params, &Patch::Apply(&body))
                .await
                .map(|_| ()),
            Err(e) => Err(kube::Error::SerdeError(e)),
        };
        let wait = match result {
            Ok(()) => {
                if failing {
                    tracing::info!("lease renewed again");
                }
                failing = false;
                RENEW
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(%error, "cannot renew the node's lease");
                }
                failing = true;
                RETRY
            }
        };
        // A new Node (new UID) gets its Lease at once.
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            changed = registered.changed() => if changed.is_err() { return },
        }
    }
}
