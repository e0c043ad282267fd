use super::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ObjectMeta;

const LABEL: &str = "example.com/owner";

fn pod(name: &str, owner: Option<&str>, version: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("ns".to_owned()),
            resource_version: Some(version.to_owned()),
            labels: owner.map(|o| [(LABEL.to_owned(), o.to_owned())].into()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

/// Feeds events to a store as the follow task does, and returns, per
/// prefix asked, the names found starting with it, and every stored name.
fn found(events: Vec<watcher::Event<Pod>>, prefixes: &[&str]) -> (Vec<Vec<String>>, Vec<String>) {
    let (followed, mut feed) = Feed::new(Options::default());
    for event in events {
        feed.apply(event);
    }
    let names = |pods: Vec<Arc<Pod>>| -> Vec<String> {
        pods.iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect()
    };
    let mut all = names(followed.store.state());
    all.sort();
    (
        prefixes
            .iter()
            .map(|p| names(followed.store.named_after("ns", p)))
            .collect(),
        all,
    )
}

#[test]
fn a_settled_object_is_replaced_only_while_it_is_the_one_read() {
    use watcher::Event::{Apply, Init, InitApply, InitDone};
    let (followed, mut feed) = Feed::new(Options::<Pod>::default());
    let journal = Changes::new();
    followed.record_into(&journal, |p: &Pod| p.metadata.name.clone());
    for event in [Init, InitApply(pod("a", None, "1")), InitDone] {
        feed.apply(event);
    }
    journal.take();
    let generation = followed.state.borrow().generation;
    let seen = followed.store.get("ns", "a").expect("stored");
    let mut settled = pod("a", None, "1");
    settled.metadata.labels = Some([("settled".to_owned(), "yes".to_owned())].into());
    assert!(followed.store.settle("ns", "a", &seen, settled.clone()));
    let stored = followed.store.get("ns", "a").expect("stored");
    assert_eq!(*stored, settled, "the settled value is stored");
    assert_eq!(journal.take(), Some(vec![]), "nothing recorded");
    assert_eq!(followed.state.borrow().generation, generation);
    // A value the watch stored since is not replaced.
    feed.apply(Apply(pod("a", None, "2")));
    assert!(
        !followed
            .store
            .settle("ns", "a", &stored, pod("a", None, "1"))
    );
    let now = followed.store.get("ns", "a").expect("stored");
    assert_eq!(now.metadata.resource_version.as_deref(), Some("2"));
    assert!(
        !followed
            .store
            .settle("ns", "gone", &now, pod("gone", None, "1"))
    );
    assert!(followed.store.get("ns", "gone").is_none());
}

#[test]
fn a_relist_shares_what_did_not_change_with_the_store_it_replaces() {
    use watcher::Event::{Init, InitApply, InitDone};
    let (followed, mut feed) = Feed::new(Options::default());
    let mut list = |changed: Pod| {
        for event in [
            Init,
            InitApply(pod("same", Some("x"), "1")),
            InitApply(changed),
            InitDone,
        ] {
            feed.apply(event);
        }
    };
    list(pod("changed", Some("x"), "1"));
    let before = |name| followed.store.get("ns", name).expect("stored");
    let (same, changed) = (before("same"), before("changed"));
    list(pod("changed", Some("y"), "2"));
    let after = |name| followed.store.get("ns", name).expect("stored");
    assert!(
        Arc::ptr_eq(&same, &after("same")),
        "an unchanged object is shared"
    );
    assert!(!Arc::ptr_eq(&changed, &after("changed")));
    assert_eq!(
        after("changed").metadata.resource_version.as_deref(),
        Some("2")
    );
}

#[test]
fn a_relist_keeps_a_settled_value_while_its_object_is_unchanged() {
    use watcher::Event::{Init, InitApply, InitDone};
    let options = Options::<Pod>::default().kept_when(|stored, listed| {
        stored.metadata.resource_version == listed.metadata.resource_version
    });
    let (followed, mut feed) = Feed::new(options);
    let mut list = |version| {
        for event in [Init, InitApply(pod("a", None, version)), InitDone] {
            feed.apply(event);
        }
    };
    list("1");
    let seen = followed.store.get("ns", "a").expect("stored");
    let mut settled = pod("a", None, "1");
    settled.metadata.labels = Some([("settled".to_owned(), "yes".to_owned())].into());
    assert!(followed.store.settle("ns", "a", &seen, settled));
    let settled = followed.store.get("ns", "a").expect("stored");
    list("1");
    let kept = followed.store.get("ns", "a").expect("stored");
    assert!(Arc::ptr_eq(&settled, &kept), "kept, though not equal");
    list("2");
    let changed = followed.store.get("ns", "a").expect("stored");
    assert_eq!(*changed, pod("a", None, "2"), "the listed value");
}

#[test]
fn objects_are_found_by_the_start_of_their_names_in_order() {
    use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
    type Case = (
        &'static str,
        Vec<watcher::Event<Pod>>,
        Vec<Vec<&'static str>>,
        Vec<&'static str>,
    );
    let prefixes = ["web-1-", "web-"];
    let cases: Vec<Case> = vec![
        (
            "a list, then changes; a longer name that starts alike is not found",
            vec![
                Init,
                InitApply(pod("web-1-bbbbb", None, "1")),
                InitApply(pod("web-10-ccccc", None, "1")),
                InitApply(pod("db-1-aaaaa", None, "1")),
                InitDone,
                Apply(pod("web-1-aaaaa", None, "2")),
                Apply(pod("web-1", None, "2")),
            ],
            vec![
                vec!["web-1-aaaaa", "web-1-bbbbb"],
                vec!["web-1", "web-1-aaaaa", "web-1-bbbbb", "web-10-ccccc"],
            ],
            vec![
                "db-1-aaaaa",
                "web-1",
                "web-1-aaaaa",
                "web-1-bbbbb",
                "web-10-ccccc",
            ],
        ),
        (
            "a deleted object is no longer found",
            vec![
                Init,
                InitApply(pod("web-1-aaaaa", None, "1")),
                InitApply(pod("web-1-bbbbb", None, "1")),
                InitDone,
                Delete(pod("web-1-aaaaa", None, "2")),
            ],
            vec![vec!["web-1-bbbbb"], vec!["web-1-bbbbb"]],
            vec!["web-1-bbbbb"],
        ),
        (
            "a relist replaces the store whole, and only when done",
            vec![
                Init,
                InitApply(pod("web-1-aaaaa", None, "1")),
                InitDone,
                Init,
                InitApply(pod("web-2-bbbbb", None, "3")),
            ],
            vec![vec!["web-1-aaaaa"], vec!["web-1-aaaaa"]],
            vec!["web-1-aaaaa"],
        ),
        (
            "after the relist, in name order whatever the order read",
            vec![
                Init,
                InitApply(pod("web-1-aaaaa", None, "1")),
                InitDone,
                Init,
                InitApply(pod("web-2-bbbbb", None, "3")),
                InitApply(pod("web-1-ccccc", None, "3")),
                InitApply(pod("web-1-bbbbb", None, "3")),
                InitDone,
            ],
            vec![
                vec!["web-1-bbbbb", "web-1-ccccc"],
                vec!["web-1-bbbbb", "web-1-ccccc", "web-2-bbbbb"],
            ],
            vec!["web-1-bbbbb", "web-1-ccccc", "web-2-bbbbb"],
        ),
    ];
    for (name, events, want, stored) in cases {
        assert_eq!(
            found(events, &prefixes),
            (
                want.iter()
                    .map(|v| v.iter().map(|s| s.to_string()).collect())
                    .collect(),
                stored.iter().map(|s| s.to_string()).collect()
            ),
            "{name}"
        );
    }
}

#[test]
fn an_object_read_twice_in_a_list_is_stored_as_last_read() {
    use watcher::Event::{Init, InitApply, InitDone};
    let (followed, mut feed) = Feed::new(Options::default());
    for event in [
        Init,
        InitApply(pod("a", None, "1")),
        InitApply(pod("b", None, "1")),
        InitApply(pod("a", None, "2")),
        InitDone,
    ] {
        feed.apply(event);
    }
    assert_eq!(followed.store.len(), 2);
    let a = followed.store.get("ns", "a").expect("stored");
    assert_eq!(a.metadata.resource_version.as_deref(), Some("2"));
}

#[test]
fn objects_are_found_by_namespace_and_name_and_stored_converted() {
    let followed = filled(
        [pod("a", Some("x"), "1"), pod("b", None, "7")],
        Options::converted(|p: Pod, key: &Key| {
            (key.clone(), p.metadata.resource_version.unwrap_or_default())
        }),
    );
    assert!(followed.is_current());
    let a = followed.store.get("ns", "a").expect("a is stored");
    assert_eq!(*a.0.namespace, *"ns");
    assert_eq!(*a.0.name, *"a");
    assert_eq!(a.1, "1");
    assert_eq!(
        followed.store.get("ns", "b").map(|b| b.1.clone()),
        Some("7".to_owned())
    );
    assert!(followed.store.get("other", "a").is_none());
    assert!(followed.store.get("ns", "c").is_none());
    assert_eq!(followed.store.len(), 2);
    assert_eq!(followed.store.in_namespace("ns").len(), 2);
    // Both objects share one copy of their namespace.
    let b = followed.store.get("ns", "b").expect("b is stored");
    assert!(Arc::ptr_eq(&a.0.namespace, &b.0.namespace));
}

#[test]
fn nothing_is_found_in_another_namespace() {
    let followed = filled([pod("web-1-aaaaa", None, "1")], Options::default());
    assert_eq!(followed.store.named_after("ns", "web-1-").len(), 1);
    assert!(followed.store.named_after("other", "web-1-").is_empty());
}

#[test]
fn a_journal_says_what_changed_or_anything() {
    let followed = filled(Vec::<Pod>::new(), Options::default());
    let journal = Changes::new();
    followed.record_into(&journal, |p: &Pod| p.metadata.name.clone());
    assert_eq!(journal.take(), None, "new: anything");
    assert_eq!(journal.take(), Some(vec![]), "then nothing");
    record(&followed.recorders, Some(&pod("a", None, "1")));
    record(&followed.recorders, Some(&pod("b", None, "1")));
    assert_eq!(journal.take(), Some(vec!["a".to_owned(), "b".to_owned()]));
    // A relist or a failed watch: anything, and what was recorded
    // before it is dropped.
    record(&followed.recorders, Some(&pod("c", None, "1")));
    record(&followed.recorders, None);
    record(&followed.recorders, Some(&pod("d", None, "1")));
    assert_eq!(journal.take(), None);
    // Past its bound, a journal says anything.
    for _ in 0..=CHANGES_MAX {
        record(&followed.recorders, Some(&pod("e", None, "1")));
    }
    assert_eq!(journal.take(), None, "past the bound");
    // A dropped journal's recorder goes with the next change.
    drop(journal);
    record(&followed.recorders, Some(&pod("f", None, "1")));
    assert!(lock_recorders(&followed.recorders).is_empty());
}
