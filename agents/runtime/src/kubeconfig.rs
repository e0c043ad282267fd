//! Kubeconfigs as the agents read them: JSON. liqoctl writes the
//! kubeconfigs it gives the agents (the provider's credential of a
//! virtual kubelet) as JSON, which every YAML reader, kubectl's too, reads
//! as well; the testbed writes those of its host-process node's pods so.
//! Read as JSON only, the agents' binaries leave out kube's reading of
//! YAML kubeconfigs (`Config::infer`, `Kubeconfig::from_yaml`), code that
//! would be resident for the agents' whole life (docs/virtual-kubelet.md,
//! "The binary").

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Why a kubeconfig gives no configuration.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("cannot read the kubeconfig {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the kubeconfig {path} is not JSON: the agents read kubeconfigs as JSON \
         (`kubectl config view --raw --flatten -o json` writes one)"
    )]
    NotJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("the kubeconfig {path} is not a usable kubeconfig")]
    Unusable {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("no KUBECONFIG is set and this is not a pod with a service account")]
    NotInCluster(#[source] kube::config::InClusterError),
}

/// The kubeconfig `text` as the agents read it: JSON.
pub fn parse(text: &[u8]) -> Result<Kubeconfig, serde_json::Error> {
    serde_json::from_slice(text)
}

/// The configuration the kubeconfig `text` (read from `path`, which errors
/// name) gives, at its current context.
pub async fn config(path: &Path, text: &[u8]) -> Result<kube::Config, KubeconfigError> {
    let kubeconfig = parse(text).map_err(|source| KubeconfigError::NotJson {
        path: path.to_owned(),
        source,
    })?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| KubeconfigError::Unusable {
            path: path.to_owned(),
            source,
        })
}

/// The configuration of the agent's own cluster: the kubeconfig file
/// `KUBECONFIG` names when it is set (one file: the agents are given one),
/// else the pod's service account.
pub async fn local() -> Result<kube::Config, KubeconfigError> {
    match std::env::var_os("KUBECONFIG").filter(|p| !p.is_empty()) {
        Some(path) => {
            let path = PathBuf::from(path);
            let text = tokio::fs::read(&path)
                .await
                .map_err(|source| KubeconfigError::Read {
                    path: path.clone(),
                    source,
                })?;
            config(&path, &text).await
        }
        None => kube::Config::incluster().map_err(KubeconfigError::NotInCluster),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: &str = r#"{
      "apiVersion": "v1", "kind": "Config",
      "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
      "users": [{"name": "u", "user": {"token": "t"}}],
      "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
      "current-context": "c"
    }"#;

    #[tokio::test]
    async fn a_json_kubeconfig_gives_its_current_context() {
        let config = config(Path::new("k.json"), JSON.as_bytes())
            .await
            .expect("a JSON kubeconfig");
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert_eq!(config.default_namespace, "ns");
    }

    #[tokio::test]
    async fn yaml_is_refused_with_what_to_do() {
        let yaml = "apiVersion: v1\nkind: Config\nclusters: []\n";
        let Err(err) = config(Path::new("k.yaml"), yaml.as_bytes()).await else {
            panic!("YAML read as a kubeconfig");
        };
        assert!(matches!(err, KubeconfigError::NotJson { .. }), "{err:?}");
        assert!(err.to_string().contains("-o json"), "{err}");
    }

    #[tokio::test]
    async fn json_without_a_usable_context_is_unusable() {
        let empty = r#"{"apiVersion": "v1", "kind": "Config"}"#;
        let Err(err) = config(Path::new("k.json"), empty.as_bytes()).await else {
            panic!("a kubeconfig without a context used");
        };
        assert!(matches!(err, KubeconfigError::Unusable { .. }), "{err:?}");
    }
}
