//! The agents' client for a Kubernetes API: requests that end (get, list,
//! create, patch, delete) share one HTTP/2 connection, and requests that
//! stay open (watches, followed logs, upgrades to a stream) have an
//! HTTP/1.1 connection each.
//!
//! kube's own client speaks HTTP/1.1 only, and keeps every connection it
//! opened idle for 90 s: an agent converging 32 keys at a time held over
//! 150 TLS connections to two API servers in a scale-up, each with its
//! buffers and channels (about 5 MiB of the virtual kubelet's heap at
//! 10,000 pods; "Memory" in docs/virtual-kubelet.md). On HTTP/2 they are
//! streams of one connection, as client-go's are. Requests that stay open
//! do not go there: an API server allows a few hundred streams on one
//! connection (Go's default is 250) and hyper's client waits for a stream
//! rather than opening a second connection, so watches in as many
//! namespaces could starve every other request; and an upgrade (exec,
//! attach) needs HTTP/1.1.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response, header};
use hyper::body::Incoming;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ConfigExt};
use tower::{BoxError, ServiceBuilder};

/// An HTTP/2 connection with no answer to a ping for this long after
/// [`PING_INTERVAL`] of silence is closed, and its requests fail: the
/// HTTP/1.1 side's read timeout does the same for its connections.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// A client for the API `config` names, as the module says; with a proxy
/// in `config`, kube's own client, which knows proxies.
pub fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    if config.proxy_url.is_some() {
        return kube::Client::try_from(config);
    }
    let streams = HyperClient::builder(TokioExecutor::new())
        .build(timeouts(&config, https(&config, Versions::Http1)?));
    let mut requests = HyperClient::builder(TokioExecutor::new());
    requests
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT);
    let requests = requests.build(timeouts(&config, https(&config, Versions::Both)?));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(Split {
            requests,
            streams: Arc::new(streams),
        });
    Ok(kube::Client::new(service, config.default_namespace))
}

/// Whether a request stays open once answered: a watch, a followed log,
/// or an upgrade to a stream of its own.
pub fn stays_open<B>(request: &Request<B>) -> bool {
    let query = request.uri().query().unwrap_or_default();
    let flag_on = |name: &str| {
        query.split('&').any(|pair| {
            pair.split_once('=')
                .is_some_and(|(k, v)| k == name && matches!(v, "true" | "1"))
        })
    };
    request.headers().contains_key(header::UPGRADE) || flag_on("watch") || flag_on("follow")
}

#[derive(Clone, Copy)]
enum Versions {
    Http1,
    Both,
}

type Connector = TimeoutConnector<HttpsConnector<HttpConnector>>;

/// kube's TLS settings for `config` (its CA, client certificate, server
/// name), offering HTTP/2 or not.
fn https(
    config: &kube::Config,
    versions: Versions,
) -> Result<HttpsConnector<HttpConnector>, kube::Error> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    // HTTP/2 writes a request as several frames, often after the last
    // request's segment is still unacknowledged: with Nagle's algorithm
    // they wait for the API server's delayed ACK, up to 40 ms each time
    // (the start latency of offloaded pods grew from 48 to 138 ms at p50
    // with it). Go's clients and servers set it too.
    http.set_nodelay(true);
    let builder = HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    let builder = match &config.tls_server_name {
        Some(name) => {
            let name = name.clone().try_into().map_err(|e| {
                kube::Error::Service(format!("tls-server-name {name:?}: {e}").into())
            })?;
            builder.with_server_name_resolver(FixedServerNameResolver::new(name))
        }
        None => builder,
    };
    Ok(match versions {
        Versions::Http1 => builder.enable_http1().wrap_connector(http),
        Versions::Both => builder.enable_http1().enable_http2().wrap_connector(http),
    })
}

/// kube's connection timeouts for `config`.
fn timeouts(config: &kube::Config, https: HttpsConnector<HttpConnector>) -> Connector {
    let mut connector = TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector
}

/// Sends each request to the connections its kind calls for.
#[derive(Clone)]
struct Split {
    requests: HyperClient<Connector, Body>,
    streams: Arc<HyperClient<Connector, Body>>,
}

impl tower::Service<Request<Body>> for Split {
    type Response = Response<Incoming>;
    type Error = hyper_util::client::legacy::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // hyper's client is always ready: it waits for a connection in
        // the call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let client = if stays_open(&request) {
            (*self.streams).clone()
        } else {
            self.requests.clone()
        };
        Box::pin(async move { client.request(request).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(uri: &str) -> Request<()> {
        Request::get(uri).body(()).expect("a valid request")
    }

    #[test]
    fn what_stays_open() {
        let cases = [
            ("/api/v1/namespaces/a/pods", false),
            (
                "/api/v1/namespaces/a/pods?watch=true&resourceVersion=5",
                true,
            ),
            ("/api/v1/pods?labelSelector=x&watch=1", true),
            ("/api/v1/pods?watch=false", false),
            ("/api/v1/pods?allowWatchBookmarks=true", false),
            (
                "/api/v1/namespaces/a/pods/p/log?follow=true&tailLines=10",
                true,
            ),
            ("/api/v1/namespaces/a/pods/p/log?tailLines=10", false),
            ("/api/v1/namespaces/a/pods/p/log?previous=true", false),
        ];
        for (uri, open) in cases {
            assert_eq!(stays_open(&get(uri)), open, "{uri}");
        }
        let exec = Request::get("/api/v1/namespaces/a/pods/p/exec?command=ls")
            .header(header::UPGRADE, "websocket")
            .body(())
            .expect("a valid request");
        assert!(stays_open(&exec));
    }
}
