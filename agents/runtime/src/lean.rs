//! Objects read without their managedFields.
//!
//! Every object the API serves carries, in its metadata, a record of
//! which manager set which field (`managedFields`): for a pod, an entry
//! for each of the kubelet, the scheduler, its controller and whoever
//! patched it, each a tree of field names. kube reads each tree into a
//! `serde_json::Value`, a map per level: for a remote pod that was most
//! of what reading it allocated, though no store keeps it
//! ([`crate::follow`] drops it at once): at the high of the virtual
//! kubelet's relists with 3,000 offloaded pods, 2.3 MB of such maps were
//! held (docs/virtual-kubelet.md). [`Lean`] reads an object as
//! its own type does, except that the `managedFields` of its metadata are
//! skipped as they are read, without making a value of them.
//!
//! It works on the reader's calls, not on JSON: an object's type asks to
//! read a struct or a map, which is read as asked but its `metadata`
//! field through the same filter, which passes every field of the
//! metadata but `managedFields` on. Any other value is read as its type
//! asks, untouched.

use std::borrow::Cow;
use std::fmt;

use kube::Resource;
use kube::core::ObjectMeta;
use serde::Deserialize;
use serde::de::value::CowStrDeserializer;
use serde::de::{
    self, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer, MapAccess, Visitor,
};

/// `K` read without the managedFields of its metadata (the module says
/// why), and otherwise as `K` reads itself: a [`Resource`] as `K` is.
#[derive(Clone, Debug)]
pub struct Lean<K>(pub K);

impl<'de, K: Deserialize<'de>> Deserialize<'de> for Lean<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        K::deserialize(Filtered {
            inner: deserializer,
            level: Level::Object,
        })
        .map(Lean)
    }
}

/// Either scope, so that an [`kube::Api`] of it can be made for a
/// namespace or for all ([`api`]).
impl<K: Resource> Resource for Lean<K> {
    type DynamicType = K::DynamicType;
    type Scope = kube::core::DynamicResourceScope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

/// The API of `api` (the same client, namespace or all), read lean.
pub fn api<K>(api: kube::Api<K>) -> kube::Api<Lean<K>>
where
    K: Resource,
    K::DynamicType: Default,
{
    let dt = K::DynamicType::default();
    let namespace = api.namespace().map(str::to_owned);
    let client = api.into_client();
    match namespace {
        Some(ns) => kube::Api::namespaced_with(client, &ns, &dt),
        None => kube::Api::all_with(client, &dt),
    }
}

impl<K> Lean<K> {
    /// The object read.
    pub fn into_inner(self) -> K {
        self.0
    }
}

/// Where a [`Filtered`] reader is.
#[derive(Clone, Copy, PartialEq)]
enum Level {
    /// The object: its `metadata` is read through the filter.
    Object,
    /// Its metadata: `managedFields` is skipped.
    Metadata,
}

/// A reader that reads what it is asked as `inner` does, the fields of
/// a struct or map filtered as its level says.
struct Filtered<D> {
    inner: D,
    level: Level,
}

/// Forwards each of a [`Deserializer`]'s methods to the inner one.
macro_rules! forward {
    ($($method:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
                self.inner.$method($($arg,)* visitor)
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Filtered<D> {
    type Error = D::Error;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let level = self.level;
        self.inner
            .deserialize_struct(name, fields, FilteredVisitor { visitor, level })
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let level = self.level;
        self.inner
            .deserialize_map(FilteredVisitor { visitor, level })
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let level = self.level;
        self.inner
            .deserialize_option(FilteredVisitor { visitor, level })
    }

    forward! {
        deserialize_any(), deserialize_bool(), deserialize_i8(), deserialize_i16(),
        deserialize_i32(), deserialize_i64(), deserialize_i128(), deserialize_u8(),
        deserialize_u16(), deserialize_u32(), deserialize_u64(), deserialize_u128(),
        deserialize_f32(), deserialize_f64(), deserialize_char(), deserialize_str(),
        deserialize_string(), deserialize_bytes(), deserialize_byte_buf(),
        deserialize_unit(), deserialize_seq(), deserialize_identifier(),
        deserialize_ignored_any(),
        deserialize_unit_struct(name: &'static str),
        deserialize_newtype_struct(name: &'static str),
        deserialize_tuple(len: usize),
        deserialize_tuple_struct(name: &'static str, len: usize),
        deserialize_enum(name: &'static str, variants: &'static [&'static str]),
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// The visitor of the type being read, given a filtered map (or, for an
/// optional value, a filtered reader of the value).
struct FilteredVisitor<V> {
    visitor: V,
    level: Level,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for FilteredVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(FilteredMap {
            map,
            level: self.level,
            metadata_next: false,
        })
    }

    fn visit_some<D: Deserializer<'de>>(self, inner: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_some(Filtered {
            inner,
            level: self.level,
        })
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_unit()
    }
}

/// A map's entries, less those the level skips; at the object's level,
/// the value of `metadata` is read through the filter.
struct FilteredMap<A> {
    map: A,
    level: Level,
    /// The key just given was `metadata` (at the object's level).
    metadata_next: bool,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for FilteredMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let Some(key) = self.map.next_key::<Key<'de>>()? else {
                return Ok(None);
            };
            match (self.level, &*key.0) {
                (Level::Metadata, "managedFields") => {
                    self.map.next_value::<IgnoredAny>()?;
                }
                (level, name) => {
                    self.metadata_next = level == Level::Object && name == "metadata";
                    let key: CowStrDeserializer<'de, A::Error> = key.0.into_deserializer();
                    return seed.deserialize(key).map(Some);
                }
            }
        }
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        if std::mem::take(&mut self.metadata_next) {
            self.map.next_value_seed(MetadataSeed(seed))
        } else {
            self.map.next_value_seed(seed)
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

/// A key of a map, borrowed from the text read when it can be.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }

            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// Reads the value of `metadata` through the filter.
struct MetadataSeed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for MetadataSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, inner: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Filtered {
            inner,
            level: Level::Metadata,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::core::{ObjectList, PartialObjectMeta, WatchEvent};
    use serde_json::json;

    fn pod_json() -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-1",
                "namespace": "shop",
                "uid": "0b5c1c1e-4a3d-4b8e-9c51-6f1f0a7d2e11",
                "resourceVersion": "42",
                "labels": {"app": "web", "managedFields": "a label, kept"},
                "annotations": {"note": "kept"},
                "managedFields": [{
                    "manager": "kube-scheduler",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {".": {}}}}
                }],
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "web", "uid": "9d2a", "controller": true
                }]
            },
            "spec": {
                "containers": [{"name": "c", "image": "nginx"}],
                "nodeName": "node-1"
            },
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}]
            }
        })
    }

    /// The same as read whole, less its managedFields, from text (as kube
    /// reads it, borrowing the keys) and from a value.
    #[test]
    fn an_object_reads_as_itself_less_its_managed_fields() {
        let text = pod_json().to_string();
        let mut whole: Pod = serde_json::from_str(&text).expect("a pod");
        assert!(whole.metadata.managed_fields.is_some());
        whole.metadata.managed_fields = None;
        let Lean(lean) = serde_json::from_str::<Lean<Pod>>(&text).expect("a pod");
        assert_eq!(lean, whole);
        let Lean(from_value) = serde_json::from_value::<Lean<Pod>>(pod_json()).expect("a pod");
        assert_eq!(from_value, whole);
    }

    #[test]
    fn lists_watch_events_and_metadata_alone_read_lean() {
        let list = json!({
            "apiVersion": "v1", "kind": "PodList",
            "metadata": {"resourceVersion": "50", "continue": "next"},
            "items": [pod_json(), pod_json()]
        })
        .to_string();
        let list: ObjectList<Lean<Pod>> = serde_json::from_str(&list).expect("a list");
        assert_eq!(list.metadata.continue_.as_deref(), Some("next"));
        assert_eq!(list.items.len(), 2);
        for Lean(pod) in &list.items {
            assert_eq!(pod.metadata.managed_fields, None);
            assert_eq!(pod.metadata.resource_version.as_deref(), Some("42"));
        }
        let event = json!({"type": "MODIFIED", "object": pod_json()}).to_string();
        match serde_json::from_str::<WatchEvent<Lean<Pod>>>(&event).expect("an event") {
            WatchEvent::Modified(Lean(pod)) => {
                assert_eq!(pod.metadata.managed_fields, None);
                assert_eq!(
                    pod.spec.and_then(|s| s.node_name).as_deref(),
                    Some("node-1")
                );
            }
            other => panic!("{other:?}"),
        }
        let meta: Lean<PartialObjectMeta<Pod>> =
            serde_json::from_str(&pod_json().to_string()).expect("metadata");
        assert_eq!(meta.0.metadata.managed_fields, None);
        assert_eq!(meta.0.metadata.name.as_deref(), Some("web-1"));
    }

    /// Only the metadata's own field is skipped: a field of that name
    /// elsewhere (a label, a field of the object) is read as it is.
    #[test]
    fn only_the_metadatas_managed_fields_are_skipped() {
        #[derive(Deserialize, Debug)]
        #[serde(rename_all = "camelCase")]
        struct Odd {
            metadata: Option<ObjectMeta>,
            managed_fields: Option<u32>,
            data: Option<serde_json::Value>,
        }
        let text = json!({
            "managedFields": 3,
            "data": {"metadata": {"managedFields": [1]}},
            "metadata": {"name": "a", "managedFields": [{"manager": "m"}]}
        })
        .to_string();
        let Lean(odd) = serde_json::from_str::<Lean<Odd>>(&text).expect("read");
        assert_eq!(odd.managed_fields, Some(3));
        assert_eq!(
            odd.data,
            Some(json!({"metadata": {"managedFields": [1]}})),
            "a nested object is left whole"
        );
        let meta = odd.metadata.expect("metadata");
        assert_eq!(meta.name.as_deref(), Some("a"));
        assert_eq!(meta.managed_fields, None);
        assert_eq!(
            pod_labels(&pod_json()),
            Some("a label, kept".to_owned()),
            "a label named so is kept"
        );
    }

    fn pod_labels(v: &serde_json::Value) -> Option<String> {
        let Lean(pod) = serde_json::from_value::<Lean<Pod>>(v.clone()).ok()?;
        pod.metadata.labels?.get("managedFields").cloned()
    }

    #[test]
    fn what_does_not_read_fails_as_it_would() {
        let text = r#"{"metadata": {"name": 5}}"#;
        let whole = serde_json::from_str::<Pod>(text).expect_err("a number for a name");
        let lean = serde_json::from_str::<Lean<Pod>>(text).expect_err("a number for a name");
        assert_eq!(lean.to_string(), whole.to_string());
    }
}
