//! A test cluster's public-key infrastructure: one CA that serves as the
//! API server's serving CA, its client CA and the controller-manager's CSR
//! signer, plus the certificates and the service-account key made from it;
//! and a second CA for the front proxy (the API server's identity towards
//! aggregated API servers).

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A PEM certificate with its PEM private key.
#[derive(Debug, Clone)]
pub struct CertAndKey {
    pub cert: String,
    pub key: String,
}

/// The cluster's certificate authority.
#[derive(Debug)]
pub(crate) struct Authority {
    issuer: Issuer<'static, KeyPair>,
    pair: CertAndKey,
}

impl Authority {
    pub(crate) fn new(cluster: &str) -> Result<Self, rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("liqo-testbed {cluster} CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        let pair = CertAndKey {
            cert: cert.pem(),
            key: key.serialize_pem(),
        };
        Ok(Self {
            issuer: Issuer::new(params, key),
            pair,
        })
    }

    pub(crate) fn pair(&self) -> &CertAndKey {
        &self.pair
    }

    /// A serving certificate for the API server, valid for loopback and for
    /// the in-cluster names of the `kubernetes` service.
    pub(crate) fn serving(&self, service_ip: std::net::IpAddr) -> Result<CertAndKey, rcgen::Error> {
        let mut params = CertificateParams::new(vec![
            "localhost".to_owned(),
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
            "kubernetes.default.svc.cluster.local".to_owned(),
        ])?;
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        params
            .subject_alt_names
            .push(SanType::IpAddress(service_ip));
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate: Kubernetes reads the user from the common name
    /// and the groups from the organizations.
    pub(crate) fn client(&self, user: &str, groups: &[&str]) -> Result<CertAndKey, rcgen::Error> {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, mut params: CertificateParams) -> Result<CertAndKey, rcgen::Error> {
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CertAndKey {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// A fresh key for signing service-account tokens: the private key (PKCS#8
/// PEM) for the signers, the public key (SPKI PEM) for the verifier, which
/// does not read PKCS#8.
pub(crate) fn service_account_key() -> Result<CertAndKey, rcgen::Error> {
    let key = KeyPair::generate()?;
    Ok(CertAndKey {
        cert: key.public_key_pem(),
        key: key.serialize_pem(),
    })
}
