//! The kubelet API's TLS: a serving certificate made at start (self-signed,
//! for the node's address and name: nothing is stored, the API server
//! checks a kubelet's serving certificate only when it is given
//! `--kubelet-certificate-authority`) and client certificates verified
//! against the cluster's client CA, read from the ConfigMap
//! `kube-system/extension-apiserver-authentication` that the API server
//! keeps, as every extension server reads it. A client without a
//! certificate still gets through the handshake: it may carry a bearer
//! token instead.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::sync::watch;

pub const AUTH_CONFIGMAP_NAMESPACE: &str = "kube-system";
pub const AUTH_CONFIGMAP: &str = "extension-apiserver-authentication";
pub const CLIENT_CA_KEY: &str = "client-ca-file";
/// How often the client CA is read again (it changes when the cluster's CA
/// is rotated).
const CLIENT_CA_REFRESH: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("making the serving certificate")]
    Certificate(#[source] rcgen::Error),
    #[error("the client CA holds no usable certificate")]
    NoClientCa,
    #[error("the client CA is not valid PEM")]
    Pem(#[source] rustls::pki_types::pem::Error),
    #[error("building the client certificate verifier")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
    #[error("building the TLS configuration")]
    Config(#[source] rustls::Error),
}

/// A self-signed serving certificate and its key, for the node's address
/// and name.
pub struct Serving {
    pub cert: CertificateDer<'static>,
    pub key: PrivatePkcs8KeyDer<'static>,
}

impl std::fmt::Debug for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs.
        f.debug_struct("Serving").finish_non_exhaustive()
    }
}

pub fn serving_certificate(node_name: &str, ip: Option<IpAddr>) -> Result<Serving, TlsError> {
    let mut names = vec![node_name.to_owned()];
    if let Some(ip) = ip {
        names.push(ip.to_string());
    }
    let mut params = rcgen::CertificateParams::new(names).map_err(TlsError::Certificate)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, node_name);
    let key = rcgen::KeyPair::generate().map_err(TlsError::Certificate)?;
    let cert = params.self_signed(&key).map_err(TlsError::Certificate)?;
    Ok(Serving {
        cert: cert.der().clone(),
        key: PrivatePkcs8KeyDer::from(key.serialize_der()),
    })
}

/// The certificates of a PEM bundle.
pub fn client_roots(pem: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let cert = cert.map_err(TlsError::Pem)?;
        // A certificate webpki cannot use is skipped, as Go's pool does.
        let _ignored = roots.add(cert);
    }
    if roots.is_empty() {
        return Err(TlsError::NoClientCa);
    }
    Ok(roots)
}

/// The server's TLS configuration: HTTP/1.1 only (streaming upgrades need
/// it), client certificates optional but verified against `roots`.
pub fn server_config(
    serving: &Serving,
    roots: RootCertStore,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(TlsError::Verifier)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![serving.cert.clone()],
            PrivateKeyDer::Pkcs8(serving.key.clone_key()),
        )
        .map_err(TlsError::Config)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Keeps `tx` holding a configuration with the cluster's current client
/// CA, read now and every [`CLIENT_CA_REFRESH`]; until it is first read,
/// `tx` holds `None` and connections are refused.
pub async fn keep_config(
    client: kube::Client,
    serving: Serving,
    tx: watch::Sender<Option<Arc<rustls::ServerConfig>>>,
) {
    let maps: Api<ConfigMap> = Api::namespaced(client, AUTH_CONFIGMAP_NAMESPACE);
    let mut last_pem: Option<String> = None;
    let mut logged: Option<String> = None;
    loop {
        let result = match maps.get(AUTH_CONFIGMAP).await {
            Ok(map) => map
                .data
                .and_then(|mut d| d.remove(CLIENT_CA_KEY))
                .ok_or_else(|| {
                    format!(
                        "the ConfigMap {AUTH_CONFIGMAP_NAMESPACE}/{AUTH_CONFIGMAP} has no {CLIENT_CA_KEY}"
                    )
                }),
            Err(e) => Err(format!(
                "reading {AUTH_CONFIGMAP_NAMESPACE}/{AUTH_CONFIGMAP}: {e}"
            )),
        };
        match result {
            Ok(pem) if last_pem.as_ref() == Some(&pem) => {}
            Ok(pem) => match client_roots(&pem).and_then(|roots| server_config(&serving, roots)) {
                Ok(config) => {
                    tracing::info!("kubelet API: client CA loaded");
                    tx.send_replace(Some(config));
                    last_pem = Some(pem);
                    logged = None;
                }
                Err(e) => log_once(&mut logged, liqo_agent_runtime::error_chain(&e)),
            },
            Err(why) => log_once(&mut logged, why),
        }
        let wait = if last_pem.is_some() {
            CLIENT_CA_REFRESH
        } else {
            Duration::from_secs(2)
        };
        tokio::time::sleep(wait).await;
    }
}

fn log_once(last: &mut Option<String>, why: String) {
    if last.as_ref() != Some(&why) {
        tracing::warn!(%why, "kubelet API: cannot load the client CA");
        *last = Some(why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_from_a_ca_bundle() -> Result<(), Box<dyn std::error::Error>> {
        let serving = serving_certificate("vnode", Some("127.0.0.5".parse()?))?;
        let ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
        let mut ca = ca;
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate()?;
        let pem = ca.self_signed(&key)?.pem();
        let roots = client_roots(&pem)?;
        assert_eq!(roots.len(), 1);
        let config = server_config(&serving, roots)?;
        assert_eq!(config.alpn_protocols, [b"http/1.1".to_vec()]);
        assert!(matches!(client_roots(""), Err(TlsError::NoClientCa)));
        Ok(())
    }
}
