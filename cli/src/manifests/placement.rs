//! The mutating admission policies that place the pods of offloaded
//! namespaces on virtual nodes (MutatingAdmissionPolicy, beta in 1.34).

use k8s_openapi::api::admissionregistration::v1beta1::{
    JSONPatch, MatchResources, MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
    MutatingAdmissionPolicyBindingSpec, MutatingAdmissionPolicySpec, Mutation,
    NamedRuleWithOperations, ParamKind, ParamRef, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use liqo_api::names::{self, labels};

use super::{Manifest, cluster_meta, label_in, strings};

/// Placement of the pods of offloaded namespaces (docs/offloading.md): in a
/// namespace labelled for offloading with LocalAndRemote or Remote, a new
/// pod tolerates the virtual nodes' taint; with Remote it also selects
/// virtual nodes. The scheduler does the rest; pods of other namespaces are
/// never touched, so never tolerate a virtual node. MutatingAdmissionPolicy
/// is beta in 1.34: install leaves these out where it is not served.
/// How many required node affinity terms of a pod's own the placement
/// policy combines with the offloading's selector (see below).
const OWN_TERMS: usize = 4;

pub fn placement_policies() -> Vec<Manifest> {
    let offloading = labels::OFFLOADING;
    let strategy = labels::POD_OFFLOADING_STRATEGY;
    let taint = names::VIRTUAL_NODE_TAINT;
    let toleration = format!(
        "Object.spec.tolerations{{key: '{taint}', operator: 'Equal', value: 'true', effect: 'NoExecute'}}"
    );
    // Tolerations are an atomic list: a JSON patch appends rather than
    // replaces; nothing is added twice.
    let tolerate = format!(
        "has(object.spec.tolerations) && object.spec.tolerations.exists(t, has(t.key) && t.key == '{taint}') ? [] : \
         has(object.spec.tolerations) \
         ? [JSONPatch{{op: 'add', path: '/spec/tolerations/-', value: {toleration}}}] \
         : [JSONPatch{{op: 'add', path: '/spec/tolerations', value: [{toleration}]}}]"
    );
    // nodeSelector is ANDed with whatever affinity the pod has: simpler
    // than rewriting each of the pod's node affinity terms. It is an atomic
    // map, so a JSON patch adds the one key.
    let key = labels::VIRTUAL_NODE;
    let pointer = key.replace('~', "~0").replace('/', "~1");
    let remote = format!(
        "has(object.spec.nodeSelector) \
         ? [JSONPatch{{op: 'add', path: '/spec/nodeSelector/{pointer}', value: 'true'}}] \
         : [JSONPatch{{op: 'add', path: '/spec/nodeSelector', value: {{'{key}': 'true'}}}}]"
    );
    // New pods of the namespaces labelled for offloading with one of
    // `strategies`.
    let new_pods = |strategies: &[&str]| MatchResources {
        resource_rules: Some(vec![NamedRuleWithOperations {
            api_groups: Some(strings(&[""])),
            api_versions: Some(strings(&["v1"])),
            operations: Some(strings(&["CREATE"])),
            resources: Some(strings(&["pods"])),
            ..Default::default()
        }]),
        namespace_selector: Some(LabelSelector {
            match_expressions: Some(vec![
                label_in(offloading, &["true"]),
                label_in(strategy, strategies),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let json_patch = |expression: String| Mutation {
        patch_type: "JSONPatch".to_owned(),
        json_patch: Some(JSONPatch {
            expression: Some(expression),
        }),
        ..Default::default()
    };
    let policy = |name: &str, strategies: &[&str], mutation: Mutation| {
        [
            Manifest::MutatingAdmissionPolicy(Box::new(MutatingAdmissionPolicy {
                metadata: cluster_meta(name, "placement"),
                spec: Some(MutatingAdmissionPolicySpec {
                    failure_policy: Some("Fail".to_owned()),
                    reinvocation_policy: Some("IfNeeded".to_owned()),
                    match_constraints: Some(new_pods(strategies)),
                    mutations: Some(vec![mutation]),
                    ..Default::default()
                }),
            })),
            Manifest::MutatingAdmissionPolicyBinding(Box::new(MutatingAdmissionPolicyBinding {
                metadata: cluster_meta(name, "placement"),
                spec: Some(MutatingAdmissionPolicyBindingSpec {
                    policy_name: Some(name.to_owned()),
                    ..Default::default()
                }),
            })),
        ]
    };
    let mut out = Vec::new();
    out.extend(policy(
        "liqo-offloading-tolerate",
        &["LocalAndRemote", "Remote"],
        json_patch(tolerate),
    ));
    out.extend(policy(
        "liqo-offloading-remote",
        &["Remote"],
        json_patch(remote),
    ));
    // The selector: the terms of the namespace's NamespaceOffloading
    // (the policy's parameter, found in the pod's own namespace) become
    // the pod's required node affinity, ORed as they select providers,
    // each asking for room on one of the provider's nodes.
    // LocalAndRemote adds a term for local nodes. A pod with a required
    // node affinity of its own must satisfy both: its terms become the
    // cross product of its terms and ours, each the union of the two
    // terms' requirements. The API server's CEL has no flatten(), so the
    // product is unrolled over the pod's first OWN_TERMS terms (a pod
    // with more keeps only those; docs/offloading.md).
    //
    // Variables hold plain maps (`e`: expressions, `f`: fields); typed
    // objects exist in mutations only, where the result is converted.
    let requirement_map = |var: &str| {
        format!(
            "{{'key': dyn({var}.key), 'operator': dyn({var}.operator), 'values': dyn(has({var}.values) ? {var}.values : [])}}"
        )
    };
    let own_path =
        "object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution";
    // Every term that selects virtual nodes also asks for room: a
    // provider's largest free node, which its virtual node's labels say,
    // must hold the pod (liqo_api::capacity::room); or it comes twice,
    // once for a virtual node that does not say (an older agent). Without
    // a selector, those are the terms for virtual nodes.
    let unsaid = format!(
        "[{{'key': dyn('{}'), 'operator': dyn('DoesNotExist'), 'values': dyn([])}}]",
        labels::LARGEST_FREE_CPU
    );
    let ours = format!(
        "variables.selected.map(e, {{'e': e + variables.room, 'f': []}}) + \
         variables.selected.map(e, {{'e': e + {unsaid}, 'f': []}}) + \
         (namespaceObject.metadata.labels['{strategy}'] == 'LocalAndRemote' \
         ? [{{'e': [{{'key': dyn('{}'), 'operator': dyn('DoesNotExist'), 'values': dyn([])}}], 'f': []}}] : [])",
        labels::VIRTUAL_NODE
    );
    // The expressions of each of the offloading's terms, or one empty
    // list where it has none.
    let selected = format!(
        "size(variables.terms) == 0 ? [dyn([])] : \
         variables.terms.map(t, dyn(has(t.matchExpressions) ? t.matchExpressions.map(r, {}) : []))",
        requirement_map("r"),
    );
    // What the pod asks, as the scheduler counts it: its containers'
    // requests, or its largest init container's where that is more
    // (liqo_api::capacity::requests_of); CPU in millicores (rounded up),
    // memory in bytes.
    let each = |list: &str, resource: &str| {
        format!(
            "{list}.map(c, has(c.resources) && has(c.resources.requests) && '{resource}' in c.resources.requests \
             ? quantity(string(c.resources.requests['{resource}'])).asApproximateFloat() : 0.0)"
        )
    };
    let asked = |resource: &str| {
        format!(
            "[{}.sum(), has(object.spec.initContainers) && size(object.spec.initContainers) > 0 ? {}.max() : 0.0].max()",
            each("object.spec.containers", resource),
            each("object.spec.initContainers", resource),
        )
    };
    // At least `amount`: more than one less; asking nothing, any value
    // (label values cannot be negative).
    let at_least = |key: &str, amount: String| {
        format!(
            "{amount} <= 0 ? {{'key': dyn('{key}'), 'operator': dyn('Exists'), 'values': dyn([])}} \
             : {{'key': dyn('{key}'), 'operator': dyn('Gt'), 'values': dyn([string({amount} - 1)])}}"
        )
    };
    let room = format!(
        "[{}, {}, {{'key': dyn('{}'), 'operator': dyn('In'), 'values': dyn(variables.levels)}}]",
        at_least(
            labels::LARGEST_FREE_CPU,
            format!("int({} * 1000.0 + 0.999)", asked("cpu"))
        ),
        at_least(
            labels::LARGEST_FREE_MEMORY,
            format!("int({} + 0.999)", asked("memory"))
        ),
        labels::POD_SECURITY,
    );
    let own = format!(
        "has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && \
         has({own_path}) && has({own_path}.nodeSelectorTerms) \
         ? {own_path}.nodeSelectorTerms.map(p, {{\
             'e': has(p.matchExpressions) ? p.matchExpressions.map(r, {}) : [], \
             'f': has(p.matchFields) ? p.matchFields.map(r, {}) : []}}) \
         : []",
        requirement_map("r"),
        requirement_map("r"),
    );
    let product = (0..OWN_TERMS)
        .map(|i| {
            format!(
                "(size(variables.own) > {i} ? variables.ours.map(o, \
                 {{'e': variables.own[{i}].e + o.e, 'f': variables.own[{i}].f}}) : [])"
            )
        })
        .collect::<Vec<_>>()
        .join(" + ");
    let combined = format!("size(variables.own) == 0 ? variables.ours : {product}");
    let term = "Object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms";
    let required = format!(
        "Object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution{{nodeSelectorTerms: \
         variables.combined.map(t, {term}{{\
           matchExpressions: t.e.map(r, {term}.matchExpressions{{key: r.key, operator: r.operator, values: r.values}}), \
           matchFields: t.f.map(r, {term}.matchFields{{key: r.key, operator: r.operator, values: r.values}})}})}}"
    );
    let node_affinity = format!(
        "Object.spec.affinity.nodeAffinity{{requiredDuringSchedulingIgnoredDuringExecution: {required}}}"
    );
    let selector = json_patch(format!(
        "!has(object.spec.affinity) \
             ? [JSONPatch{{op: 'add', path: '/spec/affinity', value: Object.spec.affinity{{nodeAffinity: {node_affinity}}}}}] \
             : !has(object.spec.affinity.nodeAffinity) \
             ? [JSONPatch{{op: 'add', path: '/spec/affinity/nodeAffinity', value: {node_affinity}}}] \
             : [JSONPatch{{op: 'add', path: '/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution', value: {required}}}]"
    ));
    let variable = |name: &str, expression: String| Variable {
        name: name.to_owned(),
        expression,
    };
    let variables = vec![
        variable(
            "terms",
            "params != null && has(params.spec.clusterSelector) && \
                has(params.spec.clusterSelector.nodeSelectorTerms) \
                ? params.spec.clusterSelector.nodeSelectorTerms : []"
                .to_owned(),
        ),
        variable(
            "containers",
            "object.spec.containers + \
             (has(object.spec.initContainers) ? object.spec.initContainers : [])"
                .to_owned(),
        ),
        variable("baseline", meets_baseline()),
        variable("restricted", meets_restricted()),
        variable(
            "levels",
            "['privileged'] + (variables.baseline ? ['baseline'] : []) + \
             (variables.baseline && variables.restricted ? ['restricted'] : [])"
                .to_owned(),
        ),
        variable("room", room),
        variable("selected", selected),
        variable("ours", ours),
        variable("own", own),
        variable("combined", combined),
    ];
    let name = "liqo-offloading-selector";
    out.push(Manifest::MutatingAdmissionPolicy(Box::new(
        MutatingAdmissionPolicy {
            metadata: cluster_meta(name, "placement"),
            spec: Some(MutatingAdmissionPolicySpec {
                failure_policy: Some("Fail".to_owned()),
                reinvocation_policy: Some("Never".to_owned()),
                param_kind: Some(ParamKind {
                    api_version: Some(format!("{}/v1alpha1", names::GROUP)),
                    kind: Some("NamespaceOffloading".to_owned()),
                }),
                match_constraints: Some(new_pods(&["LocalAndRemote", "Remote"])),
                variables: Some(variables),
                mutations: Some(vec![selector]),
                ..Default::default()
            }),
        },
    )));
    out.push(Manifest::MutatingAdmissionPolicyBinding(Box::new(
        MutatingAdmissionPolicyBinding {
            metadata: cluster_meta(name, "placement"),
            spec: Some(MutatingAdmissionPolicyBindingSpec {
                policy_name: Some(name.to_owned()),
                // No namespace: the parameter is looked up in the pod's own.
                // Not found in a namespace labelled for offloading: refused,
                // not placed without its selector. The API server reads
                // parameters from a cache, so this happens for a moment after
                // `liqoctl offload` (which writes the offloading before the
                // labels); controllers retry, as for any refused pod.
                param_ref: Some(ParamRef {
                    name: Some(names::NAMESPACE_OFFLOADING.to_owned()),
                    parameter_not_found_action: Some("Deny".to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        },
    )));
    out
}

/// A CEL list of the space-separated `words`.
fn cel_list(words: &str) -> String {
    let quoted: Vec<String> = words.split_whitespace().map(|w| format!("'{w}'")).collect();
    format!("[{}]", quoted.join(", "))
}

/// Whether the pod meets Pod Security's baseline level, in CEL: the
/// checks of `liqo_api::pod_security` (the API server's), over the pod and
/// its containers and init containers (ephemeral ones cannot be set at
/// creation). Windows pods are held to them too, which the API server
/// spares in a few checks: such a pod is kept off a virtual node it could
/// run on, never let onto one that refuses it.
fn meets_baseline() -> String {
    use liqo_api::pod_security::{
        APPARMOR_ANNOTATION, BASELINE_CAPABILITIES, CONFINED, SAFE_SYSCTLS, SELINUX_TYPES,
    };
    let psc = "object.spec.securityContext";
    let sc = "c.securityContext";
    let caps = cel_list(BASELINE_CAPABILITIES);
    let selinux = cel_list(SELINUX_TYPES);
    let confined = cel_list(CONFINED);
    let sysctls = cel_list(SAFE_SYSCTLS);
    // `x` (a security context) keeps its confinements and SELinux limits.
    let context = |x: &str| {
        format!(
            "(!has({x}.seccompProfile) || {x}.seccompProfile.type != 'Unconfined') && \
             (!has({x}.appArmorProfile) || {x}.appArmorProfile.type in {confined}) && \
             (!has({x}.seLinuxOptions) || ((!has({x}.seLinuxOptions.type) || {x}.seLinuxOptions.type == '' || \
             {x}.seLinuxOptions.type in {selinux}) && (!has({x}.seLinuxOptions.user) || {x}.seLinuxOptions.user == '') && \
             (!has({x}.seLinuxOptions.role) || {x}.seLinuxOptions.role == ''))) && \
             (!has({x}.windowsOptions) || !has({x}.windowsOptions.hostProcess) || !{x}.windowsOptions.hostProcess)"
        )
    };
    let probe = |p: &str| {
        format!(
            "(!has({p}) || ((!has({p}.httpGet) || !has({p}.httpGet.host) || {p}.httpGet.host == '') && \
             (!has({p}.tcpSocket) || !has({p}.tcpSocket.host) || {p}.tcpSocket.host == '')))"
        )
    };
    let hooks = format!(
        "(!has(c.lifecycle) || ({} && {}))",
        probe("c.lifecycle.postStart"),
        probe("c.lifecycle.preStop")
    );
    [
        "!(has(object.spec.hostNetwork) && object.spec.hostNetwork)".to_owned(),
        "!(has(object.spec.hostPID) && object.spec.hostPID)".to_owned(),
        "!(has(object.spec.hostIPC) && object.spec.hostIPC)".to_owned(),
        "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath))".to_owned(),
        format!(
            "!has(object.metadata.annotations) || object.metadata.annotations.all(k, \
             !k.startsWith('{APPARMOR_ANNOTATION}') || object.metadata.annotations[k] == 'runtime/default' || \
             object.metadata.annotations[k].startsWith('localhost/'))"
        ),
        format!("!has({psc}) || ({})", context(psc)),
        format!(
            "!has({psc}) || !has({psc}.sysctls) || {psc}.sysctls.all(s, s.name in {sysctls})"
        ),
        format!(
            "variables.containers.all(c, (!has(c.ports) || c.ports.all(p, !has(p.hostPort) || p.hostPort == 0)) && \
             {} && {} && {} && {hooks} && (!has({sc}) || ( \
             !(has({sc}.privileged) && {sc}.privileged) && \
             (!has({sc}.procMount) || {sc}.procMount == 'Default') && \
             (!has({sc}.capabilities) || !has({sc}.capabilities.add) || {sc}.capabilities.add.all(a, a in {caps})) && \
             {})))",
            probe("c.livenessProbe"),
            probe("c.readinessProbe"),
            probe("c.startupProbe"),
            context(sc),
        ),
    ]
    .map(|check| format!("({check})"))
    .join(" && ")
}

/// Whether the pod meets what restricted adds to baseline, in CEL (see
/// [`meets_baseline`]).
fn meets_restricted() -> String {
    use liqo_api::pod_security::{CONFINED, RESTRICTED_VOLUMES};
    let psc = "object.spec.securityContext";
    let sc = "c.securityContext";
    let volumes = RESTRICTED_VOLUMES
        .split_whitespace()
        .map(|t| format!("has(v.{t})"))
        .collect::<Vec<_>>()
        .join(" || ");
    let confined = cel_list(CONFINED);
    // Set on the pod and not undone by a container, or set by every one.
    let pod_or_each = |field: &str, ok: &str| {
        format!(
            "(has({psc}) && has({psc}.{field}) && {} && variables.containers.all(c, !has({sc}) || \
             !has({sc}.{field}) || {})) || variables.containers.all(c, has({sc}) && has({sc}.{field}) && {})",
            ok.replace("X", &format!("{psc}.{field}")),
            ok.replace("X", &format!("{sc}.{field}")),
            ok.replace("X", &format!("{sc}.{field}")),
        )
    };
    [
        format!("!has(object.spec.volumes) || object.spec.volumes.all(v, {volumes})"),
        format!(
            "variables.containers.all(c, has({sc}) && has({sc}.allowPrivilegeEscalation) && \
             !{sc}.allowPrivilegeEscalation)"
        ),
        pod_or_each("runAsNonRoot", "X"),
        format!(
            "!(has({psc}) && has({psc}.runAsUser) && {psc}.runAsUser == 0) && \
             variables.containers.all(c, !(has({sc}) && has({sc}.runAsUser) && {sc}.runAsUser == 0))"
        ),
        pod_or_each("seccompProfile", &format!("X.type in {confined}")),
        format!(
            "variables.containers.all(c, has({sc}) && has({sc}.capabilities) && \
             has({sc}.capabilities.drop) && 'ALL' in {sc}.capabilities.drop && \
             (!has({sc}.capabilities.add) || {sc}.capabilities.add.all(a, a == 'NET_BIND_SERVICE')))"
        ),
    ]
    .map(|check| format!("({check})"))
    .join(" && ")
}
