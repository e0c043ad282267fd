//! Peering through files (docs/tokens.md, "Peering through files"), for
//! administrators who cannot act at once and would rather no bearer
//! credential travelled: `peer request` on the consumer makes a key (kept
//! in a Secret there) and writes a certificate request; `peer accept` on
//! the provider checks it, creates the tenant and has the certificate
//! signed, exactly as `peer --remote-kubeconfig` does; `peer complete` on
//! the consumer checks the certificate against its key and the provider's
//! CA, then starts the virtual kubelet. Neither file holds a secret.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams};
use liqo_api::ClusterIdentity;
use liqo_api::authentication::peer_user;
use liqo_api::names::{self, labels, peering};
use liqo_api::sharing::{Cost, Resources};
use serde::{Deserialize, Serialize};

use crate::cli::{
    GlobalArgs, PeerAcceptArgs, PeerCompleteArgs, PeerExchange, PeerRequestArgs, RequestArgs,
};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::flags::parse_request;
use crate::kube::apply;
use crate::kube::cluster::installed;
use crate::manifests::peering_token as token;
use crate::manifests::{Manifest, common_labels};
use crate::peering::agreement::Agreement;
use crate::peering::phases::{Administrator, Credentials, Granted, Peering, WithResponse};
use crate::peering::report::print_reports;
use crate::peering::{PEER_AGAIN, check_compatible, identity, refuse_foreign};
use crate::printer::Printer;
use crate::show::show_resources;

/// On the consumer: the Secret that keeps the key of the pending request.
const REQUEST_SECRET: &str = "liqo-peering-request";
const REQUEST_ID_ANNOTATION: &str = "liqo.io/request-id";

/// What `peer request` writes. The amounts are as the flags gave them;
/// the provider checks them.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind", rename = "PeeringRequest")]
struct RequestFile {
    id: String,
    consumer: ClusterIdentity,
    #[serde(flatten)]
    request: RequestArgs,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    certificate_lifetime: Option<u64>,
    /// The certificate request, PEM.
    csr: String,
}

/// What `peer accept` writes back.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind", rename = "PeeringResponse")]
struct ResponseFile {
    /// The request it answers.
    id: String,
    provider: ClusterIdentity,
    api_server: String,
    /// The provider's CA, PEM.
    ca: String,
    /// The consumer's certificate, PEM.
    certificate: String,
    grant: Resources,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cost: Option<Cost>,
    tenant_namespace: String,
}

pub async fn run(
    exchange: &PeerExchange,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    match exchange {
        PeerExchange::Request(args) => request(args, global, printer).await,
        PeerExchange::Accept(args) => accept(args, global, printer).await,
        PeerExchange::Complete(args) => complete(args, global, printer).await,
    }
}

async fn request(
    args: &PeerRequestArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    // Checked here already, so that a typo does not travel.
    parse_request(&args.request)?;
    let consumer = ClusterClient::local(global).await?;
    let consumer_id = installed(&consumer).await?;
    let made = identity::request(&peer_user(&consumer_id.cluster_id))?;
    let id = token::new_id();
    let mut secret_labels = common_labels("identity");
    secret_labels.insert(
        labels::PEER_CLUSTER_ID.to_owned(),
        consumer_id.cluster_id.to_string(),
    );
    let secret = Manifest::Secret(Secret {
        metadata: ObjectMeta {
            name: Some(REQUEST_SECRET.to_owned()),
            namespace: Some(names::NAMESPACE.to_owned()),
            labels: Some(secret_labels),
            annotations: Some(BTreeMap::from([(
                REQUEST_ID_ANNOTATION.to_owned(),
                id.clone(),
            )])),
            ..Default::default()
        },
        type_: Some("liqo.io/peering-request".to_owned()),
        string_data: Some(BTreeMap::from([("key.pem".to_owned(), made.key_pem)])),
        ..Default::default()
    });
    refuse_foreign(&consumer, std::slice::from_ref(&secret), PEER_AGAIN).await?;
    apply::apply(&consumer, &secret).await?;
    let file = RequestFile {
        id: id.clone(),
        consumer: consumer_id,
        request: args.request.clone(),
        certificate_lifetime: args.certificate_lifetime,
        csr: made.csr_pem,
    };
    write(&args.file, &serde_json::to_string_pretty(&file)?)?;
    printer.info(format!(
        "Peering request {id} of cluster {} written{}. It holds no secret: the key stays in \
         Secret {}/{REQUEST_SECRET} here (a new request replaces it). The provider's administrator \
         runs `liqoctl peer accept --file REQUEST --response-file RESPONSE`; then run \
         `liqoctl peer complete --file RESPONSE` here.",
        consumer.name,
        shown(&args.file),
        names::NAMESPACE
    ));
    Ok(())
}

async fn accept(
    args: &PeerAcceptArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let file: RequestFile = read(&args.file, "peering request")?;
    if let Some(url) = &args.api_server
        && !url.starts_with("https://")
    {
        return Err(UserError::Usage(format!(
            "--api-server {url}: not an https:// URL such as https://203.0.113.10:6443"
        ))
        .into());
    }
    let user = peer_user(&file.consumer.cluster_id);
    identity::check_request(&file.csr, &user).map_err(|e| {
        UserError::Refused(format!(
            "the certificate request of cluster {} cannot be approved: {e}",
            file.consumer.cluster_name
        ))
    })?;
    check_compatible(&file.consumer.cluster_name, &file.consumer.version)?;
    let request = parse_request(&file.request)?;
    let provider = ClusterClient::local(global).await?;
    let ca_der = provider.ca_der.clone().ok_or_else(|| {
        UserError::Config(format!(
            "the kubeconfig of cluster {} names no certificate authority, which the consumer must \
             trust; use a kubeconfig with certificate-authority-data",
            provider.name
        ))
    })?;
    let step = printer.step(format!(
        "Checking the request of cluster {}",
        file.consumer.cluster_name
    ));
    let agreement = match Agreement::for_consumer(
        file.consumer.clone(),
        &file.consumer.cluster_name,
        &provider,
        request.as_ref(),
        file.request.require_request,
    )
    .await
    {
        Ok(agreement) => agreement,
        Err(e) => {
            step.fail("");
            return Err(e);
        }
    };
    step.done(format!("grant {}", show_resources(&agreement.grant)));
    if !printer.confirm(
        &format!(
            "Accept cluster {} ({}) as a tenant of cluster {}, granting {}?",
            file.consumer.cluster_name,
            file.consumer.cluster_id,
            provider.name,
            show_resources(&agreement.grant)
        ),
        global.yes,
    )? {
        return Err(UserError::Refused("cancelled; nothing was changed".to_owned()).into());
    }

    let run = Peering {
        consumer_id: agreement.consumer_id.clone(),
        granted: agreement.granted(),
        printer: &printer,
    };
    let admin = Administrator {
        provider: &provider,
        provider_id: &agreement.provider_id,
        policy: &agreement.policy,
        certificate_lifetime: file.certificate_lifetime,
    };
    let certificate = run.accept(&admin, &file.csr).await?;
    let response = ResponseFile {
        id: file.id.clone(),
        provider: agreement.provider_id.clone(),
        api_server: args
            .api_server
            .clone()
            .unwrap_or_else(|| provider.server.clone()),
        ca: identity::pem(&ca_der),
        certificate,
        grant: agreement.grant.clone(),
        cost: agreement.policy.cost.clone(),
        tenant_namespace: peering::tenant_namespace(&file.consumer.cluster_id),
    };
    write(
        &args.response_file,
        &serde_json::to_string_pretty(&response)?,
    )?;
    printer.info(format!(
        "Accepted cluster {} ({}): response to request {} written{}. Hand it back; it holds no \
         secret. End the tenancy with `liqoctl unpeer --tenant {}`.",
        file.consumer.cluster_name,
        file.consumer.cluster_id,
        file.id,
        shown(&args.response_file),
        file.consumer.cluster_id
    ));
    Ok(())
}

async fn complete(
    args: &PeerCompleteArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let file: ResponseFile = read(&args.file, "peering response")?;
    let consumer = ClusterClient::local(global).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let consumer_id = installed(&consumer).await?;
    let provider_id = &file.provider;
    if provider_id.cluster_id == consumer_id.cluster_id {
        return Err(UserError::Refused(format!(
            "the response comes from cluster {} itself; a cluster cannot peer with itself",
            consumer.name
        ))
        .into());
    }
    let secrets: Api<Secret> = Api::namespaced(consumer.client.clone(), names::NAMESPACE);
    let pending = secrets
        .get_opt(REQUEST_SECRET)
        .await
        .map_err(|e| consumer.explain(e, &format!("reading Secret {REQUEST_SECRET}")))?
        .filter(|s| crate::kube::ownership::is_ours(&s.metadata));
    let Some(pending) = pending else {
        return Err(UserError::NotFound(format!(
            "cluster {} has no pending peering request (its key is kept in Secret {}/{REQUEST_SECRET} \
             by `liqoctl peer request`); run `peer request` again and have it accepted",
            consumer.name,
            names::NAMESPACE
        ))
        .into());
    };
    let pending_id = pending
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REQUEST_ID_ANNOTATION))
        .cloned()
        .unwrap_or_default();
    if pending_id != file.id {
        return Err(UserError::Refused(format!(
            "the response answers request {}, but the pending request of cluster {} is {pending_id}; \
             have the latest request accepted",
            file.id, consumer.name
        ))
        .into());
    }
    let key_pem = pending
        .data
        .as_ref()
        .and_then(|d| d.get("key.pem"))
        .and_then(|k| String::from_utf8(k.0.clone()).ok())
        .ok_or_else(|| {
            UserError::Refused(format!(
                "Secret {}/{REQUEST_SECRET} holds no key; run `peer request` again",
                names::NAMESPACE
            ))
        })?;
    let ca_der = x509_parser::pem::parse_x509_pem(file.ca.as_bytes())
        .map(|(_, pem)| pem.contents)
        .map_err(|_| UserError::Usage("the peering response's CA is not PEM".to_owned()))?;
    let fingerprint = identity::check_ca(&ca_der)
        .map_err(|e| UserError::Refused(format!("the provider's CA cannot be used: {e}")))?;
    let user = peer_user(&consumer_id.cluster_id);
    let checked = identity::check(file.certificate.as_bytes(), &user, Some(&ca_der), &key_pem)
        .map_err(|e| {
            UserError::Refused(format!(
                "the certificate in the response cannot be used: {e}; was the response made for \
                 another request?"
            ))
        })?;
    let kubeconfig = identity::kubeconfig(
        provider_id.cluster_id.as_str(),
        &file.api_server,
        Some(&file.ca),
        &user,
        &file.certificate,
        &key_pem,
    )?;
    let step = printer.step(format!(
        "Checking cluster {} with the new identity",
        provider_id.cluster_name
    ));
    let provider =
        ClusterClient::from_kubeconfig_yaml(&provider_id.cluster_name, &kubeconfig).await?;
    let reached = match installed(&provider).await {
        Ok(reached) => reached,
        Err(e) => {
            step.fail("");
            return Err(e);
        }
    };
    if reached.cluster_id != provider_id.cluster_id {
        step.fail("");
        return Err(UserError::Refused(format!(
            "the API server at {} is cluster {}, not cluster {} that the response names",
            file.api_server, reached.cluster_id, provider_id.cluster_id
        ))
        .into());
    }
    step.done(format!("CA {fingerprint}"));

    let expiry = checked.not_after;
    let run = Peering {
        consumer_id,
        granted: Granted {
            request: None,
            grant: file.grant.clone(),
            cost: file.cost.clone(),
        },
        printer: &printer,
    };
    let credentials = Credentials::Response(WithResponse {
        provider: &provider,
        provider_id,
        kubeconfig: &kubeconfig,
        expiry: &expiry,
    });
    // On failure the identity goes with the rest, and the pending
    // request stays: the same response completes it later.
    let made = run.run(&consumer, &credentials, !args.no_network).await?;
    let report = made.finish(&run, &consumer, deadline, args.timeout).await?;
    print_reports(&[report], args.output.output, &printer)?;
    // The key now lives in the identity Secret only.
    let _ = secrets
        .delete(REQUEST_SECRET, &DeleteParams::default())
        .await;
    Ok(())
}

/// Reads a request or response file (`-`: standard input).
fn read<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> anyhow::Result<T> {
    let text = super::read_input(path)
        .map_err(|e| UserError::Usage(format!("--file {}: cannot read it: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| {
        UserError::Usage(format!(
            "--file {}: not a {what} written by liqoctl: {e}",
            path.display()
        ))
        .into()
    })
}

/// Writes a request or response (`-`: standard output).
fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if path.as_os_str() == "-" {
        crate::printer::write_stdout(format!("{text}\n").as_bytes());
        return Ok(());
    }
    let mut f = std::fs::File::create(path)
        .map_err(|e| UserError::Usage(format!("cannot write {}: {e}", path.display())))?;
    f.write_all(format!("{text}\n").as_bytes())?;
    Ok(())
}

fn shown(path: &Path) -> String {
    if path.as_os_str() == "-" {
        String::new()
    } else {
        format!(" to {}", path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use liqo_api::ClusterId;

    #[test]
    fn files_say_what_they_are_and_a_request_is_not_a_response() {
        let consumer = ClusterIdentity {
            cluster_id: ClusterId::new("home-1").expect("id"),
            cluster_name: "home".into(),
            labels: Default::default(),
            pod_cidr: "10.0.0.0/16".parse().expect("cidr"),
            service_cidr: "10.1.0.0/16".parse().expect("cidr"),
            version: liqo_api::VERSION.into(),
        };
        let request = RequestFile {
            id: "ab12cd34".into(),
            consumer,
            request: RequestArgs {
                cpu: Some("2".into()),
                memory: None,
                pods: None,
                storage: None,
                claims: None,
                require_request: false,
            },
            certificate_lifetime: None,
            csr: "-----BEGIN CERTIFICATE REQUEST-----".into(),
        };
        let text = serde_json::to_string(&request).expect("json");
        assert!(text.contains(r#""kind":"PeeringRequest""#), "{text}");
        let back: RequestFile = serde_json::from_str(&text).expect("round trip");
        assert_eq!(back.request.cpu.as_deref(), Some("2"));
        assert!(serde_json::from_str::<ResponseFile>(&text).is_err());
    }
}
