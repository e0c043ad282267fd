//! The consumer's side of claims kept on providers (docs/storage.md): the
//! StorageClass whose volumes the virtual kubelets provision on the
//! provider a pod lands on, and the policy that gives it to the claims of
//! namespaces whose pods all run on providers.

use k8s_openapi::api::admissionregistration::v1beta1::{
    JSONPatch, MatchResources, MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
    MutatingAdmissionPolicyBindingSpec, MutatingAdmissionPolicySpec, Mutation,
    NamedRuleWithOperations,
};
use k8s_openapi::api::core::v1::{TopologySelectorLabelRequirement, TopologySelectorTerm};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use liqo_api::names::{self, labels};

use super::{Manifest, cluster_meta, label_in, strings};

/// The policy that gives [`names::STORAGE_CLASS`] to the claims of
/// namespaces offloaded with `Remote`.
pub const CLAIMS_POLICY: &str = "liqo-offloading-claims";

/// The StorageClass `liqo`: provisioned by the virtual kubelet of the
/// virtual node the scheduler picks for a pod that uses the claim
/// (`WaitForFirstConsumer`), and only there (`allowedTopologies`: virtual
/// nodes), so that a pod with such a claim goes to a provider. Deleting a
/// claim deletes its volume on the provider; a claim may grow where the
/// provider's class lets it.
pub fn storage_class() -> Manifest {
    Manifest::StorageClass(Box::new(StorageClass {
        metadata: cluster_meta(names::STORAGE_CLASS, "storage"),
        provisioner: names::STORAGE_PROVISIONER.to_owned(),
        reclaim_policy: Some("Delete".to_owned()),
        volume_binding_mode: Some("WaitForFirstConsumer".to_owned()),
        allow_volume_expansion: Some(true),
        allowed_topologies: Some(vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: labels::VIRTUAL_NODE.to_owned(),
                values: vec!["true".to_owned()],
            }]),
        }]),
        parameters: None,
        mount_options: None,
    }))
}

/// In a namespace offloaded with `Remote`, every pod runs on a provider,
/// so a claim of any other class could never be used there: a new claim
/// gets the class `liqo` whatever it named (the cluster's default class is
/// filled in before this policy runs, so "none" cannot be told apart).
/// Namespaces offloaded with `LocalAndRemote` keep their claims' classes:
/// a claim there goes to a provider when it names `liqo`.
pub fn claims_policy() -> Vec<Manifest> {
    let class = names::STORAGE_CLASS;
    let set = format!(
        "has(object.spec.storageClassName) \
         ? [JSONPatch{{op: 'replace', path: '/spec/storageClassName', value: '{class}'}}] \
         : [JSONPatch{{op: 'add', path: '/spec/storageClassName', value: '{class}'}}]"
    );
    let new_claims = MatchResources {
        resource_rules: Some(vec![NamedRuleWithOperations {
            api_groups: Some(strings(&[""])),
            api_versions: Some(strings(&["v1"])),
            operations: Some(strings(&["CREATE"])),
            resources: Some(strings(&["persistentvolumeclaims"])),
            ..Default::default()
        }]),
        namespace_selector: Some(LabelSelector {
            match_expressions: Some(vec![
                label_in(labels::OFFLOADING, &["true"]),
                label_in(labels::POD_OFFLOADING_STRATEGY, &["Remote"]),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    };
    vec![
        Manifest::MutatingAdmissionPolicy(Box::new(MutatingAdmissionPolicy {
            metadata: cluster_meta(CLAIMS_POLICY, "storage"),
            spec: Some(MutatingAdmissionPolicySpec {
                failure_policy: Some("Fail".to_owned()),
                reinvocation_policy: Some("Never".to_owned()),
                match_constraints: Some(new_claims),
                mutations: Some(vec![Mutation {
                    patch_type: "JSONPatch".to_owned(),
                    json_patch: Some(JSONPatch {
                        expression: Some(set),
                    }),
                    ..Default::default()
                }]),
                match_conditions: Some(vec![
                    k8s_openapi::api::admissionregistration::v1beta1::MatchCondition {
                        name: "not-liqo-yet".to_owned(),
                        expression: format!(
                            "!has(object.spec.storageClassName) || object.spec.storageClassName != '{class}'"
                        ),
                    },
                ]),
                ..Default::default()
            }),
        })),
        Manifest::MutatingAdmissionPolicyBinding(Box::new(MutatingAdmissionPolicyBinding {
            metadata: cluster_meta(CLAIMS_POLICY, "storage"),
            spec: Some(MutatingAdmissionPolicyBindingSpec {
                policy_name: Some(CLAIMS_POLICY.to_owned()),
                ..Default::default()
            }),
        })),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_class_is_provisioned_on_virtual_nodes_only() {
        let Manifest::StorageClass(class) = storage_class() else {
            panic!("a StorageClass");
        };
        assert_eq!(class.provisioner, names::STORAGE_PROVISIONER);
        assert_eq!(
            class.volume_binding_mode.as_deref(),
            Some("WaitForFirstConsumer")
        );
        let terms = class.allowed_topologies.expect("topologies");
        let requirement = &terms[0].match_label_expressions.as_ref().expect("labels")[0];
        assert_eq!(
            (requirement.key.as_str(), requirement.values.clone()),
            (labels::VIRTUAL_NODE, vec!["true".to_owned()])
        );
        let _: std::collections::BTreeMap<String, String> =
            class.metadata.labels.expect("our labels");
    }
}
