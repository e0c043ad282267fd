//! The kubelet API of the virtual node, as a kubelet serves it on its
//! port 10250, for the consumer's API server (`kubectl logs`, the node
//! proxy) and whoever else a kubelet answers (metrics-server):
//! `/containerLogs/{ns}/{pod}/{container}` proxied to the provider's
//! `pods/log` of the current remote pod, `/exec/{ns}/{pod}/{container}`
//! (SPDY/3.1 from the API server, [`exec`]; the provider's `pods/exec`
//! behind), `/pods`, `/stats/summary` and `/metrics/resource`. Callers are authenticated and authorized as a
//! kubelet in webhook mode does ([`auth`]), over TLS ([`tls`]). What a
//! path asks for is decided by pure functions ([`route`], [`stats`]); this
//! module is the IO around them.

pub mod auth;
pub mod exec;
pub mod route;
pub mod spdy;
pub mod stats;
pub mod tls;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{AsyncReadExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::api::{Api, ListParams, LogParams};
use liqo_agent_runtime::follow::Followed;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::forge::pod as forge_pod;
use crate::provider::ProviderClient;
use crate::reflection::namespace::Twins;
use crate::reflection::pod::LocalPod;
use crate::tls_server::{self, ConnectionError, TlsStream};
use auth::User;
use route::Endpoint;

/// How long a TLS handshake may take.
/// How long a call to the provider (other than a log stream) may take.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(10);

type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// What the handlers need.
#[allow(missing_debug_implementations)] // kube::Client is not Debug.
pub struct KubeletApi {
    /// The consumer's API (reviews).
    pub local: kube::Client,
    pub node_name: String,
    /// When the agent started: the node's start time in the summary.
    pub start_time: String,
    /// The local pods bound to the node.
    pub pods: Followed<LocalPod>,
    pub twins: watch::Receiver<Twins>,
    pub provider: watch::Receiver<ProviderClient>,
    /// The CPU counters served to metrics-server, made from the
    /// provider's rates (never held across an await).
    pub cpu: std::sync::Mutex<stats::CpuCounters>,
}

/// Serves the API on `listener` with the TLS configuration `tls` holds
/// (no connection is taken before there is one).
pub async fn serve(
    listener: TcpListener,
    tls: watch::Receiver<Option<Arc<rustls::ServerConfig>>>,
    api: Arc<KubeletApi>,
) {
    tls_server::serve(listener, tls, "kubelet API", move |stream| {
        connection(stream, api.clone())
    })
    .await;
}

async fn connection(stream: TlsStream, api: Arc<KubeletApi>) -> Result<(), ConnectionError> {
    // The verifier checked the chain; the leaf names the user.
    let cert_user = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .map(|leaf| auth::user_from_certificate(leaf))
        .transpose()
        .map_err(ConnectionError::Certificate)?;
    let service = hyper::service::service_fn(move |req| {
        let api = api.clone();
        let cert_user = cert_user.clone();
        async move { Ok::<_, Infallible>(handle(&api, cert_user, req).await) }
    });
    hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await
        .map_err(ConnectionError::Http)
}

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(
        Full::new(body.into())
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *resp.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    resp
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    full(status, "text/plain; charset=utf-8", body.into())
}

fn json(value: &impl serde::Serialize) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(body) => full(StatusCode::OK, "application/json", body),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn handle(
    api: &KubeletApi,
    cert_user: Option<User>,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let user = match cert_user {
        Some(user) => user,
        None => match auth::bearer_token(req.headers().get(http::header::AUTHORIZATION)) {
            None => return text(StatusCode::UNAUTHORIZED, "Unauthorized"),
            Some(token) => match auth::review_token(&api.local, token).await {
                Ok(Some(user)) => user,
                Ok(None) => return text(StatusCode::UNAUTHORIZED, "Unauthorized"),
                Err(e) => {
                    tracing::warn!(why = %liqo_agent_runtime::error_chain(&e), "kubelet API: TokenReview failed");
                    return text(StatusCode::UNAUTHORIZED, "Unauthorized");
                }
            },
        },
    };
    let path = req.uri().path().to_owned();
    let (subresource, verb) = route::node_attributes(req.method(), &path);
    let review = auth::access_review(&user, &api.node_name, subresource, verb);
    match auth::allowed(&api.local, &review).await {
        Ok(true) => {}
        Ok(false) => {
            return text(
                StatusCode::FORBIDDEN,
                auth::forbidden_message(&user, &api.node_name, subresource, verb),
            );
        }
        Err(e) => {
            tracing::warn!(why = %liqo_agent_runtime::error_chain(&e), "kubelet API: SubjectAccessReview failed");
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Authorization error (the SubjectAccessReview failed)",
            );
        }
    }
    let Some(endpoint) = route::endpoint(req.method(), &path) else {
        return text(StatusCode::NOT_FOUND, "404 page not found");
    };
    tracing::debug!(user = %user.name, %path, "kubelet API request");
    let query = route::query(req.uri().query());
    match endpoint {
        Endpoint::Healthz => text(StatusCode::OK, "ok"),
        Endpoint::Pods => match pod_list(api).await {
            Ok(list) => json(&list),
            Err(e) => {
                tracing::warn!(why = %liqo_agent_runtime::error_chain(&e), "kubelet API: cannot list the node's pods");
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the pods of this node cannot be read from the cluster's API",
                )
            }
        },
        Endpoint::ContainerLogs {
            namespace,
            pod,
            container,
        } => logs(api, &namespace, &pod, &container, &query).await,
        Endpoint::Exec {
            namespace,
            pod,
            container,
        } => exec(api, &mut req, &namespace, &pod, &container).await,
        Endpoint::StatsSummary => {
            let m = measure(api).await;
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            json(&stats::summary(
                &api.node_name,
                Some(&api.start_time),
                &now,
                m.measured,
                m.node_cpu_seconds,
                &m.pods,
            ))
        }
        Endpoint::MetricsResource => {
            let m = measure(api).await;
            let now_ms = k8s_openapi::jiff::Timestamp::now().as_millisecond();
            full(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                stats::resource_metrics(m.measured, m.node_cpu_seconds, &m.pods, now_ms),
            )
        }
    }
}

/// The pods bound to this node, as a kubelet's `/pods` gives them: read
/// from the API (the agent's store keeps no spec), without their
/// managedFields ([`liqo_agent_runtime::lean`]).
async fn pod_list(api: &KubeletApi) -> Result<k8s_openapi::List<Pod>, kube::Error> {
    let pods = liqo_agent_runtime::lean::api(Api::<Pod>::all(api.local.clone()));
    let mut pods: Vec<Pod> = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={}", api.node_name)))
        .await?
        .items
        .into_iter()
        .map(liqo_agent_runtime::lean::Lean::into_inner)
        .collect();
    pods.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    Ok(k8s_openapi::List {
        items: pods,
        metadata: ListMeta::default(),
    })
}

fn has_container(pod: &Pod, name: &str) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.containers.iter().any(|c| c.name == name)
            || s.init_containers.iter().flatten().any(|c| c.name == name)
            || s.ephemeral_containers
                .iter()
                .flatten()
                .any(|c| c.name == name)
    })
}

/// The remote pod that currently stands for the local pod `uid` in `twin`.
async fn remote_pod(
    client: kube::Client,
    twin: &str,
    uid: &str,
) -> Result<Option<Pod>, kube::Error> {
    let api: Api<Pod> = Api::namespaced(client, twin);
    let list = api
        .list(&ListParams::default().labels(&format!("{}={uid}", forge_pod::LOCAL_POD_UID)))
        .await?;
    Ok(forge_pod::current_remote_pod(&list.items).cloned())
}

/// Whether `container` of `pod` has a previous, terminated instance.
fn has_previous(pod: &Pod, container: &str) -> bool {
    let status = pod.status.as_ref();
    let all = status.into_iter().flat_map(|s| {
        s.container_statuses
            .iter()
            .flatten()
            .chain(s.init_container_statuses.iter().flatten())
    });
    all.filter(|c| c.name == container).any(|c| {
        c.restart_count > 0
            || c.last_state
                .as_ref()
                .is_some_and(|s| s.terminated.is_some())
    })
}

fn kube_error(e: &kube::Error) -> Response<Body> {
    match e {
        kube::Error::Api(s) => text(
            StatusCode::from_u16(s.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            s.message.clone(),
        ),
        other => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "the provider cannot be reached: {}",
                liqo_agent_runtime::error_chain(other)
            ),
        ),
    }
}

/// The provider's client, the twin namespace and the current remote pod
/// of the local pod `namespace/pod`, or the kubelet's answer when there
/// is none (or no such container).
async fn resolve(
    api: &KubeletApi,
    namespace: &str,
    pod: &str,
    container: &str,
) -> Result<(kube::Client, String, Pod), Response<Body>> {
    let not_found = || text(StatusCode::NOT_FOUND, format!("pod {pod:?} does not exist"));
    // Bound to this node, as the store says; its containers as the API
    // says (the store keeps no spec).
    let Some(stored) = api.pods.store.get(namespace, pod) else {
        return Err(not_found());
    };
    let local = match Api::<Pod>::namespaced(api.local.clone(), namespace)
        .get_opt(pod)
        .await
    {
        Ok(Some(local)) if local.metadata.uid == stored.uid() => local,
        Ok(_) => return Err(not_found()),
        Err(e) => {
            tracing::warn!(why = %liqo_agent_runtime::error_chain(&e), %namespace, %pod, "kubelet API: cannot read the pod");
            return Err(text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("pod {pod:?} cannot be read from the cluster's API"),
            ));
        }
    };
    if !has_container(&local, container) {
        return Err(text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {pod:?}"),
        ));
    }
    let waiting = || {
        text(
            StatusCode::BAD_REQUEST,
            format!(
                "container {container:?} in pod {pod:?} is waiting to start: it does not run on the provider yet"
            ),
        )
    };
    let Some(twin) = api.twins.borrow().get(namespace).cloned() else {
        return Err(waiting());
    };
    let client = match api.provider.borrow().clone() {
        Ok(client) => client,
        Err(why) => {
            return Err(text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the provider cannot be reached: {why}"),
            ));
        }
    };
    let uid = local.metadata.uid.clone().unwrap_or_default();
    match tokio::time::timeout(PROVIDER_TIMEOUT, remote_pod(client.clone(), &twin, &uid)).await {
        Err(_) => Err(text(
            StatusCode::GATEWAY_TIMEOUT,
            "the provider did not answer in time",
        )),
        Ok(Err(e)) => Err(kube_error(&e)),
        Ok(Ok(None)) => Err(waiting()),
        Ok(Ok(Some(remote))) => Ok((client, twin, remote)),
    }
}

/// `/exec`: checks the request, answers the upgrade to SPDY/3.1, and runs
/// the session on the upgraded connection ([`exec::session`]).
async fn exec(
    api: &KubeletApi,
    req: &mut Request<Incoming>,
    namespace: &str,
    pod: &str,
    container: &str,
) -> Response<Body> {
    let opts = match exec::exec_options(&route::query_pairs(req.uri().query())) {
        Ok(opts) => opts,
        Err(why) => return text(StatusCode::BAD_REQUEST, why.to_string()),
    };
    let upgrade = req
        .headers()
        .get_all(http::header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.eq_ignore_ascii_case("SPDY/3.1"));
    if !upgrade {
        return text(
            StatusCode::BAD_REQUEST,
            "Upgrade request required (SPDY/3.1)",
        );
    }
    let offered = req
        .headers()
        .get_all("x-stream-protocol-version")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>();
    if !exec::offers_protocol(offered.iter().copied()) {
        return text(
            StatusCode::FORBIDDEN,
            format!(
                "no common streaming protocol: offered {offered:?}, served {}",
                exec::PROTOCOL
            ),
        );
    }
    let (client, twin, remote) = match resolve(api, namespace, pod, container).await {
        Ok(found) => found,
        Err(resp) => return resp,
    };
    let remote_name = remote.metadata.name.clone().unwrap_or_default();
    let on_upgrade = hyper::upgrade::on(req);
    let pods: Api<Pod> = Api::namespaced(client, &twin);
    let container = container.to_owned();
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                exec::session(TokioIo::new(upgraded), pods, remote_name, container, opts).await;
            }
            Err(error) => tracing::debug!(%error, "kubelet API: the exec upgrade failed"),
        }
    });
    let mut resp = full(StatusCode::SWITCHING_PROTOCOLS, "text/plain", Bytes::new());
    let headers = resp.headers_mut();
    headers.remove(http::header::CONTENT_TYPE);
    headers.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("Upgrade"),
    );
    headers.insert(
        http::header::UPGRADE,
        http::HeaderValue::from_static("SPDY/3.1"),
    );
    headers.insert(
        "x-stream-protocol-version",
        http::HeaderValue::from_static(exec::PROTOCOL),
    );
    resp
}

async fn logs(
    api: &KubeletApi,
    namespace: &str,
    pod: &str,
    container: &str,
    query: &BTreeMap<String, String>,
) -> Response<Body> {
    let opts = match route::log_options(query) {
        Ok(opts) => opts,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.0),
    };
    let (client, twin, remote) = match resolve(api, namespace, pod, container).await {
        Ok(found) => found,
        Err(resp) => return resp,
    };
    if opts.previous && !has_previous(&remote, container) {
        return text(
            StatusCode::BAD_REQUEST,
            format!("previous terminated container {container:?} in pod {pod:?} not found"),
        );
    }
    let since_time = match opts
        .since_time
        .as_deref()
        .map(str::parse::<k8s_openapi::jiff::Timestamp>)
    {
        None => None,
        Some(Ok(t)) => Some(t),
        Some(Err(_)) => return text(StatusCode::BAD_REQUEST, "sinceTime is not an RFC 3339 time"),
    };
    let params = LogParams {
        container: Some(container.to_owned()),
        follow: opts.follow,
        limit_bytes: opts.limit_bytes,
        pretty: false,
        previous: opts.previous,
        since_seconds: opts.since_seconds,
        since_time,
        tail_lines: opts.tail_lines,
        timestamps: opts.timestamps,
    };
    let remote_name = remote.metadata.name.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client, &twin);
    let reader = match tokio::time::timeout(
        PROVIDER_TIMEOUT,
        pods.log_stream(&remote_name, &params),
    )
    .await
    {
        Err(_) => {
            return text(
                StatusCode::GATEWAY_TIMEOUT,
                "the provider did not answer in time",
            );
        }
        Ok(Err(e)) => return kube_error(&e),
        Ok(Ok(reader)) => reader,
    };
    // Chunks as they come, so that a follower sees each line at once.
    let chunks = futures::stream::unfold(Some(Box::pin(reader)), |state| async move {
        let mut reader = state?;
        let mut buf = vec![0u8; 16 * 1024];
        match reader.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Frame::data(Bytes::from(buf))), Some(reader)))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    let mut resp = Response::new(BodyExt::boxed_unsync(StreamBody::new(chunks.boxed())));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    resp
}

/// What the provider measured, as `/stats/summary` and
/// `/metrics/resource` serve it.
struct Measured {
    /// Whether the provider serves metrics at all.
    measured: bool,
    /// The measured pods, their CPU counted.
    pods: Vec<stats::PodFigures>,
    /// The node's CPU counter.
    node_cpu_seconds: f64,
}

async fn measure(api: &KubeletApi) -> Measured {
    let Ok(client) = api.provider.borrow().clone() else {
        return Measured {
            measured: false,
            pods: Vec::new(),
            node_cpu_seconds: 0.0,
        };
    };
    let twins: Vec<String> = api.twins.borrow().values().cloned().collect();
    // The stored pods themselves, shared: a scrape copies none of them.
    let local = api.pods.store.state();
    let mut remote_to_local = BTreeMap::new();
    let mut metrics = Vec::new();
    let mut measured = true;
    for twin in twins {
        // Names and labels are all that is read of the remote pods: a
        // list of their metadata, not of the pods (at 10,000 pods, their
        // specs and statuses would be tens of megabytes per scrape).
        let pods: Api<Pod> = Api::namespaced(client.clone(), &twin);
        let listed = tokio::time::timeout(
            PROVIDER_TIMEOUT,
            pods.list_metadata(&ListParams::default().labels(forge_pod::LOCAL_POD_UID)),
        )
        .await;
        if let Ok(Ok(list)) = listed {
            for p in list.items {
                let uid = p
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(forge_pod::LOCAL_POD_UID))
                    .cloned();
                if let (Some(name), Some(uid)) = (p.metadata.name, uid) {
                    remote_to_local.insert((twin.clone(), name), uid);
                }
            }
        }
        let request = http::Request::get(format!(
            "/apis/metrics.k8s.io/v1beta1/namespaces/{twin}/pods"
        ))
        .body(Vec::new());
        let Ok(request) = request else {
            continue;
        };
        match tokio::time::timeout(
            PROVIDER_TIMEOUT,
            client.request::<stats::PodMetricsList>(request),
        )
        .await
        {
            Ok(Ok(list)) => metrics.extend(list.items.into_iter().map(|m| (twin.clone(), m))),
            Ok(Err(e)) => {
                tracing::debug!(why = %liqo_agent_runtime::error_chain(&e), %twin, "kubelet API: no pod metrics from the provider");
                measured = false;
            }
            Err(_) => measured = false,
        }
    }
    let mut pods = stats::figures(&local, &remote_to_local, &metrics);
    let alive: std::collections::HashSet<String> = local.iter().filter_map(|p| p.uid()).collect();
    let mut cpu = api
        .cpu
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    cpu.count(&mut pods, |uid| alive.contains(uid));
    Measured {
        measured,
        pods,
        node_cpu_seconds: cpu.node_seconds(),
    }
}

/// Binds the API's address; port 0 picks a free port.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(statuses: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "p", "namespace": "ns" },
            "spec": {
                "containers": [{ "name": "app" }],
                "initContainers": [{ "name": "init" }],
            },
            "status": { "containerStatuses": statuses },
        }))
        .expect("pod")
    }

    fn status(name: &str, restarts: i32, last: serde_json::Value) -> serde_json::Value {
        json!({
            "name": name, "image": "i", "imageID": "", "ready": true,
            "restartCount": restarts, "lastState": last,
        })
    }

    #[test]
    fn containers_of_the_pod() {
        let p = pod(json!([]));
        assert!(has_container(&p, "app"));
        assert!(has_container(&p, "init"));
        assert!(!has_container(&p, "other"));
    }

    #[test]
    fn a_previous_instance_is_one_that_terminated() {
        let terminated = json!({ "terminated": { "exitCode": 1 } });
        for (statuses, want) in [
            (json!([status("app", 0, json!({}))]), false),
            (json!([status("app", 2, json!({}))]), true),
            (json!([status("app", 0, terminated.clone())]), true),
            // Another container's restarts say nothing of this one.
            (json!([status("side", 3, terminated)]), false),
            (json!([]), false),
        ] {
            assert_eq!(
                has_previous(&pod(statuses.clone()), "app"),
                want,
                "{statuses}"
            );
        }
    }

    #[test]
    fn provider_errors_keep_their_code_and_message() {
        let status = kube::core::Status::failure("pods \"x\" is forbidden", "Forbidden")
            .with_code(403)
            .boxed();
        let resp = kube_error(&kube::Error::Api(status));
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        let resp = kube_error(&kube::Error::LinesCodecMaxLineLengthExceeded);
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
