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
    /// Present on the virtual nodes that stand for peer clusters.
    pub const VIRTUAL_NODE: &str = "liqo.io/virtual-node";
}

/// The ConfigMap in [`NAMESPACE`] that holds the cluster's liqo identity.
pub const IDENTITY_CONFIGMAP: &str = "liqo-cluster-identity";
/// The key of [`IDENTITY_CONFIGMAP`] that holds the installed version.
pub const IDENTITY_VERSION_KEY: &str = "version";

/// The only NamespaceOffloading a namespace may hold.
pub const NAMESPACE_OFFLOADING: &str = "offloading";

/// The gateway's Deployment and ServiceAccount, in [`NAMESPACE`].
pub const GATEWAY: &str = "liqo-gateway";

/// Image repositories of the agents; the tag is [`crate::VERSION`].
pub const GATEWAY_IMAGE: &str = "ghcr.io/liqo-rs/liqo-gateway";
pub const VIRTUAL_KUBELET_IMAGE: &str = "ghcr.io/liqo-rs/liqo-virtual-kubelet";

/// The port agents serve `/healthz` and `/readyz` on.
pub const HEALTH_PORT: u16 = 8081;
