//! The admission policy `liqo-peering-tokens`, which narrows what a
//! peering token's bootstrap credential may do (docs/tokens.md).

use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec,
};
use liqo_api::names;

use super::validation::{deny_binding, forbidden, match_condition, resource_rule, variable};
use super::{Manifest, cluster_meta};

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
    let policy = ValidatingAdmissionPolicy {
        metadata: cluster_meta(name, "admission"),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_owned()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![resource_rule(
                    &[""],
                    &["CREATE", "UPDATE", "DELETE"],
                    &["secrets", "serviceaccounts/token"],
                )]),
                ..Default::default()
            }),
            match_conditions: Some(vec![match_condition(
                "is-a-peering-token",
                format!("request.userInfo.username.startsWith('{prefix}')"),
            )]),
            variables: Some(vec![
                variable(
                    "token",
                    format!("request.userInfo.username.substring({})", prefix.len()),
                ),
                variable(
                    "subresource",
                    "has(request.subResource) ? request.subResource : ''",
                ),
            ]),
            validations: Some(vec![
                forbidden(
                    format!(
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
                    format!(
                        "'a peering token may only create the Secrets {claim_prefix}' + variables.token + \
                         '-<tenant>, and delete its own'"
                    ),
                ),
                forbidden(
                    format!(
                        "variables.subresource != 'token' || (has(object.spec.boundObjectRef) && \
                         object.spec.boundObjectRef.kind == 'Secret' && \
                         request.name.startsWith('{peer_prefix}') && \
                         object.spec.boundObjectRef.name == '{claim_prefix}' + variables.token + '-' + \
                           request.name.substring({}) && \
                         has(object.spec.boundObjectRef.uid) && object.spec.boundObjectRef.uid != '')",
                        peer_prefix.len()
                    ),
                    "'a peering token may only mint credentials bound to its own claim, by UID'",
                ),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    };
    vec![
        Manifest::ValidatingAdmissionPolicy(Box::new(policy)),
        deny_binding(
            cluster_meta(name, "admission"),
            name,
            ValidatingAdmissionPolicyBindingSpec::default(),
        ),
    ]
}
