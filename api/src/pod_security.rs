//! The Pod Security Standards (privileged, baseline, restricted) as the
//! API server's PodSecurity admission enforces them at version "latest"
//! (Kubernetes 1.34), so that liqo-rs can tell, before a cluster refuses a
//! pod, which checks it fails, and say so in the API server's words.
//!
//! This module owns the levels, the checks and the one-line refusal. It
//! reads only a pod's metadata (for the AppArmor annotations) and spec,
//! and does no IO; which level a namespace enforces is the caller's
//! business.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::{
    ContainerPort, Lifecycle, PodSecurityContext, PodSpec, Probe, SELinuxOptions, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Pod Security Standards level.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default)]
#[serde(rename_all = "lowercase")]
#[derive(PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
pub enum Level {
    /// No restriction at all.
    Privileged,
    /// Prevents the known privilege escalations; a default pod passes.
    /// What a provider gives its peers unless it says otherwise
    /// (docs/offloading.md, "The default level").
    #[default]
    Baseline,
    /// Baseline, and the current hardening practice on top.
    Restricted,
}

impl Level {
    /// Every level, from the most permissive to the strictest.
    pub const ALL: [Level; 3] = [Level::Privileged, Level::Baseline, Level::Restricted];

    /// The name the `pod-security.kubernetes.io/*` namespace labels use.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }

    /// The levels at least as strict as this one (itself included), e.g.
    /// baseline -> [baseline, restricted].
    pub fn and_stricter(self) -> Vec<Level> {
        Level::ALL.into_iter().filter(|l| *l >= self).collect()
    }
}

impl FromStr for Level {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let level = Level::ALL.into_iter().find(|l| l.as_str() == s);
        level.ok_or_else(|| {
            format!("unknown Pod Security level {s:?}: expected privileged, baseline or restricted")
        })
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One check a pod fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The check, named like the API server's reasons (e.g. "privileged").
    pub check: &'static str,
    /// Who fails it and what they must (not) set.
    pub detail: String,
}

/// What a pod (its metadata, for the AppArmor annotations, and its spec)
/// fails at `level`; empty when it passes. Privileged: always empty.
///
/// One violation per check, in the order the API server lists them, each
/// naming every container (init, regular, then ephemeral), volume or field
/// that fails it.
pub fn check(level: Level, metadata: &ObjectMeta, spec: &PodSpec) -> Vec<Violation> {
    if level == Level::Privileged {
        return Vec::new();
    }
    let pod = Pod::new(metadata, spec);
    let applies = |(scope, _, _): &&(Scope, &str, Rule)| scope.applies(level, pod.windows);
    let run = |(_, check, rule): &(Scope, &'static str, Rule)| {
        let detail = rule(&pod)?;
        Some(Violation { check, detail })
    };
    RULES.iter().filter(applies).filter_map(run).collect()
}

/// One line, shaped like the API server's refusal so users recognise it:
/// `violates PodSecurity "restricted:latest": privileged (container "a"
/// must not set securityContext.privileged=true), runAsNonRoot != true
/// (pod or container "a" must set securityContext.runAsNonRoot=true)`.
/// With no violations: `satisfies PodSecurity "restricted:latest"`.
pub fn describe(level: Level, violations: &[Violation]) -> String {
    let each = violations
        .iter()
        .map(|v| format!("{} ({})", v.check, v.detail));
    match joined(each, ", ") {
        Some(list) => format!("violates PodSecurity \"{level}:latest\": {list}"),
        None => format!("satisfies PodSecurity \"{level}:latest\""),
    }
}

/// The capabilities a baseline container may add: the runtimes' defaults.
pub const BASELINE_CAPABILITIES: &str = "AUDIT_WRITE CHOWN DAC_OVERRIDE FOWNER FSETID KILL MKNOD \
    NET_BIND_SERVICE SETFCAP SETGID SETPCAP SETUID SYS_CHROOT";

/// The namespaced, isolated sysctls baseline allows (the last two since
/// 1.32).
pub const SAFE_SYSCTLS: &str = "kernel.shm_rmid_forced net.ipv4.ip_local_port_range \
    net.ipv4.ip_unprivileged_port_start net.ipv4.tcp_syncookies net.ipv4.ping_group_range \
    net.ipv4.ip_local_reserved_ports net.ipv4.tcp_keepalive_time net.ipv4.tcp_fin_timeout \
    net.ipv4.tcp_keepalive_intvl net.ipv4.tcp_keepalive_probes net.ipv4.tcp_rmem net.ipv4.tcp_wmem";

/// The SELinux types baseline allows, besides none.
pub const SELINUX_TYPES: &str = "container_t container_init_t container_kvm_t container_engine_t";

/// The volume sources restricted allows, by their API names.
pub const RESTRICTED_VOLUMES: &str = "configMap csi downwardAPI emptyDir ephemeral \
    persistentVolumeClaim projected secret image";

/// The seccomp and AppArmor profile types that keep a confinement.
pub const CONFINED: &str = "RuntimeDefault Localhost";

pub const APPARMOR_ANNOTATION: &str = "container.apparmor.security.beta.kubernetes.io/";

/// Whether `item` is one of the space-separated `list`.
fn listed(list: &str, item: &str) -> bool {
    list.split_whitespace().any(|i| i == item)
}

/// The levels a check applies at.
#[derive(Clone, Copy)]
enum Scope {
    /// Baseline and restricted.
    Baseline,
    /// Baseline only: a stricter check of the same fields replaces it at
    /// restricted (so, as in the API server, a Windows pod escapes both).
    BaselineOnly,
    Restricted,
    /// Restricted, but not for pods whose `spec.os.name` is "windows".
    RestrictedLinux,
}

impl Scope {
    /// At a level above privileged.
    fn applies(self, level: Level, windows: bool) -> bool {
        match self {
            Scope::Baseline => true,
            Scope::BaselineOnly => level == Level::Baseline,
            Scope::Restricted => level == Level::Restricted,
            Scope::RestrictedLinux => level == Level::Restricted && !windows,
        }
    }
}

/// A check: what fails it, if anything does.
type Rule = fn(&Pod<'_>) -> Option<String>;

/// Every check, in the order the API server lists them (by its IDs).
#[rustfmt::skip]
const RULES: [(Scope, &str, Rule); 18] = [
    (Scope::RestrictedLinux, "allowPrivilegeEscalation != false", allow_privilege_escalation),
    (Scope::Baseline, "appArmorProfile", app_armor),
    (Scope::BaselineOnly, "non-default capabilities", capabilities_baseline),
    (Scope::RestrictedLinux, "unrestricted capabilities", capabilities_restricted),
    (Scope::Baseline, "host namespaces", host_namespaces),
    (Scope::Baseline, "hostPath volumes", host_path_volumes),
    (Scope::Baseline, "hostPort", host_ports),
    (Scope::Baseline, "host probes / lifecycle hooks", probe_hosts),
    (Scope::Baseline, "hostProcess", host_process),
    (Scope::Baseline, "privileged", privileged),
    (Scope::Baseline, "procMount", proc_mount),
    (Scope::Restricted, "restricted volume types", restricted_volumes),
    (Scope::Restricted, "runAsNonRoot != true", run_as_non_root),
    (Scope::Restricted, "runAsUser=0", run_as_user),
    (Scope::Baseline, "seLinuxOptions", se_linux),
    (Scope::BaselineOnly, "seccompProfile", seccomp_baseline),
    (Scope::RestrictedLinux, "seccompProfile", seccomp_restricted),
    (Scope::Baseline, "forbidden sysctls", sysctls),
];

/// A pod as the checks read it: its containers of every kind alike.
struct Pod<'a> {
    meta: &'a ObjectMeta,
    spec: &'a PodSpec,
    sc: Option<&'a PodSecurityContext>,
    windows: bool,
    containers: Vec<Ctr<'a>>,
}

/// What the checks read of a container, init container or ephemeral one.
struct Ctr<'a> {
    name: &'a str,
    sc: Option<&'a SecurityContext>,
    ports: &'a [ContainerPort],
    probes: [Option<&'a Probe>; 3],
    lifecycle: Option<&'a Lifecycle>,
}

/// A `Ctr` of a `Container` or an `EphemeralContainer` (same fields).
macro_rules! ctr {
    ($c:expr) => {
        Ctr {
            name: &$c.name,
            sc: $c.security_context.as_ref(),
            ports: $c.ports.as_deref().unwrap_or_default(),
            probes: [&$c.liveness_probe, &$c.readiness_probe, &$c.startup_probe]
                .map(Option::as_ref),
            lifecycle: $c.lifecycle.as_ref(),
        }
    };
}

impl<'a> Pod<'a> {
    fn new(meta: &'a ObjectMeta, spec: &'a PodSpec) -> Self {
        let init = spec.init_containers.iter().flatten().map(|c| ctr!(c));
        let regular = spec.containers.iter().map(|c| ctr!(c));
        let ephemeral = spec.ephemeral_containers.iter().flatten();
        let containers = init.chain(regular).chain(ephemeral.map(|c| ctr!(c)));
        Pod {
            meta,
            spec,
            sc: spec.security_context.as_ref(),
            windows: spec.os.as_ref().is_some_and(|os| os.name == "windows"),
            containers: containers.collect(),
        }
    }

    /// Who sets a value `bad` refuses: the pod (`at_pod`) or containers
    /// (`get`), and the values.
    fn offenders<T: Ord + fmt::Display>(
        &self,
        at_pod: impl Fn(&'a PodSecurityContext) -> Option<T>,
        get: impl Fn(&'a SecurityContext) -> Option<T>,
        bad: impl Fn(&T) -> bool,
    ) -> Option<Found> {
        let mut values = BTreeSet::new();
        let pod = self.sc.and_then(at_pod).filter(&bad);
        let pod = pod.map(|v| values.insert(v)).is_some();
        let mut names = Vec::new();
        for c in &self.containers {
            if let Some(v) = c.sc.and_then(&get).filter(&bad) {
                values.insert(v);
                names.push(c.name);
            }
        }
        let values = quoted(values.iter().map(T::to_string));
        setters(pod, &names).map(|who| Found { who, values })
    }

    /// The containers that do not set a value `ok` accepts, named.
    fn unless<T>(
        &self,
        get: impl Fn(&'a SecurityContext) -> Option<T>,
        ok: impl Fn(&T) -> bool,
    ) -> Option<String> {
        let fails = |c: &&Ctr<'a>| !c.sc.and_then(&get).is_some_and(|v| ok(&v));
        let names = self.containers.iter().filter(fails);
        let names: Vec<&str> = names.map(|c| c.name).collect();
        setters(false, &names)
    }
}

/// Who (`pod`, `containers "a", "b"`...) sets forbidden values, and the
/// values (`"x", "y"`).
struct Found {
    who: String,
    values: String,
}

impl Found {
    /// `{who} must not set securityContext.{setting}`.
    fn must_not_set(&self, setting: &str) -> String {
        format!("{} must not set securityContext.{setting}", self.who)
    }

    /// `{who} must not set securityContext.{field} to {values}`.
    fn must_not_set_to(&self, field: &str) -> String {
        self.must_not_set(&format!("{field} to {}", self.values))
    }
}

/// `container "a"`, `containers "a", "b"`, `volume "v"`...
fn named(kind: &str, names: &[&str]) -> String {
    let plural = if names.len() == 1 { "" } else { "s" };
    format!("{kind}{plural} {}", quoted(names))
}

/// `"a", "b"`.
fn quoted<S: AsRef<str>>(values: impl IntoIterator<Item = S>) -> String {
    let each = values.into_iter().map(|v| format!("{:?}", v.as_ref()));
    each.collect::<Vec<_>>().join(", ")
}

/// Who sets a field: `pod`, `containers "a"`, `pod and container "a"`;
/// `None` when nobody does.
fn setters(pod: bool, containers: &[&str]) -> Option<String> {
    match (pod, containers.is_empty()) {
        (false, true) => None,
        (true, true) => Some("pod".to_owned()),
        (false, false) => Some(named("container", containers)),
        (true, false) => Some(format!("pod and {}", named("container", containers))),
    }
}

/// `{who} must set securityContext.{setting}`.
fn must_set(who: &str, setting: &str) -> String {
    format!("{who} must set securityContext.{setting}")
}

/// `parts` joined by `sep`; `None` when there are none.
fn joined(parts: impl IntoIterator<Item = String>, sep: &str) -> Option<String> {
    let parts: Vec<String> = parts.into_iter().collect();
    (!parts.is_empty()).then(|| parts.join(sep))
}

fn host_namespaces(pod: &Pod<'_>) -> Option<String> {
    let s = pod.spec;
    let all = [("hostNetwork", s.host_network), ("hostPID", s.host_pid)];
    let all = all.into_iter().chain([("hostIPC", s.host_ipc)]);
    let on = all.filter(|(_, on)| *on == Some(true));
    joined(on.map(|(field, _)| format!("{field}=true")), ", ")
}

fn privileged(pod: &Pod<'_>) -> Option<String> {
    let found = pod.offenders(|_| None, |sc| sc.privileged, |p| *p)?;
    Some(found.must_not_set("privileged=true"))
}

/// What each container adds to its capabilities beyond `allowed`.
fn added_beyond(pod: &Pod<'_>, allowed: &str) -> Vec<String> {
    let mut clauses = Vec::new();
    for c in &pod.containers {
        let add = c.sc.and_then(|sc| sc.capabilities.as_ref()?.add.as_deref());
        let add = add.unwrap_or_default().iter();
        let extra = quoted(add.filter(|cap| !listed(allowed, cap)));
        if !extra.is_empty() {
            let name = c.name;
            let field = "securityContext.capabilities.add";
            let clause = format!("container {name:?} must not include {extra} in {field}");
            clauses.push(clause);
        }
    }
    clauses
}

fn capabilities_baseline(pod: &Pod<'_>) -> Option<String> {
    joined(added_beyond(pod, BASELINE_CAPABILITIES), "; ")
}

fn capabilities_restricted(pod: &Pod<'_>) -> Option<String> {
    let drop = |sc: &SecurityContext| sc.capabilities.as_ref()?.drop.clone();
    let no_drop = pod.unless(drop, |d| d.iter().any(|d| d == "ALL"));
    let no_drop = no_drop.map(|who| must_set(&who, "capabilities.drop=[\"ALL\"]"));
    let adds = added_beyond(pod, "NET_BIND_SERVICE");
    joined(no_drop.into_iter().chain(adds), "; ")
}

fn host_path_volumes(pod: &Pod<'_>) -> Option<String> {
    let volumes = pod.spec.volumes.iter().flatten();
    let volumes = volumes.filter(|v| v.host_path.is_some());
    let names: Vec<&str> = volumes.map(|v| v.name.as_str()).collect();
    (!names.is_empty()).then(|| named("volume", &names))
}

fn host_ports(pod: &Pod<'_>) -> Option<String> {
    let mut clauses = Vec::new();
    for c in &pod.containers {
        let ports = c.ports.iter().filter_map(|p| p.host_port);
        let ports: Vec<String> = ports.filter(|p| *p != 0).map(|p| p.to_string()).collect();
        let plural = if ports.len() == 1 { "" } else { "s" };
        if !ports.is_empty() {
            let (name, ports) = (c.name, ports.join(", "));
            clauses.push(format!("container {name:?} uses hostPort{plural} {ports}"));
        }
    }
    joined(clauses, "; ")
}

/// Since 1.34 the kubelet may only probe the pod itself: probes and
/// lifecycle hooks must not name a host.
fn probe_hosts(pod: &Pod<'_>) -> Option<String> {
    let mut clauses = Vec::new();
    for c in &pod.containers {
        let probes = c.probes.iter().flatten();
        let probes = probes.map(|p| (&p.http_get, &p.tcp_socket));
        let hooks = c.lifecycle.map(|l| [&l.post_start, &l.pre_stop]);
        let hooks = hooks.into_iter().flatten().flatten();
        let mut hosts = BTreeSet::new();
        for (http, tcp) in probes.chain(hooks.map(|h| (&h.http_get, &h.tcp_socket))) {
            hosts.extend(http.as_ref().and_then(|h| h.host.as_deref()));
            hosts.extend(tcp.as_ref().and_then(|t| t.host.as_deref()));
        }
        hosts.remove("");
        if !hosts.is_empty() {
            let (name, hosts) = (c.name, quoted(hosts));
            let whose = "its probes or lifecycle hooks";
            let clause = format!("container {name:?} must not set host {hosts} in {whose}");
            clauses.push(clause);
        }
    }
    joined(clauses, "; ")
}

fn host_process(pod: &Pod<'_>) -> Option<String> {
    let at_pod = |sc: &PodSecurityContext| sc.windows_options.as_ref()?.host_process;
    let get = |sc: &SecurityContext| sc.windows_options.as_ref()?.host_process;
    let found = pod.offenders(at_pod, get, |h| *h)?;
    Some(found.must_not_set("windowsOptions.hostProcess=true"))
}

fn app_armor(pod: &Pod<'_>) -> Option<String> {
    let annotations = pod.meta.annotations.iter().flatten();
    let annotations = annotations.filter(|(k, v)| {
        let allowed = *v == "runtime/default" || v.starts_with("localhost/");
        k.starts_with(APPARMOR_ANNOTATION) && !allowed
    });
    let annotations = annotations.map(|(k, v)| format!("annotation {k}={v:?}"));
    let at_pod = |sc: &PodSecurityContext| Some(sc.app_armor_profile.as_ref()?.type_.clone());
    let get = |sc: &SecurityContext| Some(sc.app_armor_profile.as_ref()?.type_.clone());
    let found = pod.offenders(at_pod, get, |t| !listed(CONFINED, t));
    let fields = found.map(|f| f.must_not_set_to("appArmorProfile.type"));
    joined(annotations.chain(fields), "; ")
}

fn se_linux(pod: &Pod<'_>) -> Option<String> {
    type Field = fn(&SELinuxOptions) -> &Option<String>;
    let fields: [(&str, Field); 3] = [
        ("type", |o| &o.type_),
        ("user", |o| &o.user),
        ("role", |o| &o.role),
    ];
    let mut clauses = Vec::new();
    for (name, field) in fields {
        let at_pod = |sc: &PodSecurityContext| field(sc.se_linux_options.as_ref()?).clone();
        let get = |sc: &SecurityContext| field(sc.se_linux_options.as_ref()?).clone();
        // Any user or role is refused; a type only outside the list.
        let bad = |v: &String| !v.is_empty() && (name != "type" || !listed(SELINUX_TYPES, v));
        let setting = format!("seLinuxOptions.{name}");
        clauses.extend(pod.offenders(at_pod, get, bad).map(|found| match name {
            "type" => found.must_not_set_to(&setting),
            _ => found.must_not_set(&setting),
        }));
    }
    joined(clauses, "; ")
}

fn proc_mount(pod: &Pod<'_>) -> Option<String> {
    let get = |sc: &SecurityContext| sc.proc_mount.clone();
    let found = pod.offenders(|_| None, get, |m| m != "Default")?;
    Some(found.must_not_set_to("procMount"))
}

/// Whoever sets a seccomp profile type other than RuntimeDefault or
/// Localhost: baseline's whole check, and half of restricted's.
fn seccomp_baseline(pod: &Pod<'_>) -> Option<String> {
    let at_pod = |sc: &PodSecurityContext| Some(sc.seccomp_profile.as_ref()?.type_.clone());
    let get = |sc: &SecurityContext| Some(sc.seccomp_profile.as_ref()?.type_.clone());
    let found = pod.offenders(at_pod, get, |t| !listed(CONFINED, t))?;
    Some(found.must_not_set_to("seccompProfile.type"))
}

fn seccomp_restricted(pod: &Pod<'_>) -> Option<String> {
    let at_pod = pod.sc.and_then(|sc| sc.seccomp_profile.as_ref());
    let pod_confined = at_pod.is_some_and(|p| listed(CONFINED, &p.type_));
    let unset = pod.unless(|sc| sc.seccomp_profile.as_ref(), |_| true);
    let unset = unset.filter(|_| !pod_confined).map(|who| {
        let who = format!("pod or {who}");
        must_set(
            &who,
            "seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
        )
    });
    joined(seccomp_baseline(pod).into_iter().chain(unset), "; ")
}

fn sysctls(pod: &Pod<'_>) -> Option<String> {
    let set = pod.sc.and_then(|sc| sc.sysctls.as_deref());
    let names = set.unwrap_or_default().iter().map(|s| &s.name);
    joined(names.filter(|n| !listed(SAFE_SYSCTLS, n)).cloned(), ", ")
}

fn restricted_volumes(pod: &Pod<'_>) -> Option<String> {
    let mut names = Vec::new();
    let mut types = BTreeSet::new();
    for v in pod.spec.volumes.iter().flatten() {
        // The sources a volume sets are the fields of its JSON besides its
        // name (one that sets none is an emptyDir once defaulted).
        let sources = match serde_json::to_value(v) {
            Ok(serde_json::Value::Object(fields)) => fields.into_iter().map(|(k, _)| k).collect(),
            _ => vec!["unknown".to_owned()],
        };
        let bad = sources.into_iter().filter(|s| s != "name");
        let bad: Vec<String> = bad.filter(|s| !listed(RESTRICTED_VOLUMES, s)).collect();
        if !bad.is_empty() {
            names.push(v.name.as_str());
            types.extend(bad);
        }
    }
    let volumes = (!names.is_empty()).then(|| named("volume", &names))?;
    let verb = if names.len() == 1 { "uses" } else { "use" };
    let plural = if types.len() == 1 { "" } else { "s" };
    let types = quoted(types);
    let detail = format!("{volumes} {verb} restricted volume type{plural} {types}");
    Some(detail)
}

fn allow_privilege_escalation(pod: &Pod<'_>) -> Option<String> {
    let who = pod.unless(|sc| sc.allow_privilege_escalation, |e| !*e)?;
    Some(must_set(&who, "allowPrivilegeEscalation=false"))
}

fn run_as_non_root(pod: &Pod<'_>) -> Option<String> {
    let explicit = pod.offenders(|sc| sc.run_as_non_root, |sc| sc.run_as_non_root, |v| !*v);
    let explicit = explicit.map(|found| found.must_not_set("runAsNonRoot=false"));
    let at_pod = pod.sc.and_then(|sc| sc.run_as_non_root);
    let unset = pod.unless(|sc| sc.run_as_non_root, |_| true);
    let unset = unset.filter(|_| at_pod != Some(true));
    let unset = unset.map(|who| must_set(&format!("pod or {who}"), "runAsNonRoot=true"));
    joined(explicit.into_iter().chain(unset), "; ")
}

fn run_as_user(pod: &Pod<'_>) -> Option<String> {
    let found = pod.offenders(|sc| sc.run_as_user, |sc| sc.run_as_user, |u| *u == 0)?;
    Some(found.must_not_set("runAsUser=0"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A pod with one container "a": `ctr` and `pod` are merged, deeply,
    /// into the container and the spec.
    fn pod(ctr: Value, pod: Value) -> PodSpec {
        let mut c = json!({"name": "a", "image": "x"});
        merge(&mut c, ctr);
        let mut spec = json!({"containers": [c]});
        merge(&mut spec, pod);
        serde_json::from_value(spec).expect("a valid PodSpec")
    }

    fn merge(into: &mut Value, from: Value) {
        match (into.as_object_mut(), from) {
            (Some(into), Value::Object(from)) => {
                for (k, v) in from {
                    merge(into.entry(k).or_insert(Value::Null), v);
                }
            }
            (_, from) => *into = from,
        }
    }

    /// Container "a" and its pod as restricted wants them.
    fn hardened(ctr: Value, extra: Value) -> PodSpec {
        let mut c = json!({"securityContext": {
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
        }});
        merge(&mut c, ctr);
        let mut p = json!({"securityContext": {
            "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"},
        }});
        merge(&mut p, extra);
        pod(c, p)
    }

    fn checks(level: Level, spec: &PodSpec) -> Vec<(&'static str, String)> {
        let found = check(level, &ObjectMeta::default(), spec);
        found.into_iter().map(|v| (v.check, v.detail)).collect()
    }

    fn names(level: Level, spec: &PodSpec) -> Vec<&'static str> {
        checks(level, spec).into_iter().map(|(c, _)| c).collect()
    }

    #[test]
    fn a_minimal_pod_is_baseline_but_not_restricted() {
        let spec = pod(json!({}), json!({}));
        assert_eq!(names(Level::Baseline, &spec), Vec::<&str>::new());
        assert_eq!(
            names(Level::Restricted, &spec),
            [
                "allowPrivilegeEscalation != false",
                "unrestricted capabilities",
                "runAsNonRoot != true",
                "seccompProfile",
            ]
        );
    }

    #[test]
    fn each_baseline_check_fails_baseline_and_passes_privileged() {
        let sc = |v: Value| json!({"securityContext": v});
        let none = || json!({});
        #[rustfmt::skip]
        let rows: Vec<(&str, Value, Value, &str)> = vec![
            ("host namespaces", none(), json!({"hostNetwork": true, "hostPID": true}), "hostNetwork=true, hostPID=true"),
            ("privileged", sc(json!({"privileged": true})), none(), r#"container "a" must not set securityContext.privileged=true"#),
            ("non-default capabilities", sc(json!({"capabilities": {"add": ["SYS_ADMIN", "CHOWN"]}})), none(), r#"container "a" must not include "SYS_ADMIN" in securityContext.capabilities.add"#),
            ("hostPath volumes", none(), json!({"volumes": [{"name": "v", "hostPath": {"path": "/"}}]}), r#"volume "v""#),
            ("hostPort", json!({"ports": [{"containerPort": 80, "hostPort": 8080}]}), none(), r#"container "a" uses hostPort 8080"#),
            ("appArmorProfile", sc(json!({"appArmorProfile": {"type": "Unconfined"}})), none(), r#"container "a" must not set securityContext.appArmorProfile.type to "Unconfined""#),
            ("appArmorProfile", none(), sc(json!({"appArmorProfile": {"type": "Unconfined"}})), r#"pod must not set securityContext.appArmorProfile.type to "Unconfined""#),
            ("seLinuxOptions", sc(json!({"seLinuxOptions": {"type": "spc_t"}})), none(), r#"container "a" must not set securityContext.seLinuxOptions.type to "spc_t""#),
            ("seLinuxOptions", sc(json!({"seLinuxOptions": {"user": "u", "role": "r"}})), none(), r#"container "a" must not set securityContext.seLinuxOptions.user; container "a" must not set securityContext.seLinuxOptions.role"#),
            ("procMount", sc(json!({"procMount": "Unmasked"})), none(), r#"container "a" must not set securityContext.procMount to "Unmasked""#),
            ("seccompProfile", sc(json!({"seccompProfile": {"type": "Unconfined"}})), none(), r#"container "a" must not set securityContext.seccompProfile.type to "Unconfined""#),
            ("seccompProfile", none(), sc(json!({"seccompProfile": {"type": "Unconfined"}})), r#"pod must not set securityContext.seccompProfile.type to "Unconfined""#),
            ("forbidden sysctls", none(), sc(json!({"sysctls": [{"name": "kernel.msgmax", "value": "1"}, {"name": "net.ipv4.tcp_syncookies", "value": "1"}]})), "kernel.msgmax"),
            ("hostProcess", sc(json!({"windowsOptions": {"hostProcess": true}})), none(), r#"container "a" must not set securityContext.windowsOptions.hostProcess=true"#),
            ("host probes / lifecycle hooks", json!({"livenessProbe": {"httpGet": {"host": "10.0.0.1", "port": 80}}}), none(), r#"container "a" must not set host "10.0.0.1" in its probes or lifecycle hooks"#),
            ("host probes / lifecycle hooks", json!({"lifecycle": {"preStop": {"tcpSocket": {"host": "node", "port": 80}}}}), none(), r#"container "a" must not set host "node" in its probes or lifecycle hooks"#),
        ];
        for (name, ctr, extra, detail) in rows {
            let spec = pod(ctr, extra);
            assert_eq!(checks(Level::Baseline, &spec), [(name, detail.to_owned())]);
            assert_eq!(checks(Level::Privileged, &spec), []);
            // Restricted's capabilities check replaces baseline's.
            let stricter = match name {
                "non-default capabilities" => "unrestricted capabilities",
                name => name,
            };
            assert!(
                names(Level::Restricted, &spec).contains(&stricter),
                "{name}"
            );
        }
    }

    #[test]
    fn baseline_allows_the_defaults_and_the_safe_values() {
        let ctr = json!({
            "ports": [{"containerPort": 80, "hostPort": 0}],
            "securityContext": {
                "privileged": false,
                "capabilities": {"add": ["NET_BIND_SERVICE", "CHOWN", "SYS_CHROOT"]},
                "seLinuxOptions": {"type": "container_init_t", "level": "s0:c1,c2"},
                "procMount": "Default",
                "appArmorProfile": {"type": "Localhost", "localhostProfile": "p"},
                "windowsOptions": {"hostProcess": false},
            },
            "readinessProbe": {"httpGet": {"port": 80}},
        });
        let spec = json!({"hostNetwork": false, "securityContext": {
            "seccompProfile": {"type": "RuntimeDefault"},
            "sysctls": [{"name": "net.ipv4.tcp_rmem", "value": "4096 87380 6291456"}],
        }});
        assert_eq!(checks(Level::Baseline, &pod(ctr, spec)), []);
    }

    #[test]
    fn the_apparmor_annotations_are_checked() {
        let meta = |value: &str| ObjectMeta {
            annotations: Some([(format!("{APPARMOR_ANNOTATION}a"), value.to_owned())].into()),
            ..ObjectMeta::default()
        };
        let spec = pod(json!({}), json!({}));
        let detail = format!("annotation {APPARMOR_ANNOTATION}a=\"unconfined\"");
        let found = check(Level::Baseline, &meta("unconfined"), &spec);
        assert_eq!(
            found,
            [Violation {
                check: "appArmorProfile",
                detail
            }]
        );
        for fine in ["runtime/default", "localhost/mine"] {
            assert_eq!(check(Level::Baseline, &meta(fine), &spec), []);
        }
    }

    #[test]
    fn every_kind_of_container_is_named() {
        let privileged = |name| json!({"name": name, "securityContext": {"privileged": true}});
        let kinds =
            json!({"initContainers": [privileged("i")], "ephemeralContainers": [privileged("e")]});
        let spec = pod(json!({"securityContext": {"privileged": true}}), kinds);
        let detail = r#"containers "i", "a", "e" must not set securityContext.privileged=true"#;
        assert_eq!(
            checks(Level::Baseline, &spec),
            [("privileged", detail.to_owned())]
        );
    }

    /// The checks and details a pod fails.
    type Expected = &'static [(&'static str, &'static str)];

    #[test]
    fn restricted() {
        let sc = |v: Value| json!({"securityContext": v});
        let none = || json!({});
        let windows = |v: Value| json!({"os": {"name": "windows"}, "securityContext": v});
        #[rustfmt::skip]
        let rows: Vec<(&str, Value, Value, Expected)> = vec![
            ("hardened", none(), none(), &[]),
            ("settings on the container", sc(json!({"runAsNonRoot": true, "seccompProfile": {"type": "Localhost"}})), json!({"securityContext": null}), &[]),
            ("allowed volumes", none(), json!({"volumes": [
                {"name": "c", "configMap": {"name": "c"}}, {"name": "s", "secret": {}}, {"name": "e", "emptyDir": {}},
                {"name": "p", "persistentVolumeClaim": {"claimName": "p"}}, {"name": "i", "image": {"reference": "x"}},
                {"name": "d", "csi": {"driver": "d"}}, {"name": "none"},
            ]}), &[]),
            ("NET_BIND_SERVICE", sc(json!({"capabilities": {"add": ["NET_BIND_SERVICE"]}})), none(), &[]),
            ("CHOWN", sc(json!({"capabilities": {"add": ["CHOWN"]}})), none(), &[("unrestricted capabilities", r#"container "a" must not include "CHOWN" in securityContext.capabilities.add"#)]),
            ("no drop", sc(json!({"capabilities": null})), none(), &[("unrestricted capabilities", r#"container "a" must set securityContext.capabilities.drop=["ALL"]"#)]),
            ("escalation", sc(json!({"allowPrivilegeEscalation": true})), none(), &[("allowPrivilegeEscalation != false", r#"container "a" must set securityContext.allowPrivilegeEscalation=false"#)]),
            ("container undoes runAsNonRoot", sc(json!({"runAsNonRoot": false})), none(), &[("runAsNonRoot != true", r#"container "a" must not set securityContext.runAsNonRoot=false"#)]),
            ("pod runAsNonRoot false", none(), sc(json!({"runAsNonRoot": false})), &[("runAsNonRoot != true", r#"pod must not set securityContext.runAsNonRoot=false; pod or container "a" must set securityContext.runAsNonRoot=true"#)]),
            ("root", sc(json!({"runAsUser": 0})), sc(json!({"runAsUser": 0})), &[("runAsUser=0", r#"pod and container "a" must not set securityContext.runAsUser=0"#)]),
            ("pod unconfined", none(), sc(json!({"seccompProfile": {"type": "Unconfined"}})), &[("seccompProfile", r#"pod must not set securityContext.seccompProfile.type to "Unconfined"; pod or container "a" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost""#)]),
            ("other volumes", none(), json!({"volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}}, {"name": "h", "hostPath": {"path": "/"}}]}), &[
                ("hostPath volumes", r#"volume "h""#),
                ("restricted volume types", r#"volumes "n", "h" use restricted volume types "hostPath", "nfs""#),
            ]),
            ("windows skips the Linux-only checks", json!({"securityContext": null}), windows(json!({"runAsNonRoot": true, "seccompProfile": null})), &[]),
            ("but not runAsNonRoot", json!({"securityContext": null}), windows(Value::Null), &[("runAsNonRoot != true", r#"pod or container "a" must set securityContext.runAsNonRoot=true"#)]),
        ];
        for (name, ctr, extra, expected) in rows {
            let found = checks(Level::Restricted, &hardened(ctr, extra));
            let found: Vec<(&str, &str)> = found.iter().map(|(c, d)| (*c, d.as_str())).collect();
            assert_eq!(found, expected, "{name}");
        }
    }

    #[test]
    fn describe_reads_like_the_api_server() {
        let spec = hardened(
            json!({"securityContext": {"privileged": true}}),
            json!({"securityContext": {"runAsNonRoot": null}}),
        );
        let found = check(Level::Restricted, &ObjectMeta::default(), &spec);
        assert_eq!(
            describe(Level::Restricted, &found),
            r#"violates PodSecurity "restricted:latest": privileged (container "a" must not set securityContext.privileged=true), runAsNonRoot != true (pod or container "a" must set securityContext.runAsNonRoot=true)"#
        );
        assert_eq!(
            describe(Level::Baseline, &[]),
            r#"satisfies PodSecurity "baseline:latest""#
        );
    }

    #[test]
    fn levels_parse_order_and_nest() {
        for level in Level::ALL {
            assert_eq!(level.as_str().parse::<Level>(), Ok(level));
            assert_eq!(level.to_string(), level.as_str());
            assert_eq!(
                serde_json::to_value(level).ok(),
                Some(json!(level.as_str()))
            );
        }
        let err = "Restricted"
            .parse::<Level>()
            .expect_err("names are lowercase");
        assert!(err.contains("privileged, baseline or restricted"), "{err}");
        assert!(Level::Privileged < Level::Baseline && Level::Baseline < Level::Restricted);
        assert_eq!(Level::default(), Level::Baseline);
        assert_eq!(Level::Privileged.and_stricter(), Level::ALL);
        assert_eq!(
            Level::Baseline.and_stricter(),
            [Level::Baseline, Level::Restricted]
        );
        assert_eq!(Level::Restricted.and_stricter(), [Level::Restricted]);
    }
}
