//! Pure translation of the service account token of an offloaded pod.
//!
//! The consumer's API server injects a `kube-api-access-*` projected
//! volume into every pod that mounts its account's token. On the provider
//! that volume would hold a token of the provider's cluster, useless to a
//! pod that belongs to the consumer. Instead the virtual kubelet asks the
//! consumer's TokenRequest API for a token of the pod's own account, bound
//! to the local pod, and keeps it in a Secret of ours in the twin
//! ([`token_secret`]: `token`, `ca.crt` = the consumer's CA, `namespace` =
//! the local namespace), refreshed before it expires. The remote pod
//! mounts that Secret under the same volume name, hence at the same paths
//! ([`mount`]), and its containers get `KUBERNETES_SERVICE_HOST` and
//! `KUBERNETES_SERVICE_PORT` of the consumer's API as the provider reaches
//! it, so that in-cluster clients talk to the consumer.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{EnvVar, KeyToPath, PodSpec, Secret, SecretVolumeSource, Volume};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::core::ObjectMeta;
use liqo_agent_runtime::compact::{Uid, Version, identity};
use liqo_agent_runtime::follow::Key;
use liqo_api::names::labels;
use std::sync::Arc;

use super::pod::LOCAL_POD_UID;

/// How long a requested token lives (the API's minimum is ten minutes).
pub const TOKEN_SECONDS: i64 = 3600;
/// The annotation of a token Secret that says when to renew it.
pub const REFRESH_AT: &str = "liqo.io/token-refresh-at";
/// The prefix of the token Secrets' names, before the local pod's name.
const SECRET_PREFIX: &str = "liqo-sa-token-";
/// The environment in-cluster clients find their API server with.
pub const HOST_ENV: &str = "KUBERNETES_SERVICE_HOST";
pub const PORT_ENV: &str = "KUBERNETES_SERVICE_PORT";
/// The ConfigMap and key the consumer publishes its CA in, in every
/// namespace.
pub const ROOT_CA_KEY: &str = "ca.crt";

/// The consumer's API as the provider's pods reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiAddress {
    pub host: String,
    pub port: u16,
}

impl ApiAddress {
    /// From a URL's host and port (443 by default).
    pub fn of(host: Option<&str>, port: Option<u16>) -> Option<Self> {
        let host = host?.trim_start_matches('[').trim_end_matches(']');
        Some(Self {
            host: host.to_owned(),
            port: port.unwrap_or(443),
        })
    }
}

/// The name of the local pod's token Secret in the twin.
pub fn secret_name(pod_name: &str) -> String {
    format!("{SECRET_PREFIX}{pod_name}")
}

/// The local pod's name from its token Secret's.
pub fn pod_name(secret_name: &str) -> Option<&str> {
    secret_name.strip_prefix(SECRET_PREFIX)
}

/// The token volume the consumer's API server injected, if any.
pub fn token_volume(spec: &PodSpec) -> Option<&Volume> {
    spec.volumes
        .iter()
        .flatten()
        .find(|v| v.name.starts_with("kube-api-access-") && v.projected.is_some())
}

/// The pod's service account.
pub fn service_account(spec: &PodSpec) -> &str {
    spec.service_account_name.as_deref().unwrap_or("default")
}

/// The TokenRequest for `pod`'s account, bound to the pod (the token dies
/// with it) for the API server's default audience.
pub fn token_request(pod: &ObjectMeta) -> TokenRequest {
    TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(TOKEN_SECONDS),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Pod".to_owned()),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
            }),
        },
        ..TokenRequest::default()
    }
}

/// When a token issued at `issued` and expiring at `expires` is renewed:
/// at 80% of its life, as a kubelet does.
pub fn refresh_at(issued: Timestamp, expires: Timestamp) -> Timestamp {
    let life = expires.duration_since(issued);
    let early = SignedDuration::from_millis(life.as_millis() as i64 * 8 / 10);
    issued.checked_add(early).unwrap_or(expires)
}

/// The token Secret of `pod` in `twin`.
pub fn token_secret(
    pod: &ObjectMeta,
    twin: &str,
    token: &str,
    ca: &str,
    refresh: Timestamp,
) -> Secret {
    let name = pod.name.clone().unwrap_or_default();
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&name)),
            namespace: Some(twin.to_owned()),
            labels: Some(BTreeMap::from([
                (
                    labels::MANAGED_BY.to_owned(),
                    labels::MANAGED_BY_VALUE.to_owned(),
                ),
                (
                    LOCAL_POD_UID.to_owned(),
                    pod.uid.clone().unwrap_or_default(),
                ),
            ])),
            annotations: Some(BTreeMap::from([(
                REFRESH_AT.to_owned(),
                refresh.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([
            ("token".to_owned(), ByteString(token.as_bytes().to_vec())),
            (ROOT_CA_KEY.to_owned(), ByteString(ca.as_bytes().to_vec())),
            (
                "namespace".to_owned(),
                ByteString(pod.namespace.clone().unwrap_or_default().into_bytes()),
            ),
        ])),
        ..Secret::default()
    }
}

/// A token Secret as the agent stores it: what [`still_good`] and the
/// reflection read (its identity, the pod it is for, whether it holds a
/// token, a digest of its CA and when to renew it), made when it is read
/// from the API. Neither the token nor the CA is kept.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredToken {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub uid: Option<Uid>,
    pub version: Option<Version>,
    /// Its `liqo.io/local-pod-uid`.
    for_pod: Option<Uid>,
    has_token: bool,
    /// Whether it holds a CA, and the digest of it ([`super::digest`]):
    /// a flag beside the other rather than an `Option`, which would make
    /// the stored value (and its allocation) a size class larger.
    has_ca: bool,
    ca: u64,
    refresh: Option<Timestamp>,
}

impl StoredToken {
    pub fn new(secret: Secret, key: &Key) -> Self {
        let (uid, version) = identity(&secret.metadata);
        let data = secret.data.unwrap_or_default();
        let ca = data.get(ROOT_CA_KEY);
        Self {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            uid,
            version,
            for_pod: secret
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LOCAL_POD_UID))
                .map(|u| Uid::new(u)),
            has_token: data.contains_key("token"),
            has_ca: ca.is_some(),
            ca: ca.map_or(0, |ca| super::digest(&ca.0)),
            refresh: secret
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(REFRESH_AT))
                .and_then(|t| t.parse().ok()),
        }
    }
}

/// Whether the existing token Secret `have` still serves `pod` at `now`
/// with the CA `ca`: same pod, same CA, not yet due.
pub fn still_good(
    have: &StoredToken,
    pod: &ObjectMeta,
    ca: &str,
    now: Timestamp,
) -> Option<Timestamp> {
    let same_pod = have.for_pod.as_ref().map(Uid::to_string) == pod.uid;
    let same_ca = have.has_ca && have.ca == super::digest(ca.as_bytes());
    let refresh = have.refresh?;
    (same_pod && same_ca && have.has_token && refresh > now).then_some(refresh)
}

/// Mounts the token Secret into a remote wrapper's pod spec (a
/// ReplicaSet's or a Job's) where the local pod had its token volume (same
/// volume name, same mounts), and points in-cluster clients at `api`.
/// Nothing when the local pod mounts no token.
pub fn mount_in(remote: &mut PodSpec, local: &PodSpec, pod_name: &str, api: &ApiAddress) {
    let Some(volume) = token_volume(local) else {
        return;
    };
    let item = |k: &str| KeyToPath {
        key: k.to_owned(),
        path: k.to_owned(),
        mode: None,
    };
    remote.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: volume.name.clone(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret_name(pod_name)),
            items: Some(vec![item("token"), item(ROOT_CA_KEY), item("namespace")]),
            default_mode: Some(0o644),
            optional: None,
        }),
        ..Volume::default()
    });
    let locals: BTreeMap<&str, _> = local
        .containers
        .iter()
        .chain(local.init_containers.iter().flatten())
        .map(|c| (c.name.as_str(), c))
        .collect();
    for c in remote
        .containers
        .iter_mut()
        .chain(remote.init_containers.iter_mut().flatten())
    {
        let Some(l) = locals.get(c.name.as_str()) else {
            continue;
        };
        let mounts: Vec<_> = l
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| m.name == volume.name)
            .cloned()
            .collect();
        if !mounts.is_empty() {
            c.volume_mounts.get_or_insert_with(Vec::new).extend(mounts);
        }
        // A container's own value wins, as on a kubelet.
        let env = c.env.get_or_insert_with(Vec::new);
        for (name, value) in [
            (HOST_ENV, api.host.clone()),
            (PORT_ENV, api.port.to_string()),
        ] {
            if !env.iter().any(|e| e.name == name) {
                env.push(EnvVar {
                    name: name.to_owned(),
                    value: Some(value),
                    value_from: None,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge::pod::replica_set;
    use k8s_openapi::api::core::v1::{Container, Pod, ProjectedVolumeSource, VolumeMount};

    const PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

    fn local_pod(token: bool, own_host: bool) -> Pod {
        let mut env = vec![];
        if own_host {
            env.push(EnvVar {
                name: HOST_ENV.to_owned(),
                value: Some("mine".to_owned()),
                value_from: None,
            });
        }
        let container = Container {
            name: "app".to_owned(),
            env: Some(env),
            volume_mounts: token.then(|| {
                vec![VolumeMount {
                    name: "kube-api-access-x1".to_owned(),
                    mount_path: PATH.to_owned(),
                    read_only: Some(true),
                    ..VolumeMount::default()
                }]
            }),
            ..Container::default()
        };
        Pod {
            metadata: ObjectMeta {
                name: Some("web-1".to_owned()),
                namespace: Some("shop".to_owned()),
                uid: Some("pod-uid".to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                service_account_name: Some("builder".to_owned()),
                containers: vec![container],
                volumes: token.then(|| {
                    vec![Volume {
                        name: "kube-api-access-x1".to_owned(),
                        projected: Some(ProjectedVolumeSource::default()),
                        ..Volume::default()
                    }]
                }),
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    fn api() -> ApiAddress {
        ApiAddress {
            host: "192.0.2.1".to_owned(),
            port: 6443,
        }
    }

    fn remote_spec(pod: &Pod) -> PodSpec {
        let rs = replica_set(pod, "shop-c", None);
        let mut remote = rs
            .spec
            .and_then(|s| s.template)
            .and_then(|t| t.spec)
            .expect("pod spec");
        mount_in(
            &mut remote,
            pod.spec.as_ref().expect("spec"),
            "web-1",
            &api(),
        );
        remote
    }

    #[test]
    fn mount_table() {
        // (what, mounts a token, sets its own host, want a volume, want host)
        let cases = [
            ("token mounted", true, false, true, Some("192.0.2.1")),
            (
                "the container's own host wins",
                true,
                true,
                true,
                Some("mine"),
            ),
            ("no token", false, false, false, None),
        ];
        for (what, token, own, want_volume, want_host) in cases {
            let spec = remote_spec(&local_pod(token, own));
            let volume = spec
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == "kube-api-access-x1");
            assert_eq!(volume.is_some(), want_volume, "{what}");
            if let Some(v) = volume {
                let s = v.secret.as_ref().expect("a secret volume");
                assert_eq!(s.secret_name.as_deref(), Some("liqo-sa-token-web-1"));
                let keys: Vec<_> = s.items.iter().flatten().map(|i| i.key.as_str()).collect();
                assert_eq!(keys, ["token", "ca.crt", "namespace"]);
                let mounts = spec.containers[0].volume_mounts.clone().expect("mounts");
                assert_eq!(mounts.len(), 1, "{what}");
                assert_eq!(mounts[0].mount_path, PATH);
            }
            let env = spec.containers[0].env.clone().unwrap_or_default();
            let get = |n: &str| {
                env.iter()
                    .find(|e| e.name == n)
                    .and_then(|e| e.value.clone())
            };
            assert_eq!(get(HOST_ENV).as_deref(), want_host, "{what}");
            assert_eq!(get(PORT_ENV).is_some(), want_host.is_some(), "{what}");
            // The provider's own token is never mounted.
            assert_eq!(spec.automount_service_account_token, Some(false), "{what}");
            assert_eq!(spec.service_account_name, None, "{what}");
        }
    }

    #[test]
    fn request_is_bound_to_the_pod() {
        let pod = local_pod(true, false);
        let r = token_request(&pod.metadata);
        let b = r.spec.bound_object_ref.expect("bound");
        assert_eq!(
            (b.kind.as_deref(), b.name.as_deref(), b.uid.as_deref()),
            (Some("Pod"), Some("web-1"), Some("pod-uid"))
        );
        assert_eq!(r.spec.expiration_seconds, Some(TOKEN_SECONDS));
        assert_eq!(service_account(pod.spec.as_ref().expect("spec")), "builder");
        assert_eq!(service_account(&PodSpec::default()), "default");
    }

    #[test]
    fn secret_and_refresh_table() {
        let pod = local_pod(true, false);
        let issued: Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        let expires: Timestamp = "2026-01-01T01:00:00Z".parse().expect("time");
        let refresh = refresh_at(issued, expires);
        assert_eq!(refresh.to_string(), "2026-01-01T00:48:00Z");
        let secret = token_secret(&pod.metadata, "shop-c", "tok", "CA", refresh);
        assert_eq!(secret.metadata.name.as_deref(), Some("liqo-sa-token-web-1"));
        assert_eq!(pod_name("liqo-sa-token-web-1"), Some("web-1"));
        let data = secret.data.clone().expect("data");
        assert_eq!(data["namespace"].0, b"shop");
        assert_eq!(data["token"].0, b"tok");
        // As stored: neither the token nor the CA is kept whole.
        let key = Key {
            namespace: "shop-c".into(),
            name: "liqo-sa-token-web-1".into(),
        };
        let secret = StoredToken::new(secret, &key);
        assert!(secret.has_token && secret.has_ca && secret.ca == crate::forge::digest(b"CA"));
        assert_eq!(&*secret.name, "liqo-sa-token-web-1");
        let before: Timestamp = "2026-01-01T00:30:00Z".parse().expect("time");
        let after: Timestamp = "2026-01-01T00:50:00Z".parse().expect("time");
        let mut other_pod = pod.clone();
        other_pod.metadata.uid = Some("another".to_owned());
        let cases = [
            ("fresh", &pod, "CA", before, true),
            ("due", &pod, "CA", after, false),
            ("the CA changed", &pod, "CA2", before, false),
            ("another pod of that name", &other_pod, "CA", before, false),
        ];
        for (what, p, ca, now, good) in cases {
            let good_now = still_good(&secret, &p.metadata, ca, now).is_some();
            assert_eq!(good_now, good, "{what}");
        }
    }

    #[test]
    fn api_address_of_urls() {
        let cases = [
            ((Some("127.0.0.1"), Some(6443)), Some(("127.0.0.1", 6443))),
            (
                (Some("api.example.org"), None),
                Some(("api.example.org", 443)),
            ),
            ((Some("[::1]"), Some(8443)), Some(("::1", 8443))),
            ((None, Some(1)), None),
        ];
        for (url, want) in cases {
            let got = ApiAddress::of(url.0, url.1);
            assert_eq!(
                got.as_ref().map(|a| (a.host.as_str(), a.port)),
                want,
                "{url:?}"
            );
        }
    }
}
