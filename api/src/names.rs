//! Well-known names of the objects liqo-rs creates.

/// The namespace that holds liqo-rs's own objects in every cluster.
pub const NAMESPACE: &str = "liqo";

/// The API group of liqo-rs's custom resources.
pub const GROUP: &str = "liqo.io";

/// Labels every object liqo-rs creates carries, so that it can be found and
/// removed whole.
pub mod labels {
    /// `app.kubernetes.io/managed-by: liqoctl` on everything we create.
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    pub const MANAGED_BY_VALUE: &str = "liqoctl";
    /// The component an object belongs to (`gateway`, `virtual-kubelet`...).
    pub const COMPONENT: &str = "app.kubernetes.io/component";
    /// The version that created or last updated an object.
    pub const VERSION: &str = "app.kubernetes.io/version";
}

/// The ConfigMap in [`NAMESPACE`] that holds the cluster's liqo identity.
pub const IDENTITY_CONFIGMAP: &str = "liqo-cluster-identity";
/// The key of [`IDENTITY_CONFIGMAP`] that holds the installed version.
pub const IDENTITY_VERSION_KEY: &str = "version";
