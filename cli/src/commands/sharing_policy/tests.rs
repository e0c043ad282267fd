use liqo_api::sharing::Cost;

use super::*;

fn args() -> SharingPolicySetArgs {
    SharingPolicySetArgs {
        peer: SharingPolicyPeerArg { peer: None },
        cpu: None,
        memory: None,
        pods: None,
        storage: None,
        claims: None,
        floor: None,
        ceiling: None,
        change_threshold: None,
        min_change_interval: None,
        cost_cpu_hour: None,
        cost_memory_gib_hour: None,
        currency: None,
        accept_new_peers: None,
        pod_security: None,
        priority_classes: None,
        tolerations: None,
        node_selector: None,
        runtime_class: None,
        storage_classes: None,
        node_ports: None,
        load_balancers: None,
        ephemeral_storage: None,
        objects: None,
        namespaces: None,
        reserved_namespaces: None,
    }
}

#[test]
fn admission_flags_replace_what_they_name_and_are_checked() {
    let mut a = args();
    a.pod_security = Some("baseline".into());
    a.priority_classes = Some("batch-low, batch-high".into());
    a.node_selector = Some("pool=peers,zone=a".into());
    a.node_ports = Some(3);
    let got = merged(sharing::default_policy(), &a)
        .expect("valid")
        .admission;
    assert_eq!(got.pod_security, Level::Baseline);
    assert_eq!(got.priority_classes, ["batch-low", "batch-high"]);
    assert_eq!(got.node_selector.len(), 2);
    assert_eq!((got.node_ports, got.load_balancers), (3, 0));
    // "" clears a list; what is not given is kept.
    let mut clear = args();
    clear.priority_classes = Some(String::new());
    clear.runtime_class = Some("gvisor".into());
    let base = SharingPolicySpec {
        admission: got.clone(),
        ..sharing::default_policy()
    };
    let again = merged(base, &clear).expect("valid").admission;
    assert!(again.priority_classes.is_empty());
    assert_eq!(again.node_selector, got.node_selector);
    assert_eq!(again.runtime_class_name.as_deref(), Some("gvisor"));
    for (set, flag) in [
        (
            (|a: &mut SharingPolicySetArgs| a.pod_security = Some("root".into())) as fn(&mut _),
            "--pod-security",
        ),
        (
            |a| a.priority_classes = Some("Not_A_Name".into()),
            "--priority-classes",
        ),
        (|a| a.tolerations = Some("bad key".into()), "--tolerations"),
        (|a| a.node_selector = Some("pool".into()), "--node-selector"),
        (
            |a| a.node_selector = Some("pool=bad value".into()),
            "--node-selector",
        ),
        (
            |a| a.runtime_class = Some("UPPER".into()),
            "--runtime-class",
        ),
    ] {
        let mut a = args();
        set(&mut a);
        let err = merged(sharing::default_policy(), &a).expect_err(flag);
        assert!(matches!(err, UserError::Usage(_)), "{flag}");
        assert!(err.to_string().starts_with(flag), "{err}");
    }
}

#[test]
fn offers_are_quantities_or_percentages() {
    for (flag, good) in [
        ("--cpu", "4"),
        ("--cpu", "500m"),
        ("--cpu", "50%"),
        ("--cpu", "0"),
        ("--memory", "8Gi"),
        ("--memory", "100%"),
        ("--pods", "110"),
        ("--pods", "12.5%"),
    ] {
        assert_eq!(
            check_offer(flag, good).ok().map(|o| o.0),
            Some(good.to_owned())
        );
    }
    for (flag, bad) in [
        ("--cpu", ""),
        ("--cpu", "lots"),
        ("--cpu", "150%"),
        ("--cpu", "-1%"),
        ("--cpu", "-2"),
        ("--memory", "8Qi"),
        ("--memory", "%"),
        ("--pods", "1.5"),
        ("--pods", "ten"),
    ] {
        let err = check_offer(flag, bad).expect_err(bad);
        assert!(matches!(err, UserError::Usage(_)), "{bad}");
        assert!(err.to_string().starts_with(flag), "{err}");
        assert!(!err.to_string().contains('\n'), "{err}");
    }
}

#[test]
fn prices_currencies_and_peers_are_checked() {
    assert_eq!(
        check_price("--cost-cpu-hour", "0.02").ok(),
        Some("0.02".into())
    );
    assert_eq!(check_price("--cost-cpu-hour", "0").ok(), Some("0".into()));
    for bad in ["", "-1", "free", "1e3", "NaN", "inf"] {
        assert!(check_price("--cost-cpu-hour", bad).is_err(), "{bad}");
    }
    assert_eq!(check_currency("EUR").ok(), Some("EUR".into()));
    for bad in ["", "€", "US D", "averyveryverylongcurrency"] {
        assert!(check_currency(bad).is_err(), "{bad}");
    }
    let peer = |p: Option<&str>| {
        policy_name(&SharingPolicyPeerArg {
            peer: p.map(str::to_owned),
        })
    };
    assert_eq!(peer(None).ok(), Some("default".into()));
    assert_eq!(peer(Some("consumer-1")).ok(), Some("consumer-1".into()));
    assert!(matches!(peer(Some("Bad_ID")), Err(UserError::Usage(_))));
    assert!(matches!(peer(Some("default")), Err(UserError::Usage(_))));
}

#[test]
fn floors_and_ceilings_are_checked_and_refused_above_each_other() {
    let mut a = args();
    a.floor = Some("cpu=2, memory=1Gi".into());
    a.ceiling = Some("cpu=8".into());
    let p = merged(sharing::default_policy(), &a).expect("valid");
    assert_eq!(
        show_bounds(&p).as_deref(),
        Some("floor cpu=2 memory=1Gi, ceiling cpu=8")
    );
    // Cleared with "".
    let mut clear = args();
    clear.floor = Some(String::new());
    assert_eq!(merged(p.clone(), &clear).expect("valid").floor, None);
    for (floor, ceiling, says) in [
        (
            "cpu=9",
            "cpu=8",
            "the floor of cpu (9) is above its ceiling (8)",
        ),
        ("gpu=1", "", "\"gpu\" is none of cpu, memory, pods"),
        ("cpu", "", "\"cpu\" is not KEY=VALUE"),
        ("memory=lots", "", "\"memory=lots\" is not a quantity"),
    ] {
        let mut a = args();
        a.floor = Some(floor.into());
        a.ceiling = Some(ceiling.into());
        let e = merged(sharing::default_policy(), &a).expect_err(floor);
        assert!(e.to_string().contains(says), "{floor}: {e}");
    }
}

#[test]
fn set_keeps_what_is_not_given() {
    let base = SharingPolicySpec {
        accept_new_peers: true,
        cpu: Some(Offer("1".into())),
        memory: Some(Offer("1Gi".into())),
        pods: Some(Offer("5".into())),
        storage: None,
        claims: None,
        cost: Some(Cost {
            cpu_hour: Some("0.02".into()),
            memory_gib_hour: None,
            currency: "EUR".into(),
        }),
        floor: None,
        ceiling: None,
        following: Following::default(),
        admission: Admission::default(),
    };
    let mut a = args();
    a.memory = Some("25%".into());
    a.cost_memory_gib_hour = Some("0.005".into());
    a.accept_new_peers = Some(false);
    let got = merged(base.clone(), &a).expect("valid");
    assert_eq!(got.cpu, base.cpu);
    assert_eq!(got.memory, Some(Offer("25%".into())));
    assert!(!got.accept_new_peers);
    let cost = got.cost.expect("cost");
    assert_eq!(cost.cpu_hour.as_deref(), Some("0.02"));
    assert_eq!(cost.memory_gib_hour.as_deref(), Some("0.005"));
    assert_eq!(cost.currency, "EUR");
    assert_eq!(
        show_cost(&cost),
        "0.02 EUR per CPU-hour, 0.005 EUR per GiB-hour"
    );
    // Nothing given: nothing changes.
    assert_eq!(merged(base.clone(), &args()).ok(), Some(base));
    // One bad value and nothing is merged.
    let mut bad = args();
    bad.cpu = Some("2".into());
    bad.pods = Some("many".into());
    assert!(merged(sharing::default_policy(), &bad).is_err());
}

#[test]
fn following_flags_are_checked_and_an_empty_one_restores_the_default() {
    let mut a = args();
    a.change_threshold = Some("25%".into());
    a.min_change_interval = Some("2m".into());
    let got = merged(sharing::default_policy(), &a).expect("valid");
    assert_eq!(got.following.threshold_percent, Some(25));
    assert_eq!(got.following.min_interval_seconds, Some(120));
    a.change_threshold = Some(String::new());
    a.min_change_interval = Some(String::new());
    let back = merged(got, &a).expect("valid");
    assert_eq!(back.following, Following::default());
    for (threshold, interval) in [
        ("150%", "10s"),
        ("ten", "10s"),
        ("10%", "1.5s"),
        ("10%", "2d"),
    ] {
        a.change_threshold = Some(threshold.into());
        a.min_change_interval = Some(interval.into());
        let e = merged(sharing::default_policy(), &a).expect_err("refused");
        assert!(e.to_string().starts_with("--"), "{e}");
    }
}
