//! An object the test's API server is to refuse, for real: a
//! ValidatingAdmissionPolicy and its binding refuse creating it, as an
//! administrator's policy or a webhook would, so that a command fails in
//! the middle of its work (and must roll back).

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use serde_json::json;

use crate::wait_for;

/// What `holdings` differences the test's own policies make: pass it to
/// `assert_as_before` among what it may ignore.
pub const TEST_POLICIES: &str = "validatingadmissionpolic";

const POLICY: &str = "liqo-test-refuse";
/// A ConfigMap name the policy also refuses: a dry-run create of it tells
/// when the API server enforces the policy (it loads policies
/// asynchronously), and when it no longer does.
const PROBE: &str = "liqo-test-vap-probe";

fn policy_resource() -> ApiResource {
    ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: "ValidatingAdmissionPolicy".into(),
        plural: "validatingadmissionpolicies".into(),
    }
}

fn binding_resource() -> ApiResource {
    ApiResource {
        kind: "ValidatingAdmissionPolicyBinding".into(),
        plural: "validatingadmissionpolicybindings".into(),
        ..policy_resource()
    }
}

/// One object the API server is to refuse on creation (or on another
/// operation).
#[derive(Debug)]
pub struct Refusal {
    /// The API group, version and plural of its resource.
    pub group: &'static str,
    pub version: &'static str,
    pub resource: &'static str,
    /// `CREATE`, `UPDATE` or `DELETE`.
    pub operation: &'static str,
    /// CEL, true for the object to refuse (`oldObject` on `DELETE`).
    pub refuse: String,
    /// The status reason: `Forbidden` (403) as an admission webhook
    /// would, or none (422 Invalid, the policy's default).
    pub reason: Option<&'static str>,
}

impl Refusal {
    /// Refuses the objects of `resource` named `name`, with 403.
    pub fn named(group: &'static str, resource: &'static str, name: &str) -> Self {
        Self {
            group,
            version: "*",
            resource,
            operation: "CREATE",
            refuse: format!("object.metadata.name == '{name}'"),
            reason: Some("Forbidden"),
        }
    }
}

/// Installs the policy and its binding, and waits until the API server
/// enforces them.
pub async fn refuse(client: &kube::Client, r: &Refusal) -> Result<()> {
    let mut validation = json!({
        "expression": format!(
            "!(({}) || (request.resource.resource == 'configmaps' && object.metadata.name == '{PROBE}'))",
            r.refuse
        ),
        "message": format!("refused by the test's admission policy {POLICY}"),
    });
    if let Some(reason) = r.reason {
        validation["reason"] = json!(reason);
    }
    let policy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": { "name": POLICY },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": { "resourceRules": [
                {
                    "apiGroups": [r.group],
                    "apiVersions": [r.version],
                    "resources": [r.resource],
                    "operations": [r.operation],
                },
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["configmaps"],
                },
            ]},
            "validations": [validation],
        },
    }))?;
    let binding: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": { "name": POLICY },
        "spec": { "policyName": POLICY, "validationActions": ["Deny"] },
    }))?;
    Api::<DynamicObject>::all_with(client.clone(), &policy_resource())
        .create(&PostParams::default(), &policy)
        .await
        .context("creating the admission policy")?;
    Api::<DynamicObject>::all_with(client.clone(), &binding_resource())
        .create(&PostParams::default(), &binding)
        .await
        .context("creating the admission policy binding")?;
    wait_for(
        "the admission policy to be enforced",
        Duration::from_secs(30),
        || probe_refused(client.clone()),
    )
    .await
}

/// Removes the policy and waits until the API server no longer enforces it.
pub async fn allow(client: &kube::Client) -> Result<()> {
    for resource in [binding_resource(), policy_resource()] {
        Api::<DynamicObject>::all_with(client.clone(), &resource)
            .delete(POLICY, &DeleteParams::default())
            .await
            .context("deleting the admission policy")?;
    }
    wait_for(
        "the admission policy to be lifted",
        Duration::from_secs(30),
        || {
            let client = client.clone();
            async move { Ok(!probe_refused(client).await?) }
        },
    )
    .await
}

/// Whether a dry-run create of the probe ConfigMap is refused.
async fn probe_refused(client: kube::Client) -> Result<bool> {
    let cm: ConfigMap = serde_json::from_value(json!({ "metadata": { "name": PROBE } }))?;
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match Api::<ConfigMap>::namespaced(client, "default")
        .create(&params, &cm)
        .await
    {
        Ok(_) => Ok(false),
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => Ok(true),
        Err(e) => Err(e.into()),
    }
}
