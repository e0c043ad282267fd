use super::*;

fn amounts(cpu: u64, memory: u64, pods: u64) -> Amounts {
    Amounts {
        cpu_millis: cpu,
        memory_bytes: memory,
        pods,
        ..Amounts::default()
    }
}

fn grant(cpu: u64, memory: u64, pods: u64) -> Grant {
    Grant {
        amounts: amounts(cpu, memory, pods),
        cpu: true,
        memory: true,
        pods: true,
        storage: false,
        claims: false,
    }
}

fn all(v: [u64; 3]) -> BTreeMap<Counted, u64> {
    Counted::ALL.into_iter().zip(v).collect()
}

/// A holder whose quota is written and enforced at `hard`, using
/// `used`.
fn holder(twin: bool, demand: [u64; 3], hard: [u64; 3], used: [u64; 3]) -> Holder {
    Holder {
        twin,
        demand: amounts(demand[0], demand[1], demand[2]),
        quota: Some(QuotaState {
            spec: all(hard),
            enforced: all(hard),
            used: all(used),
        }),
    }
}

fn tenant_ns(hard: [u64; 3], used: [u64; 3]) -> Holder {
    holder(false, [0; 3], hard, used)
}

fn pods(a: &[Amounts]) -> Vec<u64> {
    a.iter().map(|a| a.pods).collect()
}

#[test]
fn targets_follow_need_and_never_pass_the_grant() {
    let g = grant(4000, 8 << 30, 100);
    // (holders as (twin, demand pods, used pods), expected pods)
    type Case<'a> = (&'a [(bool, u64, u64)], &'a [u64]);
    let cases: [Case; 8] = [
        // One twin: all but what the tenant namespace uses.
        (&[(false, 0, 0), (true, 0, 0)], &[0, 100]),
        (&[(false, 0, 3), (true, 10, 2)], &[3, 97]),
        // Nothing needed anywhere: equal parts among twins.
        (&[(false, 0, 0), (true, 0, 0), (true, 0, 0)], &[0, 50, 50]),
        // No twin: the tenant namespace holds the grant.
        (&[(false, 0, 0)], &[100]),
        // What is left, in proportion to need.
        (&[(false, 0, 0), (true, 30, 0), (true, 10, 0)], &[0, 75, 25]),
        // Use above demand counts (pods being replaced).
        (
            &[(false, 0, 0), (true, 10, 20), (true, 20, 0)],
            &[0, 50, 50],
        ),
        // Needs above the grant (a consumer lying): each keeps what
        // it uses, the free part goes in proportion to what it lacks.
        (
            &[(false, 0, 0), (true, 300, 40), (true, 100, 20)],
            &[0, 71, 29],
        ),
        // Over the grant already (the grant was lowered): nothing
        // more for anyone, nothing taken away.
        (
            &[(false, 0, 10), (true, 200, 90), (true, 50, 30)],
            &[10, 90, 30],
        ),
    ];
    for (holders, expected) in cases {
        let hs: Vec<Holder> = holders
            .iter()
            .map(|(twin, d, u)| holder(*twin, [0, 0, *d], [0; 3], [0, 0, *u]))
            .collect();
        let t = targets(&g, &hs);
        assert_eq!(pods(&t), expected, "{holders:?}");
        let used: u64 = holders.iter().map(|h| h.2).sum();
        assert!(pods(&t).iter().sum::<u64>() <= g.amounts.pods.max(used));
        for (t, (_, _, u)) in t.iter().zip(holders) {
            assert!(t.pods >= *u, "{holders:?}");
        }
    }
}

#[test]
fn only_granted_resources_are_bounded() {
    let g = Grant {
        amounts: amounts(0, 0, 10),
        cpu: false,
        memory: false,
        pods: true,
        storage: false,
        claims: false,
    };
    let hs = [Holder {
        twin: true,
        ..Holder::default()
    }];
    let w = step(&g, &hs);
    assert_eq!(
        w,
        vec![Write {
            holder: 0,
            hard: BTreeMap::from([(Counted::Pods, 10)])
        }]
    );
}

#[test]
fn lowering_comes_first_and_raising_waits_for_it_to_be_enforced() {
    let g = grant(1000, 1000, 10);
    // Twin a holds everything; twin b now needs 4 pods.
    let a = holder(true, [0, 0, 2], [1000, 1000, 10], [0, 0, 2]);
    let b = holder(true, [0, 0, 4], [0, 0, 0], [0, 0, 0]);
    let tenant = tenant_ns([0; 3], [0; 3]);
    let round = step(&g, &[tenant.clone(), a.clone(), b.clone()]);
    // cpu and memory: nothing needed, so equal parts between twins.
    assert_eq!(
        round,
        vec![Write {
            holder: 1,
            hard: all([500, 500, 3])
        }]
    );
    // Written, not enforced yet: b may not have it.
    let mut a_written = a.clone();
    a_written.quota.as_mut().expect("a quota").spec = all([500, 500, 3]);
    let round = step(&g, &[tenant.clone(), a_written.clone(), b.clone()]);
    assert_eq!(
        round,
        vec![],
        "nothing may be raised before a's lowering is enforced"
    );
    // Enforced: b is raised to its target.
    let mut a_enforced = a_written.clone();
    a_enforced.quota.as_mut().expect("a quota").enforced = all([500, 500, 3]);
    let round = step(&g, &[tenant.clone(), a_enforced.clone(), b.clone()]);
    assert_eq!(
        round,
        vec![Write {
            holder: 2,
            hard: all([500, 500, 7])
        }]
    );
}

#[test]
fn a_share_that_grew_before_its_lowering_is_not_given_away() {
    let g = grant(1000, 1000, 10);
    // a was lowered to 3 but admitted up to 9 before that was
    // enforced: b may only have what is left.
    let a = holder(true, [0, 0, 2], [500, 500, 3], [0, 0, 9]);
    let b = holder(true, [0, 0, 4], [500, 500, 0], [0, 0, 0]);
    let tenant = tenant_ns([0; 3], [0; 3]);
    let writes = step(&g, &[tenant, a, b]);
    // a's target is what it uses (9), which costs nothing more; b
    // gets the 1 pod left, not the 7 a was lowered by.
    assert_eq!(
        writes,
        vec![
            Write {
                holder: 1,
                hard: all([500, 500, 9])
            },
            Write {
                holder: 2,
                hard: all([500, 500, 1])
            },
        ]
    );
}

#[test]
fn nothing_is_raised_while_a_use_is_not_counted() {
    let g = grant(1000, 1000, 10);
    let mut fresh = holder(true, [0, 0, 5], [0, 0, 0], [0; 3]);
    fresh.quota.as_mut().expect("a quota").used.clear();
    let other = holder(true, [0, 0, 5], [0, 0, 0], [0; 3]);
    let writes = step(&g, &[tenant_ns([0; 3], [0; 3]), fresh, other]);
    assert!(writes.is_empty(), "{writes:?}");
}

#[test]
fn exposure_is_written_only_beside_a_part_of_the_grant() {
    let terms = Admission {
        node_ports: 2,
        ..Admission::default()
    };
    let quota = |hard: &[(&str, &str)]| ResourceQuota {
        spec: Some(k8s_openapi::api::core::v1::ResourceQuotaSpec {
            hard: Some(
                hard.iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    };
    let g = grant(1000, 1000, 10);
    assert!(!exposure_to_write(&quota(&[]), &terms, &g));
    assert!(exposure_to_write(&quota(&[("pods", "3")]), &terms, &g));
    let mut written: Vec<(String, String)> = exposure_hard(&terms, &g)
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    written.push(("pods".to_owned(), "3".to_owned()));
    // As the API server writes them back.
    for (_, v) in &mut written {
        if v == "1000" {
            *v = "1k".to_owned();
        }
    }
    let pairs: Vec<(&str, &str)> = written
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let done = quota(&pairs);
    assert!(!exposure_to_write(&done, &terms, &g));
    assert!(exposure_to_write(&done, &Admission::default(), &g));
    for key in [
        "persistentvolumeclaims",
        "requests.storage",
        "configmaps",
        "count/jobs.batch",
    ] {
        assert!(exposure_hard(&terms, &g).contains_key(key), "{key}");
    }
    // Storage granted is the grant's part, not held at none.
    let with_storage = Grant {
        storage: true,
        claims: true,
        ..g
    };
    let hard = exposure_hard(&terms, &with_storage);
    assert!(!hard.contains_key("requests.storage") && !hard.contains_key("persistentvolumeclaims"));
    // Each allowed class counted on its own, within the grant.
    let with_classes = Admission {
        storage_classes: vec!["standard".to_owned()],
        ..terms.clone()
    };
    let granted = Grant {
        amounts: Amounts {
            storage_bytes: 1 << 30,
            claims: 4,
            ..Amounts::default()
        },
        ..with_storage
    };
    let hard = exposure_hard(&with_classes, &granted);
    assert_eq!(
        hard.get("standard.storageclass.storage.k8s.io/requests.storage"),
        Some(&Quantity((1u64 << 30).to_string()))
    );
    assert_eq!(
        hard.get("standard.storageclass.storage.k8s.io/persistentvolumeclaims"),
        Some(&Quantity("4".to_owned()))
    );
}

#[test]
fn a_new_tenant_namespace_share_lowers_liqo_grant_first() {
    let g = grant(1000, 1000, 10);
    let tenant = Holder::default();
    let twin = Holder {
        twin: true,
        demand: amounts(0, 0, 1),
        quota: None,
    };
    // The tenant namespace, bounded by liqo-grant alone, is lowered
    // (its share made) before the twin gets anything.
    let writes = step(&g, &[tenant, twin]);
    assert_eq!(
        writes,
        vec![Write {
            holder: 0,
            hard: all([0, 0, 0])
        }]
    );
}

#[test]
fn a_split_as_it_should_be_writes_nothing() {
    let g = grant(1000, 1000, 10);
    let hs = [
        tenant_ns([0; 3], [0; 3]),
        holder(true, [100, 100, 3], [1000, 1000, 10], [100, 100, 3]),
    ];
    assert!(step(&g, &hs).is_empty());
}

#[test]
fn the_sum_stays_within_the_grant_through_every_round() {
    // Rounds of the split while needs move between three twins and
    // admission fills each share as soon as it is enforced.
    let g = grant(8000, 1 << 30, 40);
    let mut hs = vec![
        Holder::default(),
        Holder {
            twin: true,
            ..Holder::default()
        },
        Holder {
            twin: true,
            ..Holder::default()
        },
        Holder {
            twin: true,
            ..Holder::default()
        },
    ];
    let demands = [[30, 0, 5], [0, 35, 2], [10, 10, 10], [1, 1, 1], [40, 0, 0]];
    for d in demands {
        for (h, p) in hs.iter_mut().skip(1).zip(d) {
            h.demand = amounts(p * 100, p << 20, p);
        }
        for _ in 0..10 {
            let writes = step(&g, &hs);
            for w in writes {
                let h = &mut hs[w.holder];
                let q = h.quota.get_or_insert_with(QuotaState::default);
                q.spec = w.hard;
            }
            // The quota controller catches up, and admission takes
            // what the consumer asks for within what is enforced.
            for h in hs.iter_mut() {
                let demand = h.demand;
                if let Some(q) = h.quota.as_mut() {
                    q.enforced = q.spec.clone();
                    for r in g.counted() {
                        let used = q.used.entry(r).or_insert(0);
                        *used = (*used).max(r.of(&demand).min(q.enforced[&r]));
                    }
                }
            }
            for r in g.counted() {
                let held: u64 = hs
                    .iter()
                    .filter_map(|h| h.quota.as_ref())
                    .map(|q| q.enforced[&r].max(q.used[&r]))
                    .sum();
                assert!(held <= r.of(&g.amounts), "{r:?}: {held} after {d:?}");
            }
        }
    }
}

#[test]
fn demands_round_trip_and_bad_ones_count_nothing() {
    let d = amounts(1500, 3 << 30, 12);
    let text = demand_annotation(&d);
    let annotations = BTreeMap::from([(DEMAND_ANNOTATION.to_owned(), text)]);
    assert_eq!(demand_of(Some(&annotations)), d);
    let bad = BTreeMap::from([(DEMAND_ANNOTATION.to_owned(), "{\"cpu\":\"x\"}".to_owned())]);
    assert_eq!(demand_of(Some(&bad)), Amounts::default());
    assert_eq!(demand_of(None), Amounts::default());
}

#[test]
fn quotas_are_read_as_written() {
    let q: ResourceQuota = serde_json::from_value(serde_json::json!({
        "spec": { "hard": { "requests.cpu": "2", "requests.memory": "1Gi", "pods": "10" } },
        "status": {
            "hard": { "requests.cpu": "1500m", "requests.memory": "1Gi", "pods": "10" },
            "used": { "requests.cpu": "0", "requests.memory": "0", "pods": "0" },
        },
    }))
    .expect("a quota");
    let s = QuotaState::of(&q);
    assert_eq!(s.spec, all([2000, 1 << 30, 10]));
    assert_eq!(s.enforced, all([1500, 1 << 30, 10]));
    assert_eq!(s.used, all([0, 0, 0]));
    assert_eq!(
        hard_quantities(&s.spec)["requests.cpu"],
        Quantity("2000m".into())
    );
}

#[test]
fn a_share_at_its_target_is_not_written_again_for_the_zeros_of_what_is_not_granted() {
    // The shares hold `requests.storage: 0` and `persistentvolumeclaims: 0`
    // where storage is not granted; a round that compared them with the
    // granted resources alone wrote the same share again and again.
    let g = grant(4000, 4 << 30, 20);
    let with_zeros = |h: Holder| {
        let mut q = h.quota.expect("a quota");
        for r in [Counted::Storage, Counted::Claims] {
            q.spec.insert(r, 0);
            q.enforced.insert(r, 0);
            q.used.insert(r, 0);
        }
        Holder {
            quota: Some(q),
            ..h
        }
    };
    let settled = [tenant_ns([4000, 4 << 30, 20], [0, 0, 0])];
    assert_eq!(
        step(&g, &settled),
        Vec::new(),
        "the share is where it should be"
    );
    let settled = settled.map(with_zeros);
    assert_eq!(
        step(&g, &settled),
        Vec::new(),
        "zeros of what is not granted"
    );
    // A change of a granted resource is still written.
    let lower = [with_zeros(tenant_ns([4000, 4 << 30, 30], [0, 0, 0]))];
    assert_eq!(step(&g, &lower).len(), 1);
}
