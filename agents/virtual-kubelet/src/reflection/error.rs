//! What goes wrong converging one key ([`Error`]): one variant per
//! request that failed, its cause kept as the source (the loop logs the
//! chain, each cause once), and [`NotYet`] for what a key waits for.
//! Every error is retried with backoff; none is fatal.

use std::sync::Arc;

use crate::forge::pod::Wrapper;

/// What went wrong converging one key; it is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Something the key needs is not there yet: expected after a start,
    /// logged quietly.
    #[error(transparent)]
    NotYet(#[from] NotYet),

    // Pods.
    #[error("reading the local pod {name}")]
    ReadLocalPod {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("removing the local pod")]
    RemoveLocalPod(#[source] kube::Error),
    #[error("updating the local pod's status")]
    UpdateLocalPodStatus(#[source] kube::Error),
    #[error("recording the refusal")]
    RecordRefusal(#[source] kube::Error),
    #[error("recording the failed mount")]
    RecordFailedMount(#[source] kube::Error),
    #[error("creating the {kind:?} {twin}/{name} on the provider")]
    CreateWrapper {
        kind: Wrapper,
        twin: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("putting back the {kind:?} {twin}/{name} on the provider")]
    PutBackWrapper {
        kind: Wrapper,
        twin: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// A wrapper (`what`: "replica set" or "job") or a remote pod
    /// ("pod"), deleted with the local pod or as an orphan.
    #[error("deleting {what} {name} on the provider")]
    DeleteRemote {
        what: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting the pod {twin}/{name} on the provider")]
    DeleteOrphanPod {
        twin: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading the pod {twin}/{name}")]
    ReadRemotePod {
        twin: String,
        name: String,
        #[source]
        source: kube::Error,
    },

    // Twin namespaces.
    #[error("writing the offloading's status")]
    WriteOffloadingStatus(#[source] kube::Error),
    #[error("updating the offloading's finalizers")]
    UpdateOffloadingFinalizers(#[source] kube::Error),
    #[error("annotating namespace {twin} on the provider with its demand")]
    StateDemand { twin: String, source: kube::Error },
    #[error("reviewing this agent's rights in {namespace}")]
    ReviewRights {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading namespace {twin} on the provider")]
    ReadTwin {
        twin: String,
        #[source]
        source: kube::Error,
    },
    #[error("creating namespace {twin} on the provider")]
    CreateTwin {
        twin: String,
        #[source]
        source: kube::Error,
    },
    #[error("binding {binding} in {twin} on the provider")]
    BindTwin {
        binding: &'static str,
        twin: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting namespace {twin} on the provider")]
    DeleteTwin {
        twin: String,
        #[source]
        source: kube::Error,
    },

    // The names server's Service in a twin.
    #[error("keeping the names server's Service in {twin} on the provider")]
    Nameserver {
        twin: String,
        #[source]
        source: kube::Error,
    },

    // Claims kept on the provider, and their volumes here.
    /// `claim`: its namespace and name.
    #[error("{what} of the claim {claim}")]
    Claim {
        what: &'static str,
        claim: String,
        #[source]
        source: kube::Error,
    },
    /// The provider refuses the claim, or cannot be asked for it: said on
    /// the consumer's claim.
    #[error("the provider refuses the claim {claim}: {why}")]
    ClaimRefused { claim: String, why: String },

    // Mirrored objects (ConfigMaps, Secrets, Services, EndpointSlices).
    #[error("creating {kind} {twin}/{name} on the provider")]
    CreateCopy {
        kind: &'static str,
        twin: String,
        name: std::sync::Arc<str>,
        #[source]
        source: kube::Error,
    },
    #[error("updating {kind} {twin}/{name} on the provider")]
    UpdateCopy {
        kind: &'static str,
        twin: String,
        name: std::sync::Arc<str>,
        #[source]
        source: kube::Error,
    },
    /// An immutable copy deleted to be made anew.
    #[error("replacing {kind} {twin}/{name} on the provider")]
    ReplaceCopy {
        kind: &'static str,
        twin: String,
        name: std::sync::Arc<str>,
        #[source]
        source: kube::Error,
    },
    #[error("deleting {kind} {twin}/{name} on the provider")]
    DeleteCopy {
        kind: &'static str,
        twin: String,
        name: std::sync::Arc<str>,
        #[source]
        source: kube::Error,
    },

    // Events.
    #[error("reading the event {twin}/{name}")]
    ReadEvent {
        twin: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating the event {namespace}/{name}")]
    UpdateEvent {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("copying the event {twin}/{name}")]
    CopyEvent {
        twin: String,
        name: String,
        #[source]
        source: kube::Error,
    },

    // Service account tokens.
    #[error("requesting a token of the service account {namespace}/{account}")]
    RequestToken {
        namespace: String,
        account: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing the token secret {twin}/{secret}")]
    WriteTokenSecret {
        twin: String,
        secret: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting the token secret {twin}/{secret}")]
    DeleteTokenSecret {
        twin: String,
        secret: String,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// Whether it says the key waits for something rather than that a
    /// request failed: logged at debug, not as a warning.
    pub fn is_waiting(&self) -> bool {
        matches!(self, Self::NotYet(_))
    }

    /// The error and its causes on one line, for the log.
    pub(super) fn chain(&self) -> String {
        liqo_agent_runtime::error_chain(self)
    }
}

/// What a key waits for: not there yet, or not in sync yet.
#[derive(Debug, thiserror::Error)]
pub enum NotYet {
    /// No client for the provider: why (its kubeconfig cannot be used).
    #[error("no client for the provider")]
    ProviderClient(#[source] Arc<crate::provider::KubeconfigError>),
    #[error("the provider's terms for this cluster are not read yet")]
    ProviderTerms,
    #[error("the ForeignCluster {0} is not known yet")]
    ForeignCluster(String),
    #[error("the twin namespace {0} is still being deleted")]
    TwinDeleting(String),
    #[error("the local pods are not in sync yet")]
    LocalPods,
    /// The provider's ReplicaSets, Jobs and pods in this twin.
    #[error("the provider's namespace {0} is not in sync yet")]
    RemotePods(String),
    #[error("the ConfigMaps and Secrets of {0} are not in sync yet")]
    References(String),
    /// A mirrored kind's store of one namespace (`side`: "local" or
    /// "remote").
    #[error("the {side} {kind} of {namespace} are not in sync yet")]
    Mirrored {
        side: &'static str,
        kind: &'static str,
        namespace: String,
    },
    /// The Events of one namespace (`side`: "local" or "remote").
    #[error("the {side} events of {namespace} are not in sync yet")]
    Events {
        side: &'static str,
        namespace: String,
    },
    #[error("the token Secrets of {0} are not in sync yet")]
    TokenSecrets(String),
    #[error("the CA of {0} is not known yet")]
    RootCa(String),
    #[error("the token request has no status")]
    TokenStatus,
    /// Where the pods of a namespace resolve names is not decided yet.
    #[error("the nameserver of the twin of {0} is not known yet")]
    Nameserver(String),
    /// The volumes of this node's claims are not followed yet.
    #[error("the volumes of this node's claims are not in sync yet")]
    Volumes,
    /// An object of that name on the provider that no store shows as
    /// ours: someone else's, or ours on its way to the store.
    #[error("{twin}/{name} exists on the provider and is not (yet) known as ours")]
    NotOurs { twin: String, name: String },
}
