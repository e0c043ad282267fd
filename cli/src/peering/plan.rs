//! A peering planned and carried out with the credentials of both
//! clusters: what the provider grants (checked before anything is
//! written), then the steps that write, each recorded in the [`Journal`]:
//! the tenant on the provider, the consumer's certificate signed there,
//! and the consumer's side ([`super::consumer`]).

use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use liqo_api::ClusterIdentity;
use liqo_api::authentication::{Tenant, peer_user};
use liqo_api::names::{self, labels, peering};
use liqo_api::sharing::{self, AboveOffer, Amounts, Resources, SharingError, SharingPolicySpec};
use serde_json::json;

use super::consumer::{Recorded, record, start_virtual_kubelet};
use super::{
    Journal, PEER_AGAIN, Side, capacity, compatible, identity, network, refuse_foreign, tenant,
    terms,
};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::cluster::installed;
use crate::kube::ownership;
use crate::kube::wait::{self, Waited};
use crate::manifests::{Manifest, common_labels, from_json};
use crate::printer::Printer;
use crate::show::show_resources;

/// Everything decided before anything is written.
pub(crate) struct Plan {
    /// Issue a new certificate whatever the current one's state.
    pub renew: bool,
    pub certificate_lifetime: Option<u64>,
    pub consumer_id: ClusterIdentity,
    pub provider_id: ClusterIdentity,
    pub policy: SharingPolicySpec,
    pub request: Option<Resources>,
    pub grant: Resources,
}

impl Plan {
    /// What `provider` grants the consumer `consumer_id` (called
    /// `consumer_name` in messages), checked as `liqoctl peer`
    /// checks it.
    pub(crate) async fn for_consumer(
        consumer_id: ClusterIdentity,
        consumer_name: &str,
        provider: &ClusterClient,
        request: Option<&Amounts>,
        require_request: bool,
        certificate_lifetime: Option<u64>,
    ) -> anyhow::Result<Self> {
        let provider_id = installed(provider).await?;
        if consumer_id.cluster_id == provider_id.cluster_id {
            return Err(UserError::Refused(format!(
                "cluster {} and cluster {} are the same cluster ({}); a cluster cannot peer with itself",
                consumer_name, provider.name, consumer_id.cluster_id
            ))
            .into());
        }
        if !compatible(&provider_id.version) {
            return Err(UserError::Refused(format!(
                "cluster {} runs liqo-rs {}, which liqoctl {} cannot peer; upgrade it with `liqoctl install`",
                provider.name,
                provider_id.version,
                liqo_api::VERSION
            ))
            .into());
        }

        let policy = terms::policy_for(provider, Some(&consumer_id.cluster_id)).await?;
        let tenants: Api<Tenant> = Api::all(provider.client.clone());
        let known = tenants
            .get_opt(consumer_id.cluster_id.as_str())
            .await
            .map_err(|e| provider.explain(e, "reading the tenants"))?
            .is_some();
        if !policy.accept_new_peers && !known {
            return Err(UserError::Refused(format!(
                "cluster {} accepts no new peers (its sharing policy says so); ask its administrator",
                provider.name
            ))
            .into());
        }
        let grant = grant_for(provider, &policy, request, require_request).await?;
        Ok(Self {
            renew: false,
            certificate_lifetime,
            consumer_id,
            provider_id,
            policy,
            request: request.map(|r| r.to_resources()),
            grant,
        })
    }

    /// The steps that write; returns the certificate's expiry and, when
    /// asked to link the networks, the tunnel.
    pub(crate) async fn carry_out(
        &self,
        consumer: &ClusterClient,
        provider: &ClusterClient,
        journal: &mut Journal,
        printer: &Printer,
        network: bool,
    ) -> anyhow::Result<(String, Option<network::Linked>)> {
        self.provide(provider, journal, printer).await?;

        let step = printer.step(format!(
            "Issuing the identity of cluster {} on cluster {}",
            consumer.name, provider.name
        ));
        let expiry = self.identity(consumer, provider, journal).await?;
        step.done(format!("valid until {expiry}"));

        let step = printer.step(format!(
            "Starting the virtual kubelet on cluster {}",
            consumer.name
        ));
        let uid = record(
            consumer,
            journal,
            &Recorded {
                provider: &self.provider_id,
                request: self.request.as_ref(),
                grant: &self.grant,
                cost: self.policy.cost.as_ref(),
                expiry: &expiry,
                tenant_namespace: peering::tenant_namespace(&self.consumer_id.cluster_id),
            },
        )
        .await?;
        start_virtual_kubelet(consumer, journal, &self.provider_id.cluster_id, &uid).await?;
        step.done("");
        let linked = match network {
            false => None,
            true => Some(
                network::connect(
                    consumer,
                    &self.consumer_id,
                    provider,
                    &self.provider_id,
                    &peering::tenant_namespace(&self.consumer_id.cluster_id),
                    journal,
                    printer,
                )
                .await?,
            ),
        };
        Ok((expiry, linked))
    }

    /// The provider's side: the tenant, and its record of the grant.
    pub(crate) async fn provide(
        &self,
        provider: &ClusterClient,
        journal: &mut Journal,
        printer: &Printer,
    ) -> anyhow::Result<()> {
        let step = printer.step(format!("Creating the tenant on cluster {}", provider.name));
        let objects = tenant::manifests(
            &self.consumer_id,
            self.request.as_ref(),
            &self.grant,
            self.policy.cost.as_ref(),
            &self.policy.admission,
        );
        refuse_foreign(provider, &objects, PEER_AGAIN).await?;
        for m in objects {
            journal.apply(Side::Provider, provider, m).await?;
        }
        self.tenant_status(provider).await?;
        // Twins made under other terms (an earlier peering, or a policy
        // changed since) are labelled for these.
        let id = &self.consumer_id.cluster_id;
        if let Some(brought) = terms::bring_under(provider, id, &self.policy.admission).await? {
            for warning in brought.report(id, &self.policy.admission).1 {
                printer.info(warning);
            }
        }
        step.done(peering::tenant_namespace(&self.consumer_id.cluster_id));
        Ok(())
    }

    /// The provider's record says what was granted, and when.
    async fn tenant_status(&self, provider: &ClusterClient) -> anyhow::Result<()> {
        let tenants: Api<Tenant> = Api::all(provider.client.clone());
        let name = self.consumer_id.cluster_id.as_str();
        let condition = Condition {
            type_: "Granted".to_owned(),
            status: "True".to_owned(),
            reason: "PolicyGranted".to_owned(),
            message: format!(
                "granted {} to cluster {}",
                show_resources(&self.grant),
                self.consumer_id.cluster_name
            ),
            last_transition_time: Time(Timestamp::now()),
            observed_generation: None,
        };
        tenants
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": { "conditions": [condition] } })),
            )
            .await
            .map_err(|e| provider.explain(e, &format!("recording the grant in Tenant {name}")))?;
        Ok(())
    }

    /// The consumer's certificate on the provider, kept in a Secret on the
    /// consumer: reused while it is valid for more than a third of its
    /// life, else issued anew from a key made here.
    async fn identity(
        &self,
        consumer: &ClusterClient,
        provider: &ClusterClient,
        journal: &mut Journal,
    ) -> anyhow::Result<String> {
        let user = peer_user(&self.consumer_id.cluster_id);
        let secret_name = peering::identity_secret(&self.provider_id.cluster_id);
        let secrets: Api<Secret> = Api::namespaced(consumer.client.clone(), names::NAMESPACE);
        if let Some(existing) = secrets
            .get_opt(&secret_name)
            .await
            .map_err(|e| consumer.explain(e, &format!("reading Secret {secret_name}")))?
            && ownership::is_ours(&existing.metadata)
            && !self.renew
            && let Some(expiry) = still_good(&existing, &user, provider.ca_der.as_deref())
        {
            return Ok(expiry);
        }

        let request = identity::request(&user)?;
        let cert_pem = self.sign(provider, &request.csr_pem).await?;
        let checked = identity::check(cert_pem.as_bytes(), &user, provider.ca_der.as_deref(), &request.key_pem)
            .map_err(|e| {
                UserError::Refused(format!(
                    "cluster {} issued a certificate liqoctl cannot use: {e}; check its CSR signer (kube-controller-manager --cluster-signing-*)",
                    provider.name
                ))
            })?;
        let ca_pem = provider.ca_der.as_deref().map(identity::pem);
        let kubeconfig = identity::kubeconfig(
            self.provider_id.cluster_id.as_str(),
            &provider.server,
            ca_pem.as_deref(),
            &user,
            &cert_pem,
            &request.key_pem,
        )?;
        let mut secret_labels = common_labels("identity");
        secret_labels.insert(
            labels::PEER_CLUSTER_ID.to_owned(),
            self.provider_id.cluster_id.to_string(),
        );
        let secret: Secret = from_json(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": { "name": secret_name, "namespace": names::NAMESPACE, "labels": secret_labels },
            "type": "liqo.io/peer-identity",
            "stringData": { "kubeconfig": kubeconfig },
        }));
        journal
            .apply(Side::Consumer, consumer, Manifest::Secret(secret))
            .await?;
        Ok(checked.not_after)
    }

    /// Has `provider` sign `csr_pem` for the consumer's user: creates the
    /// CSR, approves it with the provider's credentials, fetches the
    /// certificate, and deletes the CSR. The caller checks the result.
    pub(crate) async fn sign(
        &self,
        provider: &ClusterClient,
        csr_pem: &str,
    ) -> anyhow::Result<String> {
        let csr_name = format!("liqo-peer-{}", self.consumer_id.cluster_id);
        let csrs: Api<CertificateSigningRequest> = Api::all(provider.client.clone());
        let explain = |e| provider.explain(e, &format!("requesting a certificate ({csr_name})"));
        // A CSR of an earlier, interrupted run: its key is gone, start over.
        if csrs.get_opt(&csr_name).await.map_err(explain)?.is_some() {
            csrs.delete(&csr_name, &DeleteParams::default())
                .await
                .map_err(explain)?;
        }
        use base64::Engine as _;
        let csr: CertificateSigningRequest = from_json(json!({
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": { "name": csr_name, "labels": common_labels("identity") },
            "spec": {
                "request": base64::engine::general_purpose::STANDARD.encode(csr_pem),
                "signerName": "kubernetes.io/kube-apiserver-client",
                "usages": ["digital signature", "client auth"],
                "expirationSeconds": self.certificate_lifetime,
            },
        }));
        csrs.create(&PostParams::default(), &csr)
            .await
            .map_err(explain)?;
        let outcome = self.approve_and_fetch(provider, &csrs, &csr_name).await;
        // The CSR has served its purpose either way; the certificate is
        // kept on the consumer only.
        let _ = csrs.delete(&csr_name, &DeleteParams::default()).await;
        outcome
    }

    async fn approve_and_fetch(
        &self,
        provider: &ClusterClient,
        csrs: &Api<CertificateSigningRequest>,
        name: &str,
    ) -> anyhow::Result<String> {
        let approval = json!({ "status": { "conditions": [{
            "type": "Approved",
            "status": "True",
            "reason": "LiqoctlPeer",
            "message": format!("approved by liqoctl peer for cluster {}", self.consumer_id.cluster_name),
        }]}});
        csrs.patch_approval(name, &PatchParams::default(), &Patch::Merge(&approval))
            .await
            .map_err(|e| {
                provider.explain(e, &format!("approving the certificate request {name}"))
            })?;
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
            Duration::from_secs(30),
            &format!("waiting for the certificate of {name}"),
        )
        .await?;
        let status = match waited {
            Waited::Done(Some(csr)) => csr.status.unwrap_or_default(),
            _ => {
                return Err(UserError::Timeout(format!(
                    "cluster {} did not sign the certificate request {name} within 30s; is its \
                     kube-controller-manager running with --cluster-signing-cert-file?",
                    provider.name
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

/// What `provider` grants under `policy` for `request`, from its free
/// capacity now.
pub(crate) async fn grant_for(
    provider: &ClusterClient,
    policy: &SharingPolicySpec,
    request: Option<&Amounts>,
    require_request: bool,
) -> anyhow::Result<Resources> {
    let free = capacity::free(provider).await?;
    let offer = sharing::offered(policy, free).map_err(|e| {
        UserError::Refused(format!(
            "the sharing policy of cluster {} is not valid: {e}",
            provider.name
        ))
    })?;
    let above = if require_request {
        AboveOffer::Refuse
    } else {
        AboveOffer::Clamp
    };
    let grant = sharing::grant(request.copied(), offer, above).map_err(|e| match e {
        SharingError::AboveOffer { .. } => UserError::Refused(format!(
            "cluster {} cannot grant the request: {e}; ask for less, or drop --require-request to take what it offers",
            provider.name
        )),
        other => UserError::Refused(other.to_string()),
    })?;
    Ok(grant.to_resources())
}
