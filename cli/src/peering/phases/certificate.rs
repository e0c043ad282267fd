//! The certificate phase: the consumer's x509 identity on the provider,
//! signed there with its administrator's credentials and kept in the
//! consumer's identity Secret; reused while it is valid for more than a
//! third of its life. The sign phase of `peer accept` signs a request that
//! came in a file, and hands the certificate back.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use liqo_api::ClusterId;
use liqo_api::authentication::peer_user;
use liqo_api::names::{self, peering};
use serde_json::json;

use super::{Administrator, Ends, Peering, Reached};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::ownership;
use crate::kube::wait::{self, Waited};
use crate::manifests::common_labels;
use crate::peering::identity;
use crate::peering::journal::Journal;
use crate::peering::{PEER_AGAIN, refuse_foreign};

/// How long the provider's signer has to issue a certificate.
const SIGNED: Duration = Duration::from_secs(30);

/// The name of the consumer's certificate request on the provider.
pub(super) fn request_name(consumer: &ClusterId) -> String {
    format!("liqo-peer-{consumer}")
}

pub(super) async fn apply(
    run: &Peering<'_>,
    consumer: &ClusterClient,
    admin: &Administrator<'_>,
    renew: bool,
    journal: &mut Journal,
) -> anyhow::Result<Reached> {
    let step = run.printer.step(format!(
        "Issuing the identity of cluster {} on cluster {}",
        consumer.name, admin.provider.name
    ));
    match issue(run, consumer, admin, renew, journal).await {
        Ok(expiry) => {
            step.done(format!("valid until {expiry}"));
            Ok(Reached {
                provider: admin.provider.clone(),
                provider_id: admin.provider_id.clone(),
                tenant: run.consumer_id.cluster_id.clone(),
                expiry,
            })
        }
        Err(e) => {
            step.fail("");
            Err(e)
        }
    }
}

/// The consumer's certificate on the provider, kept in a Secret on the
/// consumer: reused while it is valid for more than a third of its life,
/// else issued anew from a key made here. Returns its expiry.
async fn issue(
    run: &Peering<'_>,
    consumer: &ClusterClient,
    admin: &Administrator<'_>,
    renew: bool,
    journal: &mut Journal,
) -> anyhow::Result<String> {
    let provider = admin.provider;
    let provider_id = &admin.provider_id.cluster_id;
    let user = peer_user(&run.consumer_id.cluster_id);
    let secret_name = peering::identity_secret(provider_id);
    let secrets: Api<Secret> = Api::namespaced(consumer.client.clone(), names::NAMESPACE);
    if let Some(existing) = secrets
        .get_opt(&secret_name)
        .await
        .map_err(|e| consumer.explain(e, &format!("reading Secret {secret_name}")))?
        && ownership::is_ours(&existing.metadata)
        && !renew
        && let Some(expiry) = still_good(&existing, &user, provider.ca_der.as_deref())
    {
        return Ok(expiry);
    }

    let request = identity::request(&user)?;
    let cert_pem = sign_request(run, admin, &request.csr_pem).await?;
    let checked = identity::check(cert_pem.as_bytes(), &user, provider.ca_der.as_deref(), &request.key_pem)
        .map_err(|e| {
            UserError::Refused(format!(
                "cluster {} issued a certificate liqoctl cannot use: {e}; check its CSR signer (kube-controller-manager --cluster-signing-*)",
                provider.name
            ))
        })?;
    let ca_pem = provider.ca_der.as_deref().map(identity::pem);
    let kubeconfig = identity::kubeconfig(
        provider_id.as_str(),
        &provider.server,
        ca_pem.as_deref(),
        &user,
        &cert_pem,
        &request.key_pem,
    )?;
    let secret = identity::secret(provider_id, &kubeconfig, Default::default());
    refuse_foreign(consumer, std::slice::from_ref(&secret), PEER_AGAIN).await?;
    journal.apply(consumer, secret).await?;
    Ok(checked.not_after)
}

/// The sign phase: the consumer's request of `peer accept`, signed.
pub(super) async fn sign(
    run: &Peering<'_>,
    admin: &Administrator<'_>,
    csr: &str,
) -> anyhow::Result<String> {
    let step = run.printer.step(format!(
        "Signing the certificate of cluster {}",
        run.consumer_id.cluster_name
    ));
    match sign_request(run, admin, csr).await {
        Ok(certificate) => {
            step.done("");
            Ok(certificate)
        }
        Err(e) => {
            step.fail("");
            Err(e)
        }
    }
}

/// Has the provider sign `csr_pem` for the consumer's user: creates the
/// CSR, approves it with the provider's credentials, fetches the
/// certificate, and deletes the CSR. The caller checks the result.
async fn sign_request(
    run: &Peering<'_>,
    admin: &Administrator<'_>,
    csr_pem: &str,
) -> anyhow::Result<String> {
    let provider = admin.provider;
    let csr_name = request_name(&run.consumer_id.cluster_id);
    let csrs: Api<CertificateSigningRequest> = Api::all(provider.client.clone());
    let explain = |e| provider.explain(e, &format!("requesting a certificate ({csr_name})"));
    // A CSR of an earlier, interrupted run: its key is gone, start over.
    if csrs.get_opt(&csr_name).await.map_err(explain)?.is_some() {
        csrs.delete(&csr_name, &DeleteParams::default())
            .await
            .map_err(explain)?;
    }
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(csr_name.clone()),
            labels: Some(common_labels("identity")),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.as_bytes().to_vec()),
            signer_name: "kubernetes.io/kube-apiserver-client".to_owned(),
            usages: Some(vec![
                "digital signature".to_owned(),
                "client auth".to_owned(),
            ]),
            expiration_seconds: admin
                .certificate_lifetime
                .and_then(|s| i32::try_from(s).ok()),
            ..Default::default()
        },
        status: None,
    };
    csrs.create(&PostParams::default(), &csr)
        .await
        .map_err(explain)?;
    let outcome = approve_and_fetch(run, provider, &csrs, &csr_name).await;
    // The CSR has served its purpose either way; the certificate is
    // kept on the consumer only.
    let _ = csrs.delete(&csr_name, &DeleteParams::default()).await;
    outcome
}

async fn approve_and_fetch(
    run: &Peering<'_>,
    provider: &ClusterClient,
    csrs: &Api<CertificateSigningRequest>,
    name: &str,
) -> anyhow::Result<String> {
    let approval = json!({ "status": { "conditions": [{
        "type": "Approved",
        "status": "True",
        "reason": "LiqoctlPeer",
        "message": format!("approved by liqoctl peer for cluster {}", run.consumer_id.cluster_name),
    }]}});
    csrs.patch_approval(name, &PatchParams::default(), &Patch::Merge(&approval))
        .await
        .map_err(|e| provider.explain(e, &format!("approving the certificate request {name}")))?;
    let waited = wait::until(
        provider,
        csrs.clone(),
        name,
        |c: Option<&CertificateSigningRequest>| {
            c.and_then(|c| c.status.as_ref()).is_some_and(|s| {
                s.certificate.is_some()
                    || s.conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Denied" || c.type_ == "Failed")
            })
        },
        SIGNED,
        &format!("waiting for the certificate of {name}"),
    )
    .await?;
    let status = match waited {
        Waited::Done(Some(csr)) => csr.status.unwrap_or_default(),
        _ => {
            return Err(UserError::Timeout(format!(
                "cluster {} did not sign the certificate request {name} within {}s; is its \
                 kube-controller-manager running with --cluster-signing-cert-file?",
                provider.name,
                SIGNED.as_secs()
            ))
            .into());
        }
    };
    match status.certificate {
        Some(cert) => Ok(String::from_utf8_lossy(&cert.0).into_owned()),
        None => Err(UserError::Refused(format!(
            "cluster {} refused the certificate request {name}; see `kubectl get csr {name} -o yaml` there",
            provider.name
        ))
        .into()),
    }
}

/// The expiry of the identity in `secret` if it is for `user`, checks out
/// against the provider's CA, and has more than a third of its life left.
fn still_good(secret: &Secret, user: &str, ca_der: Option<&[u8]>) -> Option<String> {
    let kubeconfig = secret.data.as_ref()?.get("kubeconfig")?;
    let config =
        kube::config::Kubeconfig::from_yaml(std::str::from_utf8(&kubeconfig.0).ok()?).ok()?;
    let auth = config.auth_infos.first()?.auth_info.as_ref()?;
    use base64::Engine as _;
    let decode = |s: &str| base64::engine::general_purpose::STANDARD.decode(s).ok();
    let cert = decode(auth.client_certificate_data.as_deref()?)?;
    let key = decode(secrecy::ExposeSecret::expose_secret(
        auth.client_key_data.as_ref()?,
    ))?;
    let checked = identity::check(&cert, user, ca_der, std::str::from_utf8(&key).ok()?).ok()?;
    let now = Timestamp::now().as_second();
    let life = checked.not_after_unix - checked.not_before_unix;
    (checked.not_after_unix - now > life / 3).then_some(checked.not_after)
}

/// Removes the consumer's identity Secret (of any phase that made one).
pub(super) async fn remove(
    ends: &Ends<'_>,
    consumer: &ClusterClient,
) -> anyhow::Result<Vec<String>> {
    let secret = identity::secret(&ends.provider_id, "", Default::default());
    super::delete_all(consumer, &[secret]).await
}
