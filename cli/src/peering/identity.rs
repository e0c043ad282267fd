//! The consumer's x509 identity on its provider: the key is made here, on
//! the consumer's side, and never sent anywhere; only the CSR goes to the
//! provider. The issued certificate is checked before anything uses it.

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::config::{AuthInfo, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};
use liqo_api::ClusterId;
use liqo_api::names::{self, labels, peering};
use x509_parser::prelude::*;

use crate::manifests::{Manifest, common_labels};

/// The consumer's identity Secret for its peering with `provider`: the
/// kubeconfig that reaches the provider as the peering's user, and what
/// else `annotations` tell of it (a token's tenant and expiry).
pub fn secret(
    provider: &ClusterId,
    kubeconfig: &str,
    annotations: BTreeMap<String, String>,
) -> Manifest {
    let mut secret_labels = common_labels("identity");
    secret_labels.insert(labels::PEER_CLUSTER_ID.to_owned(), provider.to_string());
    Manifest::Secret(Secret {
        metadata: ObjectMeta {
            name: Some(peering::identity_secret(provider)),
            namespace: Some(names::NAMESPACE.to_owned()),
            labels: Some(secret_labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Default::default()
        },
        type_: Some(SECRET_TYPE.to_owned()),
        string_data: Some(BTreeMap::from([(
            "kubeconfig".to_owned(),
            kubeconfig.to_owned(),
        )])),
        ..Default::default()
    })
}

/// The type of the consumer's identity Secrets.
const SECRET_TYPE: &str = "liqo.io/peer-identity";

/// A fresh key and a CSR for `user`, with no group (no Organization):
/// the provider's RBAC binds the user alone.
pub struct Request {
    pub key_pem: String,
    pub csr_pem: String,
}

pub fn request(user: &str) -> anyhow::Result<Request> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, user);
    let csr_pem = params.serialize_request(&key)?.pem()?;
    Ok(Request {
        key_pem: key.serialize_pem(),
        csr_pem,
    })
}

/// Checks a CSR that came from elsewhere (a request file) before anyone
/// approves it: a PEM request whose self-signature verifies, whose
/// subject is exactly `CN=<user>` (no Organization: no group), and that
/// asks for no extension (no names, no usages of its own).
pub fn check_request(csr_pem: &str, user: &str) -> Result<(), String> {
    let (_, pem) = parse_x509_pem(csr_pem.as_bytes())
        .map_err(|_| "it is not a PEM certificate request".to_owned())?;
    let (_, csr) = X509CertificationRequest::from_der(&pem.contents)
        .map_err(|e| format!("it is not a certificate request: {e}"))?;
    csr.verify_signature()
        .map_err(|_| "its signature does not verify".to_owned())?;
    let subject = &csr.certification_request_info.subject;
    let cns: Vec<&str> = subject
        .iter_common_name()
        .filter_map(|a| a.as_str().ok())
        .collect();
    if cns != [user] || subject.iter_attributes().count() != 1 {
        return Err(format!("its subject is {subject}, not CN={user}"));
    }
    if csr
        .requested_extensions()
        .is_some_and(|mut e| e.next().is_some())
    {
        return Err("it asks for extensions".to_owned());
    }
    Ok(())
}

/// Why an issued certificate is refused.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("it is not a PEM certificate")]
    NotPem,
    #[error("its subject is {0:?}, not CN={1}")]
    Subject(String, String),
    #[error("it was not issued by the provider's CA ({0})")]
    Issuer(String),
    #[error("it is not valid now (valid {0} to {1})")]
    Validity(String, String),
    #[error("it is not for client authentication")]
    Usage,
    #[error("its public key is not the one of our key")]
    Key,
}

/// What is known of a checked certificate.
#[derive(Debug, Clone)]
pub struct Checked {
    /// RFC 3339.
    pub not_after: String,
    pub not_after_unix: i64,
    pub not_before_unix: i64,
}

/// Checks an issued certificate: exactly our subject (CN=user, nothing
/// else), signed by the provider's CA, valid now, for client auth, and
/// for our key.
pub fn check(
    cert_pem: &[u8],
    user: &str,
    ca_der: Option<&[u8]>,
    key_pem: &str,
) -> Result<Checked, CertificateError> {
    let (_, pem) = parse_x509_pem(cert_pem).map_err(|_| CertificateError::NotPem)?;
    let cert = pem.parse_x509().map_err(|_| CertificateError::NotPem)?;
    let subject = cert.subject();
    let cns: Vec<&str> = subject
        .iter_common_name()
        .filter_map(|a| a.as_str().ok())
        .collect();
    if cns != [user] || subject.iter().count() != 1 {
        return Err(CertificateError::Subject(
            subject.to_string(),
            user.to_owned(),
        ));
    }
    if let Some(ca_der) = ca_der {
        let (_, ca) = X509Certificate::from_der(ca_der)
            .map_err(|e| CertificateError::Issuer(format!("the CA does not parse: {e}")))?;
        if cert.issuer() != ca.subject() {
            return Err(CertificateError::Issuer(format!(
                "issuer {}",
                cert.issuer()
            )));
        }
        cert.verify_signature(Some(ca.public_key()))
            .map_err(|_| CertificateError::Issuer("the signature does not verify".to_owned()))?;
    }
    let validity = cert.validity();
    if !validity.is_valid() {
        return Err(CertificateError::Validity(
            validity.not_before.to_string(),
            validity.not_after.to_string(),
        ));
    }
    let client_auth = cert
        .extended_key_usage()
        .ok()
        .flatten()
        .is_some_and(|eku| eku.value.client_auth);
    if !client_auth {
        return Err(CertificateError::Usage);
    }
    let key = rcgen::KeyPair::from_pem(key_pem).map_err(|_| CertificateError::Key)?;
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(CertificateError::Key);
    }
    Ok(Checked {
        not_after: validity
            .not_after
            .to_rfc2822()
            .unwrap_or_else(|_| validity.not_after.to_string()),
        not_after_unix: validity.not_after.timestamp(),
        not_before_unix: validity.not_before.timestamp(),
    })
}

/// A kubeconfig that reaches the provider at `server` as the identity.
/// Checks that `der` is a CA certificate valid now; returns its SHA-256
/// fingerprint (`sha256:<hex>`), for people to compare out of band.
pub fn check_ca(der: &[u8]) -> Result<String, String> {
    let (_, ca) =
        X509Certificate::from_der(der).map_err(|e| format!("it is not a certificate: {e}"))?;
    let is_ca = ca
        .basic_constraints()
        .ok()
        .flatten()
        .is_some_and(|b| b.value.ca);
    if !is_ca {
        return Err(format!("{} is not a certificate authority", ca.subject()));
    }
    let validity = ca.validity();
    if !validity.is_valid() {
        return Err(format!(
            "{} is valid from {} to {} only",
            ca.subject(),
            validity.not_before,
            validity.not_after
        ));
    }
    Ok(fingerprint(der))
}

/// `sha256:<hex>` of `der`.
pub fn fingerprint(der: &[u8]) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(der);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

pub fn kubeconfig(
    provider: &str,
    server: &str,
    ca_pem: Option<&str>,
    user: &str,
    cert_pem: &str,
    key_pem: &str,
) -> anyhow::Result<String> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let auth = AuthInfo {
        client_certificate_data: Some(b64(cert_pem)),
        client_key_data: Some(b64(key_pem).into()),
        ..Default::default()
    };
    kubeconfig_with(provider, server, ca_pem, user, auth)
}

/// A kubeconfig that reaches `server` with bearer `token` and acts as
/// `user` by impersonation (a peering made with a token: the token is the
/// tenant account's, which may impersonate the tenant's user only).
pub fn token_kubeconfig(
    provider: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    token: &str,
) -> anyhow::Result<String> {
    let auth = AuthInfo {
        token: Some(token.to_owned().into()),
        impersonate: Some(user.to_owned()),
        ..Default::default()
    };
    kubeconfig_with(provider, server, Some(ca_pem), user, auth)
}

/// A kubeconfig with one cluster, user and context, written as JSON: the
/// agents read kubeconfigs as JSON only (docs/virtual-kubelet.md, "The
/// binary"), and every YAML reader reads JSON too.
pub fn kubeconfig_with(
    provider: &str,
    server: &str,
    ca_pem: Option<&str>,
    user: &str,
    auth: AuthInfo,
) -> anyhow::Result<String> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let config = Kubeconfig {
        api_version: Some("v1".to_owned()),
        kind: Some("Config".to_owned()),
        clusters: vec![NamedCluster {
            name: provider.to_owned(),
            cluster: Some(kube::config::Cluster {
                server: Some(server.to_owned()),
                certificate_authority_data: ca_pem.map(b64),
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
            name: provider.to_owned(),
            context: Some(Context {
                cluster: provider.to_owned(),
                user: Some(user.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some(provider.to_owned()),
        ..Default::default()
    };
    Ok(serde_json::to_string_pretty(&config)?)
}

/// The PEM of DER certificates.
pub fn pem(der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .filter_map(|c| std::str::from_utf8(c).ok())
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CA and a certificate it issues for `cn` with `key`.
    fn issue(cn: &str, org: Option<&str>, key: &rcgen::KeyPair, client: bool) -> (Vec<u8>, String) {
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca_params = rcgen::CertificateParams::default();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "provider-ca");
        let ca = ca_params.clone().self_signed(&ca_key).expect("ca");
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        if let Some(org) = org {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, org);
        }
        if client {
            params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        }
        let issuer = rcgen::Issuer::new(ca_params, &ca_key);
        let cert = params.signed_by(key, &issuer).expect("cert");
        (ca.der().to_vec(), cert.pem())
    }

    #[test]
    fn requests_are_checked_before_approval() {
        let good = request("liqo.io:peer:home").expect("request");
        assert_eq!(check_request(&good.csr_pem, "liqo.io:peer:home"), Ok(()));
        let other = check_request(&good.csr_pem, "liqo.io:peer:elsewhere");
        assert!(other.is_err_and(|e| e.contains("subject")));
        // A group smuggled in as an Organization.
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "liqo.io:peer:home");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        let csr = params
            .serialize_request(&key)
            .expect("csr")
            .pem()
            .expect("pem");
        assert!(check_request(&csr, "liqo.io:peer:home").is_err());
        assert!(check_request("not a csr", "liqo.io:peer:home").is_err());
    }

    #[test]
    fn only_our_subject_from_the_provider_ca_for_our_key_passes() {
        let req = request("liqo.io:peer:home").expect("request");
        let key = rcgen::KeyPair::from_pem(&req.key_pem).expect("key");
        let (ca, cert) = issue("liqo.io:peer:home", None, &key, true);
        assert!(
            check(
                cert.as_bytes(),
                "liqo.io:peer:home",
                Some(&ca),
                &req.key_pem
            )
            .is_ok()
        );

        let (ca2, other) = issue("liqo.io:peer:other", None, &key, true);
        assert!(matches!(
            check(
                other.as_bytes(),
                "liqo.io:peer:home",
                Some(&ca2),
                &req.key_pem
            ),
            Err(CertificateError::Subject(..))
        ));
        let (ca3, grouped) = issue("liqo.io:peer:home", Some("system:masters"), &key, true);
        assert!(matches!(
            check(
                grouped.as_bytes(),
                "liqo.io:peer:home",
                Some(&ca3),
                &req.key_pem
            ),
            Err(CertificateError::Subject(..))
        ));
        assert!(matches!(
            check(
                cert.as_bytes(),
                "liqo.io:peer:home",
                Some(&ca2),
                &req.key_pem
            ),
            Err(CertificateError::Issuer(_))
        ));
        let (ca4, server) = issue("liqo.io:peer:home", None, &key, false);
        assert!(matches!(
            check(
                server.as_bytes(),
                "liqo.io:peer:home",
                Some(&ca4),
                &req.key_pem
            ),
            Err(CertificateError::Usage)
        ));
        let stranger = request("x").expect("request");
        assert!(matches!(
            check(
                cert.as_bytes(),
                "liqo.io:peer:home",
                Some(&ca),
                &stranger.key_pem
            ),
            Err(CertificateError::Key)
        ));
    }
}
