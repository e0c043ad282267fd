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
    /// The cluster ID of the peer an object belongs to (on a consumer: the
    /// provider's; on a provider: the consumer's).
    pub const PEER_CLUSTER_ID: &str = "liqo.io/remote-cluster-id";
    /// The human name of that peer, on virtual nodes.
    pub const PEER_CLUSTER_NAME: &str = "liqo.io/remote-cluster-name";
    /// On a provider: the consumer cluster ID a twin namespace belongs to.
    /// Admission policies only let that consumer's identity create, change
    /// or delete namespaces carrying it (docs/offloading.md).
    pub const TENANT: &str = "liqo.io/tenant";
    /// On a provider: the consumer's namespace a twin namespace stands for,
    /// and the one an object reflected into a twin (ConfigMap, Secret)
    /// comes from.
    pub const ORIGIN_NAMESPACE: &str = "liqo.io/origin-namespace";
    /// On a consumer: the namespace is offloaded (`true`); pods in it are
    /// given the virtual nodes' toleration by the placement policy.
    pub const OFFLOADING: &str = "liqo.io/offloading";
    /// On a consumer: the offloaded namespace's pod offloading strategy,
    /// which the placement policy reads.
    pub const POD_OFFLOADING_STRATEGY: &str = "liqo.io/pod-offloading-strategy";
    /// On what `liqoctl tether` makes or changes: which end of a tether
    /// the cluster is ([`crate::tether::Role`]).
    pub const TETHER: &str = "liqo.io/tether";
    /// On a virtual node: the most CPU, in millicores, free on one node of
    /// its provider that its pods may land on. The placement policy makes
    /// a pod that asks more skip the node ([`crate::capacity::room`]).
    pub const LARGEST_FREE_CPU: &str = "liqo.io/largest-free-cpu-millis";
    /// On a virtual node: the same for memory, in bytes.
    pub const LARGEST_FREE_MEMORY: &str = "liqo.io/largest-free-memory-bytes";
    /// On a virtual node: the Pod Security level its provider holds this
    /// cluster's pods to. The placement policy keeps a pod that does not
    /// meet it off the node ([`crate::capacity::room`]).
    pub const POD_SECURITY: &str = "liqo.io/pod-security";
}

/// On a consumer's ConfigMap or Secret of an offloaded namespace: `true`
/// keeps it from being reflected into the twin namespaces on the
/// providers (and removes a copy made before it was set).
pub const SKIP_REFLECTION_ANNOTATION: &str = "liqo.io/skip-reflection";

/// The ConfigMap in [`NAMESPACE`] that holds the cluster's liqo identity.
pub const IDENTITY_CONFIGMAP: &str = "liqo-cluster-identity";
/// The key of [`IDENTITY_CONFIGMAP`] that holds the installed version.
pub const IDENTITY_VERSION_KEY: &str = "version";

/// The only NamespaceOffloading a namespace may hold.
pub const NAMESPACE_OFFLOADING: &str = "offloading";

/// The gateway's Deployment and ServiceAccount, in [`NAMESPACE`].
pub const GATEWAY: &str = "liqo-gateway";

/// The TUN device the gateway's tunnels are made on: a host path of its
/// node, mounted into its pod.
pub const TUN_DEVICE: &str = "/dev/net/tun";

/// The Secret in [`NAMESPACE`] that holds the gateway's WireGuard private
/// key: made by the gateway itself on its first start, so that the key
/// never leaves the cluster.
pub const GATEWAY_KEY_SECRET: &str = "liqo-gateway-key";
/// Its type.
pub const GATEWAY_KEY_SECRET_TYPE: &str = "liqo.io/wireguard-key";
/// The key of [`GATEWAY_KEY_SECRET`] that holds the private key.
pub const GATEWAY_PRIVATE_KEY: &str = "private-key";
/// The ConfigMap in [`NAMESPACE`] where the gateway publishes its public
/// key (key [`GATEWAY_PUBLIC_KEY`]), for `liqoctl` to hand to peers.
pub const GATEWAY_CONFIGMAP: &str = "liqo-gateway";

/// The ConfigMap of this cluster's exports to the clusterset, which the
/// gateway writes in the liqo namespace and the virtual kubelets carry to
/// their providers (docs/services.md); its key.
pub const CLUSTERSET_EXPORTS: &str = "liqo-exports";
pub const CLUSTERSET_EXPORTS_KEY: &str = "exports.json";

pub const GATEWAY_PUBLIC_KEY: &str = "public-key";

/// The port the gateway serves Prometheus metrics on, besides health.
pub const GATEWAY_METRICS_PATH: &str = "/metrics";

/// The agents' published repositories; the tag is [`crate::VERSION`]
/// ([`crate::images`] names them under another registry or tag).
pub const GATEWAY_IMAGE: &str = "ghcr.io/liqo-rs/liqo-gateway";

/// The StorageClass of claims kept on a provider (docs/storage.md): its
/// volumes are provisioned by the virtual kubelet of the virtual node a
/// pod using the claim is scheduled on.
pub const STORAGE_CLASS: &str = "liqo";
/// The provisioner of [`STORAGE_CLASS`].
pub const STORAGE_PROVISIONER: &str = "liqo.io/virtual-kubelet";
/// On a consumer's claim: the provider's StorageClass to keep it in (one
/// its terms allow); by default the first the provider allows.
pub const REMOTE_STORAGE_CLASS_ANNOTATION: &str = "liqo.io/remote-storage-class";
/// On a consumer's volume of [`STORAGE_CLASS`]: the claim on the provider
/// that holds its data, `<twin>/<claim>`.
pub const REMOTE_CLAIM_ANNOTATION: &str = "liqo.io/remote-claim";
/// On a NamespaceOffloading being deleted: its twin namespaces keep the
/// claims they hold (and nothing else), for a later offload to find.
pub const KEEP_REMOTE_DATA_ANNOTATION: &str = "liqo.io/keep-remote-data";
pub const VIRTUAL_KUBELET_IMAGE: &str = "ghcr.io/liqo-rs/liqo-virtual-kubelet";

/// The port agents serve `/healthz` and `/readyz` on.
pub const HEALTH_PORT: u16 = 8081;

/// The taint of virtual nodes: only pods that tolerate it (those of
/// offloaded namespaces) are scheduled there.
pub const VIRTUAL_NODE_TAINT: &str = "virtual-node.liqo.io/not-allowed";

/// The taint `liqoctl tether` puts on a tethered cluster's own nodes
/// (`NoSchedule`): its scheduler places nothing there; the pods its anchor
/// sends it tolerate it (docs/tethering.md).
pub const TETHERED_TAINT: &str = "liqo.io/tethered";

/// The annotation of a virtual node that carries the cost of its resources
/// (JSON of [`crate::sharing::Cost`]).
pub const COST_ANNOTATION: &str = "liqo.io/cost";

/// Names of the objects of one peering, from the peer's cluster ID (a DNS
/// label, so every name below is valid).
pub mod peering {
    use crate::ClusterId;

    /// The prefix of every tenant namespace's name.
    pub const TENANT_NAMESPACE_PREFIX: &str = "liqo-tenant-";

    /// On the provider: the tenant namespace of consumer `consumer`.
    pub fn tenant_namespace(consumer: &ClusterId) -> String {
        format!("{TENANT_NAMESPACE_PREFIX}{consumer}")
    }

    /// On the provider: the Role and RoleBinding names for a tenant; also
    /// the ClusterRole the tenant binds in its twin namespaces, and the
    /// ClusterRole(Binding) that lets it manage them.
    pub fn tenant_role(consumer: &ClusterId) -> String {
        format!("liqo-tenant-{consumer}")
    }

    /// On the provider: the ClusterRole and ClusterRoleBinding that let a
    /// tenant create its twin namespaces and bind [`tenant_role`] in them.
    pub fn tenant_namespaces_role(consumer: &ClusterId) -> String {
        format!("liqo-tenant-{consumer}-namespaces")
    }

    /// On the provider: the RoleBinding in each twin namespace that grants
    /// the tenant the ClusterRole [`tenant_role`] there.
    pub const TWIN_ROLE_BINDING: &str = "liqo-tenant";

    /// On the consumer: the Secret with the kubeconfig that reaches the
    /// provider as the consumer's identity.
    pub fn identity_secret(provider: &ClusterId) -> String {
        format!("liqo-identity-{provider}")
    }

    /// On the consumer: the virtual kubelet's Deployment, ServiceAccount and
    /// RBAC objects.
    pub fn virtual_kubelet(provider: &ClusterId) -> String {
        format!("liqo-vk-{provider}")
    }

    /// On the consumer: the ClusterRole with what the virtual kubelet may
    /// do in an offloaded namespace (read what it reflects, copy Events,
    /// mint tokens), bound in each offloaded namespace by a RoleBinding
    /// named [`virtual_kubelet`].
    pub fn virtual_kubelet_offloaded_role(provider: &ClusterId) -> String {
        format!("liqo-vk-{provider}-offloaded")
    }

    /// On the consumer: the finalizer a provider's virtual kubelet puts on a
    /// NamespaceOffloading it offloads, until its twin namespace is gone.
    pub fn twin_finalizer(provider: &ClusterId) -> String {
        format!("{}/twin-{provider}", crate::names::GROUP)
    }

    /// On the consumer: the virtual node standing for the provider.
    pub fn virtual_node(provider: &ClusterId) -> String {
        format!("liqo-{provider}")
    }
}
