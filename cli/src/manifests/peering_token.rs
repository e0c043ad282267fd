//! The admission policy `liqo-peering-tokens`, which narrows what a
//! peering token's bootstrap credential may do (docs/tokens.md).

use liqo_api::names;
use serde_json::json;

use super::{Manifest, cluster_meta, from_json};

/// What a peering token's bootstrap credential may do beyond its RBAC
/// (docs/tokens.md): RBAC lets it create Secrets in `liqo` and mint the
/// credential of its own tenants' accounts; this policy narrows that to
/// creating the claim Secrets of its own token, and to minting only
/// credentials bound to such a claim by UID, which only the claimant learns
/// (from its create). A claimed tenant cannot be claimed again (the Secret
/// exists), and its credential cannot be minted again by another holder of
/// the token (the UID is unknown to it).
pub fn peering_token_policy() -> Vec<Manifest> {
    use liqo_api::token::{CLAIM_SECRET_TYPE, bootstrap_user, objects};
    let name = "liqo-peering-tokens";
    let prefix = bootstrap_user("");
    let peer_prefix = objects::PEER_PREFIX;
    let claim_prefix = objects::CLAIM_PREFIX;
    vec![
        Manifest::ValidatingAdmissionPolicy(Box::new(from_json(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": cluster_meta(name, "admission"),
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": { "resourceRules": [{
                    "apiGroups": [""],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE", "DELETE"],
                    "resources": ["secrets", "serviceaccounts/token"],
                }] },
                "matchConditions": [{
                    "name": "is-a-peering-token",
                    "expression": format!("request.userInfo.username.startsWith('{prefix}')"),
                }],
                "variables": [
                    {
                        "name": "token",
                        "expression": format!("request.userInfo.username.substring({})", prefix.len()),
                    },
                    {
                        "name": "subresource",
                        "expression": "has(request.subResource) ? request.subResource : ''",
                    },
                ],
                "validations": [
                    {
                        "expression": format!(
                            "variables.subresource != '' || \
                             (request.operation == 'DELETE' && request.namespace == '{ns}' && \
                              request.name == '{bootstrap_prefix}' + variables.token) || \
                             (request.operation == 'CREATE' && \
                             request.namespace == '{ns}' && \
                             object.metadata.name.startsWith('{claim_prefix}' + variables.token + '-') && \
                             has(object.type) && object.type == '{CLAIM_SECRET_TYPE}')",
                            ns = names::NAMESPACE,
                            bootstrap_prefix = objects::BOOTSTRAP_PREFIX,
                        ),
                        "messageExpression": format!(
                            "'a peering token may only create the Secrets {claim_prefix}' + variables.token + \
                             '-<tenant>, and delete its own'"
                        ),
                        "reason": "Forbidden",
                    },
                    {
                        "expression": format!(
                            "variables.subresource != 'token' || (has(object.spec.boundObjectRef) && \
                             object.spec.boundObjectRef.kind == 'Secret' && \
                             request.name.startsWith('{peer_prefix}') && \
                             object.spec.boundObjectRef.name == '{claim_prefix}' + variables.token + '-' + \
                               request.name.substring({}) && \
                             has(object.spec.boundObjectRef.uid) && object.spec.boundObjectRef.uid != '')",
                            peer_prefix.len()
                        ),
                        "messageExpression": "'a peering token may only mint credentials bound to its own claim, by UID'",
                        "reason": "Forbidden",
                    },
                ],
            },
        })))),
        Manifest::ValidatingAdmissionPolicyBinding(Box::new(from_json(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": cluster_meta(name, "admission"),
            "spec": { "policyName": name, "validationActions": ["Deny"] },
        })))),
    ]
}
