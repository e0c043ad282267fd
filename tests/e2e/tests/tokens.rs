//! Peering with a token (docs/tokens.md) between two real clusters: the
//! consumer peers with its own kubeconfig only, the token's bootstrap
//! credential can do nothing but claim its own tenant (proven with real
//! requests against real RBAC and admission), a spent, revoked, expired,
//! damaged or misdirected token is refused with one line, and unpeer from
//! the consumer alone leaves both clusters as they were.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret, ServiceAccount};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use liqo_api::authentication::Tenant;
use liqo_api::names::{self, peering};
use liqo_api::token::{self, PeeringToken, objects};
use liqo_e2e::fixture::{Pair, Stage};
use liqo_e2e::{liqoctl, snapshot, wait_for};
use serde_json::json;

/// `liqoctl generate peering-token` on the provider; returns the token.
fn generate(provider: &liqo_testbed::Cluster, extra: &[&str]) -> String {
    let mut args = vec!["generate", "peering-token"];
    args.extend_from_slice(extra);
    let out = liqoctl(Some(provider.kubeconfig_path()), &args).success();
    let token = out.stdout.trim().to_owned();
    assert!(token.starts_with(token::PREFIX), "{}", out.stdout);
    assert!(
        !out.stderr.contains(&token),
        "the token is printed on stderr too"
    );
    token
}

/// Writes `token` to a file of `dir`, as a user would save it.
fn save(dir: &tempfile::TempDir, name: &str, token: &str) -> Result<String> {
    let path = dir.path().join(name);
    std::fs::write(&path, format!("{token}\n"))?;
    Ok(path.to_str().context("path")?.to_owned())
}

/// A client to the provider with the token's bootstrap credential,
/// trusting the CA the token pins; `impersonate` adds the header.
fn bootstrap_client(token: &PeeringToken, impersonate: Option<&str>) -> Result<kube::Client> {
    let mut config = kube::Config::new(token.api_server.parse()?);
    config.root_cert = Some(vec![token.ca_der()?]);
    config.auth_info.token = Some(token.bootstrap.clone().into());
    config.auth_info.impersonate = impersonate.map(str::to_owned);
    Ok(kube::Client::try_from(config)?)
}

/// Waits until `client` gets 401 for what every peer may read: its
/// credential no longer authenticates.
async fn until_unauthorized(what: &str, client: impl Fn() -> Result<kube::Client>) -> Result<()> {
    wait_for(what, Duration::from_secs(30), || {
        let client = client();
        async move {
            let maps: Api<ConfigMap> = Api::namespaced(client?, names::NAMESPACE);
            Ok(code(&maps.get(names::IDENTITY_CONFIGMAP).await) == Some(401))
        }
    })
    .await
}

fn code<T>(r: &Result<T, kube::Error>) -> Option<u16> {
    match r {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(s.code),
        Err(_) => Some(0),
    }
}

fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>, codes: &[u16]) {
    let got = code(&r);
    assert!(
        got.is_some_and(|c| codes.contains(&c)),
        "with the token's bootstrap credential, {what} was not refused ({codes:?}): {r:?}"
    );
}

fn secret(name: &str, type_: &str) -> Secret {
    serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": names::NAMESPACE },
        "type": type_,
    }))
    .expect("a secret")
}

fn token_request(bound: Option<(&str, &str)>) -> TokenRequest {
    TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(600),
            bound_object_ref: bound.map(|(name, uid)| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Secret".into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
            }),
        },
        ..Default::default()
    }
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_with_a_token_then_unpeer_from_the_consumer_leaves_both_clusters_as_they_were()
-> Result<()> {
    let pair = Pair::at(Stage::Installed).await?;
    let provider = pair.provider();
    let consumer_client = pair.consumer_client.clone();
    let provider_client = pair.provider_client.clone();
    let before = (
        snapshot(&consumer_client).await?,
        snapshot(&provider_client).await?,
    );
    let dir = tempfile::tempdir()?;

    let text = generate(
        provider,
        &["--cpu=2", "--memory=1Gi", "--pods=10", "--expires=30m"],
    );
    let path = save(&dir, "token", &text)?;
    let start = std::time::Instant::now();
    let out = pair
        .on_consumer(&["peer", "--token-file", &path, "-o", "json"])
        .success();
    eprintln!(
        "peer --token: virtual node Ready after {:?}",
        start.elapsed()
    );
    assert!(!out.stdout.contains(&text) && !out.stderr.contains(&text));
    let report: serde_json::Value = serde_json::from_str(&out.stdout)?;
    assert_eq!(report["providerClusterId"], "provider-1");
    assert_eq!(report["grant"]["cpu"], "2");
    assert_eq!(report["virtualNode"], "liqo-provider-1");
    let tenant_ns = report["tenantNamespace"]
        .as_str()
        .context("tenant namespace")?
        .to_owned();

    // The virtual node stands for the grant.
    let node = Api::<Node>::all(consumer_client.clone())
        .get("liqo-provider-1")
        .await?;
    let capacity = node.status.and_then(|s| s.capacity).unwrap_or_default();
    assert_eq!(capacity.get("cpu").map(|q| q.0.as_str()), Some("2"));
    assert_eq!(capacity.get("pods").map(|q| q.0.as_str()), Some("10"));

    // The consumer's credential acts as its tenant, confined exactly as a
    // certificate identity is (the same probe as tests/peering.rs).
    let peer = liqo_e2e::peer_client(pair.consumer(), &consumer_client, "provider-1").await?;
    let allowed = liqo_e2e::least_privilege_probe(&peer, &tenant_ns).await?;
    assert!(allowed >= 3);

    // Offloading works through the token peering as through a
    // certificate: the twin namespace is the tenant's, the pod runs there.
    Api::<Namespace>::all(consumer_client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "shop" } }))?,
        )
        .await?;
    pair.on_consumer(&[
        "offload",
        "namespace",
        "shop",
        "--pod-offloading-strategy=Remote",
        "--wait",
        "--timeout=60",
    ])
    .success();
    let tenant = tenant_ns
        .strip_prefix("liqo-tenant-")
        .context("tenant")?
        .to_owned();
    let twin = Api::<Namespace>::all(provider_client.clone())
        .get("shop-consumer")
        .await?;
    assert_eq!(
        twin.metadata.labels.unwrap_or_default()[names::labels::TENANT],
        tenant
    );
    let pod: Pod = serde_json::from_value(liqo_e2e::restricted(json!({
        "metadata": { "name": "web", "namespace": "shop" },
        "spec": { "containers": [{ "name": "web", "image": "nginx" }] },
    })))?;
    let pods: Api<Pod> = Api::namespaced(consumer_client.clone(), "shop");
    pods.create(&PostParams::default(), &pod).await?;
    wait_for("the offloaded pod Running", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            Ok(pods
                .get("web")
                .await?
                .status
                .and_then(|s| s.phase)
                .as_deref()
                == Some("Running"))
        }
    })
    .await?;
    let remote = Api::<Pod>::namespaced(provider_client.clone(), "shop-consumer")
        .list(&ListParams::default())
        .await?;
    assert_eq!(remote.items.len(), 1, "one remote pod");

    // A second run resumes: nothing changes, nothing is claimed again.
    pair.on_consumer(&["peer", "--token-file", &path]).success();
    // The token had one use: it revoked itself when used.
    let spent: PeeringToken = PeeringToken::decode(&text)?;
    until_unauthorized("the spent token to stop working", || {
        bootstrap_client(&spent, None)
    })
    .await?;

    // info on both sides, as with two kubeconfigs.
    let out = pair.on_consumer(&["info", "-o", "json"]).success();
    assert!(out.stdout.contains("provider-1"), "{}", out.stdout);
    let out = pair.on_provider(&["info", "-o", "json"]).success();
    assert!(out.stdout.contains(&tenant_ns), "{}", out.stdout);

    // Unpeer with the consumer's kubeconfig only: refused while a
    // namespace is offloaded, then forced (its twin goes too).
    let out = pair
        .on_consumer(&["unpeer", "--cluster-id", "provider-1"])
        .user_error(6);
    assert!(out.error_line().contains("shop"), "{}", out.stderr);
    pair.on_consumer(&["unpeer", "--cluster-id", "provider-1", "--force"])
        .success();
    Api::<Namespace>::all(consumer_client.clone())
        .delete("shop", &Default::default())
        .await?;
    let stable = |s: BTreeSet<String>| -> BTreeSet<String> {
        // Service account token Secrets and the like come and go with
        // the clusters' controllers, not with us.
        s.into_iter()
            .filter(|o| !o.starts_with("serviceaccounts/kube-") && !o.contains("/kube-node-lease/"))
            .collect()
    };
    let (consumer_before, provider_before) = (stable(before.0), stable(before.1));
    // The provider's garbage collector removes the tenant's objects after
    // the record: give it its time.
    let settled = wait_for(
        "both clusters back as they were",
        Duration::from_secs(90),
        || {
            let (c, p) = (consumer_client.clone(), provider_client.clone());
            let (cb, pb) = (consumer_before.clone(), provider_before.clone());
            async move {
                Ok(stable(snapshot(&c).await?) == cb && stable(snapshot(&p).await?) == pb)
            }
        },
    )
    .await;
    if let Err(e) = settled {
        let (ca, pa) = (
            stable(snapshot(&consumer_client).await?),
            stable(snapshot(&provider_client).await?),
        );
        anyhow::bail!(
            "{e}: consumer +{:?} -{:?}; provider +{:?} -{:?}",
            ca.difference(&consumer_before).collect::<Vec<_>>(),
            consumer_before.difference(&ca).collect::<Vec<_>>(),
            pa.difference(&provider_before).collect::<Vec<_>>(),
            provider_before.difference(&pa).collect::<Vec<_>>()
        );
    }
    // The tenant's credential is dead with its tenancy.
    until_unauthorized("the tenant's credential to stop working", || {
        Ok(peer.clone())
    })
    .await?;
    Ok(())
}

/// A token that cannot be used is refused before anything is written,
/// each with one line: damaged, asked to expire too soon, for the provider
/// itself, for another consumer, expired.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_cannot_be_used_is_refused_before_anything_is_written() -> Result<()> {
    let pair = Pair::at(Stage::Installed).await?;
    let provider = pair.provider();
    let dir = tempfile::tempdir()?;

    let out = pair
        .on_consumer(&["peer", "--token", "liqo-token-v1.AAAA"])
        .user_error(2);
    assert!(out.error_line().contains("damaged"), "{}", out.stderr);
    let out = pair.on_provider(&["generate", "peering-token", "--expires=1m"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    let out = pair
        .on_provider(&["generate", "peering-token", "--for=provider-1"])
        .user_error(6);
    assert!(out.error_line().contains("itself"), "{}", out.stderr);

    // A token for another consumer.
    let other = generate(provider, &["--for=someone-else"]);
    let path = save(&dir, "other", &other)?;
    let out = pair
        .on_consumer(&["peer", "--token-file", &path])
        .user_error(6);
    assert!(
        out.error_line().contains("is for cluster someone-else"),
        "{}",
        out.stderr
    );
    // An expired token (its expiry rewritten: the API server's shortest
    // token lives ten minutes).
    let mut expired = PeeringToken::decode(&other)?;
    expired.expires = 1_000_000_000;
    let path = save(&dir, "expired", &expired.encode())?;
    let out = pair
        .on_consumer(&["peer", "--token-file", &path])
        .user_error(6);
    assert!(out.error_line().contains("expired"), "{}", out.stderr);

    Ok(())
}

/// With a token's bootstrap credential, its holder can claim the token's
/// tenants and do nothing else on the provider.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokens_holder_can_do_nothing_but_claim_its_tenants() -> Result<()> {
    let pair = Pair::at(Stage::Installed).await?;
    let provider = pair.provider();
    let provider_client = pair.provider_client.clone();

    // The token under test: two uses, bound to nobody.
    let text = generate(provider, &["--uses=2", "--pods=5"]);
    let held = PeeringToken::decode(&text)?;
    assert_eq!(held.tenants.len(), 2);
    let first = &held.tenants[0].id;
    let boot = bootstrap_client(&held, None)?;
    let in_liqo =
        |c: &kube::Client| -> Api<Secret> { Api::namespaced(c.clone(), names::NAMESPACE) };
    let accounts: Api<ServiceAccount> = Api::namespaced(boot.clone(), names::NAMESPACE);

    // Every other thing its holder could want.
    refused(
        "listing namespaces",
        Api::<Namespace>::all(boot.clone())
            .list(&ListParams::default())
            .await,
        &[403],
    );
    refused(
        "creating a namespace",
        Api::<Namespace>::all(boot.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({ "metadata": { "name": "mine" } }))?,
            )
            .await,
        &[403],
    );
    refused(
        "listing secrets in liqo",
        in_liqo(&boot).list(&ListParams::default()).await,
        &[403],
    );
    refused(
        "reading its own anchor",
        in_liqo(&boot).get(&objects::bootstrap(&held.id)).await,
        &[403],
    );
    refused(
        "creating any other Secret in liqo",
        in_liqo(&boot)
            .create(&PostParams::default(), &secret("grab", "Opaque"))
            .await,
        &[403],
    );
    refused(
        "creating a Secret in the tenant namespace",
        Api::<Secret>::namespaced(boot.clone(), &peering::tenant_namespace(first))
            .create(&PostParams::default(), &secret("grab", "Opaque"))
            .await,
        &[403],
    );
    refused(
        "listing pods of its tenant",
        Api::<Pod>::namespaced(boot.clone(), &peering::tenant_namespace(first))
            .list(&ListParams::default())
            .await,
        &[403],
    );
    refused(
        "reading the tenants",
        Api::<Tenant>::all(boot.clone()).get(first.as_str()).await,
        &[403],
    );
    refused(
        "minting a credential of another account",
        accounts
            .create_token_request("liqo-gateway", &PostParams::default(), &token_request(None))
            .await,
        &[403],
    );
    refused(
        "minting its tenant's credential unbound",
        accounts
            .create_token_request(
                &objects::tenant_account(first),
                &PostParams::default(),
                &token_request(None),
            )
            .await,
        &[403],
    );
    refused(
        "minting its tenant's credential bound to its own anchor",
        accounts
            .create_token_request(
                &objects::tenant_account(first),
                &PostParams::default(),
                &token_request(Some((&objects::bootstrap(&held.id), "x"))),
            )
            .await,
        &[403],
    );
    refused(
        "acting as its tenant's user",
        Api::<Pod>::namespaced(
            bootstrap_client(&held, Some(&liqo_api::authentication::peer_user(first)))?,
            &peering::tenant_namespace(first),
        )
        .list(&ListParams::default())
        .await,
        &[403],
    );
    refused(
        "impersonating another user",
        Api::<Namespace>::all(bootstrap_client(&held, Some("admin"))?)
            .list(&ListParams::default())
            .await,
        &[403],
    );
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": { "name": "token-probe" },
        "spec": {
            "request": base64_csr()?,
            "signerName": "kubernetes.io/kube-apiserver-client",
            "usages": ["client auth"],
        },
    }))?;
    refused(
        "requesting a certificate",
        Api::<CertificateSigningRequest>::all(boot.clone())
            .create(&PostParams::default(), &csr)
            .await,
        &[403],
    );
    // One made by the administrator, which the token may not approve.
    Api::<CertificateSigningRequest>::all(provider_client.clone())
        .create(&PostParams::default(), &csr)
        .await?;
    let approval = json!({ "status": { "conditions": [{
        "type": "Approved", "status": "True", "reason": "Probe", "message": "probe",
    }]}});
    refused(
        "approving a certificate request",
        Api::<CertificateSigningRequest>::all(boot.clone())
            .patch_approval(
                "token-probe",
                &PatchParams::default(),
                &Patch::Merge(&approval),
            )
            .await,
        &[403],
    );
    // Another token's tenant: its claim name is not this token's.
    let third = PeeringToken::decode(&generate(provider, &[]))?;
    refused(
        "claiming another token's tenant",
        in_liqo(&boot)
            .create(
                &PostParams::default(),
                &secret(
                    &objects::claim(&third.id, &third.tenants[0].id),
                    token::CLAIM_SECRET_TYPE,
                ),
            )
            .await,
        &[403],
    );

    Ok(())
}

/// A tenant claimed with a token cannot be claimed again, nor its
/// credential minted by another holder of the token. Revoked, the token
/// stops working and its unclaimed tenants go, while the peering made
/// with it stays; a tenancy the provider ends alone
/// leaves the consumer a dead credential, which it cleans up told why.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_tenant_is_its_consumers_alone_until_revoked_or_ended() -> Result<()> {
    let pair = Pair::at(Stage::Installed).await?;
    let (consumer, provider) = (pair.consumer(), pair.provider());
    let provider_client = pair.provider_client.clone();
    let dir = tempfile::tempdir()?;
    let text = generate(provider, &["--uses=2", "--pods=5"]);
    let held = PeeringToken::decode(&text)?;
    let (first, second) = (&held.tenants[0].id, &held.tenants[1].id);
    let boot = bootstrap_client(&held, None)?;
    let accounts: Api<ServiceAccount> = Api::namespaced(boot.clone(), names::NAMESPACE);

    // The legitimate use: the consumer takes the first tenant.
    let path = save(&dir, "token", &text)?;
    pair.on_consumer(&["peer", "--token-file", &path]).success();
    // Its claim cannot be made again, and its credential cannot be
    // minted again by another holder of the token: the UID is unknown.
    refused(
        "claiming the taken tenant again",
        Api::<Secret>::namespaced(boot.clone(), names::NAMESPACE)
            .create(
                &PostParams::default(),
                &secret(&objects::claim(&held.id, first), token::CLAIM_SECRET_TYPE),
            )
            .await,
        &[409],
    );
    refused(
        "minting the taken tenant's credential with a guessed UID",
        accounts
            .create_token_request(
                &objects::tenant_account(first),
                &PostParams::default(),
                &token_request(Some((
                    &objects::claim(&held.id, first),
                    "00000000-0000-4000-8000-000000000000",
                ))),
            )
            .await,
        &[409, 403, 400],
    );
    // The provider sees who took it.
    let claim = Api::<Secret>::namespaced(provider_client.clone(), names::NAMESPACE)
        .get(&objects::claim(&held.id, first))
        .await?;
    assert_eq!(
        claim.metadata.labels.unwrap_or_default()[names::labels::PEER_CLUSTER_ID],
        "consumer-1"
    );

    // Revoked: the bootstrap stops working, the unclaimed tenant goes,
    // the peering made with it stays.
    pair.on_provider(&["revoke", "peering-token", &held.id])
        .success();
    until_unauthorized("the revoked token to stop working", || {
        bootstrap_client(&held, None)
    })
    .await?;
    let tenants: Api<Tenant> = Api::all(provider_client.clone());
    wait_for(
        "the unclaimed tenant removed",
        Duration::from_secs(30),
        || {
            let tenants = tenants.clone();
            let second = second.clone();
            async move { Ok(tenants.get_opt(second.as_str()).await?.is_none()) }
        },
    )
    .await?;
    assert!(tenants.get_opt(first.as_str()).await?.is_some());
    let out = pair
        .on_consumer(&["info", "peer", "provider-1", "-o", "json"])
        .success();
    assert!(out.stdout.contains("provider-1"), "{}", out.stdout);
    // A revoked token used by a new consumer: one line.
    pair.on_provider(&["revoke", "peering-token", "nosuch00"])
        .user_error(7);
    // The provider takes the credential back alone: it stops working.
    let peer = liqo_e2e::peer_client(consumer, &consumer.client().await?, "provider-1").await?;
    pair.on_provider(&["unpeer", "--tenant", first.as_str(), "--yes"])
        .success();
    until_unauthorized("the tenant's credential to stop working", || {
        Ok(peer.clone())
    })
    .await?;
    // The consumer then cleans its side alone, told why.
    let out = pair
        .on_consumer(&["unpeer", "--cluster-id", "provider-1"])
        .success();
    assert!(out.stdout.contains("no longer peers"), "{}", out.stdout);
    assert!(out.stderr.contains("ended the tenancy"), "{}", out.stderr);
    let path = save(&dir, "again", &text)?;
    let out = pair
        .on_consumer(&["peer", "--token-file", &path])
        .user_error(6);
    assert!(
        out.error_line().contains("revoked, used up or has expired"),
        "{}",
        out.stderr
    );
    Ok(())
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_through_request_and_response_files() -> Result<()> {
    let pair = Pair::at(Stage::Installed).await?;
    let (consumer, provider) = (pair.consumer(), pair.provider());
    let provider_client = pair.provider_client.clone();
    let dir = tempfile::tempdir()?;
    let path = |name: &str| -> Result<String> {
        Ok(dir.path().join(name).to_str().context("path")?.to_owned())
    };
    let (request, response) = (path("request.json")?, path("response.json")?);

    pair.on_consumer(&["peer", "request", "--file", &request, "--cpu=1", "--pods=5"])
        .success();
    let text = std::fs::read_to_string(&request)?;
    assert!(!text.contains("PRIVATE KEY"), "the key left the consumer");
    let provider_before = snapshot(&provider_client).await?;

    // A request altered on the way (another cluster's name in it) is
    // refused before anything is written on the provider.
    let mut altered: serde_json::Value = serde_json::from_str(&text)?;
    altered["consumer"]["clusterId"] = json!("someone-else");
    let altered_path = path("altered.json")?;
    std::fs::write(&altered_path, altered.to_string())?;
    let out = pair
        .on_provider(&[
            "peer",
            "accept",
            "--file",
            &altered_path,
            "--response-file",
            &response,
        ])
        .user_error(6);
    assert!(out.error_line().contains("subject"), "{}", out.stderr);
    assert_eq!(snapshot(&provider_client).await?, provider_before);

    pair.on_provider(&[
        "peer",
        "accept",
        "--file",
        &request,
        "--response-file",
        &response,
    ])
    .success();
    let answer: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&response)?)?;
    assert_eq!(answer["kind"], "PeeringResponse");
    assert_eq!(answer["grant"]["cpu"], "1");
    assert!(!answer.to_string().contains("PRIVATE KEY"));

    // A second request replaces the first: its response no longer fits.
    let newer = path("newer.json")?;
    pair.on_consumer(&["peer", "request", "--file", &newer])
        .success();
    let out = pair
        .on_consumer(&["peer", "complete", "--file", &response])
        .user_error(6);
    assert!(
        out.error_line().contains("pending request"),
        "{}",
        out.stderr
    );
    // Accepting the newer one (the tenant exists: accept is idempotent)
    // and completing with it peers.
    pair.on_provider(&[
        "peer",
        "accept",
        "--file",
        &newer,
        "--response-file",
        &response,
    ])
    .success();
    let out = pair
        .on_consumer(&["peer", "complete", "--file", &response, "-o", "json"])
        .success();
    let report: serde_json::Value = serde_json::from_str(&out.stdout)?;
    assert_eq!(report["virtualNode"], "liqo-provider-1");
    assert_eq!(report["tenantNamespace"], "liqo-tenant-consumer-1");
    // The pending key is gone: it lives in the identity Secret only.
    let pending = Api::<Secret>::namespaced(consumer.client().await?, names::NAMESPACE)
        .get_opt("liqo-peering-request")
        .await?;
    assert!(pending.is_none());
    pair.on_consumer(&[
        "unpeer",
        "--remote-kubeconfig",
        provider.kubeconfig_path().to_str().context("path")?,
    ])
    .success();
    Ok(())
}

/// A CSR for another tenant's user: what a token holder would like to
/// have signed (the API server itself refuses `system:masters` for this
/// signer, even to an administrator).
fn base64_csr() -> Result<String> {
    use base64::Engine as _;
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "liqo.io:peer:another-tenant");
    let csr = params.serialize_request(&key)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(csr.pem()?))
}
