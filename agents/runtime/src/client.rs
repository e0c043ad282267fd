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
//!
//! Pages of lists are read one at a time per client ([`LIST_PAGES`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Method, Request, Response, header};
use hyper::body::{Body as HttpBody, Bytes, Frame, Incoming, SizeHint};
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ConfigExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{BoxError, ServiceBuilder};

/// An HTTP/2 connection with no answer to a ping for this long after
/// [`PING_INTERVAL`] of silence is closed, and its requests fail: the
/// HTTP/1.1 side's read timeout does the same for its connections.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// Pages of lists ([`is_list_page`]) read at once through one client; the
/// others wait for their turn. A page's text is held whole while it is
/// read, then its objects while they are stored, and when an API server
/// restarts every watch of an agent fails at once and lists its store
/// again: at 10,000 offloaded pods, a dozen lists of thousands of objects
/// each. Read one page at a time, they take about as long (the API server
/// serves them with the same CPU) and hold one page's text at a time.
/// Per client, so that lists to an API server that does not answer (cut
/// off, or paused) do not hold back those to another.
const LIST_PAGES: usize = 1;

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
            list_pages: Arc::new(Semaphore::new(LIST_PAGES)),
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

/// Whether a request reads a page of a list: a GET that ends and says
/// how many objects it wants (`limit`), as kube's watcher lists its
/// store.
pub fn is_list_page<B>(request: &Request<B>) -> bool {
    let query = request.uri().query().unwrap_or_default();
    request.method() == Method::GET
        && !stays_open(request)
        && query.split('&').any(|pair| pair.starts_with("limit="))
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

/// Sends each request to the connections its kind calls for, pages of
/// lists in their turn.
#[derive(Clone)]
struct Split {
    requests: HyperClient<Connector, Body>,
    streams: Arc<HyperClient<Connector, Body>>,
    list_pages: Arc<Semaphore>,
}

impl tower::Service<Request<Body>> for Split {
    type Response = Response<Turn>;
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
        let list_pages = is_list_page(&request).then(|| self.list_pages.clone());
        Box::pin(async move {
            let permit = match list_pages {
                // Never closed.
                Some(turns) => turns.acquire_owned().await.ok(),
                None => None,
            };
            let response = client.request(request).await?;
            Ok(response.map(|body| Turn { body, permit }))
        })
    }
}

/// A response's body, and the turn its request took ([`LIST_PAGES`]),
/// given back once the body is read to its end, fails or is dropped.
#[derive(Debug)]
struct Turn {
    body: Incoming,
    permit: Option<OwnedSemaphorePermit>,
}

impl HttpBody for Turn {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = frame {
            self.permit = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
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

    #[test]
    fn what_reads_a_page_of_a_list() {
        let cases = [
            ("/api/v1/namespaces/a/pods?limit=100", true),
            ("/api/v1/pods?labelSelector=x&limit=100&continue=abc", true),
            ("/api/v1/pods", false),
            ("/api/v1/pods?watch=true&limit=100", false),
            ("/api/v1/namespaces/a/pods/p", false),
            ("/api/v1/namespaces/a/pods/p/log?limitBytes=10", false),
        ];
        for (uri, page) in cases {
            assert_eq!(is_list_page(&get(uri)), page, "{uri}");
        }
        let delete = Request::delete("/api/v1/namespaces/a/pods?limit=100")
            .body(())
            .expect("a valid request");
        assert!(!is_list_page(&delete));
    }

    /// Requests in flight at once on a server, and the most there were.
    #[derive(Default)]
    struct InFlight {
        now: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
    }

    impl InFlight {
        async fn during<T>(&self, answer: T) -> T {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.now.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.now.fetch_sub(1, SeqCst);
            answer
        }

        fn most(&self) -> usize {
            self.most.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    #[tokio::test]
    async fn pages_of_lists_are_read_one_at_a_time_and_other_requests_are_not_held() {
        use axum::routing::get;
        use k8s_openapi::api::core::v1::Pod;
        use kube::Api;
        use kube::api::ListParams;

        let (lists, gets) = (Arc::new(InFlight::default()), Arc::new(InFlight::default()));
        let list = |lists: Arc<InFlight>| async move {
            let empty = r#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[]}"#;
            lists.during(empty).await
        };
        let one = |gets: Arc<InFlight>| async move {
            let pod = r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"a"}}"#;
            gets.during(pod).await
        };
        let app = axum::Router::new()
            .route(
                "/api/v1/pods",
                get({
                    let lists = lists.clone();
                    move || list(lists.clone())
                }),
            )
            .route(
                "/api/v1/namespaces/a/pods/p",
                get({
                    let gets = gets.clone();
                    move || one(gets.clone())
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bound");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let config = kube::Config::new(url.parse().expect("a URL"));
        let client = client(config).expect("a client");

        let all: Api<Pod> = Api::all(client.clone());
        let pods: Api<Pod> = Api::namespaced(client, "a");
        let paged = ListParams::default().limit(100);
        let (listed, got) = futures::join!(
            futures::future::join_all((0..4).map(|_| all.list(&paged))),
            futures::future::join_all((0..4).map(|_| pods.get("p"))),
        );
        assert!(listed.iter().all(Result::is_ok), "{listed:?}");
        assert!(got.iter().all(Result::is_ok), "{got:?}");
        assert_eq!(lists.most(), 1, "pages of lists one at a time");
        assert!(gets.most() > 1, "other requests at once");
    }
}
