//! The pieces of RBAC objects every builder of manifests uses, typed:
//! rules, role references and subjects.

use k8s_openapi::api::rbac::v1::{PolicyRule, RoleRef, Subject};

use super::strings;

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// A rule on `resources` of `groups`, whatever their names.
pub(crate) fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..Default::default()
    }
}

/// A rule on the objects `names` of `resources` only.
pub(crate) fn named_rule<S: AsRef<str>>(
    groups: &[&str],
    resources: &[&str],
    names: &[S],
    verbs: &[&str],
) -> PolicyRule {
    PolicyRule {
        resource_names: Some(names.iter().map(|n| n.as_ref().to_owned()).collect()),
        ..rule(groups, resources, verbs)
    }
}

/// A reference to the Role or ClusterRole (`kind`) `name`.
pub(crate) fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: RBAC_GROUP.to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
    }
}

/// The ServiceAccount `name` in `namespace`, as a subject.
pub(crate) fn service_account(name: &str, namespace: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".to_owned(),
        name: name.to_owned(),
        namespace: Some(namespace.to_owned()),
        api_group: None,
    }
}

/// The user `name`, as a subject.
pub(crate) fn user(name: &str) -> Subject {
    Subject {
        kind: "User".to_owned(),
        name: name.to_owned(),
        api_group: Some(RBAC_GROUP.to_owned()),
        namespace: None,
    }
}
