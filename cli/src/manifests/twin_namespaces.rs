//! The admission policies that confine a peer on its provider to its own
//! twin namespaces (`liqo-peer-namespaces`, `liqo-peer-rolebindings`), and
//! that keep pods out of a twin namespace until it has its share of the
//! grant (`liqo-twin-share`).

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, ParamKind, ParamRef, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use liqo_api::names::labels;

use super::validation::{deny_binding, forbidden, match_condition, resource_rule, variable};
use super::{Manifest, cluster_meta};

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
    let is_peer = || {
        Some(vec![match_condition(
            "is-a-peer",
            format!("request.userInfo.username.startsWith('{prefix}')"),
        )])
    };
    let variables = || {
        Some(vec![variable(
            "tenant",
            format!("request.userInfo.username.substring({})", prefix.len()),
        )])
    };
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
        deny_binding(
            cluster_meta(policy, "admission"),
            policy,
            ValidatingAdmissionPolicyBindingSpec::default(),
        )
    };
    // A policy on what a peer asks of `resources`, checked by `validations`.
    let policy = |name: &str, rule, validations| {
        Manifest::ValidatingAdmissionPolicy(Box::new(ValidatingAdmissionPolicy {
            metadata: cluster_meta(name, "admission"),
            spec: Some(ValidatingAdmissionPolicySpec {
                failure_policy: Some("Fail".to_owned()),
                match_constraints: Some(MatchResources {
                    resource_rules: Some(vec![rule]),
                    ..Default::default()
                }),
                match_conditions: is_peer(),
                variables: variables(),
                validations: Some(validations),
                ..Default::default()
            }),
            ..Default::default()
        }))
    };
    vec![
        policy(
            namespaces,
            resource_rule(
                &[""],
                &["CREATE", "UPDATE", "DELETE"],
                &["namespaces", "namespaces/*"],
            ),
            vec![
                forbidden(
                    format!(
                        "request.operation != 'CREATE' || {} == variables.tenant",
                        label_of("object")
                    ),
                    format!(
                        "'a peer may only create namespaces labelled {tenant}=' + variables.tenant"
                    ),
                ),
                // The existing namespace decides, so that nobody else's
                // can be taken over by labelling it.
                forbidden(
                    format!(
                        "request.operation == 'CREATE' || {} == variables.tenant",
                        label_of("oldObject")
                    ),
                    format!(
                        "'a peer may only change or delete namespaces labelled {tenant}=' + variables.tenant"
                    ),
                ),
                forbidden(
                    format!(
                        "request.operation != 'UPDATE' || {} == variables.tenant",
                        label_of("object")
                    ),
                    format!("'a peer may not remove or change the {tenant} label'"),
                ),
            ],
        ),
        binding(namespaces),
        policy(
            rolebindings,
            resource_rule(
                &["rbac.authorization.k8s.io"],
                &["CREATE", "UPDATE"],
                &["rolebindings"],
            ),
            vec![
                forbidden(
                    format!("{} == variables.tenant", label_of("namespaceObject")),
                    format!(
                        "'a peer may only bind in namespaces labelled {tenant}=' + variables.tenant"
                    ),
                ),
                forbidden(
                    "object.roleRef.apiGroup == 'rbac.authorization.k8s.io' && \
                     object.roleRef.kind == 'ClusterRole' && \
                     object.roleRef.name == 'liqo-tenant-' + variables.tenant",
                    "'a peer may only bind the ClusterRole liqo-tenant-' + variables.tenant",
                ),
                forbidden(
                    "has(object.subjects) && size(object.subjects) == 1 && \
                     object.subjects[0].kind == 'User' && \
                     object.subjects[0].name == request.userInfo.username",
                    "'a peer may only bind itself'",
                ),
            ],
        ),
        binding(rolebindings),
        share_policy(),
        deny_binding(
            cluster_meta(SHARE_POLICY, "admission"),
            SHARE_POLICY,
            ValidatingAdmissionPolicyBindingSpec {
                // The namespace's own share, found by the labels the
                // gateway gives it (a tenant cannot make quotas).
                param_ref: Some(ParamRef {
                    selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([
                            (
                                labels::MANAGED_BY.to_owned(),
                                labels::MANAGED_BY_VALUE.to_owned(),
                            ),
                            (labels::COMPONENT.to_owned(), "gateway".to_owned()),
                        ])),
                        ..Default::default()
                    }),
                    parameter_not_found_action: Some("Deny".to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ),
    ]
}

/// The admission policy that refuses pods in a twin namespace until it
/// has its share of the grant (the ResourceQuota the provider's gateway
/// makes): a new twin is not usable before the grant bounds it.
pub const SHARE_POLICY: &str = "liqo-twin-share";

fn share_policy() -> Manifest {
    let share = liqo_api::shares::SHARE_QUOTA;
    Manifest::ValidatingAdmissionPolicy(Box::new(ValidatingAdmissionPolicy {
        metadata: cluster_meta(SHARE_POLICY, "admission"),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_owned()),
            param_kind: Some(ParamKind {
                api_version: Some("v1".to_owned()),
                kind: Some("ResourceQuota".to_owned()),
            }),
            match_constraints: Some(MatchResources {
                namespace_selector: Some(LabelSelector {
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: labels::TENANT.to_owned(),
                        operator: "Exists".to_owned(),
                        values: None,
                    }]),
                    ..Default::default()
                }),
                // Everything a peer may make there (and what the
                // provider's controllers make from it), so that a new
                // twin holds nothing its share does not count.
                resource_rules: Some(vec![
                    resource_rule(
                        &[""],
                        &["CREATE"],
                        &[
                            "pods",
                            "configmaps",
                            "secrets",
                            "services",
                            "persistentvolumeclaims",
                        ],
                    ),
                    resource_rule(&["apps"], &["CREATE"], &["replicasets"]),
                    resource_rule(&["batch"], &["CREATE"], &["jobs"]),
                    resource_rule(&["discovery.k8s.io"], &["CREATE"], &["endpointslices"]),
                ]),
                ..Default::default()
            }),
            validations: Some(vec![forbidden(
                format!("params.metadata.name == '{share}'"),
                format!(
                    "'objects in a twin namespace need its share of the grant (ResourceQuota {share}), \
                     which the provider\\'s liqo-gateway makes'"
                ),
            )]),
            ..Default::default()
        }),
        ..Default::default()
    }))
}
