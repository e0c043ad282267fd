use super::*;

fn toleration(key: Option<&str>, effect: Option<&str>) -> Toleration {
    Toleration {
        key: key.map(str::to_owned),
        effect: effect.map(str::to_owned),
        operator: Some("Exists".to_owned()),
        ..Toleration::default()
    }
}

#[test]
fn tolerations_are_those_listed_and_the_default_ones() {
    let a = Admission {
        tolerations: vec!["dedicated".to_owned()],
        ..Admission::default()
    };
    for (key, effect, ok) in [
        (Some("dedicated"), Some("NoSchedule"), true),
        (Some("dedicated"), None, true),
        (
            Some("node.kubernetes.io/not-ready"),
            Some("NoExecute"),
            true,
        ),
        (
            Some("node.kubernetes.io/unreachable"),
            Some("NoExecute"),
            true,
        ),
        (
            Some("node.kubernetes.io/not-ready"),
            Some("NoSchedule"),
            false,
        ),
        (Some("node-role.kubernetes.io/control-plane"), None, false),
        // Tolerates everything.
        (None, None, false),
        (Some(""), None, false),
    ] {
        assert_eq!(
            a.tolerates(&toleration(key, effect)),
            ok,
            "{key:?} {effect:?}"
        );
    }
    assert!(!Admission::default().tolerates(&toleration(Some("dedicated"), None)));
}

#[test]
fn priority_classes_are_none_but_those_listed() {
    let a = Admission::default();
    assert!(a.allows_priority_class(""));
    assert!(!a.allows_priority_class("system-cluster-critical"));
    let a = Admission {
        priority_classes: vec!["batch-low".to_owned()],
        ..a
    };
    assert!(a.allows_priority_class("batch-low"));
    assert!(!a.allows_priority_class("system-node-critical"));
}

#[test]
fn namespace_labels_follow_the_level_and_drop_pinned_versions() {
    let a = Admission {
        pod_security: Level::Baseline,
        ..Admission::default()
    };
    assert_eq!(
        a.namespace_labels()
            .get(labels::ENFORCE)
            .map(String::as_str),
        Some("baseline")
    );
    assert_eq!(
        a.namespace_label_changes(Some(&a.namespace_labels())),
        BTreeMap::new()
    );
    let mut old = Admission {
        pod_security: Level::Restricted,
        ..Admission::default()
    }
    .namespace_labels();
    old.insert(labels::ENFORCE_VERSION.to_owned(), "v1.20".to_owned());
    old.insert(labels::WARN_VERSION.to_owned(), "latest".to_owned());
    let changes = a.namespace_label_changes(Some(&old));
    assert_eq!(changes.len(), 4, "{changes:?}");
    assert_eq!(changes[labels::ENFORCE_VERSION], None);
    assert_eq!(changes[labels::AUDIT].as_deref(), Some("baseline"));
    assert_eq!(a.namespace_label_changes(None).len(), 3);
}

#[test]
fn refusals_name_each_rule_a_pod_breaks() {
    let spec: PodSpec = serde_json::from_value(serde_json::json!({
        "containers": [{ "name": "app", "image": "app",
            "resources": { "limits": { "ephemeral-storage": "1Gi" } } }],
        "priorityClassName": "system-cluster-critical",
        "tolerations": [{ "key": "dedicated", "operator": "Exists" }],
    }))
    .expect("spec");
    let a = Admission {
        pod_security: Level::Baseline,
        node_selector: BTreeMap::from([("pool".to_owned(), "peers".to_owned())]),
        runtime_class_name: Some("gvisor".to_owned()),
        ..Admission::default()
    };
    let grant = Resources::default();
    let got = a.refusals(&grant, &ObjectMeta::default(), &spec);
    assert_eq!(
        got,
        [
            "priorityClassName system-cluster-critical is not one the provider allows",
            "the provider does not allow tolerating dedicated",
            "nodeSelector must hold pool=peers",
            "runtimeClassName must be gvisor",
        ]
    );
    // Within the terms: nothing.
    let ok = PodSpec {
        priority_class_name: None,
        tolerations: None,
        node_selector: Some(a.node_selector.clone()),
        runtime_class_name: a.runtime_class_name.clone(),
        ..spec
    };
    assert!(a.refusals(&grant, &ObjectMeta::default(), &ok).is_empty());
    // Restricted: the bare container fails its checks.
    let restricted = Admission {
        pod_security: Level::Restricted,
        ..Admission::default()
    };
    let got = restricted.refusals(&grant, &ObjectMeta::default(), &ok);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("violates PodSecurity \"restricted:latest\""),
        "{got:?}"
    );
}

#[test]
fn volumes_hold_only_what_the_peer_put_in_its_namespace() {
    let spec = |volumes: serde_json::Value| -> PodSpec {
        serde_json::from_value(serde_json::json!({
            "containers": [{ "name": "app", "image": "app",
                "resources": { "limits": { "ephemeral-storage": "1Gi" } } }],
            "volumes": volumes,
        }))
        .expect("spec")
    };
    let grant = Resources::default();
    let meta = ObjectMeta::default();
    let baseline = Admission::default();
    let privileged = Admission {
        pod_security: Level::Privileged,
        ..Admission::default()
    };
    let allowed = spec(serde_json::json!([
        { "name": "a", "configMap": { "name": "x" } },
        { "name": "b", "secret": { "secretName": "x" } },
        { "name": "c", "emptyDir": {} },
        { "name": "d", "downwardAPI": { "items": [] } },
        { "name": "e", "projected": { "sources": [{ "configMap": { "name": "x" } }] } },
    ]));
    assert_eq!(
        baseline.refusals(&grant, &meta, &allowed),
        Vec::<String>::new()
    );
    for (volume, level, says) in [
        (
            serde_json::json!({ "name": "t", "projected": { "sources": [
                { "serviceAccountToken": { "path": "t", "audience": "sts.amazonaws.com" } }] } }),
            &privileged,
            "service account token",
        ),
        (
            serde_json::json!({ "name": "e", "ephemeral": { "volumeClaimTemplate": { "spec": {} } } }),
            &privileged,
            "generic ephemeral",
        ),
        (
            serde_json::json!({ "name": "p", "persistentVolumeClaim": { "claimName": "x" } }),
            &privileged,
            "claim",
        ),
        (
            serde_json::json!({ "name": "n", "nfs": { "server": "x", "path": "/" } }),
            &baseline,
            "type the provider does not allow",
        ),
        (
            serde_json::json!({ "name": "c", "csi": { "driver": "x" } }),
            &baseline,
            "type the provider does not allow",
        ),
    ] {
        let got = level.refusals(&grant, &meta, &spec(serde_json::json!([volume])));
        assert!(got.iter().any(|r| r.contains(says)), "{volume}: {got:?}");
    }
    // Privileged admits network filesystems (its level), never claims.
    let nfs = spec(serde_json::json!([{ "name": "n", "nfs": { "server": "x", "path": "/" } }]));
    assert!(privileged.refusals(&grant, &meta, &nfs).is_empty());
}

#[test]
fn containers_ask_only_what_a_grant_holds_and_state_their_disk() {
    let spec = |resources: serde_json::Value| -> PodSpec {
        serde_json::from_value(serde_json::json!({
            "containers": [{ "name": "app", "image": "app", "resources": resources }],
        }))
        .expect("spec")
    };
    let grant = Resources {
        cpu: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
            "4".into(),
        )),
        memory: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
            "8Gi".into(),
        )),
        pods: None,
        storage: None,
        claims: None,
    };
    let a = Admission::default();
    let meta = ObjectMeta::default();
    let ok = spec(serde_json::json!({ "limits": {
        "cpu": "4", "memory": "8Gi", "ephemeral-storage": "4Gi" } }));
    assert_eq!(a.refusals(&grant, &meta, &ok), Vec::<String>::new());
    for (resources, says) in [
        (
            serde_json::json!({ "limits": { "cpu": "1000", "ephemeral-storage": "1Gi" } }),
            "cpu limit above",
        ),
        (
            serde_json::json!({ "limits": { "memory": "1000Gi", "ephemeral-storage": "1Gi" } }),
            "memory limit above",
        ),
        (serde_json::json!({}), "ephemeral-storage limit"),
        (
            serde_json::json!({ "limits": { "ephemeral-storage": "5Gi" } }),
            "ephemeral-storage limit",
        ),
        (
            serde_json::json!({ "limits": { "nvidia.com/gpu": "1", "ephemeral-storage": "1Gi" } }),
            "nvidia.com/gpu is not in the grant",
        ),
        (
            serde_json::json!({ "requests": { "hugepages-2Mi": "2Mi" }, "limits": { "ephemeral-storage": "1Gi" } }),
            "hugepages-2Mi",
        ),
    ] {
        let got = a.refusals(&grant, &meta, &spec(resources.clone()));
        assert!(got.iter().any(|r| r.contains(says)), "{resources}: {got:?}");
    }
}

#[test]
fn reserved_names_are_refused_as_peer_namespaces() {
    let a = Admission {
        reserved_namespaces: vec!["cert-manager".to_owned(), "team-*".to_owned()],
        ..Admission::default()
    };
    for name in [
        "liqo",
        "liqo-tenant-x",
        "kube-system",
        "kube-anything",
        "default",
        "istio-system",
        "cert-manager",
        "team-a",
    ] {
        assert!(!a.allows_namespace_name(name), "{name}");
    }
    for name in [
        "shop",
        "shop-home",
        "liqofoo",
        "liqo-test-network-1",
        "systems",
        "cert-manager-x",
    ] {
        assert!(a.allows_namespace_name(name), "{name}");
    }
}

#[test]
fn the_defaults_admit_ordinary_workloads() {
    let a: Admission = serde_json::from_str("{}").expect("parses");
    assert_eq!(a, Admission::default());
    assert_eq!(a.pod_security, Level::Baseline);
    assert_eq!(a.ephemeral_storage, "4Gi");
    assert_eq!(a.objects, 1000);
    assert_eq!(
        a.describe(),
        "pod security baseline, priority classes none, tolerations none, nodes any node, \
         runtime class any, storage classes none, node ports 0, load balancers 0, local disk 4Gi per container, \
         1000 objects of a kind per namespace, 100 namespaces"
    );
}
