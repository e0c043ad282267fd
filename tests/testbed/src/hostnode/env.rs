//! What a host-process container runs, computed as the kubelet would: the
//! binary its image names, its environment (values, the downward API,
//! ConfigMap and Secret keys) and its command line with `$(VAR)` references
//! expanded; plus the service-account credentials it is given.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, ServiceAccount};
use kube::api::{Api, PostParams};
use serde_json::json;

use super::StartError;

/// Variables of the harness' own environment a container may see; nothing
/// else of it leaks in.
const INHERITED: [&str; 4] = ["PATH", "HOME", "RUST_LOG", "RUST_BACKTRACE"];

/// How long the service-account tokens given to pods last.
pub(super) const TOKEN_SECONDS: i64 = 3600;

/// The repository of an image: without its tag or digest
/// (`ghcr.io/liqo-rs/liqo-gateway:0.1.0` is `ghcr.io/liqo-rs/liqo-gateway`;
/// the port of `localhost:5000/agent` is not a tag).
pub(super) fn image_repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    let last_segment = image.rfind('/').map_or(0, |at| at + 1);
    match image[last_segment..].find(':') {
        Some(colon) => &image[..last_segment + colon],
        None => image,
    }
}

/// The binary the allow-list `images` (repository → binary) gives for
/// `image`, if it lists its repository.
pub(super) fn allowed_binary<'a>(
    images: &'a BTreeMap<String, String>,
    image: &str,
) -> Option<&'a str> {
    images.get(image_repository(image)).map(String::as_str)
}

/// The executable file `name` in `dir`, if there is one. Names that are not
/// a plain file name never match, so an image cannot reach outside `dir`.
pub(super) fn executable(dir: &Path, name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return None;
    }
    let path = dir.join(name);
    let meta = std::fs::metadata(&path).ok()?;
    (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some(path)
}

/// Expands `$(VAR)` references in `input` the way the kubelet does:
/// a defined variable is replaced by its value, an undefined one is left as
/// written, `$$` is an escaped `$`, and any other `$` stays literal.
pub(super) fn expand(input: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(reference) = after.strip_prefix('(')
            && let Some(close) = reference.find(')')
        {
            let name = &reference[..close];
            match vars.get(name) {
                Some(value) => out.push_str(value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &reference[close + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The program and arguments of a container whose image is `binary`: the
/// image's own binary with the container's `args`, or, when `command` is
/// set, the binary of `bin_dir` named like `command[0]`, followed by the
/// rest of `command` and by `args`; all expanded from `env`.
pub(super) fn command_line(
    bin_dir: &Path,
    binary: &Path,
    container: &Container,
    env: &BTreeMap<String, String>,
) -> Result<(PathBuf, Vec<String>), StartError> {
    let expand_all =
        |words: &[String]| -> Vec<String> { words.iter().map(|w| expand(w, env)).collect() };
    let mut args = Vec::new();
    let program = match container.command.as_deref() {
        Some([first, rest @ ..]) => {
            let first = expand(first, env);
            let name = Path::new(&first)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            args.extend(expand_all(rest));
            executable(bin_dir, &name).ok_or_else(|| StartError::NoBinary {
                name,
                dir: bin_dir.to_owned(),
            })?
        }
        _ => binary.to_owned(),
    };
    args.extend(expand_all(container.args.as_deref().unwrap_or_default()));
    Ok((program, args))
}

/// The environment of a container of `pod`: the few inherited variables,
/// `KUBECONFIG`, then the container's `envFrom` and `env` in order, later
/// entries overriding earlier ones and `$(VAR)` in values referring to
/// earlier ones.
pub(super) async fn container_env(
    client: &kube::Client,
    pod: &Pod,
    container: &Container,
    ips: Addresses,
    kubeconfig: &Path,
) -> Result<BTreeMap<String, String>, StartError> {
    let mut env: BTreeMap<String, String> = INHERITED
        .iter()
        .filter_map(|name| Some(((*name).to_owned(), std::env::var(name).ok()?)))
        .collect();
    env.insert("KUBECONFIG".to_owned(), kubeconfig.display().to_string());

    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut sources = Sources::new(client, namespace);
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let data = if let Some(cm) = &from.config_map_ref {
            sources
                .config_map(&cm.name, cm.optional.unwrap_or(false))
                .await?
        } else if let Some(secret) = &from.secret_ref {
            sources
                .secret(&secret.name, secret.optional.unwrap_or(false))
                .await?
        } else {
            None
        };
        for (key, value) in data.into_iter().flatten() {
            env.insert(format!("{prefix}{key}"), value);
        }
    }

    for var in container.env.iter().flatten() {
        let value = match &var.value_from {
            None => Some(expand(var.value.as_deref().unwrap_or_default(), &env)),
            Some(from) => {
                if let Some(field) = &from.field_ref {
                    Some(field_value(pod, &field.field_path, ips)?)
                } else if let Some(key) = &from.config_map_key_ref {
                    let optional = key.optional.unwrap_or(false);
                    let data = sources.config_map(&key.name, optional).await?;
                    lookup(data, "configmap", &key.name, &key.key, optional)?
                } else if let Some(key) = &from.secret_key_ref {
                    let optional = key.optional.unwrap_or(false);
                    let data = sources.secret(&key.name, optional).await?;
                    lookup(data, "secret", &key.name, &key.key, optional)?
                } else {
                    return Err(StartError::Unsupported(format!(
                        "env {}: only fieldRef, configMapKeyRef and secretKeyRef are supported",
                        var.name
                    )));
                }
            }
        };
        if let Some(value) = value {
            env.insert(var.name.clone(), value);
        }
    }
    Ok(env)
}

/// A key of a ConfigMap's or Secret's data; `None` if optional and absent.
fn lookup(
    data: Option<BTreeMap<String, String>>,
    kind: &'static str,
    name: &str,
    key: &str,
    optional: bool,
) -> Result<Option<String>, StartError> {
    match data.and_then(|mut d| d.remove(key)) {
        Some(value) => Ok(Some(value)),
        None if optional => Ok(None),
        None => Err(StartError::MissingKey {
            kind,
            name: name.to_owned(),
            key: key.to_owned(),
        }),
    }
}

/// The ConfigMaps and Secrets a container's environment reads, each read
/// once per start.
struct Sources<'a> {
    client: &'a kube::Client,
    namespace: &'a str,
    read: BTreeMap<(&'static str, String), Option<BTreeMap<String, String>>>,
}

impl<'a> Sources<'a> {
    fn new(client: &'a kube::Client, namespace: &'a str) -> Self {
        Self {
            client,
            namespace,
            read: BTreeMap::new(),
        }
    }

    async fn config_map(
        &mut self,
        name: &str,
        optional: bool,
    ) -> Result<Option<BTreeMap<String, String>>, StartError> {
        let key = ("configmap", name.to_owned());
        if !self.read.contains_key(&key) {
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), self.namespace);
            let data = api
                .get_opt(name)
                .await
                .map_err(|source| StartError::Read {
                    kind: "configmap",
                    name: name.to_owned(),
                    source,
                })?
                .map(|cm| cm.data.unwrap_or_default());
            self.read.insert(key.clone(), data);
        }
        self.found(&key, optional)
    }

    async fn secret(
        &mut self,
        name: &str,
        optional: bool,
    ) -> Result<Option<BTreeMap<String, String>>, StartError> {
        let key = ("secret", name.to_owned());
        if !self.read.contains_key(&key) {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), self.namespace);
            let data = api
                .get_opt(name)
                .await
                .map_err(|source| StartError::Read {
                    kind: "secret",
                    name: name.to_owned(),
                    source,
                })?
                .map(|secret| {
                    let mut data: BTreeMap<String, String> = secret
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                        .collect();
                    data.extend(secret.string_data.unwrap_or_default());
                    data
                });
            self.read.insert(key.clone(), data);
        }
        self.found(&key, optional)
    }

    fn found(
        &self,
        key: &(&'static str, String),
        optional: bool,
    ) -> Result<Option<BTreeMap<String, String>>, StartError> {
        match self.read.get(key).cloned().flatten() {
            Some(data) => Ok(Some(data)),
            None if optional => Ok(None),
            None => Err(StartError::Missing {
                kind: key.0,
                namespace: self.namespace.to_owned(),
                name: key.1.clone(),
            }),
        }
    }
}

/// A pod's address and its node's, as the downward API tells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Addresses {
    pub(super) pod: Ipv4Addr,
    pub(super) host: Ipv4Addr,
}

/// A downward-API field of the pod.
pub(super) fn field_value(pod: &Pod, path: &str, ips: Addresses) -> Result<String, StartError> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let from_map = |map: Option<&BTreeMap<String, String>>, prefix: &str| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map?.get(key).cloned().unwrap_or_default())
    };
    let value = match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => Some(service_account(pod).to_owned()),
        "status.podIP" | "status.podIPs" => Some(ips.pod.to_string()),
        "status.hostIP" | "status.hostIPs" => Some(ips.host.to_string()),
        _ => from_map(meta.labels.as_ref(), "metadata.labels['")
            .or_else(|| from_map(meta.annotations.as_ref(), "metadata.annotations['")),
    };
    value.ok_or_else(|| StartError::Unsupported(format!("fieldRef {path}")))
}

/// The service account a pod runs as.
pub(super) fn service_account(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.service_account_name.as_deref())
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
}

/// A token of the pod's service account for `audiences` (none: the API
/// server's), lasting `seconds`, bound to the pod (it stops working when the
/// pod is deleted), from the TokenRequest API.
pub(super) async fn request_token(
    client: &kube::Client,
    pod: &Pod,
    audiences: &[&str],
    seconds: i64,
) -> Result<String, StartError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let account = service_account(pod);
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": audiences,
            "expirationSeconds": seconds,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.metadata.name,
                "uid": pod.metadata.uid,
            },
        },
    }))
    .expect("invariant: the literal above is a TokenRequest");
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let answer = api
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .map_err(|source| StartError::Token {
            account: format!("{namespace}/{account}"),
            source,
        })?;
    Ok(answer.status.map(|s| s.token).unwrap_or_default())
}

/// A kubeconfig that reaches the cluster as the pod's service account,
/// reading its token from `token_file` (re-read by clients as it changes),
/// with the pod's namespace as the default one, as in-cluster clients have.
pub(super) fn token_kubeconfig(
    cluster: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    namespace: &str,
    token_file: &Path,
) -> String {
    let auth = kube::config::AuthInfo {
        token_file: Some(token_file.display().to_string()),
        ..Default::default()
    };
    crate::cluster::kubeconfig(cluster, server, ca_pem, user, auth, Some(namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn image_repository_drops_tag_and_digest() {
        for (image, repository) in [
            (
                "ghcr.io/liqo-rs/liqo-gateway:0.1.0",
                "ghcr.io/liqo-rs/liqo-gateway",
            ),
            (
                "ghcr.io/liqo-rs/liqo-gateway",
                "ghcr.io/liqo-rs/liqo-gateway",
            ),
            ("liqo-gateway", "liqo-gateway"),
            (
                "localhost:5000/agents/vk@sha256:abcd",
                "localhost:5000/agents/vk",
            ),
            ("localhost:5000/vk:1@sha256:abcd", "localhost:5000/vk"),
            ("localhost:5000/vk", "localhost:5000/vk"),
            ("nginx:1.27", "nginx"),
        ] {
            assert_eq!(image_repository(image), repository, "{image}");
        }
    }

    #[test]
    fn only_allow_listed_repositories_have_a_binary() {
        let images = vars(&[
            ("ghcr.io/liqo-rs/liqo-gateway", "liqo-gateway"),
            ("example.test/test-agent", "test-agent"),
        ]);
        for (image, binary) in [
            ("ghcr.io/liqo-rs/liqo-gateway:0.1.0", Some("liqo-gateway")),
            (
                "ghcr.io/liqo-rs/liqo-gateway@sha256:abcd",
                Some("liqo-gateway"),
            ),
            ("example.test/test-agent:1", Some("test-agent")),
            // The same last segment under another repository is not listed.
            ("evil.test/liqo-gateway:0.1.0", None),
            ("liqo-gateway", None),
            ("ghcr.io/liqo-rs/liqo-gateway-extra:1", None),
            ("nginx:1.27", None),
            ("", None),
        ] {
            assert_eq!(allowed_binary(&images, image), binary, "{image}");
        }
    }

    #[test]
    fn expand_follows_the_kubelet() {
        let env = vars(&[("A", "1"), ("EMPTY", "")]);
        for (input, want) in [
            ("$(A)", "1"),
            ("x$(A)y$(A)", "x1y1"),
            ("$(EMPTY)", ""),
            ("$(MISSING)", "$(MISSING)"),
            ("$$(A)", "$(A)"),
            ("$$$(A)", "$1"),
            ("$A", "$A"),
            ("$(A", "$(A"),
            ("a$", "a$"),
            ("$", "$"),
            ("$()", "$()"),
            ("no references", "no references"),
            ("é$(A)ü", "é1ü"),
        ] {
            assert_eq!(expand(input, &env), want, "{input}");
        }
    }

    #[test]
    fn executable_rejects_paths_and_non_executables() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("agent");
        std::fs::write(&bin, "#!/bin/sh\n").expect("write");
        assert_eq!(executable(dir.path(), "agent"), None, "not executable yet");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(executable(dir.path(), "agent"), Some(bin));
        for name in ["", ".", "..", "../agent", "/bin/sh", "missing"] {
            assert_eq!(executable(dir.path(), name), None, "{name:?}");
        }
    }

    #[test]
    fn command_line_uses_command_from_bin_dir_then_args() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        for name in ["agent", "other"] {
            let path = dir.path().join(name);
            std::fs::write(&path, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let binary = dir.path().join("agent");
        let env = vars(&[("X", "42")]);
        let container = |command: Option<&[&str]>, args: &[&str]| Container {
            name: "c".to_owned(),
            command: command.map(|c| c.iter().map(|s| (*s).to_owned()).collect()),
            args: Some(args.iter().map(|s| (*s).to_owned()).collect()),
            ..Default::default()
        };

        let (program, args) =
            command_line(dir.path(), &binary, &container(None, &["--x=$(X)"]), &env)
                .expect("image binary");
        assert_eq!(program, binary);
        assert_eq!(args, ["--x=42"]);

        let (program, args) = command_line(
            dir.path(),
            &binary,
            &container(Some(&["/usr/bin/other", "serve", "$$(X)"]), &["--x=$(X)"]),
            &env,
        )
        .expect("command from bin dir");
        assert_eq!(program, dir.path().join("other"));
        assert_eq!(args, ["serve", "$(X)", "--x=42"]);

        let missing = command_line(
            dir.path(),
            &binary,
            &container(Some(&["/bin/sh", "-c", "true"]), &[]),
            &env,
        );
        assert!(matches!(missing, Err(StartError::NoBinary { .. })));
    }
}
