//! `liqo-gateway`: links the pod networks of peered clusters over a
//! userspace WireGuard tunnel.
//!
//! What runs today: the gateway follows the cluster's identity and the
//! peers (ForeignClusters) with reflectors, under the RBAC `liqoctl
//! install` gives it, and is ready exactly while both are known and
//! current: not while the API cannot be followed, not once the identity is
//! deleted or damaged. It keeps no state of its own: everything comes from
//! the API.
//!
//! The data plane ([`tunnel`]: the sans-IO WireGuard peer on boringtun;
//! [`io`]: the TUN device and UDP socket around it; [`nat`]: the route
//! of the peer's pods and the nftables table that remaps an overlapping
//! pod CIDR) also runs alone, as `liqo-gateway tunnel`, configured by
//! flags like `wg` and `ip` would configure a WireGuard interface: that is
//! how the tests and the benchmark run it against standard WireGuard.
//!
//! With `--announce` (`liqoctl install --announce`), the agent also
//! announces the cluster on the node's LAN with mDNS ([`announce`]),
//! following the identity; `liqo-gateway announce` runs the same
//! announcer from flags, without a cluster (docs/discovery.md).

mod announce;
mod clusterset;
mod control;
mod flags;
mod io;
mod metrics;
mod nat;
mod netcheck;
mod tenancy;
mod tunnel;

use anyhow::Context as _;
use clap::Parser;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use liqo_agent_runtime::Readiness;
use liqo_agent_runtime::follow::follow;
use liqo_api::core::ForeignCluster;
use liqo_api::names;
use liqo_api::networking::Connection;
use tokio::sync::watch;

use flags::{Cli, Command};
use liqo_api::agents::gateway::GatewayFlags;

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    liqo_agent_runtime::init_logging();
    let cli = Cli::parse();
    let done = match cli.command {
        Some(Command::Tunnel(args)) => {
            // One line, which the agent that started it keeps as the
            // reason it ended (in the Connection's status).
            return Ok(match io::process::run(args).await {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!(
                        "{}{}",
                        control::TUNNEL_FAILED,
                        liqo_agent_runtime::error_chain(&e)
                    );
                    std::process::ExitCode::FAILURE
                }
            });
        }
        Some(Command::Announce(args)) => announce::from_flags(args).await,
        // Blocking, and alone in its process.
        Some(Command::Netcheck(command)) => {
            return tokio::task::spawn_blocking(move || netcheck::run(command)).await?;
        }
        None => run_agent(cli.agent).await,
    };
    done.map(|()| std::process::ExitCode::SUCCESS)
}

async fn run_agent(args: GatewayFlags) -> anyhow::Result<()> {
    let announcement = flags::announcement(&args)?;
    let readiness = Readiness::default();
    let health_addr = args.health_addr.socket_addr()?;
    let listener = liqo_agent_runtime::bind_health(health_addr).await?;
    tracing::info!(version = liqo_api::VERSION, health = %health_addr, "gateway starting");
    // KUBECONFIG when set, else the pod's service account.
    let client =
        liqo_agent_runtime::client::client(liqo_agent_runtime::kubeconfig::local().await?)?;

    // The RBAC grants this one ConfigMap by name, so the watch must name it.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
    let (identity, follow_identity) = follow(
        maps,
        watcher::Config::default().fields(&format!("metadata.name={}", names::IDENTITY_CONFIGMAP)),
        "identity",
    );
    let (peers, follow_peers) = follow(
        Api::<ForeignCluster>::all(client.clone()),
        watcher::Config::default(),
        "peers",
    );
    let (connections, follow_connections) = follow(
        Api::<Connection>::all(client.clone()),
        watcher::Config::default(),
        "connections",
    );
    // The Service in front of the tunnels, when there is one; the RBAC
    // grants it by name.
    let (service, follow_service) = args
        .expose
        .map(|_| {
            follow(
                Api::<Service>::namespaced(client.clone(), &args.namespace),
                watcher::Config::default().fields(&format!("metadata.name={}", names::GATEWAY)),
                "service",
            )
        })
        .unzip();
    let key = control::ensure_key(&client, &args.namespace)
        .await
        .context("the gateway's key")?;
    tracing::info!(public_key = %key.public_of_private(), "key pair ready");
    // On a provider: the tenants' grants, split across their namespaces.
    let (tenancies, follow_tenancies) = tenancy::follow(client.clone());
    let keep_shares = tenancy::shares::keep(client.clone(), tenancies.clone());
    // On a provider: the tenants' grants follow its free capacity.
    let follow_load = tenancy::grant::follow_load(client.clone(), tenancies);
    // The clusterset's Services (docs/services.md).
    let keep_clusterset = clusterset::keep(
        client.clone(),
        args.namespace.clone(),
        identity.clone(),
        connections.clone(),
    );
    let tunnels = control::Tunnels::new(
        client,
        control::Settings {
            instance: key.public_of_private(),
            namespace: args.namespace.clone(),
            endpoint_host: args.endpoint_address.clone(),
            exposed_by: args.expose,
            listen_address: control::listen_address(args.endpoint_address.as_deref()),
            ports: {
                let ports = args.tunnel_ports();
                ports.first..=ports.last
            },
            remap_pool: args.remap_pool.clone(),
            mtu: args.mtu,
            netns: args.tunnel_netns.clone(),
        },
        key,
    );
    let observed = tunnels.observed.clone();
    let metrics = liqo_agent_runtime::axum::Router::new().route(
        "/metrics",
        liqo_agent_runtime::axum::routing::get(move || {
            let text = metrics::render(&observed);
            async move {
                (
                    [(
                        "content-type",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    text,
                )
            }
        }),
    );
    let (records, announced) = watch::channel(None);
    let (stop_tunnels, tunnels_stop) = watch::channel(false);
    let run_tunnels = tokio::spawn(control::run_tunnels(
        tunnels,
        identity.clone(),
        ObjectRef::new(names::IDENTITY_CONFIGMAP).within(&args.namespace),
        connections.clone(),
        service,
        tunnels_stop,
    ));
    let inputs = control::ReadinessInputs {
        identity,
        identity_ref: ObjectRef::new(names::IDENTITY_CONFIGMAP).within(&args.namespace),
        peers,
        connections,
        announcement: announcement.clone().map(|api| (api, records)),
    };
    // Without --announce nothing is sent on the LAN: no responder starts.
    // With it, the announcer is told to stop when the agent stops, so
    // that it says goodbye.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut announcing = announcement.is_some().then(|| {
        tokio::spawn(announce::announce(None, announced, async {
            let _ = stopped.await;
        }))
    });
    let announcer_failed = async {
        match announcing.as_mut() {
            Some(task) => task.await,
            None => std::future::pending().await,
        }
    };
    let result = run_until_stopped(
        listener,
        metrics,
        readiness,
        async move {
            let follow_service = async {
                if let Some(task) = follow_service {
                    task.await;
                }
            };
            tokio::join!(
                follow_identity,
                follow_peers,
                follow_connections,
                follow_service,
                follow_tenancies,
                keep_shares,
                follow_load,
                keep_clusterset
            );
        },
        inputs,
        announcer_failed,
    )
    .await;
    let _ = stop.send(());
    // The tunnels' processes remove their routes and tables.
    stop_tunnels.send_replace(true);
    let _ = run_tunnels.await;
    if let Some(task) = announcing
        && !task.is_finished()
    {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(3), task).await;
    }
    result
}

async fn run_until_stopped(
    listener: tokio::net::TcpListener,
    more_routes: liqo_agent_runtime::axum::Router,
    readiness: Readiness,
    following: impl Future<Output = ()>,
    inputs: control::ReadinessInputs,
    announcer: impl Future<Output = Result<anyhow::Result<()>, tokio::task::JoinError>>,
) -> anyhow::Result<()> {
    tokio::select! {
        result = liqo_agent_runtime::serve_health_with(listener, readiness.clone(), more_routes) => result?,
        result = announcer => result.map_err(anyhow::Error::from).and_then(|r| r).context("announcing on the LAN")?,
        () = following => {}
        () = inputs.keep_readiness(&readiness) => {}
        () = liqo_agent_runtime::shutdown_signal() => {}
    }
    Ok(())
}
