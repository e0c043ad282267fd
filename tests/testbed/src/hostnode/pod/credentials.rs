//! A pod's credentials: the token of its service account, bound to the
//! pod, and the kubeconfig that reads it, made on the first container
//! start and the token replaced well before it expires.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use super::super::{StartError, env};
use super::{Context, PodRuntime, chain};

/// How often a pod's service-account token is replaced, well within its life.
const TOKEN_REFRESH: Duration = Duration::from_secs(20 * 60);

/// A pod's service-account token file and the kubeconfig that reads it.
#[derive(Debug)]
pub(super) struct Credentials {
    token: PathBuf,
    kubeconfig: PathBuf,
    refreshed: Instant,
}

impl PodRuntime {
    /// The kubeconfig of the pod's service account, made on first use.
    pub(super) async fn credentials(
        &mut self,
        pod: &Pod,
        ctx: &Context<'_>,
    ) -> Result<PathBuf, StartError> {
        if let Some(c) = &self.credentials {
            return Ok(c.kubeconfig.clone());
        }
        let dir = self.dir(ctx.config);
        let token = dir.join("token");
        let kubeconfig = dir.join("kubeconfig");
        std::fs::create_dir_all(&dir).map_err(|source| StartError::Write {
            path: dir.clone(),
            source,
        })?;
        let token_value = env::request_token(ctx.client, pod, &[], env::TOKEN_SECONDS).await?;
        write_atomically(&token, &token_value)?;
        let user = format!(
            "system:serviceaccount:{}:{}",
            self.namespace,
            env::service_account(pod)
        );
        let yaml = env::token_kubeconfig(
            &ctx.config.cluster,
            &ctx.config.server,
            &ctx.config.ca_pem,
            &user,
            &self.namespace,
            &token,
        );
        write_atomically(&kubeconfig, &yaml)?;
        self.credentials = Some(Credentials {
            token,
            kubeconfig: kubeconfig.clone(),
            refreshed: Instant::now(),
        });
        Ok(kubeconfig)
    }

    /// Replaces the token before it expires; clients re-read the file.
    pub(super) async fn refresh_credentials(&mut self, pod: &Pod, ctx: &Context<'_>) {
        let Some(c) = self.credentials.as_mut() else {
            return;
        };
        if c.refreshed.elapsed() < TOKEN_REFRESH {
            return;
        }
        let written = match env::request_token(ctx.client, pod, &[], env::TOKEN_SECONDS).await {
            Ok(token) => write_atomically(&c.token, &token),
            Err(e) => Err(e),
        };
        match written {
            Ok(()) => c.refreshed = Instant::now(),
            Err(e) => tracing::warn!(
                pod = %format!("{}/{}", self.namespace, self.name),
                "refreshing the token: {}",
                chain(&e)
            ),
        }
    }
}

/// Writes a private file whole: readers (clients re-reading a token) never
/// see half of it, and nobody else reads it.
fn write_atomically(path: &std::path::Path, contents: &str) -> Result<(), StartError> {
    let tmp = path.with_extension("tmp");
    crate::write_private(&tmp, contents)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| StartError::Write {
            path: path.to_owned(),
            source,
        })
}
