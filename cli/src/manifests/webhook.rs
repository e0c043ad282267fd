//! The placement webhook that stands in for the placement policies where
//! MutatingAdmissionPolicy is not served: its Service, its configuration,
//! and the names of its serving certificate's Secret and port.

use liqo_api::names::{self, labels};
use serde_json::json;

use super::{Manifest, cluster_meta, from_json, meta, selector_labels};

/// The placement webhook's objects and its Secret, by kind and name.
pub fn placement_webhook_objects() -> Vec<Manifest> {
    let mut out = placement_webhook("");
    out.push(Manifest::Secret(from_json(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta(PLACEMENT_TLS_SECRET, "placement"),
    }))));
    out
}

/// The placement webhook's Service and configuration.
pub const PLACEMENT_WEBHOOK: &str = "liqo-placement";
/// The Secret with its serving certificate (`tls.crt`, `tls.key`,
/// `ca.crt`), made by install, read by the virtual kubelets.
pub const PLACEMENT_TLS_SECRET: &str = "liqo-placement-tls";
/// The port the virtual kubelets serve the webhook on.
pub use liqo_api::agents::virtual_kubelet::PLACEMENT_PORT;

/// Placement where MutatingAdmissionPolicy is not served (docs/
/// offloading.md, "Placement"): the same mutations, by a webhook that
/// every virtual kubelet serves behind the Service `liqo-placement`. One
/// entry per strategy, selecting namespaces by their labels as the
/// policies do, so the path tells the strategy. `Ignore` on failure: a
/// pod the webhook did not see tolerates no virtual node and stays local
/// (with no peering there is no virtual kubelet to answer).
pub(super) fn placement_webhook(ca_pem: &str) -> Vec<Manifest> {
    use base64::Engine as _;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let entry = |name: &str, strategy: &str, path: &str| {
        json!({
            "name": name,
            "clientConfig": {
                "service": {
                    "namespace": names::NAMESPACE,
                    "name": PLACEMENT_WEBHOOK,
                    "path": path,
                    "port": 443,
                },
                "caBundle": ca_bundle,
            },
            "rules": [{
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }],
            "namespaceSelector": { "matchExpressions": [
                { "key": labels::OFFLOADING, "operator": "In", "values": ["true"] },
                { "key": labels::POD_OFFLOADING_STRATEGY, "operator": "In", "values": [strategy] },
            ] },
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
            "reinvocationPolicy": "Never",
        })
    };
    vec![
        Manifest::Service(Box::new(from_json(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(PLACEMENT_WEBHOOK, "placement"),
            "spec": {
                // Every virtual kubelet, whichever provider it stands for.
                "selector": selector_labels("virtual-kubelet"),
                "ports": [{ "name": "webhook", "port": 443, "targetPort": PLACEMENT_PORT }],
            },
        })))),
        Manifest::MutatingWebhookConfiguration(Box::new(from_json(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": cluster_meta(PLACEMENT_WEBHOOK, "placement"),
            "webhooks": [
                entry("remote.placement.liqo.io", "Remote", "/placement/remote"),
                entry(
                    "local-and-remote.placement.liqo.io",
                    "LocalAndRemote",
                    "/placement/local-and-remote",
                ),
            ],
        })))),
    ]
}
