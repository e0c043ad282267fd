//! The gateway's WireGuard key pair: made on its first start, the private
//! key kept in the Secret `liqo-gateway-key` of its own namespace (it never
//! leaves the cluster: children get it on standard input), the public key
//! published in the ConfigMap `liqo-gateway`, where `liqoctl` reads it to
//! hand it to peers.

use std::collections::BTreeMap;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use liqo_api::names;

use super::{MANAGER, is_ours, our_labels};
use crate::tunnel::Key;

/// Makes the gateway's key pair unless its Secret holds one, and
/// publishes the public key. Refuses a Secret or ConfigMap of that name
/// that is not ours.
pub async fn ensure_key(client: &kube::Client, namespace: &str) -> anyhow::Result<Key> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = match secrets.get_opt(names::GATEWAY_KEY_SECRET).await? {
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
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    secrets.get(names::GATEWAY_KEY_SECRET).await?
                }
                Err(e) => return Err(e).context("creating the gateway's key Secret"),
            }
        }
    };
    anyhow::ensure!(
        is_ours(secret.labels()),
        "the Secret {namespace}/{} exists and is not liqo's: remove or rename it",
        names::GATEWAY_KEY_SECRET
    );
    let key: Key = secret
        .data
        .as_ref()
        .and_then(|d| d.get(names::GATEWAY_PRIVATE_KEY))
        .and_then(|v| std::str::from_utf8(&v.0).ok())
        .ok_or_else(|| anyhow::anyhow!("the gateway's key Secret holds no private key"))?
        .parse()
        .map_err(|e| anyhow::anyhow!("the gateway's key Secret is damaged: {e}"))?;

    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    if let Some(map) = maps.get_opt(names::GATEWAY_CONFIGMAP).await? {
        anyhow::ensure!(
            is_ours(map.labels()),
            "the ConfigMap {namespace}/{} exists and is not liqo's: remove or rename it",
            names::GATEWAY_CONFIGMAP
        );
    }
    let map = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": names::GATEWAY_CONFIGMAP, "labels": our_labels() },
        "data": { names::GATEWAY_PUBLIC_KEY: key.public_of_private() },
    });
    maps.patch(
        names::GATEWAY_CONFIGMAP,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(map),
    )
    .await
    .context("publishing the gateway's public key")?;
    Ok(key)
}
