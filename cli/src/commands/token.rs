//! Peering with a token (docs/tokens.md): `liqoctl generate peering-token`
//! and `revoke peering-token` on the provider, `liqoctl peer --token` on
//! the consumer. The provider's administrator makes everything the
//! consumer will have when the token is generated; the consumer, with the
//! token's bootstrap credential, can only claim it. Nothing of ours runs
//! on the provider for this: RBAC, the admission policy
//! `liqo-peering-tokens`, bound service account tokens and the garbage
//! collector do the provider's part.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, SelfSubjectReview, TokenRequest, TokenRequestSpec,
};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::Resource as _;
use kube::api::{Api, DeleteParams, PostParams};
use liqo_api::authentication::{Tenant, peer_user};
use liqo_api::names::{self, labels, peering};
use liqo_api::sharing::{Resources, SharingPolicySpec};
use liqo_api::token::{self as tokens, PeeringToken, TokenTenant, objects};
use liqo_api::{ClusterId, ClusterIdentity};
use serde::Serialize;
use serde_json::json;

use crate::cli::{GeneratePeeringTokenArgs, GlobalArgs, PeerArgs, RevokePeeringTokenArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::flags::parse_request;
use crate::kube::apply::{self, Deletion};
use crate::kube::cluster::installed;
use crate::manifests::{Manifest, common_labels, from_json};
use crate::peering::consumer::{Finish, Recorded, finish_on_consumer};
use crate::peering::outgoing::{Identity, identity_of};
use crate::peering::plan::grant_for;
use crate::peering::token::new_id;
use crate::peering::tokens::{Held, claimed, held, token_secrets};
use crate::peering::{
    Journal, PEER_AGAIN, Side, compatible, identity, refuse_foreign, tenant, token,
};
use crate::printer::Printer;
use crate::show::show_resources;

/// How long a tenant's credential lives when `peer --certificate-lifetime`
/// does not say: a year, as a kubeadm signer's certificates.
const CREDENTIAL_LIFETIME: u64 = 365 * 24 * 3600;

/// What `generate peering-token -o json|yaml` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Generated {
    id: String,
    token: String,
    expires: String,
    tenants: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    for_cluster: Option<String>,
    grant: Resources,
    api_server: String,
    ca_fingerprint: String,
}

pub async fn generate(
    args: &GeneratePeeringTokenArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let consumer = args
        .for_cluster
        .as_deref()
        .map(|c| ClusterId::new(c.to_owned()))
        .transpose()
        .map_err(|e| UserError::Usage(format!("--for: {e}")))?;
    let request = parse_request(&args.request)?;
    if let Some(url) = &args.api_server
        && !url.starts_with("https://")
    {
        return Err(UserError::Usage(format!(
            "--api-server {url}: not an https:// URL such as https://203.0.113.10:6443"
        ))
        .into());
    }
    let provider = ClusterClient::local(global).await?;
    let step = printer.step(format!("Checking cluster {}", provider.name));
    let checked = async {
        let identity = installed(&provider).await?;
        if consumer.as_ref() == Some(&identity.cluster_id) {
            return Err(UserError::Refused(format!(
                "--for {}: that is cluster {} itself; a cluster cannot peer with itself",
                identity.cluster_id, provider.name
            ))
            .into());
        }
        let ca = provider.ca_der.clone().ok_or_else(|| {
            UserError::Config(format!(
                "the kubeconfig of cluster {} names no certificate authority, and a token pins the \
                 provider's CA; use a kubeconfig with certificate-authority-data",
                provider.name
            ))
        })?;
        let fingerprint = identity::check_ca(&ca).map_err(|e| {
            UserError::Refused(format!(
                "the CA in the kubeconfig of cluster {} cannot be pinned: {e}",
                provider.name
            ))
        })?;
        let policy = crate::peering::terms::policy_for(&provider, consumer.as_ref()).await?;
        let grant = grant_for(
            &provider,
            &policy,
            request.as_ref(),
            args.request.require_request,
        )
        .await?;
        anyhow::Ok((identity, ca, fingerprint, policy, grant))
    }
    .await;
    let (identity, ca, fingerprint, policy, grant) = match checked {
        Ok(checked) => checked,
        Err(e) => {
            step.fail("");
            return Err(e);
        }
    };
    let id = new_id();
    let ids = tokens::tenants(&id, args.uses, consumer.as_ref());
    let tenants: Api<Tenant> = Api::all(provider.client.clone());
    for t in &ids {
        let existing = tenants
            .get_opt(t.as_str())
            .await
            .map_err(|e| provider.explain(e, "reading the tenants"))?;
        if existing.is_some() {
            step.fail("");
            return Err(UserError::Refused(format!(
                "cluster {} already has the tenant {t}; end it with `liqoctl unpeer --tenant {t}` first",
                provider.name
            ))
            .into());
        }
    }
    step.done(format!("grant {}", show_resources(&grant)));

    let plan = Issue {
        id: &id,
        ids: &ids,
        identity: &identity,
        policy: &policy,
        request: request.map(|r| r.to_resources()),
        grant: &grant,
        lifetime: args.expires,
    };
    let mut journal = Journal::default();
    let (claimable, bootstrap, expires) =
        match plan.carry_out(&provider, &mut journal, &printer).await {
            Ok(made) => made,
            Err(e) => {
                let step = printer.step("Rolling back what this run created");
                let left = journal.roll_back(&provider, &provider).await;
                if left.is_empty() {
                    step.done("");
                } else {
                    step.fail(format!("could not remove {}", left.join(", ")));
                }
                return Err(e);
            }
        };
    use base64::Engine as _;
    let token = PeeringToken {
        id: id.clone(),
        provider_cluster_id: identity.cluster_id.clone(),
        provider_cluster_name: identity.cluster_name.clone(),
        api_server: args
            .api_server
            .clone()
            .unwrap_or_else(|| provider.server.clone()),
        ca: base64::engine::general_purpose::STANDARD.encode(&ca),
        tenants: claimable,
        consumer: consumer.clone(),
        expires: expires.as_second(),
        grant: grant.clone(),
        cost: policy.cost.clone(),
        bootstrap,
    };
    let text = token.encode();
    if let Some(format) = args.output.output {
        return printer.structured(
            &Generated {
                id,
                token: text,
                expires: expires.to_string(),
                tenants: ids.iter().map(ToString::to_string).collect(),
                for_cluster: consumer.map(String::from),
                grant,
                api_server: token.api_server,
                ca_fingerprint: fingerprint,
            },
            format,
        );
    }
    printer.info(format!(
        "Peering token {id} of cluster {} ({}): {} use{}{}, until {expires}.\n\
         It pins the CA {fingerprint}. Hand it over as you would a password; the consumer runs\n\
         \x20 liqoctl peer --token-file FILE\n\
         Revoke it with `liqoctl revoke peering-token {id}`.",
        identity.cluster_name,
        identity.cluster_id,
        ids.len(),
        if ids.len() == 1 { "" } else { "s" },
        consumer
            .as_ref()
            .map(|c| format!(", by cluster {c} only"))
            .unwrap_or_default(),
    ));
    printer.result(text);
    Ok(())
}

/// What `generate` writes on the provider.
struct Issue<'a> {
    id: &'a str,
    ids: &'a [ClusterId],
    identity: &'a ClusterIdentity,
    policy: &'a SharingPolicySpec,
    request: Option<Resources>,
    grant: &'a Resources,
    lifetime: Duration,
}

impl Issue<'_> {
    /// The tenants (each owning its objects, so that deleting its record
    /// removes it whole), then the bootstrap credential, bound to the
    /// token's anchor Secret. Returns the tenants, the credential and its
    /// expiry.
    async fn carry_out(
        &self,
        provider: &ClusterClient,
        journal: &mut Journal,
        printer: &Printer,
    ) -> anyhow::Result<(Vec<TokenTenant>, String, Timestamp)> {
        let step = printer.step(format!(
            "Creating {} tenant{} on cluster {}",
            self.ids.len(),
            if self.ids.len() == 1 { "" } else { "s" },
            provider.name
        ));
        let records: Api<Tenant> = Api::all(provider.client.clone());
        let mut claimable = Vec::new();
        for t in self.ids {
            let mut objects = tenant::manifests(
                &token::unclaimed(t, self.id, self.identity),
                self.request.as_ref(),
                self.grant,
                self.policy.cost.as_ref(),
                &self.policy.admission,
            );
            objects.extend(token::tenant_account(t, self.id));
            refuse_foreign(provider, &objects, PEER_AGAIN).await?;
            // The record first: everything else is its dependent.
            let Some(pos) = objects
                .iter()
                .position(|m| matches!(m, Manifest::Tenant(_)))
            else {
                anyhow::bail!("invariant: a tenant has a record");
            };
            let mut record = objects.remove(pos);
            if let Manifest::Tenant(r) = &mut record {
                r.metadata
                    .labels
                    .get_or_insert_default()
                    .insert(token::TOKEN_LABEL.to_owned(), self.id.to_owned());
            }
            journal.apply(Side::Provider, provider, record).await?;
            let uid = records
                .get(t.as_str())
                .await
                .map_err(|e| provider.explain(e, &format!("reading Tenant {t}")))?
                .metadata
                .uid
                .unwrap_or_default();
            let owner = token::owner("Tenant", &Tenant::api_version(&()), t.as_str(), &uid);
            for m in objects {
                journal
                    .apply(Side::Provider, provider, m.owned_by(owner.clone()))
                    .await?;
            }
            claimable.push(TokenTenant { id: t.clone(), uid });
        }
        step.done("");

        let step = printer.step("Issuing the bootstrap credential");
        let expires = Timestamp::from_second(
            Timestamp::now().as_second() + i64::try_from(self.lifetime.as_secs())?,
        )?;
        let anchor = objects::bootstrap(self.id);
        journal
            .apply(
                Side::Provider,
                provider,
                token::anchor(self.id, self.ids, &expires.to_string()),
            )
            .await?;
        let secrets: Api<Secret> = Api::namespaced(provider.client.clone(), names::NAMESPACE);
        let anchor_uid = secrets
            .get(&anchor)
            .await
            .map_err(|e| provider.explain(e, &format!("reading Secret {anchor}")))?
            .metadata
            .uid
            .unwrap_or_default();
        let owner = token::owner("Secret", "v1", &anchor, &anchor_uid);
        for m in token::bootstrap(self.id, self.ids) {
            journal
                .apply(Side::Provider, provider, m.owned_by(owner.clone()))
                .await?;
        }
        let (credential, expires) = mint(
            provider,
            &anchor,
            &anchor,
            &anchor_uid,
            self.lifetime.as_secs(),
        )
        .await
        .map_err(|e| provider.explain(e, "issuing the bootstrap credential"))?;
        step.done(format!("until {expires}"));
        Ok((claimable, credential, expires))
    }
}

/// A credential of ServiceAccount `account` (in `liqo`), bound to Secret
/// `bound` (`uid`): it stops working when that Secret is deleted. Returns
/// the credential and when it expires.
async fn mint(
    cluster: &ClusterClient,
    account: &str,
    bound: &str,
    uid: &str,
    seconds: u64,
) -> Result<(String, Timestamp), kube::Error> {
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client.clone(), names::NAMESPACE);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: i64::try_from(seconds).ok(),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Secret".to_owned()),
                name: Some(bound.to_owned()),
                uid: Some(uid.to_owned()),
            }),
        },
        ..Default::default()
    };
    let issued = accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await?;
    match issued.status {
        Some(status) => Ok((status.token, status.expiration_timestamp.0)),
        None => Err(kube::Error::Api(
            kube::core::Status::failure("the API server returned no token", "NoToken")
                .with_code(500)
                .boxed(),
        )),
    }
}

pub async fn revoke(
    args: &RevokePeeringTokenArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let provider = ClusterClient::local(global).await?;
    let secrets = token_secrets(&provider).await?;
    let all = held(&secrets);
    let now = Timestamp::now();
    let chosen: Vec<&Held> = if args.all {
        all.iter().collect()
    } else if args.expired {
        all.iter()
            .filter(|t| t.expires.is_none_or(|e| e <= now))
            .collect()
    } else {
        let mut chosen = Vec::new();
        for id in &args.ids {
            let Some(t) = all.iter().find(|t| &t.id == id) else {
                let known: Vec<&str> = all.iter().map(|t| t.id.as_str()).collect();
                return Err(UserError::NotFound(format!(
                    "cluster {} has no peering token {id}; its tokens: {}",
                    provider.name,
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ))
                .into());
            };
            chosen.push(t);
        }
        chosen
    };
    if chosen.is_empty() {
        printer.info(format!(
            "Cluster {} has no {}peering tokens.",
            provider.name,
            if args.expired { "expired " } else { "" }
        ));
        return Ok(());
    }
    for t in chosen {
        let step = printer.step(format!("Revoking peering token {}", t.id));
        let mut removed = Vec::new();
        let mut kept = Vec::new();
        for tenant in &t.tenants {
            if claimed(&secrets, &t.id, tenant).is_some() {
                kept.push(tenant.to_string());
                continue;
            }
            // Its objects are the record's dependents: the garbage
            // collector removes them.
            let record = tenant::names_of(tenant)
                .into_iter()
                .find(|m| matches!(m, Manifest::Tenant(_)));
            if let Some(record) = record
                && matches!(
                    apply::delete(&provider, &record).await?,
                    Deletion::Deleted { .. }
                )
            {
                removed.push(tenant.to_string());
            }
        }
        let anchor = token::anchor(&t.id, &t.tenants, "");
        apply::delete(&provider, &anchor).await?;
        step.done(match (removed.len(), kept.is_empty()) {
            (0, true) => String::new(),
            (n, true) => format!("{n} unclaimed tenant(s) removed"),
            (n, false) => format!(
                "{n} unclaimed tenant(s) removed; peerings made with it stay: tenant(s) {} \
                 (end them with `liqoctl unpeer --tenant`)",
                kept.join(", ")
            ),
        });
    }
    Ok(())
}

/// `liqoctl peer --token`: the consumer claims a tenant with the token,
/// mints that tenant's credential, and starts its virtual kubelet, with
/// its own kubeconfig only.
pub async fn peer(args: &PeerArgs, global: &GlobalArgs, printer: Printer) -> anyhow::Result<()> {
    let text = read_token(args)?;
    let token = PeeringToken::decode(&text)
        .map_err(|e| UserError::Usage(format!("the peering token cannot be read: {e}")))?;
    let now = Timestamp::now();
    if token.expires <= now.as_second() {
        return Err(UserError::Refused(format!(
            "the peering token {} expired at {}; ask the administrator of cluster {} for a new one",
            token.id,
            Timestamp::from_second(token.expires).unwrap_or(now),
            token.provider_cluster_name
        ))
        .into());
    }
    let ca_der = token
        .ca_der()
        .map_err(|e| UserError::Usage(format!("the peering token cannot be read: {e}")))?;
    let fingerprint = identity::check_ca(&ca_der).map_err(|e| {
        UserError::Refused(format!("the CA the peering token pins cannot be used: {e}"))
    })?;
    let ca_pem = identity::pem(&ca_der);
    let consumer = ClusterClient::local(global).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let consumer_id = installed(&consumer).await?;
    if token.provider_cluster_id == consumer_id.cluster_id {
        return Err(UserError::Refused(format!(
            "the peering token is cluster {}'s own; a cluster cannot peer with itself",
            consumer.name
        ))
        .into());
    }
    if let Some(bound) = &token.consumer
        && bound != &consumer_id.cluster_id
    {
        return Err(UserError::Refused(format!(
            "the peering token {} is for cluster {bound}, and cluster {} is {}",
            token.id, consumer.name, consumer_id.cluster_id
        ))
        .into());
    }

    // An earlier run's identity is where this one resumes.
    let (tenant, kubeconfig, expiry) =
        match identity_of(&consumer, &token.provider_cluster_id).await? {
            Identity::Token {
                tenant,
                kubeconfig,
                expiry,
            } => (tenant, kubeconfig, expiry),
            Identity::Certificate => {
                return Err(UserError::Refused(format!(
                    "cluster {} already peers with {} through a certificate; unpeer first to \
                     peer again with a token",
                    consumer.name, token.provider_cluster_id
                ))
                .into());
            }
            Identity::Absent => {
                claim_and_mint(
                    &consumer,
                    &consumer_id,
                    &token,
                    &ca_pem,
                    &fingerprint,
                    args,
                    &printer,
                )
                .await?
            }
        };

    // From here on, everything on the provider is done as the tenant.
    let step = printer.step(format!(
        "Checking cluster {} as tenant {tenant}",
        token.provider_cluster_name
    ));
    let provider =
        ClusterClient::from_kubeconfig_yaml(&token.provider_cluster_name, &kubeconfig).await?;
    let provider_id = match check_tenant(&provider, &tenant, &token).await {
        Ok(id) => id,
        Err(e) => {
            step.fail("");
            return Err(e);
        }
    };
    step.done("");

    finish_on_consumer(
        &consumer,
        &provider,
        // The identity is not in it: it stays, and the same command
        // resumes from it.
        Journal::default(),
        Recorded {
            provider: &provider_id,
            request: None,
            grant: &token.grant,
            cost: token.cost.as_ref(),
            expiry: &expiry,
            tenant_namespace: peering::tenant_namespace(&tenant),
        },
        Finish {
            deadline,
            timeout: args.timeout,
            output: args.output.output,
            network: !args.no_network,
        },
        &printer,
    )
    .await
}

/// The token's text, from `--token` or `--token-file` (`-`: standard input).
fn read_token(args: &PeerArgs) -> anyhow::Result<String> {
    if let Some(text) = &args.token {
        return Ok(text.clone());
    }
    let Some(path) = &args.token_file else {
        return Err(UserError::Usage("pass --token or --token-file".to_owned()).into());
    };
    Ok(super::read_input(path).map_err(|e| {
        UserError::Usage(format!(
            "--token-file {}: cannot read it: {e}",
            path.display()
        ))
    })?)
}

/// With the token's bootstrap credential: checks the provider is the one
/// the token names, claims the first tenant still free, and mints that
/// tenant's credential, bound to the claim. The identity Secret is written
/// at once: it is where a re-run resumes (the claim cannot be made twice).
async fn claim_and_mint(
    consumer: &ClusterClient,
    consumer_id: &ClusterIdentity,
    token: &PeeringToken,
    ca_pem: &str,
    fingerprint: &str,
    args: &PeerArgs,
    printer: &Printer,
) -> anyhow::Result<(ClusterId, String, String)> {
    let step = printer.step(format!(
        "Claiming a tenant on cluster {} with token {}",
        token.provider_cluster_name, token.id
    ));
    let outcome = async {
        let bootstrap_config = identity::kubeconfig_with(
            token.provider_cluster_id.as_str(),
            &token.api_server,
            Some(ca_pem),
            &objects::bootstrap(&token.id),
            kube::config::AuthInfo {
                token: Some(token.bootstrap.clone().into()),
                ..Default::default()
            },
        )?;
        let bootstrap =
            ClusterClient::from_kubeconfig_yaml(&token.provider_cluster_name, &bootstrap_config)
                .await?;
        let provider_id = installed(&bootstrap)
            .await
            .map_err(|e| spent_or(e, token))?;
        check_provider(&provider_id, token)?;
        let (tenant, claim_uid) = claim(&bootstrap, token, consumer_id).await?;
        let lifetime = args.certificate_lifetime.unwrap_or(CREDENTIAL_LIFETIME);
        let (credential, expires) = mint(
            &bootstrap,
            &objects::tenant_account(&tenant.id),
            &objects::claim(&token.id, &tenant.id),
            &claim_uid,
            lifetime,
        )
        .await
        .map_err(|e| bootstrap.explain(e, "minting the tenant's credential"))?;
        // The last tenant taken: the token has no use left; revoke it now
        // rather than at its expiry.
        if token.tenants.last().map(|t| &t.id) == Some(&tenant.id) {
            let secrets: Api<Secret> = Api::namespaced(bootstrap.client.clone(), names::NAMESPACE);
            if let Err(error) = secrets
                .delete(&objects::bootstrap(&token.id), &DeleteParams::background())
                .await
            {
                tracing::debug!(%error, "the spent token could not revoke itself");
            }
        }
        let kubeconfig = identity::token_kubeconfig(
            token.provider_cluster_id.as_str(),
            &token.api_server,
            ca_pem,
            &peer_user(&tenant.id),
            &credential,
        )?;
        // As a certificate's expiry is shown (RFC 2822), for `info`.
        let expiry = k8s_openapi::jiff::fmt::rfc2822::DateTimePrinter::new()
            .timestamp_to_string(&expires)
            .unwrap_or_else(|_| expires.to_string());
        store_identity(consumer, token, &tenant.id, &kubeconfig, &expiry).await?;
        anyhow::Ok((tenant.id, kubeconfig, expiry))
    }
    .await;
    match outcome {
        Ok(claimed) => {
            step.done(format!("tenant {}, CA {fingerprint}", claimed.0));
            Ok(claimed)
        }
        Err(e) => {
            step.fail("");
            Err(e)
        }
    }
}

/// A 401 with the bootstrap credential means the token was revoked or has
/// expired (its anchor deleted when its last tenant was taken, too).
fn spent_or(e: anyhow::Error, token: &PeeringToken) -> anyhow::Error {
    let unauthorized = e
        .downcast_ref::<UserError>()
        .is_some_and(|u| matches!(u, UserError::Unauthenticated(_)));
    if unauthorized {
        return UserError::Refused(format!(
            "cluster {} does not accept the peering token {}: it was revoked, used up or has \
             expired; ask its administrator for a new one",
            token.provider_cluster_name, token.id
        ))
        .into();
    }
    e
}

fn check_provider(provider: &ClusterIdentity, token: &PeeringToken) -> anyhow::Result<()> {
    if provider.cluster_id != token.provider_cluster_id {
        return Err(UserError::Refused(format!(
            "the API server at {} is cluster {}, not cluster {} that the peering token names",
            token.api_server, provider.cluster_id, token.provider_cluster_id
        ))
        .into());
    }
    if !compatible(&provider.version) {
        return Err(UserError::Refused(format!(
            "cluster {} runs liqo-rs {}, which liqoctl {} cannot peer; upgrade it with `liqoctl install`",
            token.provider_cluster_name,
            provider.version,
            liqo_api::VERSION
        ))
        .into());
    }
    Ok(())
}

/// Creates the claim of the first tenant of the token not yet claimed;
/// returns it and the claim's UID.
async fn claim(
    bootstrap: &ClusterClient,
    token: &PeeringToken,
    consumer: &ClusterIdentity,
) -> anyhow::Result<(TokenTenant, String)> {
    let secrets: Api<Secret> = Api::namespaced(bootstrap.client.clone(), names::NAMESPACE);
    for t in &token.tenants {
        let owner = token::owner("Tenant", &Tenant::api_version(&()), t.id.as_str(), &t.uid);
        let Manifest::Secret(claim) = token::claim(&token.id, &t.id, consumer).owned_by(owner)
        else {
            anyhow::bail!("invariant: a claim is a Secret");
        };
        match secrets.create(&PostParams::default(), &claim).await {
            Ok(created) => return Ok((t.clone(), created.metadata.uid.unwrap_or_default())),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => {
                return Err(spent_or(bootstrap.explain(e, "claiming a tenant"), token));
            }
        }
    }
    Err(UserError::Refused(format!(
        "the peering token {} is used up: {} of {} tenant(s) claimed; ask the administrator of \
         cluster {} for a new one",
        token.id,
        token.tenants.len(),
        token.tenants.len(),
        token.provider_cluster_name
    ))
    .into())
}

/// The identity Secret of a token peering on the consumer: the kubeconfig,
/// and which tenant and token it came from.
async fn store_identity(
    consumer: &ClusterClient,
    token: &PeeringToken,
    tenant: &ClusterId,
    kubeconfig: &str,
    expiry: &str,
) -> anyhow::Result<()> {
    let mut secret_labels = common_labels("identity");
    secret_labels.insert(
        labels::PEER_CLUSTER_ID.to_owned(),
        token.provider_cluster_id.to_string(),
    );
    let secret: Secret = from_json(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": peering::identity_secret(&token.provider_cluster_id),
            "namespace": names::NAMESPACE,
            "labels": secret_labels,
            "annotations": {
                token::TENANT_ANNOTATION: tenant.as_str(),
                token::TOKEN_LABEL: token.id,
                token::EXPIRES_ANNOTATION: expiry,
            },
        },
        "type": "liqo.io/peer-identity",
        "stringData": { "kubeconfig": kubeconfig },
    }));
    let objects = [Manifest::Secret(secret)];
    refuse_foreign(consumer, &objects, PEER_AGAIN).await?;
    apply::apply(consumer, &objects[0]).await?;
    Ok(())
}

/// The provider's identity, read as the tenant, after checking the
/// credential acts as that tenant.
async fn check_tenant(
    provider: &ClusterClient,
    tenant: &ClusterId,
    token: &PeeringToken,
) -> anyhow::Result<ClusterIdentity> {
    let reviews: Api<SelfSubjectReview> = Api::all(provider.client.clone());
    let review = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 401 => UserError::Refused(format!(
                "cluster {} no longer accepts this peering's credential (its tenant {tenant} was \
                 ended there); remove it with `liqoctl unpeer --force --cluster-id {}`",
                provider.name, token.provider_cluster_id
            ))
            .into(),
            other => provider.explain(other, "checking the tenant's credential"),
        })?;
    let user = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default();
    if user != peer_user(tenant) {
        return Err(UserError::Refused(format!(
            "cluster {} knows this peering's credential as {user:?}, not as tenant {tenant}",
            provider.name
        ))
        .into());
    }
    let id = installed(provider).await?;
    check_provider(&id, token)?;
    Ok(id)
}
