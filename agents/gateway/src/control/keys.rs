//! The gateway's WireGuard key pair: made on its first start, the private
//! key kept in the Secret `liqo-gateway-key` of its own namespace (it never
//! leaves the cluster: children get it on standard input), the public key
//! published in the ConfigMap `liqo-gateway`, where `liqoctl` reads it to
//! hand it to peers.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use liqo_api::names;

use super::{MANAGER, is_ours, our_labels};
use crate::tunnel::{Key, KeyError};

/// Why the gateway's key pair could not be made, read or published.
/// Where the API's error alone said it, it still does (`transparent`).
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error(transparent)]
    ReadSecret(kube::Error),
    #[error("creating the gateway's key Secret")]
    CreateSecret(#[source] kube::Error),
    #[error("the Secret {namespace}/{name} exists and is not liqo's: remove or rename it")]
    SecretNotOurs {
        namespace: String,
        name: &'static str,
    },
    #[error("the gateway's key Secret holds no private key")]
    NoPrivateKey,
    #[error("the gateway's key Secret is damaged")]
    Damaged(#[source] KeyError),
    #[error(transparent)]
    ReadConfigMap(kube::Error),
    #[error("the ConfigMap {namespace}/{name} exists and is not liqo's: remove or rename it")]
    ConfigMapNotOurs {
        namespace: String,
        name: &'static str,
    },
    #[error("publishing the gateway's public key")]
    Publish(#[source] kube::Error),
}

/// Makes the gateway's key pair unless its Secret holds one, and
/// publishes the public key. Refuses a Secret or ConfigMap of that name
/// that is not ours.
pub async fn ensure_key(client: &kube::Client, namespace: &str) -> Result<Key, KeysError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = match secrets
        .get_opt(names::GATEWAY_KEY_SECRET)
        .await
        .map_err(KeysError::ReadSecret)?
    {
        Some(secret) => secret,
        None => {
            let key = Key::generate();
            let secret = Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(names::GATEWAY_KEY_SECRET.to_owned()),
                    labels: Some(our_labels()),
                    ..Default::default()
                },
                type_: Some(names::GATEWAY_KEY_SECRET_TYPE.to_owned()),
                string_data: Some(BTreeMap::from([(
                    names::GATEWAY_PRIVATE_KEY.to_owned(),
                    key.expose(),
                )])),
                ..Default::default()
            };
            match secrets.create(&PostParams::default(), &secret).await {
                Ok(created) => created,
                // Another gateway made it first: use that one.
                Err(kube::Error::Api(e)) if e.code == 409 => secrets
                    .get(names::GATEWAY_KEY_SECRET)
                    .await
                    .map_err(KeysError::ReadSecret)?,
                Err(e) => return Err(KeysError::CreateSecret(e)),
            }
        }
    };
    if !is_ours(secret.labels()) {
        return Err(KeysError::SecretNotOurs {
            namespace: namespace.to_owned(),
            name: names::GATEWAY_KEY_SECRET,
        });
    }
    let key: Key = secret
        .data
        .as_ref()
        .and_then(|d| d.get(names::GATEWAY_PRIVATE_KEY))
        .and_then(|v| std::str::from_utf8(&v.0).ok())
        .ok_or(KeysError::NoPrivateKey)?
        .parse()
        .map_err(KeysError::Damaged)?;

    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let existing = maps
        .get_opt(names::GATEWAY_CONFIGMAP)
        .await
        .map_err(KeysError::ReadConfigMap)?;
    if existing.is_some_and(|map| !is_ours(map.labels())) {
        return Err(KeysError::ConfigMapNotOurs {
            namespace: namespace.to_owned(),
            name: names::GATEWAY_CONFIGMAP,
        });
    }
    let map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(names::GATEWAY_CONFIGMAP.to_owned()),
            labels: Some(our_labels()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            names::GATEWAY_PUBLIC_KEY.to_owned(),
            key.public_of_private(),
        )])),
        ..ConfigMap::default()
    };
    maps.patch(
        names::GATEWAY_CONFIGMAP,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&map),
    )
    .await
    .map_err(KeysError::Publish)?;
    Ok(key)
}
