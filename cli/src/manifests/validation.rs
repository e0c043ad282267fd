//! The pieces of the validating admission policies every builder of
//! manifests uses, typed: what they match, their variables and checks,
//! and their bindings.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, NamedRuleWithOperations, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{Manifest, strings};

/// The requests of `operations` on `resources` of `groups`, at any version.
pub(crate) fn resource_rule(
    groups: &[&str],
    operations: &[&str],
    resources: &[&str],
) -> NamedRuleWithOperations {
    NamedRuleWithOperations {
        api_groups: Some(strings(groups)),
        api_versions: Some(strings(&["*"])),
        operations: Some(strings(operations)),
        resources: Some(strings(resources)),
        ..Default::default()
    }
}

/// The condition `name` a request must meet to be checked at all.
pub(crate) fn match_condition(name: &str, expression: String) -> MatchCondition {
    MatchCondition {
        name: name.to_owned(),
        expression,
    }
}

/// The variable `name`, as the checks read it.
pub(crate) fn variable(name: &str, expression: impl Into<String>) -> Variable {
    Variable {
        name: name.to_owned(),
        expression: expression.into(),
    }
}

/// A check: what `expression` refuses is forbidden, and
/// `message_expression` says why.
pub(crate) fn forbidden(
    expression: impl Into<String>,
    message_expression: impl Into<String>,
) -> Validation {
    Validation {
        expression: expression.into(),
        message_expression: Some(message_expression.into()),
        reason: Some("Forbidden".to_owned()),
        ..Default::default()
    }
}

/// The binding `metadata` of `policy`, which denies what it refuses, with
/// `spec`'s parameter and resources.
pub(crate) fn deny_binding(
    metadata: ObjectMeta,
    policy: &str,
    spec: ValidatingAdmissionPolicyBindingSpec,
) -> Manifest {
    Manifest::ValidatingAdmissionPolicyBinding(Box::new(ValidatingAdmissionPolicyBinding {
        metadata,
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(policy.to_owned()),
            validation_actions: Some(strings(&["Deny"])),
            ..spec
        }),
    }))
}
