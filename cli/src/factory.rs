//! Builds Kubernetes clients the way kubectl finds its cluster:
//! `--kubeconfig`, then `KUBECONFIG`, then `~/.kube/config`, then the
//! in-cluster service account; `--context` picks a context. Turns transport
//! and permission failures into [`UserError`]s that say what to do.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};

use crate::cli::GlobalArgs;
use crate::error::UserError;

/// A client for one cluster, with what is needed to talk about it.
#[derive(Clone)]
pub struct ClusterClient {
    pub client: kube::Client,
    /// How to call the cluster in messages: the context's name, or its URL.
    pub name: String,
    pub server: String,
    /// The CA the kubeconfig trusts for the API server (DER), if it names one.
    pub ca_der: Option<Vec<u8>>,
}

impl std::fmt::Debug for ClusterClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterClient")
            .field("name", &self.name)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl ClusterClient {
    /// The local cluster named by the global flags.
    pub async fn local(global: &GlobalArgs) -> anyhow::Result<Self> {
        Self::connect(global.kubeconfig.as_deref(), global.context.as_deref()).await
    }

    pub async fn connect(kubeconfig: Option<&Path>, context: Option<&str>) -> anyhow::Result<Self> {
        let options = KubeConfigOptions {
            context: context.map(str::to_owned),
            ..Default::default()
        };
        let (config, name) = match kubeconfig {
            Some(path) => {
                let kc = Kubeconfig::read_from(path).map_err(|e| {
                    UserError::Config(format!(
                        "cannot read kubeconfig {}: {}",
                        path.display(),
                        kubeconfig_reason(&e)
                    ))
                })?;
                let name = context
                    .map(str::to_owned)
                    .or_else(|| kc.current_context.clone());
                let config = kube::Config::from_custom_kubeconfig(kc, &options)
                    .await
                    .map_err(|e| config_error(&e, context, &path.display().to_string()))?;
                (config, name)
            }
            None => match kube::Config::from_kubeconfig(&options).await {
                Ok(config) => {
                    let name = context
                        .map(str::to_owned)
                        .or_else(|| Kubeconfig::read().ok().and_then(|kc| kc.current_context));
                    (config, name)
                }
                Err(KubeconfigError::ReadConfig(..)) if context.is_none() => {
                    // No kubeconfig file at all: try the in-cluster account.
                    let config = kube::Config::incluster().map_err(|_| {
                        UserError::Config(
                            "no kubeconfig found: pass --kubeconfig, set KUBECONFIG, or create ~/.kube/config"
                                .to_owned(),
                        )
                    })?;
                    (config, Some("in-cluster".to_owned()))
                }
                Err(e) => return Err(config_error(&e, context, "the kubeconfig").into()),
            },
        };
        Self::from_config(config, name)
    }

    fn from_config(config: kube::Config, name: Option<String>) -> anyhow::Result<Self> {
        let server = config.cluster_url.to_string();
        let ca_der = config
            .root_cert
            .as_ref()
            .and_then(|certs| certs.first().cloned());
        let client = kube::Client::try_from(config)
            .map_err(|e| UserError::Config(format!("cannot build a client for {server}: {e}")))?;
        Ok(Self {
            client,
            name: name.unwrap_or_else(|| server.clone()),
            server,
            ca_der,
        })
    }

    /// A client from a kubeconfig held in memory (a peering's credential),
    /// called `name` in messages.
    pub async fn from_kubeconfig_yaml(name: &str, yaml: &str) -> anyhow::Result<Self> {
        let kc = Kubeconfig::from_yaml(yaml).map_err(|e| {
            UserError::Config(format!(
                "a kubeconfig for {name}: {}",
                kubeconfig_reason(&e)
            ))
        })?;
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| config_error(&e, None, name))?;
        Self::from_config(config, Some(name.to_owned()))
    }

    /// Explains a failed API call: unreachable, forbidden and the like are
    /// user errors; the rest keeps its cause for the report.
    pub fn explain(&self, err: kube::Error, doing: &str) -> anyhow::Error {
        match &err {
            // Admission control (a ValidatingAdmissionPolicy, a webhook, Pod
            // Security) also answers 403, but more rights would not help.
            kube::Error::Api(status) if status.code == 403 && !refused_by_rbac(&status.message) => {
                UserError::Refused(format!(
                    "{doing} on cluster {}: refused by the cluster's admission control: {}",
                    self.name, status.message
                ))
                .into()
            }
            kube::Error::Api(status) if status.code == 403 => UserError::Forbidden(format!(
                "{doing} on cluster {}: forbidden ({}); use a kubeconfig with more rights",
                self.name, status.message
            ))
            .into(),
            kube::Error::Api(status) if status.code == 401 => UserError::Unauthenticated(format!(
                "{doing} on cluster {}: the cluster does not accept the kubeconfig's credentials",
                self.name
            ))
            .into(),
            kube::Error::Api(status) if status.code == 404 => UserError::NotFound(format!(
                "{doing} on cluster {}: not found ({})",
                self.name, status.message
            ))
            .into(),
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::TlsRequired => {
                UserError::Unreachable(format!(
                    "cannot reach cluster {} at {}: {}",
                    self.name,
                    self.server,
                    transport_reason(&err)
                ))
                .into()
            }
            // The server understood and refused: invalid (422), in conflict
            // (409), or another rule of the cluster's.
            kube::Error::Api(status) if (400..500).contains(&status.code) => {
                UserError::Refused(format!(
                    "{doing} on cluster {}: refused ({}): {}",
                    self.name, status.code, status.message
                ))
                .into()
            }
            _ => anyhow::Error::new(err).context(format!("{doing} on cluster {}", self.name)),
        }
    }
}

/// Whether a 403's message is RBAC's ("User \"x\" cannot create resource
/// ..."), as opposed to an admission plugin's.
fn refused_by_rbac(message: &str) -> bool {
    message.contains(" cannot ")
}

/// What went wrong on the way to the API server, in words that say what to
/// check: the causes of a transport error are nested several layers deep.
fn transport_reason(err: &kube::Error) -> &'static str {
    let mut causes = Vec::new();
    let mut cause: Option<&dyn std::error::Error> = Some(err);
    while let Some(c) = cause {
        causes.push(c.to_string());
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => {
                    return "connection refused; check that the API server is up and the kubeconfig's server address";
                }
                std::io::ErrorKind::TimedOut => {
                    return "no answer in time; check the address and the network";
                }
                _ => {}
            }
        }
        cause = c.source();
    }
    let all = causes.join(": ");
    if all.contains("certificate") || all.contains("UnknownIssuer") {
        "its certificate is not trusted; check the kubeconfig's certificate-authority-data"
    } else if all.contains("dns error") || all.contains("failed to lookup address") {
        "its host name does not resolve; check the kubeconfig's server address"
    } else if all.contains("connection refused") {
        "connection refused; check that the API server is up and the kubeconfig's server address"
    } else if all.contains("timed out") || all.contains("elapsed") {
        "no answer in time; check the address and the network"
    } else {
        "check the kubeconfig and that the API server is up"
    }
}

fn kubeconfig_reason(err: &KubeconfigError) -> String {
    // The innermost cause is the one a person can act on (file missing,
    // YAML broken at line N).
    let mut cause: &dyn std::error::Error = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    // One line: a YAML error quotes the offending input below its first line.
    cause
        .to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn config_error(err: &KubeconfigError, context: Option<&str>, file: &str) -> UserError {
    match (err, context) {
        (KubeconfigError::LoadContext(_), Some(ctx)) => UserError::Config(format!(
            "context {ctx:?} not found in {file}; `kubectl config get-contexts` lists the contexts"
        )),
        (KubeconfigError::CurrentContextNotSet, _) => {
            UserError::Config(format!("{file} sets no current context; pass --context"))
        }
        _ => UserError::Config(format!("cannot use {file}: {}", kubeconfig_reason(err))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rbac_refusals_are_told_from_admission_ones() {
        assert!(refused_by_rbac(
            "configmaps is forbidden: User \"liqo.io:peer:a\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"default\""
        ));
        assert!(!refused_by_rbac(
            "resourcequotas \"liqo-grant\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: no"
        ));
        assert!(!refused_by_rbac(
            "pods \"x\" is forbidden: violates PodSecurity \"restricted:v1.34\": runAsNonRoot != true"
        ));
    }
}
