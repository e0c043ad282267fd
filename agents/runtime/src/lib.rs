//! What every liqo-rs agent does the same way: logging, the `/healthz` and
//! `/readyz` endpoints the kubelet probes, following the API with
//! reflectors ([`follow`]) with a client that suits them ([`client`]) and
//! the kubeconfigs they are given ([`kubeconfig`]), and stopping on
//! SIGTERM. Agent logic does not live here.

pub mod client;
pub mod compact;
pub mod follow;
pub mod kubeconfig;
pub mod lean;

pub use axum;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;

/// Logs to stderr, filtered by `RUST_LOG` (default: info), with colours
/// only on a terminal: container logs are files.
pub fn init_logging() {
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Whether the agent is ready to do its work. Liveness is the health
/// server answering at all: a wedged runtime stops answering.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        if self.0.swap(ready, Ordering::Relaxed) != ready {
            tracing::info!(ready, "readiness changed");
        }
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Binds the health endpoints; serve them with [`serve_health`].
pub async fn bind_health(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Serves `/healthz` (200 while running) and `/readyz` (200 when ready,
/// 503 otherwise) until the process ends.
pub async fn serve_health(
    listener: tokio::net::TcpListener,
    readiness: Readiness,
) -> std::io::Result<()> {
    serve_health_with(listener, readiness, Router::new()).await
}

/// [`serve_health`], and the routes of `more` (an agent's metrics) on the
/// same port.
pub async fn serve_health_with(
    listener: tokio::net::TcpListener,
    readiness: Readiness,
    more: Router,
) -> std::io::Result<()> {
    let app = more.route("/healthz", get(|| async { "ok" })).route(
        "/readyz",
        get(move || {
            let ready = readiness.get();
            async move {
                if ready {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }
        }),
    );
    axum::serve(listener, app).await
}

/// Whether the API server refused a write because its namespace is being
/// deleted (the `NamespaceTerminating` cause of the namespace lifecycle
/// admission): nothing to retry, the namespace and what it held are going.
pub fn namespace_terminating(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.details.as_ref().is_some_and(|d| {
        d.causes.iter().any(|c| c.reason == "NamespaceTerminating")
    }))
}

/// Resolves on SIGTERM (what the kubelet sends) or Ctrl-C.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("stopping");
}

/// An error with its causes on one line, for logs and status messages:
/// `error: cause: cause's cause`, each cause once (hyper and kube repeat
/// theirs in their own messages).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_into_a_namespace_being_deleted() {
        // What kube-apiserver answers (its body, as kube reads it).
        let refused: kube::core::Status = serde_json::from_value(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "resourcequotas \"liqo-share\" is forbidden: unable to create new content in namespace liqo-tenant-a because it is being terminated",
            "reason": "Forbidden",
            "details": {
                "name": "liqo-share", "kind": "resourcequotas",
                "causes": [{
                    "reason": "NamespaceTerminating",
                    "message": "namespace liqo-tenant-a is being terminated",
                    "field": "metadata.namespace",
                }],
            },
            "code": 403,
        }))
        .expect("a Status");
        assert!(namespace_terminating(&kube::Error::Api(Box::new(
            refused.clone()
        ))));
        let mut other = refused;
        other.details = None;
        assert!(!namespace_terminating(&kube::Error::Api(Box::new(other))));
    }

    #[tokio::test]
    async fn readyz_follows_readiness_and_healthz_is_always_ok() {
        let listener = bind_health(([127, 0, 0, 1], 0).into()).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let readiness = Readiness::default();
        tokio::spawn(serve_health(listener, readiness.clone()));
        let get = |path: &str| {
            let url = format!("http://{addr}{path}");
            async move { reqwest::get(url).await.expect("request").status().as_u16() }
        };
        assert_eq!(get("/healthz").await, 200);
        assert_eq!(get("/readyz").await, 503);
        readiness.set(true);
        assert_eq!(get("/readyz").await, 200);
        assert_eq!(get("/nothing").await, 404);
    }
}
