//! The cluster's certificates and kubeconfigs: the PKI its control plane
//! is started with (the files of `<dir>/pki/`), the kubeconfig of each of
//! its components, and kubeconfigs and clients in general.

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::ClusterSpec;
use crate::pki::{self, Authority, CertAndKey};
use crate::{Error, io_error, write_private};

/// The common name of the API server's front-proxy client certificate, the
/// one name aggregated API servers accept request headers from.
pub(super) const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// The files of the cluster's PKI, in its `pki/` folder, and the CA that
/// signs its clients.
pub(super) struct Certificates {
    pub(super) ca: Authority,
    pub(super) ca_crt: PathBuf,
    pub(super) ca_key: PathBuf,
    pub(super) serving_crt: PathBuf,
    pub(super) serving_key: PathBuf,
    pub(super) kubelet_client_crt: PathBuf,
    pub(super) kubelet_client_key: PathBuf,
    pub(super) front_proxy_ca_crt: PathBuf,
    pub(super) front_proxy_crt: PathBuf,
    pub(super) front_proxy_key: PathBuf,
    pub(super) sa_key: PathBuf,
    pub(super) sa_pub: PathBuf,
}

impl Certificates {
    /// Makes the cluster's CAs and certificates and writes them in `pki_dir`.
    pub(super) fn write(spec: &ClusterSpec, pki_dir: &Path) -> Result<Self, Error> {
        let ca = Authority::new(&spec.name)?;
        let write = |name: &str, contents: &str| -> Result<PathBuf, Error> {
            let path = pki_dir.join(name);
            write_private(&path, contents).map_err(io_error(&path))?;
            Ok(path)
        };
        let ca_crt = write("ca.crt", &ca.pair().cert)?;
        let ca_key = write("ca.key", &ca.pair().key)?;
        let serving = ca.serving(spec.kubernetes_service_ip()?)?;
        let serving_crt = write("apiserver.crt", &serving.cert)?;
        let serving_key = write("apiserver.key", &serving.key)?;
        // The API server's identity towards kubelets (`kubectl logs`, the
        // node proxy): a client of the cluster CA in system:masters, as
        // kubeadm makes it, so that a kubelet's SubjectAccessReview allows
        // it.
        let kubelet_client = ca.client("kube-apiserver-kubelet-client", &["system:masters"])?;
        let kubelet_client_crt = write("apiserver-kubelet-client.crt", &kubelet_client.cert)?;
        let kubelet_client_key = write("apiserver-kubelet-client.key", &kubelet_client.key)?;
        // The aggregation layer's identity towards aggregated API servers
        // (metrics-server): a CA of its own, as kubeadm makes it, so that no
        // ordinary client certificate can pass for the front proxy.
        let front_proxy_ca = Authority::new(&format!("{} front-proxy", spec.name))?;
        let front_proxy_ca_crt = write("front-proxy-ca.crt", &front_proxy_ca.pair().cert)?;
        let front_proxy = front_proxy_ca.client(FRONT_PROXY_CLIENT, &[])?;
        let front_proxy_crt = write("front-proxy-client.crt", &front_proxy.cert)?;
        let front_proxy_key = write("front-proxy-client.key", &front_proxy.key)?;
        let sa = pki::service_account_key()?;
        let sa_key = write("service-account.key", &sa.key)?;
        let sa_pub = write("service-account.pub", &sa.cert)?;
        Ok(Self {
            ca,
            ca_crt,
            ca_key,
            serving_crt,
            serving_key,
            kubelet_client_crt,
            kubelet_client_key,
            front_proxy_ca_crt,
            front_proxy_crt,
            front_proxy_key,
            sa_key,
            sa_pub,
        })
    }
}

/// The kubeconfig files of the cluster's users, in its folder.
pub(super) struct Kubeconfigs {
    /// The admin's, in `system:masters`.
    pub(super) admin: PathBuf,
    pub(super) controller_manager: PathBuf,
    pub(super) scheduler: PathBuf,
    pub(super) kwok: PathBuf,
    /// kube-proxy's, when the node has a network namespace.
    pub(super) kube_proxy: Option<PathBuf>,
    /// The real node's kubelet's, in the real-node mode.
    pub(super) kubelet: Option<PathBuf>,
}

impl Kubeconfigs {
    /// Writes them in `dir`, each with a client certificate of `ca`, for
    /// the API server at `server`; kube-proxy's too if `kube_proxy`.
    pub(super) fn write(
        ca: &Authority,
        spec: &ClusterSpec,
        dir: &Path,
        server: &str,
        kube_proxy: bool,
    ) -> Result<Self, Error> {
        let kubeconfig_for = |file: &str, user: &str, groups: &[&str]| -> Result<PathBuf, Error> {
            let pair = ca.client(user, groups)?;
            let path = dir.join(file);
            let text = kubeconfig_json(&spec.name, server, &ca.pair().cert, user, &pair);
            write_private(&path, &text).map_err(io_error(&path))?;
            Ok(path)
        };
        let kubeconfig = kubeconfig_for("kubeconfig", "testbed-admin", &["system:masters"])?;
        let kcm_kubeconfig = kubeconfig_for(
            "kube-controller-manager.kubeconfig",
            "system:kube-controller-manager",
            &[],
        )?;
        let scheduler_kubeconfig =
            kubeconfig_for("kube-scheduler.kubeconfig", "system:kube-scheduler", &[])?;
        let kwok_kubeconfig = kubeconfig_for("kwok.kubeconfig", "kwok", &["system:masters"])?;
        // The default ClusterRoleBinding system:node-proxier gives this
        // user what kube-proxy needs.
        let kube_proxy_kubeconfig = match kube_proxy {
            true => Some(kubeconfig_for(
                "kube-proxy.kubeconfig",
                "system:kube-proxy",
                &[],
            )?),
            false => None,
        };

        // The real node's kubelet, as the Node authorizer knows a node.
        let kubelet_kubeconfig = spec
            .real_node
            .then(|| {
                kubeconfig_for(
                    "kubelet.kubeconfig",
                    &format!("system:node:{}", spec.real_node_name()),
                    &["system:nodes"],
                )
            })
            .transpose()?;
        Ok(Self {
            admin: kubeconfig,
            controller_manager: kcm_kubeconfig,
            scheduler: scheduler_kubeconfig,
            kwok: kwok_kubeconfig,
            kube_proxy: kube_proxy_kubeconfig,
            kubelet: kubelet_kubeconfig,
        })
    }
}

/// A client for a kubeconfig file, using its current context.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, Error> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    kube::Client::try_from(config).map_err(|source| Error::Kube {
        what: "building a client".to_owned(),
        source,
    })
}

/// A kubeconfig with one cluster, one user and one context, all named after
/// the cluster, with certificates embedded.
pub fn kubeconfig_json(
    cluster: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    pair: &CertAndKey,
) -> String {
    use base64::Engine as _;
    let auth = kube::config::AuthInfo {
        client_certificate_data: Some(base64::engine::general_purpose::STANDARD.encode(&pair.cert)),
        client_key_data: Some(
            base64::engine::general_purpose::STANDARD
                .encode(&pair.key)
                .into(),
        ),
        ..Default::default()
    };
    kubeconfig(cluster, server, ca_pem, user, auth, None)
}

/// A kubeconfig with one cluster, one user (`auth`) and one context (with
/// `namespace` as its default one), all named after the cluster, as JSON
/// (which the agents of the host-process node read; kubectl reads it too).
pub(crate) fn kubeconfig(
    cluster: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    auth: kube::config::AuthInfo,
    namespace: Option<&str>,
) -> String {
    use base64::Engine as _;
    use kube::config::{Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};
    let config = Kubeconfig {
        api_version: Some("v1".to_owned()),
        kind: Some("Config".to_owned()),
        clusters: vec![NamedCluster {
            name: cluster.to_owned(),
            cluster: Some(kube::config::Cluster {
                server: Some(server.to_owned()),
                certificate_authority_data: Some(
                    base64::engine::general_purpose::STANDARD.encode(ca_pem),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: user.to_owned(),
            auth_info: Some(auth),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: cluster.to_owned(),
            context: Some(Context {
                cluster: cluster.to_owned(),
                user: Some(user.to_owned()),
                namespace: namespace.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some(cluster.to_owned()),
        ..Default::default()
    };
    serde_json::to_string_pretty(&config).expect("invariant: a kubeconfig always serializes")
}
