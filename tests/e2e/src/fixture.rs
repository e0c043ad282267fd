//! The fixture of the end-to-end tests: the clusters a test starts (the
//! specs of [`spec`], one cluster as [`One`], a consumer and a provider as
//! [`Pair`] at the stage a test starts from: started, installed, peered, a
//! namespace offloaded), and the waits and pod predicates every test
//! shares. Every cluster a test starts is held in a [`Testbed`], whose drop
//! stops it and keeps its folder when the test fails.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use liqo_e2e::fixture::{Pair, Stage};
//! let pair = Pair::at(Stage::Offloaded("shop")).await?;
//! let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(pair.consumer_client.clone(), "shop");
//! # Ok(()) }
//! ```

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use liqo_testbed::{Cluster, ClusterSpec, Testbed};

use crate::{Run, liqoctl};

/// How long a test waits for the clusters to reach a state before it fails:
/// long enough for a loaded machine running four tests at once (a wait
/// that succeeds returns as soon as it can), short enough that a real hang
/// ends the run.
pub const WAIT: Duration = Duration::from_secs(180);

/// The consumer's cluster ID ([`Pair`] installs it so).
pub const CONSUMER_ID: &str = "consumer-1";
/// The provider's cluster ID.
pub const PROVIDER_ID: &str = "provider-1";

/// What the consumer and the provider hold, as [`crate::snapshot`] lists
/// it: consumer first.
pub type Holdings = (BTreeSet<String>, BTreeSet<String>);

/// A cluster of `nodes` kwok nodes and a host-process node running the
/// agents of this build; `index` sets its CIDRs (see [`ClusterSpec::new`]).
/// A test that needs more changes this spec.
pub fn spec(name: &str, index: u8, nodes: u32) -> ClusterSpec {
    let mut spec = ClusterSpec::new(name, index);
    spec.nodes = nodes;
    spec.agent_bin_dir = Some(crate::bin_dir());
    spec
}

/// A cluster whose one node is a real kubelet (the testbed's real-node
/// mode) holding the agents' images made from this build: no kwok node, so
/// that every pod runs there.
pub fn real_node_spec(name: &str, index: u8) -> ClusterSpec {
    let mut spec = spec(name, index, 0);
    spec.real_node = true;
    spec
}

/// Starts the clusters of `specs` together, in this order: for the tests
/// that [`One`] and [`Pair`] do not fit (three clusters, say).
pub async fn start(specs: Vec<ClusterSpec>) -> anyhow::Result<Testbed> {
    Ok(Testbed::start(specs).await?)
}

/// One cluster with a client; stopped, and its folder removed, when
/// dropped (kept when the test fails).
#[allow(missing_debug_implementations, reason = "kube::Client has no Debug")]
pub struct One {
    pub testbed: Testbed,
    pub client: kube::Client,
}

impl One {
    /// Starts the cluster of `spec`.
    pub async fn start(spec: ClusterSpec) -> anyhow::Result<Self> {
        let testbed = start(vec![spec]).await?;
        let client = testbed.clusters()[0].client().await?;
        Ok(Self { testbed, client })
    }

    pub fn cluster(&self) -> &Cluster {
        &self.testbed.clusters()[0]
    }

    /// The cluster, to change (stop or pause its API server).
    pub fn cluster_mut(&mut self) -> &mut Cluster {
        &mut self.testbed.clusters_mut()[0]
    }

    /// Stops the cluster and removes its folder now (see [`Testbed::stop`]).
    pub fn stop(self) {
        self.testbed.stop();
    }
}

/// Where a test starts.
#[derive(Debug, Clone, Copy)]
pub enum Stage<'a> {
    /// Both clusters running, nothing of ours in them.
    Started,
    /// liqo-rs installed on both (IDs [`CONSUMER_ID`], [`PROVIDER_ID`]).
    Installed,
    /// Installed, and the consumer peered with the provider by `liqoctl
    /// peer --remote-kubeconfig`; the virtual node is Ready.
    Peered,
    /// Peered, and this namespace made on the consumer and offloaded with
    /// `liqoctl offload namespace --wait`.
    Offloaded(&'a str),
}

/// A consumer and a provider with a client of each; stopped, and its
/// folder removed, when dropped (kept when the test fails).
#[allow(missing_debug_implementations, reason = "kube::Client has no Debug")]
pub struct Pair {
    pub testbed: Testbed,
    pub consumer_client: kube::Client,
    pub provider_client: kube::Client,
}

impl Pair {
    /// Starts the two clusters and brings them to `stage`.
    pub async fn at(stage: Stage<'_>) -> anyhow::Result<Self> {
        Self::with_nodes(1, 2, stage).await
    }

    /// [`Pair::at`], with these numbers of kwok nodes in the consumer and
    /// the provider.
    pub async fn with_nodes(
        consumer_nodes: u32,
        provider_nodes: u32,
        stage: Stage<'_>,
    ) -> anyhow::Result<Self> {
        Self::with_specs(
            spec("consumer", 1, consumer_nodes),
            spec("provider", 2, provider_nodes),
            stage,
        )
        .await
    }

    /// [`Pair::at`], with clusters of these specs (made from [`spec`]),
    /// whatever their names.
    pub async fn with_specs(
        consumer: ClusterSpec,
        provider: ClusterSpec,
        stage: Stage<'_>,
    ) -> anyhow::Result<Self> {
        let testbed = start(vec![consumer, provider]).await?;
        let consumer_client = testbed.clusters()[0].client().await?;
        let provider_client = testbed.clusters()[1].client().await?;
        let pair = Self {
            testbed,
            consumer_client,
            provider_client,
        };
        match stage {
            Stage::Started => {}
            Stage::Installed => pair.install(),
            Stage::Peered => pair.peer().await?,
            Stage::Offloaded(namespace) => {
                pair.peer().await?;
                pair.offload(namespace).await?;
            }
        }
        Ok(pair)
    }

    pub fn consumer(&self) -> &Cluster {
        &self.testbed.clusters()[0]
    }

    pub fn provider(&self) -> &Cluster {
        &self.testbed.clusters()[1]
    }

    /// The provider's kubeconfig, as `--remote-kubeconfig` takes it.
    pub fn remote(&self) -> String {
        self.provider().kubeconfig_path().display().to_string()
    }

    /// What each cluster holds now ([`crate::snapshot`]): consumer first.
    pub async fn holdings(&self) -> anyhow::Result<Holdings> {
        Ok((
            crate::snapshot(&self.consumer_client).await?,
            crate::snapshot(&self.provider_client).await?,
        ))
    }

    /// Asserts that both clusters hold what they held `before`, but for
    /// what is replaced over time (pods, ReplicaSets) and the kinds of
    /// object `ignoring` (resource prefixes, e.g. `"validatingadmissionpolicies"`);
    /// `after` says after what.
    pub async fn assert_as_before(
        &self,
        before: &Holdings,
        after: &str,
        ignoring: &[&str],
    ) -> anyhow::Result<()> {
        let now = self.holdings().await?;
        let changed = |a: &BTreeSet<String>, b: &BTreeSet<String>| -> Vec<String> {
            a.symmetric_difference(b)
                .filter(|o| {
                    !["pods/", "replicasets/"]
                        .iter()
                        .chain(ignoring)
                        .any(|p| o.starts_with(p))
                })
                .cloned()
                .collect()
        };
        assert_eq!(
            changed(&before.0, &now.0),
            Vec::<String>::new(),
            "the consumer differs after {after}"
        );
        assert_eq!(
            changed(&before.1, &now.1),
            Vec::<String>::new(),
            "the provider differs after {after}"
        );
        Ok(())
    }

    /// `liqoctl peer --remote-kubeconfig` on the consumer, as the
    /// provider's policy grants, which must succeed.
    pub fn peer_with_kubeconfigs(&self) {
        self.on_consumer(&[
            "peer",
            "--remote-kubeconfig",
            &self.remote(),
            "--timeout=120",
        ])
        .success();
    }

    /// `liqoctl` on the consumer's kubeconfig.
    pub fn on_consumer(&self, args: &[&str]) -> Run {
        liqoctl(Some(self.consumer().kubeconfig_path()), args)
    }

    /// `liqoctl` on the provider's kubeconfig.
    pub fn on_provider(&self, args: &[&str]) -> Run {
        liqoctl(Some(self.provider().kubeconfig_path()), args)
    }

    fn install(&self) {
        for (cluster, id, cidr) in [
            (self.consumer(), CONSUMER_ID, "10.201.0.0/16"),
            (self.provider(), PROVIDER_ID, "10.202.0.0/16"),
        ] {
            let out = crate::install(cluster, id, cidr, &[]).success();
            // The testbed's API servers serve every API install uses.
            assert!(!out.stderr.contains("does not serve"), "{}", out.stderr);
        }
    }

    async fn peer(&self) -> anyhow::Result<()> {
        crate::install_and_peer(self.consumer(), self.provider())?;
        crate::virtual_node_ready(&self.consumer_client, PROVIDER_ID, WAIT).await
    }

    /// Makes `namespace` on the consumer and offloads it, waiting for its
    /// twin on the provider.
    pub async fn offload(&self, namespace: &str) -> anyhow::Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.consumer_client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({ "metadata": { "name": namespace } }))?,
            )
            .await?;
        self.on_consumer(&["offload", "namespace", namespace, "--wait", "--timeout=60"])
            .success();
        Ok(())
    }
}

/// What the tests ask of a pod's status.
pub mod pod {
    use k8s_openapi::api::core::v1::Pod;

    /// A pod of `namespace` on the virtual node by hand (its selector and
    /// toleration), passing the `restricted` level, whose one container
    /// asks `cpu` and `memory`.
    pub fn on_virtual_node(
        namespace: &str,
        name: &str,
        cpu: &str,
        memory: &str,
    ) -> anyhow::Result<Pod> {
        Ok(serde_json::from_value(crate::restricted(
            serde_json::json!({
                "metadata": { "name": name, "namespace": namespace, "labels": { "app": name } },
                "spec": {
                    "nodeSelector": crate::virtual_node_selector(),
                    "tolerations": crate::virtual_node_tolerations(),
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "app", "image": "nginx",
                        "resources": { "requests": { "cpu": cpu, "memory": memory } },
                    }],
                },
            }),
        ))?)
    }

    /// Its phase (`Pending`, `Running`, ...).
    pub fn phase(p: &Pod) -> Option<&str> {
        p.status.as_ref()?.phase.as_deref()
    }

    pub fn running(p: &Pod) -> bool {
        phase(p) == Some("Running")
    }

    /// Its Ready condition is True.
    pub fn ready(p: &Pod) -> bool {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    }

    /// Its IP, once it has one.
    pub fn ip(p: &Pod) -> Option<String> {
        p.status.as_ref()?.pod_ip.clone()
    }

    /// Why its first container waits (`ErrImagePull`, ...), if it does.
    pub fn waiting_reason(p: &Pod) -> Option<String> {
        p.status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .state
            .as_ref()?
            .waiting
            .as_ref()?
            .reason
            .clone()
    }

    /// Why it is not scheduled, as its PodScheduled condition says
    /// (reason, message), while it is not.
    pub fn scheduled_reason(p: &Pod) -> Option<(String, String)> {
        let c = p
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
        Some((
            c.reason.clone().unwrap_or_default(),
            c.message.clone().unwrap_or_default(),
        ))
    }
}
