//! The placement webhook that stands in for the placement policies where
//! MutatingAdmissionPolicy is not served: its Service, its configuration,
//! and the names of its serving certificate's Secret and port.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{Secret, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use liqo_api::names::{self, labels};

use super::{Manifest, cluster_meta, label_in, meta, selector_labels, strings};

/// The placement webhook's objects and its Secret, by kind and name.
pub fn placement_webhook_objects() -> Vec<Manifest> {
    let mut out = placement_webhook("");
    out.push(Manifest::Secret(Secret {
        metadata: meta(PLACEMENT_TLS_SECRET, "placement"),
        ..Default::default()
    }));
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
    let entry = |name: &str, strategy: &str, path: &str| MutatingWebhook {
        name: name.to_owned(),
        client_config: WebhookClientConfig {
            service: Some(ServiceReference {
                namespace: names::NAMESPACE.to_owned(),
                name: PLACEMENT_WEBHOOK.to_owned(),
                path: Some(path.to_owned()),
                port: Some(443),
            }),
            ca_bundle: Some(ByteString(ca_pem.as_bytes().to_vec())),
            ..Default::default()
        },
        rules: Some(vec![RuleWithOperations {
            api_groups: Some(strings(&[""])),
            api_versions: Some(strings(&["v1"])),
            operations: Some(strings(&["CREATE"])),
            resources: Some(strings(&["pods"])),
            scope: Some("Namespaced".to_owned()),
        }]),
        namespace_selector: Some(LabelSelector {
            match_expressions: Some(vec![
                label_in(labels::OFFLOADING, &["true"]),
                label_in(labels::POD_OFFLOADING_STRATEGY, &[strategy]),
            ]),
            ..Default::default()
        }),
        failure_policy: Some("Ignore".to_owned()),
        side_effects: "None".to_owned(),
        admission_review_versions: strings(&["v1"]),
        timeout_seconds: Some(5),
        reinvocation_policy: Some("Never".to_owned()),
        ..Default::default()
    };
    vec![
        Manifest::Service(Box::new(Service {
            metadata: meta(PLACEMENT_WEBHOOK, "placement"),
            spec: Some(ServiceSpec {
                // Every virtual kubelet, whichever provider it stands for.
                selector: Some(selector_labels("virtual-kubelet")),
                ports: Some(vec![ServicePort {
                    name: Some("webhook".to_owned()),
                    port: 443,
                    target_port: Some(IntOrString::Int(PLACEMENT_PORT.into())),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        })),
        Manifest::MutatingWebhookConfiguration(Box::new(MutatingWebhookConfiguration {
            metadata: cluster_meta(PLACEMENT_WEBHOOK, "placement"),
            webhooks: Some(vec![
                entry("remote.placement.liqo.io", "Remote", "/placement/remote"),
                entry(
                    "local-and-remote.placement.liqo.io",
                    "LocalAndRemote",
                    "/placement/local-and-remote",
                ),
            ]),
        })),
    ]
}
