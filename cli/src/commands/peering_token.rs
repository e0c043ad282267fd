//! Peering with a token (docs/tokens.md): `liqoctl generate peering-token`
//! and `revoke peering-token` on the provider, `liqoctl peer --token` on
//! the consumer. The provider's administrator makes everything the
//! consumer will have when the token is generated; the consumer, with the
//! token's bootstrap credential, can only claim it. Nothing of ours runs
//! on the provider for this: RBAC, the admission policy
//! `liqo-peering-tokens`, bound service account tokens and the garbage
//! collector do the provider's part.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::Resource as _;
use kube::api::Api;
use liqo_api::authentication::Tenant;
use liqo_api::names;
use liqo_api::sharing::{Resources, SharingPolicySpec};
use liqo_api::token::{self as tokens, PeeringToken, TokenTenant, objects};
use liqo_api::{ClusterId, ClusterIdentity};
use serde::Serialize;

use crate::cli::{GeneratePeeringTokenArgs, GlobalArgs, PeerArgs, RevokePeeringTokenArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::flags::parse_request;
use crate::kube::apply::{self, Deletion};
use crate::kube::cluster::installed;
use crate::manifests::Manifest;
use crate::manifests::peering_token::new_id;
use crate::manifests::{peering_token as token, tenant};
use crate::peering::agreement::grant_for;
use crate::peering::held_tokens::{Held, claimed, held, mint, token_secrets};
use crate::peering::journal::Journal;
use crate::peering::report::print_reports;
use crate::peering::{PEER_AGAIN, by_token, identity, refuse_foreign};
use crate::printer::Printer;
use crate::show::show_resources;

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
            consumer.as_ref(),
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

    let issue = Issue {
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
        match issue.carry_out(&provider, &mut journal, &printer).await {
            Ok(made) => made,
            Err(e) => {
                journal.undo(&printer).await;
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
                // The consumer is not known yet: its pod CIDR is fixed
                // by the provider's gateway when its end of the tunnel
                // first comes (docs/network.md).
                r.spec.pod_cidr = None;
                r.metadata
                    .labels
                    .get_or_insert_default()
                    .insert(token::TOKEN_LABEL.to_owned(), self.id.to_owned());
            }
            let uid = journal.apply(provider, record).await?;
            let owner = token::owner("Tenant", &Tenant::api_version(&()), t.as_str(), &uid);
            for m in objects {
                journal.apply(provider, m.owned_by(owner.clone())).await?;
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
            journal.apply(provider, m.owned_by(owner.clone())).await?;
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
                    crate::show::list_or_none(&known)
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
    let text = by_token::read(args.token.as_deref(), args.token_file.as_deref())?;
    let checked = by_token::Checked::new(&text)?;
    let consumer = ClusterClient::local(global).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let consumer_id = installed(&consumer).await?;
    checked.usable_by(&consumer, &consumer_id)?;
    let report = by_token::peer(
        &consumer,
        consumer_id,
        &checked,
        &by_token::Asked {
            credential_lifetime: args.certificate_lifetime,
            network: !args.no_network,
            timeout: args.timeout,
        },
        &printer,
        deadline,
    )
    .await?;
    print_reports(&[report], args.output.output, &printer)
}
