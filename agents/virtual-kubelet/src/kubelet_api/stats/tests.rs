use super::*;
use serde_json::json;

#[test]
fn quantities() {
    for (q, want) in [
        ("250m", Some(0.25)),
        ("1", Some(1.0)),
        ("12345n", Some(12345e-9)),
        ("1Ki", Some(1024.0)),
        ("1.5Gi", Some(1.5 * 1024.0 * 1024.0 * 1024.0)),
        ("2M", Some(2e6)),
        ("1e3", Some(1000.0)),
        ("5u", Some(5e-6)),
        ("", None),
        ("x", None),
        ("1Zi", None),
        ("-1", None),
    ] {
        let got = quantity(q);
        let close = match (got, want) {
            (Some(g), Some(w)) => (g - w).abs() <= w.abs() * 1e-12,
            (g, w) => g == w,
        };
        assert!(close, "{q}: {got:?} != {want:?}");
    }
}

fn local(ns: &str, name: &str, uid: &str) -> Arc<LocalPod> {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": ns, "uid": uid },
        "status": { "startTime": "2026-01-01T00:00:00Z" },
    }))
    .expect("pod");
    Arc::new(LocalPod::from(pod))
}

fn metrics(name: &str, containers: serde_json::Value) -> PodMetrics {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "timestamp": "2026-01-01T00:01:00Z",
        "containers": containers,
    }))
    .expect("metrics")
}

#[test]
fn figures_follow_the_remote_pods_to_the_local_ones() {
    let locals = [local("shop", "web-1", "u1"), local("shop", "web-2", "u2")];
    let map = BTreeMap::from([
        (
            ("shop-c".to_owned(), "web-1-abc".to_owned()),
            "u1".to_owned(),
        ),
        (
            ("shop-c".to_owned(), "gone-xyz".to_owned()),
            "u9".to_owned(),
        ),
    ]);
    let ms = [
        (
            "shop-c".to_owned(),
            metrics(
                "web-1-abc",
                json!([
                    { "name": "web", "usage": { "cpu": "10m", "memory": "1Mi" } },
                    { "name": "side", "usage": { "cpu": "5m" } },
                ]),
            ),
        ),
        // A remote pod whose local pod is gone, one not ours.
        ("shop-c".to_owned(), metrics("gone-xyz", json!([]))),
        ("shop-c".to_owned(), metrics("other", json!([]))),
    ];
    let got = figures(&locals, &map, &ms);
    assert_eq!(got.len(), 1);
    let p = &got[0];
    assert_eq!(
        (p.namespace.as_str(), p.name.as_str(), p.uid.as_str()),
        ("shop", "web-1", "u1")
    );
    assert_eq!(
        p.containers,
        [
            (
                "web".to_owned(),
                Usage {
                    nano_cores: Some(10_000_000),
                    working_set_bytes: Some(1_048_576),
                    cpu_seconds: None,
                }
            ),
            (
                "side".to_owned(),
                Usage {
                    nano_cores: Some(5_000_000),
                    working_set_bytes: None,
                    cpu_seconds: None,
                }
            ),
        ]
    );
    assert_eq!(
        p.total(),
        Usage {
            nano_cores: Some(15_000_000),
            working_set_bytes: Some(1_048_576),
            cpu_seconds: None,
        }
    );
}

#[test]
fn the_summary_omits_what_is_not_known() {
    let pods = figures(
        &[local("shop", "web-1", "u1")],
        &BTreeMap::from([(("t".to_owned(), "r".to_owned()), "u1".to_owned())]),
        &[(
            "t".to_owned(),
            metrics(
                "r",
                json!([{ "name": "web", "usage": { "cpu": "1m", "memory": "2Ki" } }]),
            ),
        )],
    );
    let now = "2026-01-01T00:02:00Z";
    let with = serde_json::to_value(summary("vn", Some("s"), now, true, 0.5, &pods)).expect("json");
    assert_eq!(with["node"]["nodeName"], "vn");
    assert_eq!(with["node"]["cpu"]["usageNanoCores"], 1_000_000);
    assert_eq!(with["node"]["memory"]["workingSetBytes"], 2048);
    assert_eq!(with["pods"][0]["podRef"]["uid"], "u1");
    assert_eq!(
        with["pods"][0]["containers"][0]["cpu"]["time"],
        "2026-01-01T00:01:00Z"
    );
    assert_eq!(with["pods"][0]["memory"]["workingSetBytes"], 2048);
    assert_eq!(with["node"]["cpu"]["usageCoreNanoSeconds"], 500_000_000);
    // Not counted yet: no counter rather than zero.
    assert!(
        with["pods"][0]["cpu"].get("usageCoreNanoSeconds").is_none(),
        "{with}"
    );
    // Measured but empty: the node uses nothing.
    let idle = serde_json::to_value(summary("vn", None, now, true, 0.0, &[])).expect("json");
    assert_eq!(idle["node"]["cpu"]["usageNanoCores"], 0);
    // Not measured: no figure at all, rather than zeros.
    let none = serde_json::to_value(summary("vn", None, now, false, 0.0, &[])).expect("json");
    assert!(none["node"].get("cpu").is_none(), "{none}");
    assert!(none["node"].get("memory").is_none(), "{none}");
    assert_eq!(none["pods"], json!([]));
}

fn figure(uid: &str, timestamp: &str, window: Option<i64>, millicores: u64) -> PodFigures {
    PodFigures {
        namespace: "shop".into(),
        name: format!("web-{uid}"),
        uid: uid.into(),
        start_time: None,
        timestamp: Some(timestamp.into()),
        window_ms: window,
        containers: vec![(
            "web".into(),
            Usage {
                nano_cores: Some(millicores * 1_000_000),
                working_set_bytes: Some(100),
                cpu_seconds: None,
            },
        )],
    }
}

fn seconds(pods: &[PodFigures]) -> Vec<Option<f64>> {
    pods.iter().map(|p| p.containers[0].1.cpu_seconds).collect()
}

#[test]
fn go_durations() {
    for (d, want) in [
        ("15s", Some(15_000)),
        ("15.004s", Some(15_004)),
        ("1m0.5s", Some(60_500)),
        ("1h0m0s", Some(3_600_000)),
        ("250ms", Some(250)),
        ("1500us", Some(2)),
        ("0s", Some(0)),
        ("", None),
        ("15", None),
        ("1d", None),
    ] {
        assert_eq!(go_duration_ms(d), want, "{d}");
    }
}

#[test]
fn counters_add_up_the_providers_rates_between_its_samples() {
    let mut counters = CpuCounters::default();
    let all = |_: &str| true;
    // First sample: 200m over a 10 s window, 2 CPU-seconds.
    let mut pods = [figure("u1", "2026-01-01T00:00:10Z", Some(10_000), 200)];
    counters.count(&mut pods, all);
    assert_eq!(seconds(&pods), [Some(2.0)]);
    // The same sample read again: nothing more.
    counters.count(&mut pods, all);
    assert_eq!(seconds(&pods), [Some(2.0)]);
    // 15 s later at 1 core: 15 more. A reader's rate between the two
    // readings, (17 − 2) / 15 s, is the provider's.
    let mut pods = [figure("u1", "2026-01-01T00:00:25Z", Some(15_000), 1_000)];
    counters.count(&mut pods, all);
    assert_eq!(seconds(&pods), [Some(17.0)]);
    // An older sample (another provider replica lagging) counts nothing.
    let mut pods = [figure("u1", "2026-01-01T00:00:20Z", Some(15_000), 4_000)];
    counters.count(&mut pods, all);
    assert_eq!(seconds(&pods), [Some(17.0)]);
    // A second pod, without a window: it starts from zero.
    let mut pods = [
        figure("u1", "2026-01-01T00:00:25Z", Some(15_000), 1_000),
        figure("u2", "2026-01-01T00:00:25Z", None, 500),
    ];
    counters.count(&mut pods, all);
    assert_eq!(seconds(&pods), [Some(17.0), Some(0.0)]);
    assert!((counters.node_seconds() - 17.0).abs() < 1e-9);
    // u1's pod is gone: forgotten, but the node's counter keeps it.
    let mut pods = [figure("u2", "2026-01-01T00:00:35Z", None, 500)];
    counters.count(&mut pods, |uid| uid == "u2");
    assert_eq!(seconds(&pods), [Some(5.0)]);
    assert!((counters.node_seconds() - 22.0).abs() < 1e-9);
    // A pod without a timestamp, or a container without a rate, has
    // no counter.
    let mut pods = [figure("u3", "not a time", Some(1_000), 1)];
    counters.count(&mut pods, all);
    assert_eq!(seconds(&pods), [None]);
}

#[test]
fn resource_metrics_in_prometheus_text() {
    let mut pods = vec![figure("u1", "2026-01-01T00:00:10Z", Some(10_000), 200)];
    // Memory only until the CPU is counted.
    let text = resource_metrics(true, 0.0, &pods, 7);
    assert!(
        !text.contains("container_cpu_usage_seconds_total{"),
        "{text}"
    );
    CpuCounters::default().count(&mut pods, |_| true);
    let at = "1767225610000";
    let text = resource_metrics(true, 2.5, &pods, 7);
    for line in [
        format!(
            "container_cpu_usage_seconds_total{{container=\"web\",namespace=\"shop\",pod=\"web-u1\"}} 2.000000000 {at}"
        ),
        format!(
            "container_memory_working_set_bytes{{container=\"web\",namespace=\"shop\",pod=\"web-u1\"}} 100 {at}"
        ),
        format!(
            "pod_cpu_usage_seconds_total{{namespace=\"shop\",pod=\"web-u1\"}} 2.000000000 {at}"
        ),
        format!("pod_memory_working_set_bytes{{namespace=\"shop\",pod=\"web-u1\"}} 100 {at}"),
        "node_cpu_usage_seconds_total 2.500000000 7".to_owned(),
        "node_memory_working_set_bytes 100 7".to_owned(),
        "# TYPE container_cpu_usage_seconds_total counter".to_owned(),
        "scrape_error 0".to_owned(),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    let unmeasured = resource_metrics(false, 0.0, &[], 7);
    assert!(
        unmeasured.lines().any(|l| l == "scrape_error 1"),
        "{unmeasured}"
    );
    assert!(!unmeasured.contains("node_"), "{unmeasured}");
}
