//! Pure translation of the consumer's ConfigMaps and Secrets of an
//! offloaded namespace into their copies in the twin namespace, and the
//! rules of what is reflected at all: not what the provider has its own of
//! (`kube-root-ca.crt`, service account token Secrets), not what its owner
//! opted out ([`names::SKIP_REFLECTION_ANNOTATION`]).

use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Resource;
use kube::core::ObjectMeta;
use liqo_api::names::{self, labels};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The ConfigMap every namespace holds with its cluster's CA: the
/// provider's own one stays in the twin.
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";
/// Secrets of this type are tokens of the consumer's service accounts,
/// minted by its controllers: the provider's twin has its own accounts.
pub const SERVICE_ACCOUNT_TOKEN_TYPE: &str = "kubernetes.io/service-account-token";
/// The annotation kubectl keeps its last applied configuration in: it
/// says nothing to the provider.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The label selector of the remote copies the virtual kubelet follows:
/// ours, with an origin. Nothing else in a twin is ever touched.
pub fn remote_selector() -> String {
    format!(
        "{}={},{}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE,
        labels::ORIGIN_NAMESPACE
    )
}

/// A kind whose objects are copied as they are into the twin namespace.
/// Where a copy goes: the provider of the virtual node `node_name`, which
/// sees this cluster's pods where `seen` says (remapped when the pod
/// CIDRs overlap, docs/network.md; `None` while no tunnel links them).
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub node_name: &'a str,
    pub seen: Option<liqo_api::networking::Remap>,
}

impl<'a> From<&'a str> for Target<'a> {
    /// A provider no tunnel links to yet.
    fn from(node_name: &'a str) -> Self {
        Self {
            node_name,
            seen: None,
        }
    }
}

pub trait Reflected:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + PartialEq
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The kind's name in logs.
    const NAME: &'static str;
    /// The remote object's content (its metadata is not looked at), or
    /// `None` when this object has no remote copy (the provider has its
    /// own, or nothing of it is for this provider).
    fn content(&self, target: &Target<'_>) -> Option<Self>;
    /// Whether both hold the same content, as far as the remote copy is
    /// concerned (fields the provider's API server defaults aside).
    fn same_content(&self, other: &Self) -> bool;
    /// Changes to the local labels on the remote copy.
    fn adjust_labels(_labels: &mut BTreeMap<String, String>) {}
}

impl Reflected for ConfigMap {
    const NAME: &'static str = "configmaps";
    fn content(&self, _target: &Target<'_>) -> Option<Self> {
        (self.metadata.name.as_deref() != Some(ROOT_CA_CONFIGMAP)).then(|| Self {
            data: self.data.clone(),
            binary_data: self.binary_data.clone(),
            immutable: self.immutable,
            ..Self::default()
        })
    }
    fn same_content(&self, other: &Self) -> bool {
        self.data == other.data
            && self.binary_data == other.binary_data
            && self.immutable == other.immutable
    }
}

impl Reflected for Secret {
    const NAME: &'static str = "secrets";
    fn content(&self, _target: &Target<'_>) -> Option<Self> {
        (self.type_.as_deref() != Some(SERVICE_ACCOUNT_TOKEN_TYPE)).then(|| Self {
            data: self.data.clone(),
            string_data: self.string_data.clone(),
            type_: self.type_.clone(),
            immutable: self.immutable,
            ..Self::default()
        })
    }
    fn same_content(&self, other: &Self) -> bool {
        // The API server turns stringData into data and defaults the type.
        self.data == other.data
            && self.type_.as_deref().unwrap_or("Opaque")
                == other.type_.as_deref().unwrap_or("Opaque")
            && self.immutable == other.immutable
    }
}

/// Whether the owner of `local` asked for it not to be reflected.
pub fn opted_out(meta: &ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(names::SKIP_REFLECTION_ANNOTATION))
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The copy `local` should have in `twin` for `target`, or `None` when it has none (see [`Reflected::content`],
/// opted out, or being deleted).
pub fn remote<'a, K: Reflected>(local: &K, twin: &str, target: impl Into<Target<'a>>) -> Option<K> {
    let meta = local.meta();
    if opted_out(meta) || meta.deletion_timestamp.is_some() {
        return None;
    }
    let mut out = local.content(&target.into())?;
    let mut labels = meta.labels.clone().unwrap_or_default();
    K::adjust_labels(&mut labels);
    labels.insert(
        labels::MANAGED_BY.to_owned(),
        labels::MANAGED_BY_VALUE.to_owned(),
    );
    labels.insert(
        labels::ORIGIN_NAMESPACE.to_owned(),
        meta.namespace.clone().unwrap_or_default(),
    );
    let annotations: BTreeMap<String, String> = meta
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != LAST_APPLIED)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    *out.meta_mut() = ObjectMeta {
        name: meta.name.clone(),
        namespace: Some(twin.to_owned()),
        labels: Some(labels),
        annotations: (!annotations.is_empty()).then_some(annotations),
        ..ObjectMeta::default()
    };
    Some(out)
}

/// Whether the remote copy `have` is as `want` (from [`remote`]) says.
pub fn in_sync<K: Reflected>(want: &K, have: &K) -> bool {
    let (w, h) = (want.meta(), have.meta());
    let empty = BTreeMap::new();
    w.labels.as_ref().unwrap_or(&empty) == h.labels.as_ref().unwrap_or(&empty)
        && w.annotations.as_ref().unwrap_or(&empty) == h.annotations.as_ref().unwrap_or(&empty)
        && want.same_content(have)
}

/// Whether `have` is a remote copy of ours (from `origin`): only those
/// are ever changed or deleted.
pub fn is_ours(have: &ObjectMeta, origin: &str) -> bool {
    let get = |k: &str| {
        have.labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
    };
    get(labels::MANAGED_BY) == Some(labels::MANAGED_BY_VALUE)
        && get(labels::ORIGIN_NAMESPACE) == Some(origin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn meta(name: &str, annotations: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("shop".to_owned()),
            uid: Some("uid-1".to_owned()),
            resource_version: Some("42".to_owned()),
            labels: Some(BTreeMap::from([("app".to_owned(), "web".to_owned())])),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        }
    }

    fn config_map(name: &str, annotations: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: meta(name, annotations),
            data: Some(BTreeMap::from([("k".to_owned(), "v".to_owned())])),
            ..ConfigMap::default()
        }
    }

    fn secret(name: &str, type_: Option<&str>) -> Secret {
        Secret {
            metadata: meta(name, &[]),
            data: Some(BTreeMap::from([(
                "password".to_owned(),
                ByteString(b"hunter2".to_vec()),
            )])),
            type_: type_.map(str::to_owned),
            ..Secret::default()
        }
    }

    #[test]
    fn what_is_reflected_table() {
        let deleting = {
            let mut c = config_map("app", &[]);
            c.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
            c
        };
        let cases: [(&str, Option<ConfigMap>, bool); 5] = [
            ("a plain ConfigMap", Some(config_map("app", &[])), true),
            (
                "the root CA",
                Some(config_map(ROOT_CA_CONFIGMAP, &[])),
                false,
            ),
            (
                "opted out",
                Some(config_map(
                    "app",
                    &[(names::SKIP_REFLECTION_ANNOTATION, "true")],
                )),
                false,
            ),
            (
                "opt-out annotation set to false",
                Some(config_map(
                    "app",
                    &[(names::SKIP_REFLECTION_ANNOTATION, "false")],
                )),
                true,
            ),
            ("being deleted", Some(deleting), false),
        ];
        for (what, local, want) in cases {
            let local = local.expect("case");
            assert_eq!(
                remote(&local, "shop-c", "liqo-prov").is_some(),
                want,
                "{what}"
            );
        }
        let secrets = [
            (None, true),
            (Some("Opaque"), true),
            (Some("kubernetes.io/tls"), true),
            (Some(SERVICE_ACCOUNT_TOKEN_TYPE), false),
        ];
        for (type_, want) in secrets {
            assert_eq!(
                remote(&secret("s", type_), "shop-c", "liqo-prov").is_some(),
                want,
                "{type_:?}"
            );
        }
    }

    #[test]
    fn remote_copy_is_labelled_and_keeps_content() {
        let local = config_map("app", &[(LAST_APPLIED, "{}"), ("note", "x")]);
        let copy = remote(&local, "shop-c", "liqo-prov").expect("reflected");
        assert_eq!(copy.metadata.name.as_deref(), Some("app"));
        assert_eq!(copy.metadata.namespace.as_deref(), Some("shop-c"));
        // Nothing the local API server set comes along.
        assert_eq!(copy.metadata.uid, None);
        assert_eq!(copy.metadata.resource_version, None);
        let l = copy.metadata.labels.clone().expect("labels");
        assert_eq!(l["app"], "web");
        assert_eq!(l[labels::MANAGED_BY], labels::MANAGED_BY_VALUE);
        assert_eq!(l[labels::ORIGIN_NAMESPACE], "shop");
        let a = copy.metadata.annotations.clone().expect("annotations");
        assert_eq!(a.len(), 1);
        assert_eq!(a["note"], "x");
        assert_eq!(copy.data, local.data);
        assert!(is_ours(&copy.metadata, "shop"));
        assert!(!is_ours(&copy.metadata, "other"));
        assert!(!is_ours(&local.metadata, "shop"));

        let s = secret("s", Some("kubernetes.io/tls"));
        let copy = remote(&s, "shop-c", "liqo-prov").expect("reflected");
        assert_eq!(copy.data, s.data);
        assert_eq!(copy.type_.as_deref(), Some("kubernetes.io/tls"));
    }

    #[test]
    fn in_sync_table() {
        let want = remote(&config_map("app", &[]), "shop-c", "liqo-prov").expect("reflected");
        let mut data = want.clone();
        data.data = Some(BTreeMap::from([("k".to_owned(), "changed".to_owned())]));
        let mut label = want.clone();
        label
            .metadata
            .labels
            .as_mut()
            .expect("labels")
            .insert("extra".to_owned(), "x".to_owned());
        let mut server_fields = want.clone();
        server_fields.metadata.uid = Some("remote-uid".to_owned());
        server_fields.metadata.resource_version = Some("7".to_owned());
        let cases = [
            ("identical", want.clone(), true),
            ("server-set fields only", server_fields, true),
            ("data changed", data, false),
            ("a label added", label, false),
        ];
        for (what, have, sync) in cases {
            assert_eq!(in_sync(&want, &have), sync, "{what}");
        }
        // A Secret read back from the API has its type defaulted.
        let want = remote(&secret("s", None), "shop-c", "liqo-prov").expect("reflected");
        let mut have = want.clone();
        have.type_ = Some("Opaque".to_owned());
        assert!(in_sync(&want, &have));
    }
}
