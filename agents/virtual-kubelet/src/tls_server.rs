//! The agent's TLS servers, the kubelet API and the placement webhook:
//! one accept loop, one handshake with its timeout, and each connection
//! in a task of its own, handed to the server's handler once it speaks
//! TLS. A failed connection is logged at debug and ends there.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A connection once its TLS handshake is done.
pub type TlsStream = tokio_rustls::server::TlsStream<TcpStream>;

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the loop waits after an accept failed (out of descriptors).
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("the TLS handshake did not finish within {}s", HANDSHAKE_TIMEOUT.as_secs())]
    HandshakeTimeout,
    #[error("TLS handshake")]
    Handshake(#[source] std::io::Error),
    #[error("the client certificate")]
    Certificate(#[source] crate::kubelet_api::auth::AuthError),
    #[error("HTTP")]
    Http(#[source] hyper::Error),
}

/// Accepts connections on `listener` for ever, once `tls` holds a
/// configuration (the newest for each connection), and runs `handle` on
/// each once its handshake is done; `what` names the server in logs.
pub async fn serve<F, Fut>(
    listener: TcpListener,
    mut tls: watch::Receiver<Option<Arc<rustls::ServerConfig>>>,
    what: &'static str,
    handle: F,
) where
    F: Fn(TlsStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), ConnectionError>> + Send + 'static,
{
    if tls.wait_for(Option::is_some).await.is_err() {
        return;
    }
    let handle = Arc::new(handle);
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(%error, "{what}: accept failed");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let Some(config) = tls.borrow().clone() else {
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let served = async {
                let stream = handshake(tcp, config).await?;
                handle(stream).await
            };
            if let Err(why) = served.await {
                let why = liqo_agent_runtime::error_chain(&why);
                tracing::debug!(%peer, %why, "{what}: connection ended");
            }
        });
    }
}

async fn handshake(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
) -> Result<TlsStream, ConnectionError> {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
        .await
        .map_err(|_| ConnectionError::HandshakeTimeout)?
        .map_err(ConnectionError::Handshake)
}
