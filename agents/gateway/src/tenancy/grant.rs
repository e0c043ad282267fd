//! On a provider: each tenant's grant follows the provider's free
//! capacity while the peering lasts (docs/peering.md, "A grant that
//! follows the load"). The gateway is the provider's only agent, so it is
//! the one that watches the load; what it decides is
//! `liqo_api::following::next`, and this is its IO.
//!
//! A change is written to the Tenant record (`spec.grant`, which the
//! shares ([`super::shares`]) and so the API server's quotas follow), with
//! its time and reason in the record's `Granted` condition and an Event
//! of the tenant's share quota, in the tenant namespace. The consumer's virtual kubelet reads the
//! record and resizes its node. Nothing is kept here between rounds: the
//! grant in force and the time of its last change are the record's, so a
//! restarted gateway goes on where the last one stopped, and the policy's
//! least interval between changes holds across restarts.
//!
//! It also writes the provider's largest free node into each Tenant's
//! status (`largestFreeNode`, at most every 5 s), from which the
//! consumer's virtual kubelet refuses a pod no node of the provider has
//! room for (docs/offloading.md, "A pod no node can hold").

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Event, Namespace, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use liqo_agent_runtime::follow::{Followed, Options, follow, follow_with};
use liqo_api::authentication::Tenant;
use liqo_api::capacity;
use liqo_api::following::{self, Inputs};
use liqo_api::names::labels;
use liqo_api::sharing::{self, Amounts, SharingPolicy, SharingPolicySpec};
use serde_json::json;

use super::Tenants;

/// The field manager of the grants the gateway writes.
const MANAGER: &str = "liqo-gateway-grants";
/// Changes closer together than this are looked at once (a Deployment
/// scaled by 20 is one look, not 20).
const DEBOUNCE: Duration = Duration::from_secs(1);
/// Without any change: a full round now and then.
const PERIOD: Duration = Duration::from_secs(60);
/// After a failed round.
const RETRY: Duration = Duration::from_secs(5);
/// The least time between two writes of a tenant's largest free node,
/// which moves with every pod the provider places.
const BOUND_PERIOD: Duration = Duration::from_secs(5);

/// Keeps every tenant's grant on its share of the free capacity, for ever.
pub async fn follow_load(client: kube::Client, tenants: Tenants) {
    let (nodes, follow_nodes) = follow(
        Api::<Node>::all(client.clone()),
        watcher::Config::default().labels(&format!("!{}", labels::VIRTUAL_NODE)),
        "nodes",
    );
    // Only what the capacity needs of a pod: where it runs and what it
    // requests.
    let (pods, follow_pods) = follow_with(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed"),
        "pods",
        Options {
            trim: Some(trim_pod),
            ..Options::default()
        },
    );
    let (policies, follow_policies) = follow(
        Api::<SharingPolicy>::all(client.clone()),
        watcher::Config::default(),
        "sharing policies",
    );
    let follower = Follower {
        client,
        nodes,
        pods,
        tenants: tenants.tenants,
        twins: tenants.twins,
        policies,
        bound_written: Default::default(),
        failing: None,
    };
    tokio::join!(follow_nodes, follow_pods, follow_policies, follower.run());
}

fn trim_pod(pod: &mut Pod) {
    pod.status = None;
    pod.metadata.annotations = None;
    pod.metadata.labels = None;
    if let Some(spec) = pod.spec.as_mut() {
        let lean = |c: &mut Container| Container {
            name: std::mem::take(&mut c.name),
            resources: c.resources.take(),
            ..Container::default()
        };
        let containers = spec.containers.iter_mut().map(lean).collect();
        let init: Option<Vec<Container>> = spec
            .init_containers
            .as_mut()
            .map(|cs| cs.iter_mut().map(lean).collect());
        let node_name = spec.node_name.take();
        *spec = Default::default();
        spec.containers = containers;
        spec.init_containers = init;
        spec.node_name = node_name;
    }
}

struct Follower {
    client: kube::Client,
    nodes: Followed<Node>,
    pods: Followed<Pod>,
    tenants: Followed<Tenant>,
    twins: Followed<Namespace>,
    policies: Followed<SharingPolicy>,
    /// When each tenant's largest free node was last written: a pace, not
    /// a state (a restarted gateway writes at once what differs).
    bound_written: std::sync::Mutex<std::collections::BTreeMap<String, std::time::Instant>>,
    /// The last failure, logged once until it changes.
    failing: Option<String>,
}

/// What one tenant's round found.
enum Look {
    /// Its grant stays.
    Keep,
    /// Its grant changes, but not before this long.
    Later(Duration),
    /// Its grant changes now.
    Change {
        to: Amounts,
        from: Amounts,
        free: Amounts,
    },
}

impl Follower {
    fn current(&self) -> bool {
        self.nodes.is_current()
            && self.pods.is_current()
            && self.tenants.is_current()
            && self.twins.is_current()
            && self.policies.is_current()
    }

    async fn run(mut self) {
        let mut changed = [
            self.nodes.state.clone(),
            self.pods.state.clone(),
            self.tenants.state.clone(),
            self.twins.state.clone(),
            self.policies.state.clone(),
        ];
        let mut wait = PERIOD;
        loop {
            let [a, b, c, d, e] = &mut changed;
            tokio::select! {
                _ = a.changed() => {}
                _ = b.changed() => {}
                _ = c.changed() => {}
                _ = d.changed() => {}
                _ = e.changed() => {}
                () = tokio::time::sleep(wait) => {}
            }
            tokio::time::sleep(DEBOUNCE).await;
            if !self.current() {
                wait = PERIOD;
                continue;
            }
            wait = match self.round().await {
                Ok(next) => {
                    if self.failing.take().is_some() {
                        tracing::info!("grants followed again");
                    }
                    next
                }
                Err(error) => {
                    let text = liqo_agent_runtime::error_chain(&error);
                    if self.failing.as_ref() != Some(&text) {
                        tracing::warn!(error = %text, "cannot follow the load with the tenants' grants");
                        self.failing = Some(text);
                    }
                    RETRY
                }
            };
        }
    }

    /// One look at every tenant; when to look again at the latest.
    async fn round(&self) -> Result<Duration, kube::Error> {
        let nodes: Vec<Node> = self
            .nodes
            .store
            .state()
            .iter()
            .map(|n| (**n).clone())
            .collect();
        let pods = self.pods.store.state();
        let pods: Vec<&Pod> = pods.iter().map(|p| &**p).collect();
        let twins = self.twins.store.state();
        let policies = self.policies.store.state();
        let mut next = PERIOD;
        for tenant in self.tenants.store.state() {
            if tenant.meta().deletion_timestamp.is_some() {
                continue;
            }
            let open = nodes
                .iter()
                .filter(|n| capacity::open_to(n, &tenant.spec.admission));
            let largest = capacity::largest_free(open, &pods).to_resources();
            match self.bound(&tenant, &largest).await {
                Ok(Some(after)) => next = next.min(after),
                Ok(None) => {}
                Err(error) => {
                    tracing::debug!(tenant = %tenant.name_any(), %error, "writing the largest free node");
                }
            }
            let id = tenant.spec.cluster_id.to_string();
            let policy = policies
                .iter()
                .find(|p| p.name_any() == id)
                .or_else(|| policies.iter().find(|p| p.name_any() == "default"))
                .map_or_else(sharing::default_policy, |p| p.spec.clone());
            let mut own = BTreeSet::from([tenant.spec.namespace.clone()]);
            own.extend(super::twins_of(&twins, &id).map(|n| n.name_any()));
            match look(&tenant, &policy, &nodes, &pods, &own) {
                Ok(Look::Keep) => {}
                Ok(Look::Later(after)) => next = next.min(after),
                Ok(Look::Change { to, from, free }) => {
                    self.write(&tenant, to, from, free).await?;
                }
                Err(why) => {
                    tracing::debug!(tenant = %id, %why, "its grant cannot follow the load");
                }
            }
        }
        Ok(next)
    }

    /// Writes the provider's largest free node into the tenant's record
    /// where it says another, at most every [`BOUND_PERIOD`]; when to look
    /// again if it had to wait.
    async fn bound(
        &self,
        tenant: &Tenant,
        largest: &sharing::Resources,
    ) -> Result<Option<Duration>, kube::Error> {
        let recorded = tenant
            .status
            .as_ref()
            .and_then(|s| s.largest_free_node.as_ref());
        if recorded == Some(largest) {
            return Ok(None);
        }
        let name = tenant.name_any();
        {
            let mut written = self.bound_written.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(at) = written.get(&name)
                && at.elapsed() < BOUND_PERIOD
            {
                return Ok(Some(BOUND_PERIOD - at.elapsed()));
            }
            written.insert(name.clone(), std::time::Instant::now());
        }
        let params = PatchParams {
            field_manager: Some(MANAGER.to_owned()),
            ..PatchParams::default()
        };
        Api::<Tenant>::all(self.client.clone())
            .patch_status(
                &name,
                &params,
                &Patch::Merge(json!({ "status": { "largestFreeNode": largest } })),
            )
            .await?;
        Ok(None)
    }

    /// Writes the new grant, then when and why in the record's condition,
    /// then an Event in the tenant namespace.
    async fn write(
        &self,
        tenant: &Tenant,
        to: Amounts,
        from: Amounts,
        free: Amounts,
    ) -> Result<(), kube::Error> {
        let name = tenant.name_any();
        let tenants: Api<Tenant> = Api::all(self.client.clone());
        let params = PatchParams {
            field_manager: Some(MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let grant = to.to_resources();
        tenants
            .patch(
                &name,
                &params,
                &Patch::Merge(json!({ "spec": { "grant": grant } })),
            )
            .await?;
        let message = format!(
            "grant {} (was {}): the free capacity is now {}",
            show(to),
            show(from),
            show(free)
        );
        let now = Timestamp::now();
        let condition = Condition {
            type_: following::GRANTED.to_owned(),
            status: "True".to_owned(),
            reason: following::FOLLOWED.to_owned(),
            message: message.clone(),
            last_transition_time: Time(now),
            observed_generation: None,
        };
        tenants
            .patch_status(
                &name,
                &params,
                &Patch::Merge(json!({ "status": { "conditions": [condition] } })),
            )
            .await?;
        tracing::info!(tenant = %name, %message, "grant changed");
        // Of the tenant's share in its tenant namespace, which the grant
        // bounds: an Event of a cluster-scoped object (the Tenant) could
        // only be in `default`, and would outlive the tenancy there; this
        // one goes with the tenant namespace, where the consumer may read
        // it.
        let share = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("ResourceQuota".to_owned()),
            name: Some(liqo_api::shares::SHARE_QUOTA.to_owned()),
            namespace: Some(tenant.spec.namespace.clone()),
            ..ObjectReference::default()
        };
        let event = following::grant_changed_event(
            &tenant.spec.namespace,
            share,
            "liqo-gateway",
            "liqo-gateway",
            message,
            now,
        );
        let events: Api<Event> = Api::namespaced(self.client.clone(), &tenant.spec.namespace);
        // The grant is written: an Event that cannot be is only logged.
        if let Err(error) = events.create(&PostParams::default(), &event).await {
            tracing::warn!(tenant = %name, %error, "cannot record the grant's change as an Event");
        }
        Ok(())
    }
}

/// What tenant `tenant` under `policy` should be granted now, given the
/// provider's `nodes` and `pods` and the tenant's `own` namespaces.
fn look(
    tenant: &Tenant,
    policy: &SharingPolicySpec,
    nodes: &[Node],
    pods: &[&Pod],
    own: &BTreeSet<String>,
) -> Result<Look, sharing::SharingError> {
    if !following::follows(policy) {
        return Ok(Look::Keep);
    }
    let (free, used) = capacity::for_tenant(nodes, pods, |p| {
        p.metadata
            .namespace
            .as_ref()
            .is_some_and(|ns| own.contains(ns))
    });
    let current = Amounts::from_resources(&tenant.spec.grant)?;
    let request = tenant
        .spec
        .request
        .as_ref()
        .map(Amounts::from_resources)
        .transpose()?;
    let Some(to) = following::next(Inputs {
        policy,
        request,
        current,
        free,
        used,
    })?
    else {
        return Ok(Look::Keep);
    };
    let since = last_change(tenant).map(|at| {
        let elapsed = Timestamp::now().duration_since(at);
        Duration::try_from(elapsed).unwrap_or_default()
    });
    let interval = policy.following.min_interval();
    match since {
        Some(since) if since < interval => Ok(Look::Later(interval - since)),
        _ => Ok(Look::Change {
            to,
            from: current,
            free,
        }),
    }
}

/// When the tenant's grant last changed: its `Granted` condition's time
/// (written at peer time, and at each change).
fn last_change(tenant: &Tenant) -> Option<Timestamp> {
    following::granted(&tenant.status.as_ref()?.conditions).map(|c| c.last_transition_time.0)
}

/// `cpu 2, memory 4Gi, pods 10`.
fn show(a: Amounts) -> String {
    let r = a.to_resources();
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
