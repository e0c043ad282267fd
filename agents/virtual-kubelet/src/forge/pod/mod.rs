//! Pure translation of a local pod bound to the virtual node into its
//! remote twin (a ReplicaSet of one in the twin namespace, so that the
//! provider's own controllers keep the pod running while the consumer is
//! unreachable, or a Job of one for a pod meant to end: [`wrapper`]), and
//! of the remote pod's status back into the local one. What cannot run on
//! a provider is refused here with a reason.
//!
//! One file per concern, each with its test table: [`spec`] (the remote
//! pod spec, refusals, requests), [`wrapper`] (the ReplicaSet or Job that
//! runs it), [`status`] (the status brought back).

pub mod dns;
#[cfg(test)]
mod fixtures;
mod spec;
mod status;
mod wrapper;

pub use self::spec::{Requests, refusal, requests, terms_refusal};
pub use self::status::{
    REFUSED_REASON, Ranked, UNSCHEDULABLE_REASON, current_remote_pod, digest_shows, ended,
    given_up, given_up_status, local_status, says_nothing, status_digest,
};
pub use self::wrapper::{
    WRAPPER_GENERATION, Wrapper, changed_by_others, first_pod, job, replica_set, wrapper,
};

/// The label that ties a remote ReplicaSet (and its pod) to the local pod,
/// by UID: a pod deleted and created again under the same name is another
/// pod, and its old twin must not be taken for it.
pub const LOCAL_POD_UID: &str = "liqo.io/local-pod-uid";
