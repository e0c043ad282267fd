//! `liqoctl peer`: the local cluster (the consumer) peers with a provider
//! whose kubeconfig it is given. Checks everything it can before it writes
//! (both installed, not the same cluster, versions, the provider's policy
//! and the grant), then runs its steps; a failed step rolls back what the
//! run created on both clusters, and a re-run resumes.

use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use liqo_api::ClusterIdentity;
use liqo_api::authentication::{Tenant, peer_user};
use liqo_api::core::{ForeignCluster, ForeignClusterSpec};
use liqo_api::names::{self, labels, peering};
use liqo_api::offloading::NamespaceOffloading;
use liqo_api::sharing::{self, AboveOffer, Amounts, Resources, SharingError, SharingPolicySpec};
use serde::Serialize;
use serde_json::json;

use crate::cli::{GlobalArgs, PeerArgs};
use crate::commands::install::{installed_pod_placement, read_identity};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::k8s::agents::{self, Readiness};
use crate::k8s::ownership;
use crate::k8s::wait::{self, Waited};
use crate::manifests::{Manifest, common_labels, from_json};
use crate::peering::{Journal, Side, capacity, identity, network, tenant, terms, virtual_kubelet};
use crate::printer::Printer;

/// What `peer` reports (`-o json|yaml`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Report {
    pub consumer: String,
    pub provider: String,
    pub provider_cluster_id: String,
    pub grant: Resources,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<sharing::Cost>,
    pub certificate_expiry: String,
    pub tenant_namespace: String,
    pub virtual_node: String,
    /// The tunnel, unless peered with --no-network.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<network::Linked>,
}

pub async fn run(args: &PeerArgs, global: &GlobalArgs, printer: Printer) -> anyhow::Result<()> {
    if let Some(exchange) = &args.exchange {
        return crate::commands::exchange::run(exchange, global, printer).await;
    }
    if args.token.is_some() || args.token_file.is_some() {
        return crate::commands::token::peer(args, global, printer).await;
    }
    let request = parse_request(&args.request)?;
    let Some(remote) = args.remote.remote_kubeconfig.as_deref() else {
        return Err(UserError::Usage(
            "pass the provider's kubeconfig with --remote-kubeconfig, or a peering token from its \
             administrator with --token-file"
                .to_owned(),
        )
        .into());
    };
    let local = ClusterClient::local(global).await?;
    let remote =
        ClusterClient::connect(Some(remote), args.remote.remote_context.as_deref()).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);

    let mut reports =
        vec![peer_one(&local, &remote, request.as_ref(), args, &printer, deadline).await?];
    if args.bidirectional {
        reports.push(peer_one(&remote, &local, request.as_ref(), args, &printer, deadline).await?);
    }
    print_reports(&reports, args.output.output, &printer)
}

/// What `peer` prints: the reports as asked, else a line each.
pub(crate) fn print_reports(
    reports: &[Report],
    output: Option<crate::cli::OutputFormat>,
    printer: &Printer,
) -> anyhow::Result<()> {
    if let Some(format) = output {
        return match reports {
            [one] => printer.structured(one, format),
            all => printer.structured(&all, format),
        };
    }
    for report in reports {
        printer.result(format!(
            "cluster {} now peers with {} ({}): virtual node {} offers {}",
            report.consumer,
            report.provider,
            report.provider_cluster_id,
            report.virtual_node,
            show(&report.grant)
        ));
        if let Some(linked) = &report.network {
            printer.result(format!(
                "  network: tunnel to {}; its pods are seen here as {}, ours there as {}",
                linked.endpoint, linked.provider_pods_seen_as, linked.consumer_pods_seen_as
            ));
        }
    }
    Ok(())
}

/// One direction: `consumer` peers with `provider`.
async fn peer_one(
    consumer: &ClusterClient,
    provider: &ClusterClient,
    request: Option<&Amounts>,
    args: &PeerArgs,
    printer: &Printer,
    deadline: tokio::time::Instant,
) -> anyhow::Result<Report> {
    let step = printer.step(format!(
        "Checking clusters {} and {}",
        consumer.name, provider.name
    ));
    let plan = match Plan::make(consumer, provider, request, args).await {
        Ok(plan) => plan,
        Err(e) => {
            step.fail("");
            return Err(e);
        }
    };
    step.done(format!("grant {}", show(&plan.grant)));

    let mut journal = Journal::default();
    let outcome = plan
        .carry_out(consumer, provider, &mut journal, printer, !args.no_network)
        .await;
    let (expiry, network) = match outcome {
        Ok(done) => done,
        Err(e) => {
            let step = printer.step("Rolling back what this run created");
            let left = journal.roll_back(consumer, provider).await;
            if left.is_empty() {
                step.done("");
            } else {
                step.fail(format!("could not remove {}", left.join(", ")));
            }
            return Err(e);
        }
    };

    // Past this point everything is in place: a slow node is waited for,
    // not rolled back; the same command picks up from here.
    let node_name = wait_for_virtual_node(
        consumer,
        &plan.provider_id.cluster_id,
        deadline,
        args.timeout,
        printer,
    )
    .await?;

    Ok(Report {
        consumer: consumer.name.clone(),
        provider: provider.name.clone(),
        provider_cluster_id: plan.provider_id.cluster_id.to_string(),
        grant: plan.grant.clone(),
        cost: plan.policy.cost.clone(),
        certificate_expiry: expiry,
        tenant_namespace: peering::tenant_namespace(&plan.consumer_id.cluster_id),
        virtual_node: node_name,
        network,
    })
}

/// Waits until the virtual node of `provider` is Ready and its agent's pod
/// passes its readiness probe; returns the node's name.
pub(crate) async fn wait_for_virtual_node(
    consumer: &ClusterClient,
    provider: &liqo_api::ClusterId,
    deadline: tokio::time::Instant,
    timeout: u64,
    printer: &Printer,
) -> anyhow::Result<String> {
    let node_name = peering::virtual_node(provider);
    let step = printer.step(format!("Waiting for the virtual node {node_name}"));
    // The agent's pod first: an image its node cannot pull is told at
    // once. The node is Ready as soon as the agent registers it, and the
    // pod passes its readiness probe about then; `info` shows both, so
    // both are waited for.
    let vk = peering::virtual_kubelet(provider);
    let ready = match agents::wait_ready(consumer, &vk, wait::left(deadline)).await? {
        Readiness::Ready => {
            let nodes: Api<Node> = Api::all(consumer.client.clone());
            let waited = wait::until(
                consumer,
                nodes,
                &node_name,
                |n: Option<&Node>| n.is_some_and(node_ready),
                wait::left(deadline),
                &format!("waiting for the virtual node {node_name}"),
            )
            .await?;
            matches!(waited, Waited::Done(_))
        }
        Readiness::TimedOut => false,
        Readiness::CannotPull(failure) => {
            step.fail("image not found");
            return Err(UserError::NotFound(failure.advice("`liqoctl peer`")).into());
        }
        Readiness::CannotMount(failure) => {
            step.fail("the node lacks a device");
            return Err(UserError::NotFound(failure.advice("`liqoctl peer`")).into());
        }
    };
    if !ready {
        step.fail("timed out");
        return Err(UserError::Timeout(format!(
            "the virtual node {node_name} is not ready after {timeout}s; see `kubectl -n {ns} logs deploy/{vk}` \
             on cluster {}, then run peer again",
            consumer.name,
            ns = names::NAMESPACE,
        ))
        .into());
    }
    step.done("");
    Ok(node_name)
}

/// The amounts asked for with `--cpu`, `--memory` and `--pods`, if any.
pub(crate) fn parse_request(args: &crate::cli::RequestArgs) -> Result<Option<Amounts>, UserError> {
    let crate::cli::RequestArgs {
        cpu, memory, pods, ..
    } = args;
    if cpu.is_none() && memory.is_none() && pods.is_none() {
        return Ok(None);
    }
    let quantity = |flag: &str, v: &Option<String>, parse: fn(&str) -> Option<u64>| {
        v.as_deref()
            .map(|text| match parse(text) {
                None => Err(UserError::Usage(format!(
                    "{flag}: {text:?} is not a quantity such as 2, 500m or 4Gi"
                ))),
                // Zero would ask for nothing, which a grant reads as "all
                // that is offered": said, rather than taken.
                Some(0) => Err(UserError::Usage(format!(
                    "{flag}: {text:?} asks for nothing; ask for more than 0, or leave {flag} out \
                     to take what the provider offers"
                ))),
                Some(n) => Ok(n),
            })
            .transpose()
            .map(Option::unwrap_or_default)
    };
    Ok(Some(Amounts {
        cpu_millis: quantity("--cpu", cpu, sharing::parse_cpu_millis)?,
        memory_bytes: quantity("--memory", memory, sharing::parse_bytes)?,
        pods: quantity("--pods", pods, |s| s.parse().ok())?,
    }))
}

pub(crate) fn show(r: &Resources) -> String {
    let q = |q: &Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.as_ref().map_or("0".to_owned(), |q| q.0.clone())
    };
    format!(
        "cpu {}, memory {}, pods {}",
        q(&r.cpu),
        q(&r.memory),
        q(&r.pods)
    )
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Everything decided before anything is written.
pub(crate) struct Plan {
    /// Issue a new certificate whatever the current one's state.
    renew: bool,
    certificate_lifetime: Option<u64>,
    consumer_id: ClusterIdentity,
    pub provider_id: ClusterIdentity,
    pub policy: SharingPolicySpec,
    request: Option<Resources>,
    pub grant: Resources,
}

impl Plan {
    async fn make(
        consumer: &ClusterClient,
        provider: &ClusterClient,
        request: Option<&Amounts>,
        args: &PeerArgs,
    ) -> anyhow::Result<Self> {
        let consumer_id = installed(consumer).await?;
        if !compatible(&consumer_id.version) {
            return Err(UserError::Refused(format!(
                "cluster {} runs liqo-rs {}, which liqoctl {} cannot peer; upgrade it with `liqoctl install`",
                consumer.name,
                consumer_id.version,
                liqo_api::VERSION
            ))
            .into());
        }
        Self::for_consumer(
            consumer_id,
            &consumer.name,
            provider,
            request,
            args.request.require_request,
            args.certificate_lifetime,
        )
        .await
        .map(|plan| Self {
            renew: args.renew,
            ..plan
        })
    }

    /// What `provider` grants the consumer `consumer_id` (called
    /// `consumer_name` in messages), checked as `make` checks it.
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
    async fn carry_out(
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
        refuse_foreign(provider, &objects).await?;
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
                show(&self.grant),
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

/// What the consumer records of a peering in its ForeignCluster.
pub(crate) struct Recorded<'a> {
    pub provider: &'a ClusterIdentity,
    pub request: Option<&'a Resources>,
    pub grant: &'a Resources,
    pub cost: Option<&'a sharing::Cost>,
    /// When the consumer's credential expires.
    pub expiry: &'a str,
    pub tenant_namespace: String,
}

/// The ForeignCluster of the provider on the consumer, with the grant in
/// its status; returns its UID, which the virtual kubelet's objects name
/// as their owner.
pub(crate) async fn record(
    consumer: &ClusterClient,
    journal: &mut Journal,
    r: &Recorded<'_>,
) -> anyhow::Result<String> {
    let p = r.provider;
    let mut fc_labels = common_labels("peering");
    fc_labels.insert(labels::PEER_CLUSTER_ID.to_owned(), p.cluster_id.to_string());
    let fc = ForeignCluster {
        metadata: kube::core::ObjectMeta {
            name: Some(p.cluster_id.to_string()),
            labels: Some(fc_labels),
            ..Default::default()
        },
        spec: ForeignClusterSpec {
            cluster_id: p.cluster_id.clone(),
            cluster_name: p.cluster_name.clone(),
            api_server_url: None,
            outgoing: true,
            incoming: false,
            cluster_labels: p.labels.clone(),
            request: r.request.cloned(),
        },
        status: None,
    };
    refuse_foreign(consumer, &[Manifest::ForeignCluster(Box::new(fc.clone()))]).await?;
    journal
        .apply(
            Side::Consumer,
            consumer,
            Manifest::ForeignCluster(Box::new(fc)),
        )
        .await?;
    let api: Api<ForeignCluster> = Api::all(consumer.client.clone());
    let name = p.cluster_id.as_str();
    let now = Time(Timestamp::now());
    let condition = Condition {
        type_: "Granted".to_owned(),
        status: "True".to_owned(),
        reason: "PolicyGranted".to_owned(),
        message: format!("cluster {} granted {}", p.cluster_name, show(r.grant)),
        last_transition_time: now,
        observed_generation: None,
    };
    let status = json!({ "status": {
        "grant": r.grant,
        "cost": r.cost,
        "certificateExpiry": r.expiry,
        "tenantNamespace": r.tenant_namespace,
        "conditions": [condition],
    }});
    let fc = api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(|e| {
            consumer.explain(e, &format!("recording the grant in ForeignCluster {name}"))
        })?;
    Ok(fc.uid().unwrap_or_default())
}

/// The consumer's side of a peering once its identity is in place (a
/// token's or a response file's): the ForeignCluster, the virtual kubelet
/// (rolled back with whatever `journal` already holds if they fail), the
/// wait for the virtual node, and the report.
pub(crate) async fn finish_on_consumer(
    consumer: &ClusterClient,
    provider: &ClusterClient,
    mut journal: Journal,
    recorded: Recorded<'_>,
    finish: Finish,
    printer: &Printer,
) -> anyhow::Result<()> {
    let Finish {
        deadline,
        timeout,
        output,
        network,
    } = finish;
    let step = printer.step(format!(
        "Starting the virtual kubelet on cluster {}",
        consumer.name
    ));
    let started = async {
        let uid = record(consumer, &mut journal, &recorded).await?;
        start_virtual_kubelet(consumer, &mut journal, &recorded.provider.cluster_id, &uid).await
    }
    .await;
    if let Err(e) = started {
        step.fail("");
        for object in journal.roll_back(consumer, provider).await {
            printer.info(format!("  could not remove {object}"));
        }
        return Err(e);
    }
    step.done("");
    let linked = match network {
        false => None,
        true => {
            let linked = async {
                let consumer_id = installed(consumer).await?;
                network::connect(
                    consumer,
                    &consumer_id,
                    provider,
                    recorded.provider,
                    &recorded.tenant_namespace,
                    &mut journal,
                    printer,
                )
                .await
            }
            .await;
            match linked {
                Ok(linked) => Some(linked),
                Err(e) => {
                    for object in journal.roll_back(consumer, provider).await {
                        printer.info(format!("  could not remove {object}"));
                    }
                    return Err(e);
                }
            }
        }
    };
    let virtual_node = wait_for_virtual_node(
        consumer,
        &recorded.provider.cluster_id,
        deadline,
        timeout,
        printer,
    )
    .await?;
    let report = Report {
        consumer: consumer.name.clone(),
        provider: recorded.provider.cluster_name.clone(),
        provider_cluster_id: recorded.provider.cluster_id.to_string(),
        grant: recorded.grant.clone(),
        cost: recorded.cost.cloned(),
        certificate_expiry: recorded.expiry.to_owned(),
        tenant_namespace: recorded.tenant_namespace.clone(),
        virtual_node,
        network: linked,
    };
    print_reports(&[report], output, printer)
}

/// How [`finish_on_consumer`] ends: its deadline (`timeout`, in seconds,
/// for messages), the output format, and whether to link the networks.
pub(crate) struct Finish {
    pub deadline: tokio::time::Instant,
    pub timeout: u64,
    pub output: Option<crate::cli::OutputFormat>,
    pub network: bool,
}

/// The virtual kubelet of `provider` on the consumer, owned by its
/// ForeignCluster (`uid`).
pub(crate) async fn start_virtual_kubelet(
    consumer: &ClusterClient,
    journal: &mut Journal,
    provider: &liqo_api::ClusterId,
    uid: &str,
) -> anyhow::Result<()> {
    let placement = installed_pod_placement(consumer).await?;
    let mut objects = virtual_kubelet::manifests(
        provider,
        Some(uid),
        &placement.node_selector,
        &placement.tolerations,
        &placement.images,
    );
    // Its rights in the namespaces offloaded already (`liqoctl offload`
    // binds them in those offloaded later).
    let offloadings: Api<NamespaceOffloading> = Api::all(consumer.client.clone());
    let offloaded = offloadings
        .list(&Default::default())
        .await
        .map_err(|e| consumer.explain(e, "listing offloaded namespaces"))?;
    let bindings = offloaded.items.iter().filter_map(|o| {
        let ns = o.metadata.namespace.as_deref()?;
        Some(virtual_kubelet::offloaded_namespace_binding(
            provider,
            ns,
            o.metadata.uid.as_deref(),
        ))
    });
    // Before the agent starts, so that it finds them readable.
    let at = objects
        .iter()
        .position(|m| matches!(m, Manifest::Deployment(_)))
        .unwrap_or(objects.len());
    objects.splice(at..at, bindings);
    refuse_foreign(consumer, &objects).await?;
    for m in objects {
        journal.apply(Side::Consumer, consumer, m).await?;
    }
    Ok(())
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

pub(crate) async fn installed(cluster: &ClusterClient) -> anyhow::Result<ClusterIdentity> {
    read_identity(cluster).await?.ok_or_else(|| {
        UserError::NotFound(format!(
            "liqo-rs is not installed on cluster {}; run `liqoctl install` there first",
            cluster.name
        ))
        .into()
    })
}

/// Refuses, naming them, objects of the names the peering uses that
/// liqoctl did not make.
pub(crate) async fn refuse_foreign(
    cluster: &ClusterClient,
    objects: &[Manifest],
) -> anyhow::Result<()> {
    let foreign = ownership::foreign(cluster, objects).await?;
    if foreign.is_empty() {
        return Ok(());
    }
    Err(UserError::Refused(format!(
        "cluster {} already has {}, which liqoctl did not create; remove or rename it, then peer again",
        cluster.name,
        foreign.join(", ")
    ))
    .into())
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

/// Same major and minor version (a 0.x minor is a major).
pub(crate) fn compatible(version: &str) -> bool {
    let key = |v: &str| -> Option<(u64, u64)> {
        let mut parts = v.split('.');
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    };
    key(version).is_some() && key(version) == key(liqo_api::VERSION)
}
