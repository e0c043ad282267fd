//! `liqo-virtual-kubelet`: the virtual node of one outgoing peering, run
//! on the consumer, one per provider.
//!
//! What runs today: the node is registered from its ForeignCluster
//! (labels, taint, cost, capacity = the grant), keeps a heartbeat Lease,
//! and is Ready while the provider's API answers as the expected cluster
//! ([`provider`]). Offloaded namespaces get their twin on the provider,
//! and pods bound to the node run there as ReplicaSets of one
//! ([`reflection`], translated by [`forge`]). The node serves the kubelet
//! API (logs, exec, `/pods`, stats) for them ([`kubelet_api`]). The agent
//! keeps no state of its own: everything comes from the API, the
//! provider's credential too (the peering's identity Secret).

mod clusterset;
mod dns;
mod forge;
mod kubelet_api;
mod memory;
mod node;
mod placement;
mod provider;
mod reflection;
mod tenancy;
mod tls_server;

use clap::Parser;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use liqo_agent_runtime::Readiness;
use liqo_agent_runtime::follow::{follow, follow_with};
use liqo_api::agents::ListenAddr;
use liqo_api::agents::virtual_kubelet::VirtualKubeletFlags;
use liqo_api::core::ForeignCluster;
use liqo_api::names;
use liqo_api::offloading::NamespaceOffloading;
use std::sync::Arc;
use tokio::sync::{Notify, watch};

/// jemalloc rather than glibc's malloc: the agent reads many whole
/// objects from the API and keeps a small part of each, and glibc's
/// arenas kept the pages those reads left behind (see "Memory" in
/// docs/virtual-kubelet.md). The unit tests run on it too, and
/// `reflection::footprint` reads its counts.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read when it starts: one arena (its default is
/// four per CPU, and each keeps pages of its own: the agent's memory
/// would grow with the node's cores, not its pods), freed pages given
/// back at once instead of over ten seconds (a relist frees a store's
/// pages as it reads the next: kept for even a second, they were the
/// relists' peak), and no cache of freed blocks per thread (each held
/// blocks of every size class for its thread alone). Measured with
/// `tests/bench/vk-memory.sh` ("Memory" in docs/virtual-kubelet.md);
/// `_RJEM_MALLOC_CONF` in the environment still overrides them. A C
/// string, as jemalloc reads it.
#[allow(unsafe_code)] // jemalloc finds its options by this symbol.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; 40] = b"narenas:1,dirty_decay_ms:0,tcache:false\0";

#[derive(Parser, Debug)]
#[command(version = liqo_api::VERSION, about = "The virtual node of one outgoing liqo-rs peering")]
struct Args {
    /// The flags liqoctl gives (their contract is in `liqo_api::agents`).
    #[command(flatten)]
    flags: VirtualKubeletFlags,
}

/// Two workers, whatever the node's cores: the agent waits on the API
/// far more than it computes (its whole share of a 1,000-pod burst is a
/// few CPU-seconds), and each worker thread costs memory of its own (its
/// stack and jemalloc's cache of freed blocks), which would otherwise
/// grow with the node's cores, not with the pods.
#[tokio::main(worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    liqo_agent_runtime::init_logging();
    let args = Args::parse().flags;
    let health_addr = args.health_addr.socket_addr()?;
    let readiness = Readiness::default();
    let listener = liqo_agent_runtime::bind_health(health_addr).await?;
    tracing::info!(
        version = liqo_api::VERSION,
        health = %health_addr,
        foreign_cluster = %args.foreign_cluster,
        node = %args.node_name,
        "virtual kubelet starting"
    );
    // KUBECONFIG when set, else the pod's service account.
    let config = liqo_agent_runtime::kubeconfig::local().await?;
    let consumer_api = match args.consumer_api_address.as_deref() {
        Some(address) => {
            let (host, port) = address
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h, p.parse().ok()?)))
                .ok_or_else(|| {
                    anyhow::anyhow!("--consumer-api-address {address}: not host:port")
                })?;
            forge::token::ApiAddress::of(Some(host), Some(port))
        }
        None => {
            forge::token::ApiAddress::of(config.cluster_url.host(), config.cluster_url.port_u16())
        }
    };
    let client = liqo_agent_runtime::client::client(config)?;

    // The kubelet API: bound first, so that the port registered is the
    // one actually bound.
    let (tls_tx, tls_rx) = watch::channel(None);
    let mut kubelet = None;
    let mut kubelet_endpoint = None;
    let mut keep_tls: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
        Box::pin(std::future::pending());
    if let Some(addr) = args.kubelet_addr {
        let listener = kubelet_api::bind(addr.socket_addr()?).await?;
        let bound = listener.local_addr()?;
        let ip = args
            .node_ip
            .or_else(|| (!bound.ip().is_unspecified()).then_some(bound.ip()));
        match ip {
            Some(ip) => {
                kubelet_endpoint = Some(forge::KubeletEndpoint {
                    ip,
                    port: bound.port(),
                });
            }
            None => tracing::warn!(
                %bound,
                "the kubelet API listens on every address and --node-ip is not set: the node registers no address"
            ),
        }
        tracing::info!(%bound, "kubelet API listening");
        let serving = kubelet_api::tls::serving_certificate(&args.node_name, ip)?;
        keep_tls = Box::pin(kubelet_api::tls::keep_config(
            client.clone(),
            serving,
            tls_tx,
        ));
        kubelet = Some((listener, tls_rx));
    }

    // The RBAC grants this one ForeignCluster by name, so the watch must
    // name it.
    let (peers, follow_peers) = follow(
        Api::<ForeignCluster>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={}", args.foreign_cluster)),
        "foreign cluster",
    );
    let fc_ref = ObjectRef::new(&args.foreign_cluster);
    // The tunnel to the provider: its Connection, named after it.
    let (tunnel, follow_tunnel) = follow(
        Api::<liqo_api::networking::Connection>::namespaced(client.clone(), names::NAMESPACE),
        watcher::Config::default().fields(&format!("metadata.name={}", args.foreign_cluster)),
        "tunnel",
    );

    // The provider's credential: the peering's identity Secret, which may
    // not exist yet when the agent starts.
    let (credential, follow_credential) =
        provider::follow_credential(client.clone(), &args.provider_secret);
    let (client_tx, client_rx) =
        watch::channel(Err(Arc::new(provider::KubeconfigError::NotReadYet)));
    let (health_tx, health_rx) = watch::channel(provider::Health::default());
    let (registered_tx, registered_rx) = watch::channel(None);
    // Where no webhook is served, nothing of it gates readiness.
    let (placement_able, placement_able_rx) = watch::channel(args.placement_addr.is_none());
    let keeper = node::NodeKeeper {
        client: client.clone(),
        node_name: args.node_name.clone(),
        fc_ref: fc_ref.clone(),
        peers: peers.clone(),
        health: health_rx,
        provider: client_rx.clone(),
        registered: registered_tx,
        kubelet_endpoint,
        tunnel: tunnel.clone(),
        placement: placement_able_rx,
    };
    let placement = match args
        .placement_addr
        .map(ListenAddr::socket_addr)
        .transpose()?
    {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("binding the placement webhook to {addr}: {e}"))?,
        ),
        None => None,
    };
    // The names server: on the pod's IP, which the offloaded pods reach
    // through the tunnel; without an address for the provider to reach,
    // none.
    let names = match args.dns_addr.map(ListenAddr::socket_addr).transpose()? {
        Some(addr) => match args
            .node_ip
            .or_else(|| (!addr.ip().is_unspecified()).then_some(addr.ip()))
        {
            Some(ip) => Some((addr, ip)),
            None => {
                tracing::warn!(%addr, "the names server listens on every address and --node-ip is not set: offloaded pods use the provider's DNS");
                None
            }
        },
        None => None,
    };
    let reflect = reflect(Wiring {
        placement: placement.map(|listener| (listener, placement_able)),
        client: client.clone(),
        consumer_api,
        foreign_cluster: args.foreign_cluster.clone(),
        node_name: args.node_name.clone(),
        provider: client_rx.clone(),
        peers: peers.clone(),
        fc_ref: fc_ref.clone(),
        kubelet,
        credential: (credential.clone(), args.provider_secret.clone()),
        tunnel,
        unschedulable_timeout: std::time::Duration::from_secs(args.unschedulable_timeout),
        names,
        cluster_domain: args.cluster_domain.clone(),
    });
    tokio::select! {
        () = keep_tls => {}
        result = liqo_agent_runtime::serve_health(listener, readiness.clone()) => result?,
        () = reflect => {}
        () = follow_peers => {}
        () = follow_tunnel => {}
        () = follow_credential => {}
        () = provider::keep_client(credential, args.provider_secret, client_tx) => {}
        () = provider::keep_checking(client_rx, peers, fc_ref, health_tx) => {}
        () = keeper.run(readiness.clone()) => {}
        () = node::lease::keep_lease(client, args.node_name, registered_rx) => {}
        () = memory::report_on_signal() => {}
        () = liqo_agent_runtime::shutdown_signal() => {}
    }
    Ok(())
}

/// The consumer's own identity (its cluster ID names the tenant on the
/// provider, its name the twin namespaces), read until it can be.
async fn local_identity(client: &kube::Client) -> liqo_api::ClusterIdentity {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), names::NAMESPACE);
    let mut backoff = std::time::Duration::from_millis(250);
    loop {
        match maps.get(names::IDENTITY_CONFIGMAP).await {
            Ok(map) => match liqo_api::ClusterIdentity::from_data(&map.data.unwrap_or_default()) {
                Ok(identity) => return identity,
                Err(error) => tracing::warn!(%error, "this cluster's identity is damaged"),
            },
            Err(error) => tracing::warn!(%error, "cannot read this cluster's identity"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(std::time::Duration::from_secs(10));
    }
}

/// What [`reflect`] runs with.
struct Wiring {
    /// The placement webhook's listener, when served, and where it says
    /// whether it can answer.
    placement: Option<(tokio::net::TcpListener, watch::Sender<bool>)>,
    client: kube::Client,
    consumer_api: Option<forge::token::ApiAddress>,
    foreign_cluster: String,
    node_name: String,
    provider: watch::Receiver<provider::ProviderClient>,
    peers: liqo_agent_runtime::follow::Followed<ForeignCluster>,
    fc_ref: ObjectRef<ForeignCluster>,
    /// The identity Secret, and its name: its kubeconfig names the tenant
    /// when it impersonates one.
    credential: (provider::Credential, String),
    tunnel: liqo_agent_runtime::follow::Followed<liqo_api::networking::Connection>,
    /// `--unschedulable-timeout`.
    unschedulable_timeout: std::time::Duration,
    /// The kubelet API's listener and TLS configuration, when served.
    kubelet: Option<(
        tokio::net::TcpListener,
        watch::Receiver<Option<Arc<rustls::ServerConfig>>>,
    )>,
    /// Where the names server listens, when served, and the address the
    /// provider reaches it at (this pod's IP, before the tunnel's remap).
    names: Option<(std::net::SocketAddr, std::net::IpAddr)>,
    /// The consumer's cluster domain.
    cluster_domain: String,
}

/// Twin namespaces, pods and the objects they need: follows the local
/// offloadings and the pods bound to the node, runs every reflection
/// kind, and serves the kubelet API.
async fn reflect(wiring: Wiring) {
    let Wiring {
        placement,
        client,
        consumer_api,
        foreign_cluster,
        node_name,
        provider,
        peers,
        fc_ref,
        kubelet,
        credential,
        tunnel,
        unschedulable_timeout,
        names,
        cluster_domain,
    } = wiring;
    let start_time = k8s_openapi::jiff::Timestamp::now().to_string();
    let mut consumer = local_identity(&client).await;
    // A peering made with a token knows this cluster as the tenant the
    // token's credential acts as (docs/tokens.md); the twin namespaces and
    // bindings on the provider are that tenant's.
    let (credential, secret) = credential;
    let kubeconfig = provider::first_kubeconfig(&credential, &secret).await;
    if let Some(tenant) = provider::tenant_of(&kubeconfig) {
        tracing::info!(%tenant, "the provider knows this cluster as its tenant");
        consumer.cluster_id = tenant;
    }
    let provider_id = match liqo_api::ClusterId::new(foreign_cluster.clone()) {
        Ok(id) => id,
        Err(error) => {
            tracing::error!(%error, "the ForeignCluster's name is not a cluster ID: nothing to offload to");
            return std::future::pending().await;
        }
    };
    let (seen_there_tx, seen_there) = watch::channel(None);
    let keep_seen_there = provider::keep_seen_there(
        provider.clone(),
        names::peering::tenant_namespace(&consumer.cluster_id),
        seen_there_tx,
    );
    let carry_exports = clusterset::carry(
        client.clone(),
        provider.clone(),
        names::peering::tenant_namespace(&consumer.cluster_id),
        provider_id.to_string(),
    );
    let (terms_tx, terms) = watch::channel(tenancy::Terms::NotRead);
    let (largest_tx, largest_free_node) = watch::channel(None);
    let keep_record = tenancy::keep_record(
        tenancy::Record {
            clients: provider.clone(),
            tenant: consumer.cluster_id.clone(),
            local: client.clone(),
            foreign_cluster,
            node_name: node_name.clone(),
        },
        terms_tx,
        largest_tx,
    );
    let peering = reflection::namespace::PeeringContext {
        local: client.clone(),
        provider: provider.clone(),
        provider_id,
        consumer,
        node_name: node_name.clone(),
        tunnel: Some(tunnel),
        seen_there,
        terms,
        largest_free_node,
        unschedulable_timeout,
    };
    let (offloadings, follow_offloadings) = follow(
        Api::<NamespaceOffloading>::all(client.clone()),
        watcher::Config::default(),
        "namespace offloadings",
    );
    // Only the pods bound to this node, as a kubelet watches; stored
    // trimmed to what is read of every pod all the time (the spec is read
    // from the API when it is needed).
    let (pods, follow_pods) = follow_with(
        Api::<k8s_openapi::api::core::v1::Pod>::all(client.clone()),
        watcher::Config::default().fields(&format!("spec.nodeName={node_name}")),
        "local pods",
        reflection::pod::LocalPod::options(),
    );
    let (twins_tx, twins_rx) = watch::channel(Default::default());
    let api = kubelet_api::KubeletApi {
        local: client.clone(),
        node_name: node_name.clone(),
        start_time,
        pods: pods.clone(),
        twins: twins_rx.clone(),
        provider: provider.clone(),
        cpu: std::sync::Mutex::default(),
    };
    let kubelet_api = async move {
        match kubelet {
            Some((listener, tls)) => kubelet_api::serve(listener, tls, Arc::new(api)).await,
            None => std::future::pending().await,
        }
    };
    let (synced_tx, synced_rx) = watch::channel(false);
    let ns_wake = Arc::new(Notify::new());
    let pod_wake = Arc::new(Notify::new());
    let namespaces = reflection::namespace::TwinNamespaces {
        peering: peering.clone(),
        offloadings: offloadings.clone(),
        peers: peers.clone(),
        fc_ref,
        twins: twins_tx,
        synced: synced_tx,
        passed_once: Default::default(),
        verified: Default::default(),
    };
    let cm_wake = Arc::new(Notify::new());
    let secret_wake = Arc::new(Notify::new());
    let config_maps = reflection::mirror::Reflector::<ConfigMap>::new(
        peering.clone(),
        twins_rx.clone(),
        &cm_wake,
        &pod_wake,
    );
    let secrets = reflection::mirror::Reflector::<Secret>::new(
        peering.clone(),
        twins_rx.clone(),
        &secret_wake,
        &pod_wake,
    );
    let svc_wake = Arc::new(Notify::new());
    let slice_wake = Arc::new(Notify::new());
    // Nothing waits for them but their own reflection.
    let services = reflection::mirror::Reflector::<Service>::new(
        peering.clone(),
        twins_rx.clone(),
        &svc_wake,
        &svc_wake,
    );
    let slices = reflection::mirror::Reflector::<EndpointSlice>::new(
        peering.clone(),
        twins_rx.clone(),
        &slice_wake,
        &slice_wake,
    );
    // The volumes of the claims this node keeps on its provider.
    let (volumes, follow_volumes) = follow(
        Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(client.clone()),
        watcher::Config::default()
            .labels(&forge::claim::volume_selector(peering.provider_id.as_str())),
        "volumes",
    );
    let claims_wake = Arc::new(Notify::new());
    let claims = reflection::claims::Claims::new(
        peering.clone(),
        twins_rx.clone(),
        volumes.clone(),
        &claims_wake,
    );
    let references = reflection::references::References {
        local: client.clone(),
        node_name: node_name.clone(),
        config_maps: config_maps.local.clone(),
        secrets: secrets.local.clone(),
    };
    let pod_kind = reflection::pod::Pods::new(
        peering.clone(),
        pods.clone(),
        twins_rx.clone(),
        synced_rx,
        pod_wake.clone(),
    )
    .with_references(references);
    let (nameservers_tx, nameservers) = watch::channel(Default::default());
    let pod_kind = pod_kind.with_names(nameservers, cluster_domain.clone());
    let ns_server_wake = Arc::new(Notify::new());
    let nameserver_services = reflection::nameserver::NameserverServices {
        peering: peering.clone(),
        twins: twins_rx.clone(),
        serving: names.map(|(addr, ip)| (ip, addr.port())),
        published: nameservers_tx,
        first_seen: Default::default(),
    };
    let serve_names = {
        let names = names.map(|(addr, _)| {
            let upstream = std::fs::read_to_string("/etc/resolv.conf")
                .ok()
                .and_then(|conf| crate::dns::upstream_of(&conf));
            (
                addr,
                crate::dns::Names {
                    domain: cluster_domain.clone(),
                    twins: twins_rx.clone(),
                    services: services.remote.clone(),
                    provider: provider.clone(),
                    upstream,
                },
            )
        });
        async move {
            match names {
                Some((addr, names)) => {
                    if let Err(error) = crate::dns::serve(addr, names).await {
                        tracing::error!(%error, "offloaded pods get no names from this agent");
                    }
                    std::future::pending::<()>().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
    };
    let seen_changed = {
        let mut rx = peering.seen_there.clone();
        let wake = ns_server_wake.clone();
        async move {
            while rx.changed().await.is_ok() {
                wake.notify_one();
            }
        }
    };
    let pod_kind = match consumer_api {
        Some(api) => pod_kind.with_token_api(api),
        None => {
            tracing::warn!("the consumer's API address is unknown: offloaded pods get no token");
            pod_kind
        }
    };
    let event_wake = Arc::new(Notify::new());
    let events = reflection::event::Events::new(
        peering.clone(),
        twins_rx.clone(),
        pods.clone(),
        &event_wake,
    );
    let token_wake = Arc::new(Notify::new());
    let tokens = reflection::token::Tokens::new(
        peering.clone(),
        twins_rx.clone(),
        pods.clone(),
        config_maps.local.clone(),
        &token_wake,
    );
    let placement = {
        let client = client.clone();
        let offloadings = offloadings.clone();
        async move {
            match placement {
                Some((listener, able)) => {
                    placement::serve(client, listener, offloadings, able).await;
                }
                None => std::future::pending().await,
            }
        }
    };
    let keep_demands = reflection::demand::keep(
        peering.clone(),
        pods.clone(),
        claims.demand(),
        twins_rx.clone(),
    );
    let say_no_room = reflection::no_room::keep(peering.clone(), twins_rx.clone());
    let twins_changed = {
        let wakes = [
            pod_wake.clone(),
            cm_wake.clone(),
            secret_wake.clone(),
            svc_wake.clone(),
            slice_wake.clone(),
            token_wake.clone(),
            event_wake.clone(),
            ns_server_wake.clone(),
            claims_wake.clone(),
        ];
        let mut rx = twins_rx;
        async move {
            while rx.changed().await.is_ok() {
                for wake in &wakes {
                    wake.notify_one();
                }
            }
        }
    };
    tokio::join!(
        kubelet_api,
        placement,
        keep_seen_there,
        carry_exports,
        keep_record,
        keep_demands,
        say_no_room,
        follow_offloadings,
        follow_pods,
        reflection::wake_on(offloadings, ns_wake.clone()),
        reflection::wake_on(peers, ns_wake.clone()),
        reflection::wake_on(pods.clone(), pod_wake.clone()),
        twins_changed,
        reflection::run(namespaces, ns_wake),
        reflection::run(pod_kind, pod_wake),
        reflection::run(config_maps, cm_wake),
        reflection::run(secrets, secret_wake),
        reflection::run(services, svc_wake),
        reflection::run(slices, slice_wake),
        reflection::run(nameserver_services, ns_server_wake),
        serve_names,
        seen_changed,
        reflection::wake_on(pods.clone(), token_wake.clone()),
        reflection::run(tokens, token_wake),
        reflection::run(events, event_wake),
        follow_volumes,
        reflection::wake_on(volumes, claims_wake.clone()),
        reflection::run(claims, claims_wake),
    );
}
