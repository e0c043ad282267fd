use super::*;
use render::{status_detail, status_line};

const WIDE: Layout = Layout {
    wide: true,
    width: None,
};

fn peering(name: &str, id: &str, direction: &str) -> PeeringView {
    PeeringView {
        name: name.into(),
        cluster_id: id.into(),
        direction: direction.into(),
        virtual_node: None,
        ready: None,
        conditions: Vec::new(),
        request: None,
        grant: None,
        cost: None,
        certificate_expiry: None,
        tenant_namespace: None,
        admission: None,
        largest_free_node: None,
        user: None,
        network: None,
    }
}

#[test]
fn offloaded_namespaces_show_one_row_per_peer() {
    let info = info_with_offloaded_namespace();
    let out = render(&info, WIDE);
    for want in [
        "Clusterset services: 2 exported here, 1 imported",
        "export shop/ghost: NoService",
        "CoreDNS does not serve clusterset.local",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
    for want in [
        "shop",
        "Remote",
        "(all peers)",
        "p1",
        "Ready",
        "p2",
        "Not ready: AlreadyExists",
        "baseline (enforced)",
    ] {
        assert!(out.contains(want), "{want}:\n{out}");
    }
    assert_eq!(out.matches("shop-home").count(), 2, "{out}");
    // Pods being refused: not ready, how many and why.
    let mut refusing = info;
    refusing.offloaded_namespaces[0].refusing = Refusing {
        pods: 20,
        why: Some("pods \"web-1\" is forbidden: violates PodSecurity".into()),
    };
    let out = render(&refusing, WIDE);
    assert!(out.contains("Not ready: 20 pods refused"), "{out}");
}

#[test]
fn peers_are_found_by_id_or_name_and_unknown_names_list_the_known() {
    let all = [
        peering("provider", "provider-1", "outgoing"),
        peering("consumer", "consumer-1", "incoming"),
    ];
    assert_eq!(matching(&all, "provider-1").map(|f| f.len()).ok(), Some(1));
    assert_eq!(
        matching(&all, "consumer")
            .ok()
            .map(|f| f[0].cluster_id.clone()),
        Some("consumer-1".to_owned())
    );
    let err = matching(&all, "nope").expect_err("unknown");
    assert!(matches!(err, UserError::NotFound(_)));
    let line = err.to_string();
    assert!(
        line.contains("provider (provider-1, outgoing)")
            && line.contains("consumer (consumer-1, incoming)")
            && !line.contains('\n'),
        "{line}"
    );
    assert!(
        matching(&[], "x")
            .expect_err("none")
            .to_string()
            .contains("no peerings")
    );
}

#[test]
fn outgoing_peerings_say_why_they_are_not_ready() {
    let fc: ForeignCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "liqo.io/v1alpha1", "kind": "ForeignCluster",
        "metadata": { "name": "p-1" },
        "spec": { "clusterId": "p-1", "clusterName": "p", "outgoing": true },
        "status": { "grant": { "cpu": "1", "pods": "5" }, "tenantNamespace": "liqo-tenant-c" },
    }))
    .expect("fc");
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "liqo-p-1" },
        "status": { "conditions": [{
            "type": "Ready", "status": "False", "reason": "ProviderUnreachable",
            "message": "cannot reach the provider",
        }]},
    }))
    .expect("node");
    let p = outgoing(fc.clone(), std::slice::from_ref(&node));
    assert_eq!(status_line(&p), "Not ready: ProviderUnreachable");
    assert_eq!(
        status_detail(&p),
        "Not ready: ProviderUnreachable\ncannot reach the provider"
    );
    let detail = render_one(&p, WIDE);
    for want in [
        "cannot reach the provider",
        "liqo-tenant-c",
        "cpu 1, memory 0, pods 5",
    ] {
        assert!(detail.contains(want), "{want} missing from\n{detail}");
    }
    let missing = outgoing(fc, &[]);
    assert_eq!(
        missing.ready.map(|r| r.reason),
        Some("NoVirtualNode".to_owned())
    );
}

/// An overview with long values everywhere: a peering not ready for a long
/// reason, a namespace refusing pods, a long image name.
fn crowded() -> Info {
    let mut info = info_with_offloaded_namespace();
    let mut p = peering(
        "provider-with-a-long-name",
        "provider-with-a-long-name-1",
        "outgoing",
    );
    p.ready = Some(Ready {
        status: "False".into(),
        reason: "ProviderUnreachable".into(),
        message: "the provider's API server at https://provider.example.com:6443 did not \
                  answer within 10 s: connection refused"
            .into(),
    });
    p.grant = Some(
        serde_json::from_value(serde_json::json!({
            "cpu": "12", "memory": "48Gi", "pods": "110",
        }))
        .expect("resources"),
    );
    p.tenant_namespace = Some("liqo-tenant-consumer-with-a-long-name-1".into());
    p.certificate_expiry = Some("2027-11-28T17:48:51Z".into());
    p.network = Some(NetworkView {
        reason: Some("no handshake with 192.168.100.2:51820 for 3 minutes".into()),
        ..NetworkView::default()
    });
    info.peerings = vec![p];
    info.agents = vec![Agent {
        name: "liqo-gateway".into(),
        ready: true,
        ready_replicas: 1,
        replicas: 1,
        image: "registry.internal.example.com:5000/platform/liqo/liqo-gateway:0.1.0".into(),
    }];
    info.offloaded_namespaces[0].refusing = Refusing {
        pods: 20,
        why: Some(
            "pods \"web-1\" is forbidden: violates PodSecurity \"restricted:latest\": \
             allowPrivilegeEscalation != false"
                .into(),
        ),
    };
    info
}

#[test]
fn the_overview_fits_its_width_and_wide_shows_every_column() {
    let info = crowded();
    for width in [100u16, 80, 60] {
        let out = render(
            &info,
            Layout {
                wide: false,
                width: Some(width),
            },
        );
        for line in out.lines() {
            assert!(
                line.chars().count() <= usize::from(width),
                "a line of {} columns at width {width}:\n{out}",
                line.chars().count()
            );
        }
        for want in [
            "provider-with",
            "Ready",
            "ProviderUnreachable",
            "shop",
            "cpu 12",
        ] {
            assert!(
                out.contains(want),
                "{want:?} missing at width {width}:\n{out}"
            );
        }
        // Details only -o wide shows.
        assert!(!out.contains("Certificate expiry"), "{out}");
        assert!(!out.contains("shop-home"), "{out}");
    }
    let wide = render(&info, WIDE);
    for want in [
        "Certificate expiry",
        "2027-11-28T17:48:51Z",
        "liqo-tenant-consumer-with-a-long-name-1",
        "provider-with-a-long-name-1",
        "shop-home",
        "(all peers)",
    ] {
        assert!(
            wide.contains(want),
            "{want:?} missing from -o wide:\n{wide}"
        );
    }
}

/// An overview of one namespace offloaded to two peers, one ready.
fn info_with_offloaded_namespace() -> Info {
    let entry = |id: &str, ready: bool| ClusterOffloadingStatus {
        cluster_id: liqo_api::ClusterId::new(id).expect("valid"),
        remote_namespace: "shop-home".into(),
        ready,
        reason: (!ready).then(|| "AlreadyExists".into()),
        message: None,
    };
    Info {
        identity: liqo_api::ClusterIdentity {
            cluster_id: liqo_api::ClusterId::new("home-1").expect("valid"),
            cluster_name: "home".into(),
            labels: Default::default(),
            pod_cidr: "10.0.0.0/16".parse().expect("cidr"),
            service_cidr: "10.1.0.0/16".parse().expect("cidr"),
            version: liqo_api::VERSION.into(),
        },
        mode: "autonomous".into(),
        agents: Vec::new(),
        peerings: Vec::new(),
        peering_tokens: Vec::new(),
        offloaded_namespaces: vec![Offloaded {
            namespace: "shop".into(),
            pod_offloading_strategy: "Remote".into(),
            namespace_mapping_strategy: "DefaultName".into(),
            cluster_selector: None,
            clusters: vec![entry("p1", true), entry("p2", false)],
            pod_security: Some("baseline (enforced)".into()),
            refusing: Refusing::default(),
        }],
        clusterset: super::clusterset::ClustersetView {
            exports: vec!["shop/web".into(), "shop/ghost".into()],
            problems: vec![
                "shop/ghost: NoService: there is no Service shop/ghost to export".into(),
            ],
            imports: vec!["shop/web".into()],
            dns: crate::kube::cluster_dns::DnsState::NotServed,
        },
    }
}
