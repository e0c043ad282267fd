//! What a provider's API server refuses from its peers, as admission
//! policies it enforces alone (docs/offloading.md, "What a peer may run").
//!
//! [`policies`] are installed on every cluster by `liqoctl install` (any
//! cluster may become a provider): they say what no peer may do, and how
//! each peer's own terms are read. The terms themselves are the peer's
//! [`liqo_api::admission::Admission`], in its Tenant record, which each
//! policy takes as its parameter through a binding of that peer's
//! ([`bindings`], written by `liqoctl peer` with the tenant, before any of
//! its rights). The peer's own credential cannot change any of them.

use liqo_api::ClusterId;
use liqo_api::admission::{ALWAYS_TOLERATED, labels as pss};
use liqo_api::names::{labels, peering};
use serde_json::json;

use crate::manifests::{Manifest, cluster_meta, from_json};

/// Pods in a peer's namespaces, whoever makes them (the provider's
/// ReplicaSet and Job controllers make them from the peer's templates).
pub const PODS: &str = "liqo-peer-pods";
/// ReplicaSets and Jobs a peer writes: their pod templates, refused at
/// once rather than pod by pod.
pub const WORKLOADS: &str = "liqo-peer-workloads";
/// Services a peer writes.
pub const SERVICES: &str = "liqo-peer-services";
/// EndpointSlices a peer writes.
pub const ENDPOINT_SLICES: &str = "liqo-peer-endpointslices";
/// The Pod Security labels of the namespaces a peer creates.
pub const POD_SECURITY: &str = "liqo-peer-pod-security";
/// Secrets a peer writes.
pub const SECRETS: &str = "liqo-peer-secrets";

/// The prefix of every peer identity's user name (see
/// [`liqo_api::authentication::peer_user`]).
const PEER_PREFIX: &str = "liqo.io:peer:";

/// Every policy a provider needs, in the order they are applied.
pub fn policies() -> Vec<Manifest> {
    vec![
        pod_policy(PODS),
        pod_policy(WORKLOADS),
        services_policy(),
        endpoint_slices_policy(),
        pod_security_policy(),
        secrets_policy(),
        // No parameter: one binding for every peer.
        binding_of(SECRETS, cluster_meta(SECRETS, "admission"), json!({})),
    ]
}

/// The names of the policies that take a peer's terms, with a binding per
/// peer.
pub const BOUND_PER_PEER: [&str; 5] = [PODS, WORKLOADS, SERVICES, ENDPOINT_SLICES, POD_SECURITY];

/// The name of `consumer`'s binding of `policy`.
pub fn binding_name(policy: &str, consumer: &ClusterId) -> String {
    format!("{policy}-{consumer}")
}

/// The bindings that apply `consumer`'s terms (its Tenant record; for
/// EndpointSlices, its end of the tunnel) to what it does in its own
/// namespaces.
pub fn bindings(consumer: &ClusterId, tenant_labels: &serde_json::Value) -> Vec<Manifest> {
    let id = consumer.as_str();
    let own_namespaces = json!({ "namespaceSelector": { "matchLabels": { labels::TENANT: id } } });
    let tenant = json!({ "name": id, "parameterNotFoundAction": "Deny" });
    BOUND_PER_PEER
        .iter()
        .map(|policy| {
            let name = binding_name(policy, consumer);
            let meta = json!({ "name": name, "labels": tenant_labels });
            let spec = match *policy {
                // The namespaces it creates are selected by their own
                // label (a namespace has no namespace to select).
                POD_SECURITY => json!({
                    "paramRef": tenant,
                    "matchResources": { "objectSelector": { "matchLabels": { labels::TENANT: id } } },
                }),
                // Where the provider sees its pods: its end of the tunnel,
                // which only the provider's gateway gives a status. It is
                // named after the consumer's cluster ID, which a tenant
                // made for a peering token does not know: every Connection
                // of the tenant's namespace is a parameter, and each must
                // admit the request (one the consumer adds has no status,
                // and admits nothing).
                ENDPOINT_SLICES => json!({
                    "paramRef": {
                        "namespace": peering::tenant_namespace(consumer),
                        "selector": {},
                        "parameterNotFoundAction": "Deny",
                    },
                    "matchResources": own_namespaces,
                }),
                _ => json!({ "paramRef": tenant, "matchResources": own_namespaces }),
            };
            binding_of(policy, meta, spec)
        })
        .collect()
}

fn binding_of(policy: &str, meta: serde_json::Value, spec: serde_json::Value) -> Manifest {
    let mut spec = spec;
    spec["policyName"] = json!(policy);
    spec["validationActions"] = json!(["Deny"]);
    Manifest::ValidatingAdmissionPolicyBinding(Box::new(from_json(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": meta,
        "spec": spec,
    }))))
}

/// Requests made by a peer's own credential.
fn by_a_peer() -> serde_json::Value {
    json!([{
        "name": "by-a-peer",
        "expression": format!("request.userInfo.username.startsWith('{PEER_PREFIX}')"),
    }])
}

fn policy(
    name: &str,
    param_kind: serde_json::Value,
    resources: serde_json::Value,
    match_conditions: Option<serde_json::Value>,
    variables: serde_json::Value,
    validations: Vec<serde_json::Value>,
) -> Manifest {
    let mut spec = json!({
        "failurePolicy": "Fail",
        "matchConstraints": { "resourceRules": resources },
        "variables": variables,
        "validations": validations,
    });
    if !param_kind.is_null() {
        spec["paramKind"] = param_kind;
    }
    if let Some(conditions) = match_conditions {
        spec["matchConditions"] = conditions;
    }
    Manifest::ValidatingAdmissionPolicy(Box::new(from_json(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": cluster_meta(name, "admission"),
        "spec": spec,
    }))))
}

fn tenant_kind() -> serde_json::Value {
    json!({ "apiVersion": format!("{}/v1alpha1", liqo_api::names::GROUP), "kind": "Tenant" })
}

fn rule(group: &str, resources: &[&str]) -> serde_json::Value {
    json!({
        "apiGroups": [group],
        "apiVersions": ["*"],
        "operations": ["CREATE", "UPDATE"],
        "resources": resources,
    })
}

fn check(expression: String, message: String) -> serde_json::Value {
    json!({ "expression": expression, "messageExpression": message, "reason": "Forbidden" })
}

/// The pod rules, on pods themselves ([`PODS`]) or on the pod templates of
/// ReplicaSets and Jobs ([`WORKLOADS`]).
fn pod_policy(name: &str) -> Manifest {
    let pods = name == PODS;
    let (spec, what) = if pods {
        ("object.spec", "pods")
    } else {
        ("object.spec.template.spec", "pod templates")
    };
    // On a pod, what cannot change after it is made is judged once, when
    // it is made: an update by a controller (an owner reference, a
    // finalizer) never fails for terms changed since.
    let at_creation = if pods {
        "request.operation != 'CREATE' || "
    } else {
        ""
    };
    let always = ALWAYS_TOLERATED
        .iter()
        .map(|k| format!("'{k}'"))
        .collect::<Vec<_>>()
        .join(", ");
    // A toleration a pod already had is kept through an update.
    let kept = if pods {
        "(request.operation == 'UPDATE' && has(oldObject.spec.tolerations) && \
         t in oldObject.spec.tolerations) || "
    } else {
        ""
    };
    let validations = vec![
        check(
            format!("{at_creation}!has({spec}.nodeName) || {spec}.nodeName == ''"),
            format!(
                "'a peer\\'s {what} may not set spec.nodeName: the provider\\'s scheduler places its pods'"
            ),
        ),
        check(
            format!(
                "{at_creation}!has({spec}.priorityClassName) || {spec}.priorityClassName == '' || \
                 {spec}.priorityClassName in variables.terms.priorityClasses"
            ),
            format!(
                "'priorityClassName ' + {spec}.priorityClassName + ' is not one the provider allows this peer (allowed: ' + \
                 (size(variables.terms.priorityClasses) == 0 ? 'none' : variables.terms.priorityClasses.join(', ')) + ')'"
            ),
        ),
        check(
            format!(
                "!has({spec}.tolerations) || {spec}.tolerations.all(t, {kept}\
                 (has(t.key) && t.key != '' && (t.key in variables.terms.tolerations || \
                 (t.key in [{always}] && has(t.effect) && t.effect == 'NoExecute'))))"
            ),
            format!(
                "'a peer\\'s {what} may tolerate only the taints the provider allows it (' + \
                 (size(variables.terms.tolerations) == 0 ? 'none' : variables.terms.tolerations.join(', ')) + \
                 '), and not-ready and unreachable with effect NoExecute'"
            ),
        ),
        check(
            format!(
                "{at_creation}variables.terms.nodeSelector.all(k, has({spec}.nodeSelector) && \
                 k in {spec}.nodeSelector && {spec}.nodeSelector[k] == variables.terms.nodeSelector[k])"
            ),
            format!(
                "'a peer\\'s {what} must select the provider\\'s nodes for peers: nodeSelector ' + \
                 variables.terms.nodeSelector.map(k, k + '=' + variables.terms.nodeSelector[k]).join(',')"
            ),
        ),
        check(
            format!(
                "{at_creation}!has(variables.terms.runtimeClassName) || \
                 (has({spec}.runtimeClassName) && {spec}.runtimeClassName == variables.terms.runtimeClassName)"
            ),
            format!(
                "'a peer\\'s {what} must run with runtimeClassName ' + variables.terms.runtimeClassName"
            ),
        ),
    ];
    let (resources, conditions) = if pods {
        (json!([rule("", &["pods"])]), None)
    } else {
        (
            json!([rule("apps", &["replicasets"]), rule("batch", &["jobs"])]),
            Some(by_a_peer()),
        )
    };
    policy(
        name,
        tenant_kind(),
        resources,
        conditions,
        json!([{ "name": "terms", "expression": "params.spec.admission" }]),
        validations,
    )
}

fn services_policy() -> Manifest {
    let type_is = |t: &str| format!("has(object.spec.type) && object.spec.type == '{t}'");
    policy(
        SERVICES,
        tenant_kind(),
        json!([rule("", &["services"])]),
        Some(by_a_peer()),
        json!([{ "name": "terms", "expression": "params.spec.admission" }]),
        vec![
            check(
                "!has(object.spec.externalIPs) || size(object.spec.externalIPs) == 0".to_owned(),
                "'a peer\\'s Services may not set externalIPs: they would take that address over \
                 for every pod of the provider (CVE-2020-8554)'"
                    .to_owned(),
            ),
            check(
                format!(
                    "!({}) || variables.terms.nodePorts > 0",
                    type_is("NodePort")
                ),
                "'the provider does not allow this peer NodePort Services (its sharing policy\\'s nodePorts is 0)'"
                    .to_owned(),
            ),
            check(
                format!(
                    "!({}) || variables.terms.loadBalancers > 0",
                    type_is("LoadBalancer")
                ),
                "'the provider does not allow this peer LoadBalancer Services (its sharing policy\\'s loadBalancers is 0)'"
                    .to_owned(),
            ),
        ],
    )
}

fn endpoint_slices_policy() -> Manifest {
    let group = liqo_api::names::GROUP;
    policy(
        ENDPOINT_SLICES,
        json!({ "apiVersion": format!("{group}/v1alpha1"), "kind": "Connection" }),
        json!([rule("discovery.k8s.io", &["endpointslices"])]),
        Some(by_a_peer()),
        json!([{
            "name": "seenAs",
            "expression": "has(params.status) && has(params.status.peerSeenAs) ? params.status.peerSeenAs : ''",
        }]),
        vec![
            check(
                "object.addressType == 'IPv4' || object.addressType == 'IPv6'".to_owned(),
                "'a peer\\'s EndpointSlices hold addresses of its pods (addressType IPv4 or IPv6), not ' + object.addressType"
                    .to_owned(),
            ),
            check(
                "!has(object.endpoints) || size(object.endpoints) == 0 || variables.seenAs != ''".to_owned(),
                "'a peer\\'s EndpointSlices may hold addresses only once the provider\\'s gateway says where it sees \
                 the peer\\'s pods (the status of its Connection)'"
                    .to_owned(),
            ),
            check(
                "variables.seenAs == '' || !has(object.endpoints) || object.endpoints.all(e, \
                 e.addresses.all(a, isIP(a) && cidr(variables.seenAs).containsIP(a)))"
                    .to_owned(),
                "'a peer\\'s EndpointSlices may hold only addresses of its own pods, ' + variables.seenAs + \
                 ' as this cluster sees them'"
                    .to_owned(),
            ),
            check(
                "!has(object.endpoints) || object.endpoints.all(e, !has(e.targetRef) || \
                 !has(e.targetRef.namespace) || e.targetRef.namespace == request.namespace)"
                    .to_owned(),
                "'a peer\\'s EndpointSlices may not refer to objects of another namespace'".to_owned(),
            ),
        ],
    )
}

fn pod_security_policy() -> Manifest {
    let modes = pss::MODES
        .iter()
        .map(|k| format!("'{k}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let versions = pss::VERSIONS
        .iter()
        .map(|k| format!("'{k}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let label = |obj: &str| {
        format!(
            "(has({obj}.metadata.labels) && k in {obj}.metadata.labels ? {obj}.metadata.labels[k] : '')"
        )
    };
    policy(
        POD_SECURITY,
        tenant_kind(),
        json!([rule("", &["namespaces"])]),
        Some(by_a_peer()),
        json!([{ "name": "level", "expression": "params.spec.admission.podSecurity" }]),
        vec![
            check(
                format!(
                    "request.operation != 'CREATE' || [{modes}].all(k, {} == variables.level)",
                    label("object")
                ),
                format!(
                    "'a peer\\'s namespaces must carry {}, {} and {} = ' + variables.level + \
                     ' (the Pod Security level the provider gives this peer)'",
                    pss::ENFORCE,
                    pss::AUDIT,
                    pss::WARN
                ),
            ),
            check(
                format!(
                    "request.operation != 'CREATE' || [{versions}].all(k, {} in ['', 'latest'])",
                    label("object")
                ),
                "'a peer\\'s namespaces may not pin a Pod Security version (only latest)'"
                    .to_owned(),
            ),
            check(
                format!(
                    "request.operation != 'UPDATE' || [{modes}, {versions}].all(k, {} == {})",
                    label("oldObject"),
                    label("object")
                ),
                "'a peer may not change the Pod Security labels of its namespaces'".to_owned(),
            ),
        ],
    )
}

fn secrets_policy() -> Manifest {
    policy(
        SECRETS,
        serde_json::Value::Null,
        json!([rule("", &["secrets"])]),
        Some(by_a_peer()),
        json!([]),
        vec![check(
            "!has(object.type) || object.type != 'kubernetes.io/service-account-token'".to_owned(),
            "'a peer may not create Secrets of type kubernetes.io/service-account-token: the provider would \
             fill them with a token of its own'"
                .to_owned(),
        )],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_a_peer_is_bound_to_is_installed() {
        let installed: Vec<String> = policies()
            .iter()
            .filter(|m| matches!(m, Manifest::ValidatingAdmissionPolicy(_)))
            .map(|m| m.name().to_owned())
            .collect();
        let id = ClusterId::new("home-1").expect("valid");
        let bound = bindings(&id, &json!({}));
        assert_eq!(bound.len(), BOUND_PER_PEER.len());
        for b in &bound {
            let Manifest::ValidatingAdmissionPolicyBinding(b) = b else {
                panic!("a binding");
            };
            let spec = b.spec.as_ref().expect("spec");
            let policy = spec.policy_name.as_deref().expect("policy");
            assert!(installed.iter().any(|p| p == policy), "{policy}");
            assert_eq!(
                b.metadata.name.as_deref(),
                Some(binding_name(policy, &id).as_str())
            );
            let param = spec.param_ref.as_ref().expect("a parameter");
            if policy == ENDPOINT_SLICES {
                assert_eq!(param.name, None);
                assert_eq!(
                    param.namespace.as_deref(),
                    Some(peering::tenant_namespace(&id).as_str())
                );
                assert!(param.selector.is_some(), "{param:?}");
            } else {
                assert_eq!(param.name.as_deref(), Some("home-1"));
            }
            assert_eq!(param.parameter_not_found_action.as_deref(), Some("Deny"));
            assert_eq!(
                spec.validation_actions.as_deref(),
                Some(&["Deny".to_owned()][..])
            );
        }
    }
}
