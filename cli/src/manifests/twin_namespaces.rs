//! The admission policies that confine a peer on its provider to its own
//! twin namespaces (`liqo-peer-namespaces`, `liqo-peer-rolebindings`), and
//! that keep pods out of a twin namespace until it has its share of the
//! grant (`liqo-twin-share`).

use liqo_api::names::labels;
use serde_json::json;

use super::{Manifest, cluster_meta, from_json};

/// The prefix of every peer identity's user name (see
/// `liqo_api::authentication::peer_user`); CEL takes the cluster ID after it.
const PEER_PREFIX: &str = "liqo.io:peer:";

/// What a peer's identity may do with namespaces and RoleBindings on this
/// cluster when it is a provider, beyond what RBAC can say (docs/offloading.md):
/// RBAC lets a peer create any namespace and RoleBinding; these policies,
/// enforced by the API server itself, confine it to namespaces labelled as
/// its own, and to binding its own ClusterRole to itself there. Installed
/// on every cluster, as any cluster may become a provider.
pub fn twin_namespace_policies() -> Vec<Manifest> {
    let tenant = labels::TENANT;
    let prefix = PEER_PREFIX;
    let is_peer = json!([{
        "name": "is-a-peer",
        "expression": format!("request.userInfo.username.startsWith('{prefix}')"),
    }]);
    let variables = json!([{
        "name": "tenant",
        "expression": format!("request.userInfo.username.substring({})", prefix.len()),
    }]);
    // A namespace's tenant label, or "" when it has none.
    let label_of = |obj: &str| {
        format!(
            "(has({obj}.metadata.labels) && '{tenant}' in {obj}.metadata.labels \
             ? {obj}.metadata.labels['{tenant}'] : '')"
        )
    };
    let namespaces = "liqo-peer-namespaces";
    let rolebindings = "liqo-peer-rolebindings";
    let binding = |policy: &str| {
        Manifest::ValidatingAdmissionPolicyBinding(Box::new(from_json(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": cluster_meta(policy, "admission"),
            "spec": { "policyName": policy, "validationActions": ["Deny"] },
        }))))
    };
    vec![
        Manifest::ValidatingAdmissionPolicy(Box::new(from_json(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": cluster_meta(namespaces, "admission"),
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": { "resourceRules": [{
                    "apiGroups": [""],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE", "DELETE"],
                    "resources": ["namespaces", "namespaces/*"],
                }] },
                "matchConditions": is_peer,
                "variables": variables,
                "validations": [
                    {
                        "expression": format!(
                            "request.operation != 'CREATE' || {} == variables.tenant",
                            label_of("object")
                        ),
                        "messageExpression": format!(
                            "'a peer may only create namespaces labelled {tenant}=' + variables.tenant"
                        ),
                        "reason": "Forbidden",
                    },
                    {
                        // The existing namespace decides, so that nobody
                        // else's can be taken over by labelling it.
                        "expression": format!(
                            "request.operation == 'CREATE' || {} == variables.tenant",
                            label_of("oldObject")
                        ),
                        "messageExpression": format!(
                            "'a peer may only change or delete namespaces labelled {tenant}=' + variables.tenant"
                        ),
                        "reason": "Forbidden",
                    },
                    {
                        "expression": format!(
                            "request.operation != 'UPDATE' || {} == variables.tenant",
                            label_of("object")
                        ),
                        "messageExpression": format!(
                            "'a peer may not remove or change the {tenant} label'"
                        ),
                        "reason": "Forbidden",
                    },
                ],
            },
        })))),
        binding(namespaces),
        Manifest::ValidatingAdmissionPolicy(Box::new(from_json(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": cluster_meta(rolebindings, "admission"),
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": { "resourceRules": [{
                    "apiGroups": ["rbac.authorization.k8s.io"],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["rolebindings"],
                }] },
                "matchConditions": is_peer,
                "variables": variables,
                "validations": [
                    {
                        "expression": format!("{} == variables.tenant", label_of("namespaceObject")),
                        "messageExpression": format!(
                            "'a peer may only bind in namespaces labelled {tenant}=' + variables.tenant"
                        ),
                        "reason": "Forbidden",
                    },
                    {
                        "expression": format!(
                            "object.roleRef.apiGroup == 'rbac.authorization.k8s.io' && \
                             object.roleRef.kind == 'ClusterRole' && \
                             object.roleRef.name == 'liqo-tenant-' + variables.tenant"
                        ),
                        "messageExpression": "'a peer may only bind the ClusterRole liqo-tenant-' + variables.tenant",
                        "reason": "Forbidden",
                    },
                    {
                        "expression": "has(object.subjects) && size(object.subjects) == 1 && \
                             object.subjects[0].kind == 'User' && \
                             object.subjects[0].name == request.userInfo.username",
                        "messageExpression": "'a peer may only bind itself'",
                        "reason": "Forbidden",
                    },
                ],
            },
        })))),
        binding(rolebindings),
        share_policy(),
        Manifest::ValidatingAdmissionPolicyBinding(Box::new(from_json(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": cluster_meta(SHARE_POLICY, "admission"),
            "spec": {
                "policyName": SHARE_POLICY,
                "validationActions": ["Deny"],
                // The namespace's own share, found by the labels the
                // gateway gives it (a tenant cannot make quotas).
                "paramRef": {
                    "selector": { "matchLabels": {
                        labels::MANAGED_BY: labels::MANAGED_BY_VALUE,
                        labels::COMPONENT: "gateway",
                    } },
                    "parameterNotFoundAction": "Deny",
                },
            },
        })))),
    ]
}

/// The admission policy that refuses pods in a twin namespace until it
/// has its share of the grant (the ResourceQuota the provider's gateway
/// makes): a new twin is not usable before the grant bounds it.
pub const SHARE_POLICY: &str = "liqo-twin-share";

fn share_policy() -> Manifest {
    let share = liqo_api::shares::SHARE_QUOTA;
    Manifest::ValidatingAdmissionPolicy(Box::new(from_json(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": cluster_meta(SHARE_POLICY, "admission"),
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": { "apiVersion": "v1", "kind": "ResourceQuota" },
            "matchConstraints": {
                "namespaceSelector": { "matchExpressions": [
                    { "key": labels::TENANT, "operator": "Exists" },
                ] },
                "resourceRules": [{
                    "apiGroups": [""],
                    "apiVersions": ["*"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                }],
            },
            "validations": [{
                "expression": format!("params.metadata.name == '{share}'"),
                "messageExpression": format!(
                    "'pods in a twin namespace need its share of the grant (ResourceQuota {share}), \
                     which the provider\\'s liqo-gateway makes'"
                ),
                "reason": "Forbidden",
            }],
        },
    }))))
}
