//! The placement webhook's serving certificate (docs/offloading.md,
//! "Placement"): a CA of its own and a certificate it signs for the
//! Service `liqo-placement`, kept in the Secret `liqo/liqo-placement-tls`
//! and read there by the virtual kubelets; the CA goes into the webhook
//! configuration. Made by `install` on clusters without
//! MutatingAdmissionPolicy, kept while it is valid for long enough, made
//! anew otherwise.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use liqo_api::names::{self, labels};

use crate::factory::ClusterClient;
use crate::manifests::webhook::{PLACEMENT_TLS_SECRET, PLACEMENT_WEBHOOK};
use crate::manifests::{self, Manifest};

/// How long the certificates are valid.
const VALIDITY: Duration = Duration::from_secs(5 * 365 * 24 * 3600);
/// A certificate valid for less than this is made anew by install.
const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);

/// The webhook's certificates, PEM. The key never leaves the Secret and
/// this process.
pub struct PlacementTls {
    pub ca: String,
    cert: String,
    key: secrecy::SecretString,
    /// Made now: the Secret must be written.
    pub fresh: bool,
    /// The CA of the pair this one replaces: the virtual kubelets serve
    /// the old certificate until they read the new one (within a
    /// minute), so the webhook trusts both meanwhile.
    previous_ca: Option<String>,
}

impl std::fmt::Debug for PlacementTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacementTls")
            .field("fresh", &self.fresh)
            .finish_non_exhaustive()
    }
}

/// The names the serving certificate is for: the Service's.
fn service_names() -> Vec<String> {
    let base = format!("{PLACEMENT_WEBHOOK}.{}.svc", names::NAMESPACE);
    vec![base.clone(), format!("{base}.cluster.local")]
}

/// A new CA and a serving certificate it signs.
pub fn generate() -> anyhow::Result<PlacementTls> {
    let now = rcgen::date_time_ymd(1970, 1, 1)
        + Duration::from_secs(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs(),
        );
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca_params = rcgen::CertificateParams::default();
    ca_params.distinguished_name = rcgen::DistinguishedName::new();
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "liqo-placement-ca");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = now - Duration::from_secs(3600);
    ca_params.not_after = now + VALIDITY;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);

    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(service_names())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, service_names()[0].clone());
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = now - Duration::from_secs(3600);
    params.not_after = now + VALIDITY;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(PlacementTls {
        ca: ca_cert.pem(),
        cert: cert.pem(),
        key: key.serialize_pem().into(),
        fresh: true,
        previous_ca: None,
    })
}

/// Whether `cert_pem` is valid for at least [`RENEW_BEFORE`] more.
fn lasts(cert_pem: &str) -> bool {
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()) else {
        return false;
    };
    let Ok(cert) = pem.parse_x509() else {
        return false;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let not_after = u64::try_from(cert.validity().not_after.timestamp()).unwrap_or(0);
    not_after > now + RENEW_BEFORE.as_secs()
}

/// The certificates in the installed Secret when it is ours, whole and
/// valid for long enough; new ones otherwise.
pub async fn current_or_new(cluster: &ClusterClient) -> anyhow::Result<PlacementTls> {
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), names::NAMESPACE);
    let existing = secrets
        .get_opt(PLACEMENT_TLS_SECRET)
        .await
        .map_err(|e| cluster.explain(e, "reading the placement webhook's certificate"))?;
    let ours = |s: &Secret| {
        s.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::MANAGED_BY))
            .is_some_and(|v| v == labels::MANAGED_BY_VALUE)
    };
    if let Some(secret) = existing.filter(ours) {
        let data = secret.data.unwrap_or_default();
        let text = |k: &str| {
            data.get(k)
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
        };
        if let (Some(ca), Some(cert), Some(key)) =
            (text("ca.crt"), text("tls.crt"), text("tls.key"))
            && lasts(&cert)
        {
            return Ok(PlacementTls {
                ca,
                cert,
                key: key.into(),
                fresh: false,
                previous_ca: None,
            });
        }
        return renewal(text("ca.crt"));
    }
    generate()
}

/// A new pair replacing one whose CA was `previous_ca` (kept beside the
/// new CA in the webhook's bundle when it is a certificate).
fn renewal(previous_ca: Option<String>) -> anyhow::Result<PlacementTls> {
    let mut renewed = generate()?;
    renewed.previous_ca = previous_ca.filter(|ca| is_certificate(ca));
    Ok(renewed)
}

/// Whether `pem` starts with a certificate that parses.
fn is_certificate(pem: &str) -> bool {
    x509_parser::pem::parse_x509_pem(pem.as_bytes()).is_ok_and(|(_, pem)| pem.parse_x509().is_ok())
}

impl PlacementTls {
    /// What the webhook trusts: the CA, and the one it replaces while the
    /// virtual kubelets may still serve that one's certificate (the next
    /// `install` drops it).
    pub fn ca_bundle(&self) -> String {
        match &self.previous_ca {
            Some(previous) => format!("{}{previous}", self.ca),
            None => self.ca.clone(),
        }
    }

    /// The Secret to write (never printed: it holds the key).
    pub fn secret(&self) -> Manifest {
        use secrecy::ExposeSecret as _;
        let data = BTreeMap::from([
            (
                "ca.crt".to_owned(),
                ByteString(self.ca.clone().into_bytes()),
            ),
            (
                "tls.crt".to_owned(),
                ByteString(self.cert.clone().into_bytes()),
            ),
            (
                "tls.key".to_owned(),
                ByteString(self.key.expose_secret().as_bytes().to_vec()),
            ),
        ]);
        Manifest::Secret(Secret {
            metadata: kube::core::ObjectMeta {
                name: Some(PLACEMENT_TLS_SECRET.to_owned()),
                namespace: Some(names::NAMESPACE.to_owned()),
                labels: Some(manifests::common_labels("placement")),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".to_owned()),
            data: Some(data),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serving_certificate_is_the_services_and_signed_by_the_ca() {
        let tls = generate().expect("certificates");
        assert!(lasts(&tls.cert));
        let (_, ca_pem) = x509_parser::pem::parse_x509_pem(tls.ca.as_bytes()).expect("pem");
        let ca = ca_pem.parse_x509().expect("x509");
        let (_, pem) = x509_parser::pem::parse_x509_pem(tls.cert.as_bytes()).expect("pem");
        let cert = pem.parse_x509().expect("x509");
        assert!(ca.is_ca());
        cert.verify_signature(Some(ca.public_key()))
            .expect("signed by the CA");
        let sans: Vec<String> = cert
            .subject_alternative_name()
            .expect("parsed")
            .expect("present")
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert!(
            sans.iter().any(|n| n.contains("liqo-placement.liqo.svc")),
            "{sans:?}"
        );
        // The key is in the Secret and nowhere in its debug form.
        let shown = format!("{tls:?}");
        assert!(!shown.contains("PRIVATE KEY"), "{shown}");
        let secret = serde_json::to_value(tls.secret()).expect("json");
        assert_eq!(secret["type"], "kubernetes.io/tls");
        assert!(secret["data"]["tls.key"].is_string());
        assert!(!lasts("not a certificate"));
        assert_eq!(tls.ca_bundle(), tls.ca, "nothing replaced: the CA alone");
    }

    #[test]
    fn a_renewed_pair_is_trusted_beside_the_one_it_replaces() {
        let old = generate().expect("certificates");
        let renewed = renewal(Some(old.ca.clone())).expect("certificates");
        let bundle = renewed.ca_bundle();
        let cas: Vec<_> = x509_parser::pem::Pem::iter_from_buffer(bundle.as_bytes())
            .map(|pem| pem.expect("pem").contents)
            .collect();
        let der = |ca: &str| {
            x509_parser::pem::parse_x509_pem(ca.as_bytes())
                .expect("pem")
                .1
                .contents
        };
        assert_eq!(cas, [der(&renewed.ca), der(&old.ca)]);
        assert!(!is_certificate("-----BEGIN CERTIFICATE-----\nnot one\n"));
        let damaged = renewal(Some("not a certificate".to_owned())).expect("certificates");
        assert_eq!(damaged.ca_bundle(), damaged.ca, "a damaged CA is not kept");
    }
}
