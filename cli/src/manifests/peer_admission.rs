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

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ParamKind, ParamRef,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec,
    Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use liqo_api::ClusterId;
use liqo_api::admission::{
    ALWAYS_RESERVED_NAMESPACES, ALWAYS_TOLERATED, CONTAINER_RESOURCES, NAMESPACE_LABELS,
    VOLUME_TYPES, labels as pss,
};
use liqo_api::names::{labels, peering};

use crate::manifests::validation::{
    deny_binding, forbidden, match_condition, resource_rule, variable,
};
use crate::manifests::{Manifest, cluster_meta};

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
/// The names and labels of the namespaces a peer creates.
pub const NAMESPACE_NAMES: &str = "liqo-peer-namespace-names";
/// A peer's end of the tunnel, in its tenant namespace.
pub const CONNECTIONS: &str = "liqo-peer-connections";
/// The PersistentVolumeClaims a peer writes.
pub const CLAIMS: &str = "liqo-peer-claims";

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
        namespace_names_policy(),
        connections_policy(),
        claims_policy(),
        secrets_policy(),
        // No parameter: one binding for every peer.
        deny_binding(
            cluster_meta(SECRETS, "admission"),
            SECRETS,
            ValidatingAdmissionPolicyBindingSpec::default(),
        ),
    ]
}

/// The names of the policies that take a peer's terms, with a binding per
/// peer.
pub const BOUND_PER_PEER: [&str; 8] = [
    PODS,
    WORKLOADS,
    SERVICES,
    ENDPOINT_SLICES,
    POD_SECURITY,
    NAMESPACE_NAMES,
    CONNECTIONS,
    CLAIMS,
];

/// The name of `consumer`'s binding of `policy`.
pub fn binding_name(policy: &str, consumer: &ClusterId) -> String {
    format!("{policy}-{consumer}")
}

/// The bindings that apply `consumer`'s terms (its Tenant record; for
/// EndpointSlices, its end of the tunnel) to what it does in its own
/// namespaces.
pub fn bindings(consumer: &ClusterId, tenant_labels: &BTreeMap<String, String>) -> Vec<Manifest> {
    let id = consumer.as_str();
    let own_label = || LabelSelector {
        match_labels: Some(BTreeMap::from([(labels::TENANT.to_owned(), id.to_owned())])),
        ..Default::default()
    };
    let own_namespaces = || {
        Some(MatchResources {
            namespace_selector: Some(own_label()),
            ..Default::default()
        })
    };
    let tenant = || {
        Some(ParamRef {
            name: Some(id.to_owned()),
            parameter_not_found_action: Some("Deny".to_owned()),
            ..Default::default()
        })
    };
    BOUND_PER_PEER
        .iter()
        .map(|policy| {
            let meta = ObjectMeta {
                name: Some(binding_name(policy, consumer)),
                labels: Some(tenant_labels.clone()),
                ..Default::default()
            };
            let spec = match *policy {
                // The namespaces it creates are selected by their own
                // label (a namespace has no namespace to select).
                POD_SECURITY | NAMESPACE_NAMES => ValidatingAdmissionPolicyBindingSpec {
                    param_ref: tenant(),
                    match_resources: Some(MatchResources {
                        object_selector: Some(own_label()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                // Where the provider sees its pods: its end of the tunnel,
                // which only the provider's gateway gives a status. It is
                // named after the consumer's cluster ID, which a tenant
                // made for a peering token does not know: every Connection
                // of the tenant's namespace is a parameter, and each must
                // admit the request (one the consumer adds has no status,
                // and admits nothing).
                ENDPOINT_SLICES => ValidatingAdmissionPolicyBindingSpec {
                    param_ref: Some(ParamRef {
                        namespace: Some(peering::tenant_namespace(consumer)),
                        selector: Some(LabelSelector::default()),
                        parameter_not_found_action: Some("Deny".to_owned()),
                        ..Default::default()
                    }),
                    match_resources: own_namespaces(),
                    ..Default::default()
                },
                // Its end of the tunnel, in its tenant namespace (which
                // is not labelled as its own: it may not change it).
                CONNECTIONS => ValidatingAdmissionPolicyBindingSpec {
                    param_ref: tenant(),
                    match_resources: Some(MatchResources {
                        namespace_selector: Some(LabelSelector {
                            match_labels: Some(BTreeMap::from([(
                                "kubernetes.io/metadata.name".to_owned(),
                                peering::tenant_namespace(consumer),
                            )])),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                _ => ValidatingAdmissionPolicyBindingSpec {
                    param_ref: tenant(),
                    match_resources: own_namespaces(),
                    ..Default::default()
                },
            };
            deny_binding(meta, policy, spec)
        })
        .collect()
}

/// Requests made by a peer's own credential.
fn by_a_peer() -> Vec<MatchCondition> {
    vec![match_condition(
        "by-a-peer",
        format!("request.userInfo.username.startsWith('{PEER_PREFIX}')"),
    )]
}

/// The policy `name`: what `validations` refuse of the requests on
/// `resources` (that meet `match_conditions`) is forbidden; its checks
/// read `param_kind` (a peer's) and `variables`.
fn policy(
    name: &str,
    param_kind: Option<ParamKind>,
    resources: Vec<NamedRuleWithOperations>,
    match_conditions: Option<Vec<MatchCondition>>,
    variables: Vec<Variable>,
    validations: Vec<Validation>,
) -> Manifest {
    Manifest::ValidatingAdmissionPolicy(Box::new(ValidatingAdmissionPolicy {
        metadata: cluster_meta(name, "admission"),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_owned()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(resources),
                ..Default::default()
            }),
            variables: Some(variables),
            validations: Some(validations),
            param_kind,
            match_conditions,
            ..Default::default()
        }),
        ..Default::default()
    }))
}

/// Our kind `kind`, as a policy's parameter.
fn our_kind(kind: &str) -> Option<ParamKind> {
    Some(ParamKind {
        api_version: Some(format!("{}/v1alpha1", liqo_api::names::GROUP)),
        kind: Some(kind.to_owned()),
    })
}

/// A peer's Tenant record, as a policy's parameter.
fn tenant_kind() -> Option<ParamKind> {
    our_kind("Tenant")
}

/// Creating and changing `resources` of `group`.
fn rule(group: &str, resources: &[&str]) -> NamedRuleWithOperations {
    resource_rule(&[group], &["CREATE", "UPDATE"], resources)
}

/// The peer's terms, the parameter's `admission`.
fn terms() -> Vec<Variable> {
    vec![variable("terms", "params.spec.admission")]
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
        forbidden(
            format!("{at_creation}!has({spec}.nodeName) || {spec}.nodeName == ''"),
            format!(
                "'a peer\\'s {what} may not set spec.nodeName: the provider\\'s scheduler places its pods'"
            ),
        ),
        forbidden(
            format!(
                "{at_creation}!has({spec}.priorityClassName) || {spec}.priorityClassName == '' || \
                 {spec}.priorityClassName in variables.terms.priorityClasses"
            ),
            format!(
                "'priorityClassName ' + {spec}.priorityClassName + ' is not one the provider allows this peer (allowed: ' + \
                 (size(variables.terms.priorityClasses) == 0 ? 'none' : variables.terms.priorityClasses.join(', ')) + ')'"
            ),
        ),
        forbidden(
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
        forbidden(
            format!(
                "{at_creation}variables.terms.nodeSelector.all(k, has({spec}.nodeSelector) && \
                 k in {spec}.nodeSelector && {spec}.nodeSelector[k] == variables.terms.nodeSelector[k])"
            ),
            format!(
                "'a peer\\'s {what} must select the provider\\'s nodes for peers: nodeSelector ' + \
                 variables.terms.nodeSelector.map(k, k + '=' + variables.terms.nodeSelector[k]).join(',')"
            ),
        ),
        forbidden(
            format!(
                "{at_creation}!has(variables.terms.runtimeClassName) || \
                 (has({spec}.runtimeClassName) && {spec}.runtimeClassName == variables.terms.runtimeClassName)"
            ),
            format!(
                "'a peer\\'s {what} must run with runtimeClassName ' + variables.terms.runtimeClassName"
            ),
        ),
    ];
    let validations = validations
        .into_iter()
        .chain(volume_rules(spec, what, at_creation))
        .chain(resource_rules(what, at_creation))
        .collect();
    let (resources, conditions) = if pods {
        (vec![rule("", &["pods"])], None)
    } else {
        (
            vec![rule("apps", &["replicasets"]), rule("batch", &["jobs"])],
            Some(by_a_peer()),
        )
    };
    let variables = terms()
        .into_iter()
        .chain([
            variable("grant", "params.spec.grant"),
            variable(
                "containers",
                format!(
                    "{spec}.containers + (has({spec}.initContainers) ? {spec}.initContainers : [])"
                ),
            ),
        ])
        .collect();
    policy(
        name,
        tenant_kind(),
        resources,
        conditions,
        variables,
        validations,
    )
}

/// The volume rules of [`pod_policy`] (see `Admission::refusals`): no
/// token of the provider's, no claim, and below `privileged` only the
/// volume types that hold what the peer put in its namespace.
fn volume_rules(spec: &str, what: &str, at_creation: &str) -> Vec<Validation> {
    let volumes = |check: &str| {
        format!("{at_creation}!has({spec}.volumes) || {spec}.volumes.all(v, {check})")
    };
    let types = VOLUME_TYPES
        .iter()
        .map(|t| format!("has(v.{t})"))
        .collect::<Vec<_>>()
        .join(" || ");
    vec![
        forbidden(
            volumes(
                "!has(v.projected) || !has(v.projected.sources) || \
                 v.projected.sources.all(s, !has(s.serviceAccountToken))",
            ),
            format!(
                "'a peer\\'s {what} may not mount a service account token of the provider\\'s: \
                 set automountServiceAccountToken: false and mount no serviceAccountToken'"
            ),
        ),
        forbidden(
            volumes("!has(v.ephemeral)"),
            format!(
                "'a peer\\'s {what} may not mount generic ephemeral volumes: mount a claim of \
                 the peer\\'s instead'"
            ),
        ),
        forbidden(
            volumes(
                "!has(v.persistentVolumeClaim) || \
                 (has(variables.terms.storageClasses) && size(variables.terms.storageClasses) > 0)",
            ),
            format!("'a peer\\'s {what} may not mount claims: the provider grants no storage'"),
        ),
        forbidden(
            format!(
                "{at_creation}variables.terms.podSecurity == 'privileged' || !has({spec}.volumes) || \
                 {spec}.volumes.all(v, {types} || has(v.persistentVolumeClaim))"
            ),
            format!(
                "'a peer\\'s {what} may mount only volumes of types {}, and claims'",
                VOLUME_TYPES.join(", ")
            ),
        ),
    ]
}

/// The resource rules of [`pod_policy`] (see `Admission::refusals`):
/// only what a grant holds, no CPU or memory limit above the whole grant,
/// and the local disk stated and bounded by the terms in what the peer
/// itself writes (pods its old templates make keep running).
fn resource_rules(what: &str, at_creation: &str) -> Vec<Validation> {
    let allowed = CONTAINER_RESOURCES
        .iter()
        .map(|r| format!("'{r}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let limit = |r: &str| {
        format!("has(c.resources) && has(c.resources.limits) && '{r}' in c.resources.limits")
    };
    let within_grant = |r: &str| {
        format!(
            "{at_creation}!has(variables.grant.{r}) || variables.containers.all(c, !({}) || \
             quantity(c.resources.limits['{r}']).compareTo(quantity(string(variables.grant.{r}))) <= 0)",
            limit(r)
        )
    };
    vec![
        forbidden(
            format!(
                "{at_creation}variables.containers.all(c, !has(c.resources) || \
                 ((!has(c.resources.requests) || c.resources.requests.all(k, k in [{allowed}])) && \
                 (!has(c.resources.limits) || c.resources.limits.all(k, k in [{allowed}]))))"
            ),
            format!(
                "'a peer\\'s {what} may ask only for {}: nothing else is in its grant'",
                CONTAINER_RESOURCES.join(", ")
            ),
        ),
        forbidden(
            within_grant("cpu"),
            format!(
                "'a peer\\'s {what} may not have a cpu limit above its whole grant, ' + string(variables.grant.cpu)"
            ),
        ),
        forbidden(
            within_grant("memory"),
            format!(
                "'a peer\\'s {what} may not have a memory limit above its whole grant, ' + string(variables.grant.memory)"
            ),
        ),
        forbidden(
            format!(
                "{at_creation}!request.userInfo.username.startsWith('{PEER_PREFIX}') || \
                 !has(variables.terms.ephemeralStorage) || variables.containers.all(c, {} && \
                 quantity(c.resources.limits['ephemeral-storage']).compareTo(quantity(variables.terms.ephemeralStorage)) <= 0)",
                limit("ephemeral-storage")
            ),
            format!(
                "'every container of a peer\\'s {what} must state an ephemeral-storage limit of at most ' + \
                 (has(variables.terms.ephemeralStorage) ? variables.terms.ephemeralStorage : '')"
            ),
        ),
    ]
}

fn services_policy() -> Manifest {
    let type_is = |t: &str| format!("has(object.spec.type) && object.spec.type == '{t}'");
    policy(
        SERVICES,
        tenant_kind(),
        vec![rule("", &["services"])],
        Some(by_a_peer()),
        terms(),
        vec![
            forbidden(
                "!has(object.spec.externalIPs) || size(object.spec.externalIPs) == 0",
                "'a peer\\'s Services may not set externalIPs: they would take that address over \
                 for every pod of the provider (CVE-2020-8554)'",
            ),
            forbidden(
                format!("!({})", type_is("ExternalName")),
                "'a peer\\'s Services may not be ExternalName: an alias on the provider\\'s DNS \
                 may name any host the provider reaches, its own Services included'",
            ),
            forbidden(
                format!(
                    "!({}) || variables.terms.nodePorts > 0",
                    type_is("NodePort")
                ),
                "'the provider does not allow this peer NodePort Services (its sharing policy\\'s nodePorts is 0)'",
            ),
            forbidden(
                format!(
                    "!({}) || variables.terms.loadBalancers > 0",
                    type_is("LoadBalancer")
                ),
                "'the provider does not allow this peer LoadBalancer Services (its sharing policy\\'s loadBalancers is 0)'",
            ),
        ],
    )
}

/// A peer's claims reach only volumes provisioned for them, of the
/// classes its terms list (the cluster's default class filled in before
/// this is judged): no volume named, none selected, no data from another
/// namespace, and no volume bound by hand afterwards. How much it claims
/// is its quota's.
fn claims_policy() -> Manifest {
    let created = "request.operation != 'CREATE' || ";
    policy(
        CLAIMS,
        tenant_kind(),
        vec![rule("", &["persistentvolumeclaims"])],
        Some(by_a_peer()),
        terms(),
        vec![
            forbidden(
                format!("{created}!has(object.spec.volumeName) || object.spec.volumeName == ''"),
                "'a peer\\'s claims may not name a volume (spec.volumeName): the provider \
                 provisions one for each'",
            ),
            forbidden(
                "request.operation != 'UPDATE' || \
                 (has(object.spec.volumeName) ? object.spec.volumeName : '') == \
                 (has(oldObject.spec.volumeName) ? oldObject.spec.volumeName : '')",
                "'a peer may not bind its claims to a volume (spec.volumeName): the provider \
                 binds them'",
            ),
            forbidden(
                format!("{created}!has(object.spec.selector)"),
                "'a peer\\'s claims may not select volumes (spec.selector): the provider \
                 provisions one for each'",
            ),
            forbidden(
                format!(
                    "{created}!has(object.spec.dataSourceRef) || \
                     !has(object.spec.dataSourceRef.namespace) || \
                     object.spec.dataSourceRef.namespace == '' || \
                     object.spec.dataSourceRef.namespace == request.namespace"
                ),
                "'a peer\\'s claims may not take their data from another namespace'",
            ),
            forbidden(
                format!(
                    "{created}has(variables.terms.storageClasses) && \
                     has(object.spec.storageClassName) && \
                     object.spec.storageClassName in variables.terms.storageClasses"
                ),
                "'storageClassName ' + (has(object.spec.storageClassName) ? \
                 object.spec.storageClassName : '(none)') + ' is not one the provider allows \
                 this peer (allowed: ' + (!has(variables.terms.storageClasses) || \
                 size(variables.terms.storageClasses) == 0 ? 'none' : \
                 variables.terms.storageClasses.join(', ')) + ')'",
            ),
        ],
    )
}

fn endpoint_slices_policy() -> Manifest {
    policy(
        ENDPOINT_SLICES,
        our_kind("Connection"),
        vec![rule("discovery.k8s.io", &["endpointslices"])],
        Some(by_a_peer()),
        vec![variable(
            "seenAs",
            "has(params.status) && has(params.status.peerSeenAs) ? params.status.peerSeenAs : ''",
        )],
        vec![
            forbidden(
                "object.addressType == 'IPv4' || object.addressType == 'IPv6'",
                "'a peer\\'s EndpointSlices hold addresses of its pods (addressType IPv4 or IPv6), not ' + object.addressType",
            ),
            forbidden(
                "!has(object.endpoints) || size(object.endpoints) == 0 || variables.seenAs != ''",
                "'a peer\\'s EndpointSlices may hold addresses only once the provider\\'s gateway says where it sees \
                 the peer\\'s pods (the status of its Connection)'",
            ),
            forbidden(
                "variables.seenAs == '' || !has(object.endpoints) || object.endpoints.all(e, \
                 e.addresses.all(a, isIP(a) && cidr(variables.seenAs).containsIP(a)))",
                "'a peer\\'s EndpointSlices may hold only addresses of its own pods, ' + variables.seenAs + \
                 ' as this cluster sees them'",
            ),
            forbidden(
                "!has(object.endpoints) || object.endpoints.all(e, !has(e.targetRef) || \
                 !has(e.targetRef.namespace) || e.targetRef.namespace == request.namespace)",
                "'a peer\\'s EndpointSlices may not refer to objects of another namespace'",
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
        vec![rule("", &["namespaces"])],
        Some(by_a_peer()),
        vec![variable("level", "params.spec.admission.podSecurity")],
        vec![
            forbidden(
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
            forbidden(
                format!(
                    "request.operation != 'CREATE' || [{versions}].all(k, {} in ['', 'latest'])",
                    label("object")
                ),
                "'a peer\\'s namespaces may not pin a Pod Security version (only latest)'",
            ),
            forbidden(
                format!(
                    "request.operation != 'UPDATE' || [{modes}, {versions}].all(k, {} == {})",
                    label("oldObject"),
                    label("object")
                ),
                "'a peer may not change the Pod Security labels of its namespaces'",
            ),
        ],
    )
}

/// The names a peer's namespaces may take and the labels they may carry
/// (see `Admission::allows_namespace_name` and `NAMESPACE_LABELS`).
fn namespace_names_policy() -> Manifest {
    let reserved = ALWAYS_RESERVED_NAMESPACES
        .iter()
        .map(|p| format!("'{p}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let allowed = NAMESPACE_LABELS
        .iter()
        .map(|k| format!("'{k}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let psa = "pod-security.kubernetes.io/";
    policy(
        NAMESPACE_NAMES,
        tenant_kind(),
        vec![rule("", &["namespaces"])],
        Some(by_a_peer()),
        vec![
            variable("name", "object.metadata.name"),
            variable(
                "reserved",
                format!(
                    "[{reserved}] + (has(params.spec.admission.reservedNamespaces) ? \
                     params.spec.admission.reservedNamespaces : [])"
                ),
            ),
        ],
        vec![
            forbidden(
                "request.operation != 'CREATE' || !variables.reserved.exists(p, \
                 p.endsWith('*') ? variables.name.startsWith(p.substring(0, size(p) - 1)) : \
                 (p.startsWith('*') ? variables.name.endsWith(p.substring(1)) : variables.name == p))",
                "'the name ' + variables.name + ' is reserved on this cluster: a peer\\'s namespaces may not take ' + \
                 variables.reserved.join(', ')",
            ),
            forbidden(
                format!(
                    "!has(object.metadata.labels) || object.metadata.labels.all(k, k in [{allowed}] || \
                     k.startsWith('{psa}') || (request.operation == 'UPDATE' && \
                     has(oldObject.metadata.labels) && k in oldObject.metadata.labels && \
                     oldObject.metadata.labels[k] == object.metadata.labels[k]))"
                ),
                format!(
                    "'a peer\\'s namespaces may carry only the labels {}, and {psa}*'",
                    NAMESPACE_LABELS.join(", ")
                ),
            ),
        ],
    )
}

/// A peer's end of the tunnel: the network it is seen from is the one the
/// provider fixed when it peered (the Tenant record's `spec.podCidr`, or
/// where a token's tenant did not know it yet, the first its gateway saw:
/// `status.podCidr`), and the cluster it names is its own.
fn connections_policy() -> Manifest {
    policy(
        CONNECTIONS,
        tenant_kind(),
        vec![rule(liqo_api::names::GROUP, &["connections"])],
        Some(by_a_peer()),
        vec![variable(
            "pinned",
            "has(params.spec.podCidr) ? params.spec.podCidr : \
             (has(params.status) && has(params.status.podCidr) ? params.status.podCidr : '')",
        )],
        vec![
            forbidden(
                "variables.pinned == '' || object.spec.podCidr == variables.pinned",
                "'a peer\\'s Connection must name the pod CIDR it peered with, ' + variables.pinned + \
                 ': only the provider\\'s administrator changes it (its Tenant record)'",
            ),
            forbidden(
                "request.operation != 'UPDATE' || (object.spec.podCidr == oldObject.spec.podCidr && \
                 object.spec.clusterId == oldObject.spec.clusterId)",
                "'a peer may not change the pod CIDR nor the cluster of its Connection'",
            ),
        ],
    )
}

fn secrets_policy() -> Manifest {
    policy(
        SECRETS,
        None,
        vec![rule("", &["secrets"])],
        Some(by_a_peer()),
        Vec::new(),
        vec![forbidden(
            "!has(object.type) || object.type != 'kubernetes.io/service-account-token'",
            "'a peer may not create Secrets of type kubernetes.io/service-account-token: the provider would \
             fill them with a token of its own'",
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
        let bound = bindings(&id, &BTreeMap::new());
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
