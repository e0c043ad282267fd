//! Placement of the pods of offloaded namespaces, as a mutating admission
//! webhook: the fallback for clusters that do not serve
//! MutatingAdmissionPolicy (docs/offloading.md, "Placement"), doing what
//! the three policies `liqoctl install` writes elsewhere do. A pod created
//! in a namespace labelled for offloading with LocalAndRemote or Remote
//! tolerates the virtual nodes' taint; with Remote it also selects
//! virtual nodes; and the namespace's NamespaceOffloading's selector,
//! with the room the pod needs on one of a provider's nodes
//! ([`liqo_api::capacity::room`]), becomes its required node affinity,
//! combined with the pod's own.
//!
//! Every virtual kubelet of the cluster serves it (the Service
//! `liqo-placement` selects them all), from its store of the
//! offloadings; the webhook's two entries (one per strategy, told by the
//! path) select the namespaces by their labels, so the strategy needs no
//! read. The serving certificate is the Secret `liqo/liqo-placement-tls`
//! that `liqoctl install` makes, read from the API (never stored); the
//! webhook's `failurePolicy` is `Ignore`: a pod this webhook never saw
//! tolerates no virtual node, so it stays on local nodes.
//!
//! [`patch`] is pure; the rest is its server.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, Secret,
    Toleration,
};
use kube::Api;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use liqo_agent_runtime::follow::Followed;
use liqo_api::names::{self, labels};
use liqo_api::offloading::NamespaceOffloading;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

use crate::tls_server::{self, ConnectionError, TlsStream};
use tokio::sync::watch;

/// The Secret in `liqo` with the webhook's serving certificate.
pub const TLS_SECRET: &str = "liqo-placement-tls";
/// How often the certificate is read again (a new one comes with
/// `liqoctl install`), and how soon while there is none.
const TLS_REFRESH: Duration = Duration::from_secs(60);
const TLS_RETRY: Duration = Duration::from_secs(3);
/// What is logged once where the webhook is not installed.
const NOT_INSTALLED: &str = "not installed";
/// The largest AdmissionReview read.
const MAX_BODY: usize = 4 << 20;

/// The namespace's pod offloading strategy, told by the webhook's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    LocalAndRemote,
    Remote,
}

impl Strategy {
    pub fn of_path(path: &str) -> Option<Self> {
        match path {
            "/placement/local-and-remote" => Some(Self::LocalAndRemote),
            "/placement/remote" => Some(Self::Remote),
            _ => None,
        }
    }
}

/// The JSON patch that places `pod` as `strategy` and the offloading's
/// `selector` say (empty: nothing to change). Each changed field is
/// written whole (`add` replaces a member that exists).
pub fn patch(pod: &Pod, strategy: Strategy, selector: Option<&NodeSelector>) -> json_patch::Patch {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut ops = Vec::new();
    let taint = names::VIRTUAL_NODE_TAINT;
    let mut tolerations = spec.tolerations.clone().unwrap_or_default();
    if !tolerations.iter().any(|t| t.key.as_deref() == Some(taint)) {
        tolerations.push(Toleration {
            key: Some(taint.to_owned()),
            operator: Some("Equal".to_owned()),
            value: Some("true".to_owned()),
            effect: Some("NoExecute".to_owned()),
            toleration_seconds: None,
        });
        ops.push(add_to_spec("tolerations", &tolerations));
    }
    if strategy == Strategy::Remote {
        let mut selector = spec.node_selector.clone().unwrap_or_default();
        if selector.get(labels::VIRTUAL_NODE).map(String::as_str) != Some("true") {
            selector.insert(labels::VIRTUAL_NODE.to_owned(), "true".to_owned());
            ops.push(add_to_spec("nodeSelector", &selector));
        }
    }
    let terms = selector
        .map(|s| s.node_selector_terms.as_slice())
        .unwrap_or_default();
    // Ours: the offloading's terms (their expressions: a selector of
    // providers says nothing of fields), or one term with none, each
    // twice: asking for a provider with room for the pod, and for a
    // virtual node that does not say its room (an older agent); and with
    // LocalAndRemote a term for local nodes.
    let room = liqo_api::capacity::room(pod);
    let unsaid = vec![liqo_api::capacity::room_unsaid()];
    let expressions: Vec<Option<Vec<NodeSelectorRequirement>>> = if terms.is_empty() {
        vec![None]
    } else {
        terms.iter().map(|t| t.match_expressions.clone()).collect()
    };
    let mut ours: Vec<NodeSelectorTerm> = [&room, &unsaid]
        .into_iter()
        .flat_map(|extra| {
            expressions.iter().map(move |e| NodeSelectorTerm {
                match_expressions: join(e, &Some(extra.clone())),
                match_fields: None,
            })
        })
        .collect();
    if strategy == Strategy::LocalAndRemote {
        ours.push(NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: labels::VIRTUAL_NODE.to_owned(),
                operator: "DoesNotExist".to_owned(),
                values: None,
            }]),
            match_fields: None,
        });
    }
    let mut affinity = spec.affinity.clone().unwrap_or_default();
    let mut node = affinity.node_affinity.take().unwrap_or_default();
    let own = node
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .map(|r| r.node_selector_terms.clone())
        .unwrap_or_default();
    // Placed already (a review made again): a term asks for room.
    let placed = own.iter().any(|t| {
        let expressions = t.match_expressions.as_deref().unwrap_or_default();
        room.iter().all(|r| expressions.contains(r))
    });
    if placed {
        return json_patch::Patch(ops);
    }
    // Terms are ORed: the pod must satisfy one of its own and one of ours,
    // that is one of each pair joined.
    let combined = if own.is_empty() {
        ours
    } else {
        own.iter()
            .flat_map(|o| {
                ours.iter().map(move |t| NodeSelectorTerm {
                    match_expressions: join(&o.match_expressions, &t.match_expressions),
                    match_fields: o.match_fields.clone(),
                })
            })
            .collect()
    };
    node.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: combined,
    });
    let affinity = Affinity {
        node_affinity: Some(NodeAffinity { ..node }),
        ..affinity
    };
    ops.push(add_to_spec("affinity", &affinity));
    json_patch::Patch(ops)
}

/// The operation that writes `value` as the pod spec's field `field`
/// (`add` replaces a member that exists).
fn add_to_spec(field: &str, value: &impl serde::Serialize) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(["spec", field]),
        value: serde_json::to_value(value).unwrap_or_default(),
    })
}

fn join<T: Clone>(a: &Option<Vec<T>>, b: &Option<Vec<T>>) -> Option<Vec<T>> {
    let all: Vec<T> = a.iter().chain(b.iter()).flatten().cloned().collect();
    (!all.is_empty()).then_some(all)
}

/// The AdmissionReview answering `review` for `strategy`, with the
/// offloadings `offloading_of` finds by namespace.
pub fn review(
    review: AdmissionReview<Pod>,
    strategy: Strategy,
    offloading_of: impl Fn(&str) -> Option<Arc<NamespaceOffloading>>,
) -> AdmissionReview<DynamicObject> {
    let request: AdmissionRequest<Pod> = match review.try_into() {
        Ok(request) => request,
        Err(e) => return AdmissionResponse::invalid(e).into_review(),
    };
    let refuse = |code: u16, message: String| {
        let mut response = AdmissionResponse::from(&request).deny(message);
        response.result.code = code;
        response.into_review()
    };
    let Some(pod) = &request.object else {
        return refuse(400, "the request has no pod".to_owned());
    };
    // Without its offloading, the pod would be placed without its
    // selector: refused (its controller tries again), as the policies'
    // `parameterNotFoundAction: Deny` does.
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let Some(offloading) = offloading_of(namespace) else {
        return refuse(
            409,
            format!(
                "the NamespaceOffloading of namespace {namespace} is not known yet to the \
                 virtual kubelets; try again"
            ),
        );
    };
    let ops = patch(pod, strategy, offloading.spec.cluster_selector.as_ref());
    let response = AdmissionResponse::from(&request);
    if ops.0.is_empty() {
        return response.into_review();
    }
    match response.with_patch(ops) {
        Ok(response) => response.into_review(),
        Err(e) => refuse(500, format!("the placement's patch: {e}")),
    }
}

/// Serves the webhook on `listener` for ever, once a certificate is
/// known. `able` is true while the webhook can answer: a certificate is
/// loaded, or the cluster has no webhook (its Secret does not exist, and
/// the API server calls none); the agent is not ready otherwise, so the
/// Service `liqo-placement` sends no admission to an agent that would
/// refuse its connection (the webhook's `failurePolicy` is `Ignore`: the
/// pod would be admitted unplaced).
pub async fn serve(
    client: kube::Client,
    listener: TcpListener,
    offloadings: Followed<NamespaceOffloading>,
    able: watch::Sender<bool>,
) {
    let (tls_tx, tls) = watch::channel(None);
    let keep = keep_tls(client, tls_tx, able);
    let accept = tls_server::serve(listener, tls, "placement webhook", move |stream| {
        connection(stream, offloadings.clone())
    });
    tokio::join!(keep, accept);
}

async fn connection(
    stream: TlsStream,
    offloadings: Followed<NamespaceOffloading>,
) -> Result<(), ConnectionError> {
    let service = hyper::service::service_fn(move |req| {
        let offloadings = offloadings.clone();
        async move { Ok::<_, Infallible>(handle(req, &offloadings).await) }
    });
    hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await
        .map_err(ConnectionError::Http)
}

async fn handle(
    req: Request<hyper::body::Incoming>,
    offloadings: &Followed<NamespaceOffloading>,
) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: Vec<u8>| {
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        resp
    };
    let Some(strategy) = Strategy::of_path(req.uri().path()) else {
        return reply(StatusCode::NOT_FOUND, b"{}".to_vec());
    };
    if req.method() != hyper::Method::POST {
        return reply(StatusCode::METHOD_NOT_ALLOWED, b"{}".to_vec());
    }
    let body = match http_body_util::Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(_) => return reply(StatusCode::BAD_REQUEST, b"{}".to_vec()),
    };
    let Ok(request) = serde_json::from_slice::<AdmissionReview<Pod>>(&body) else {
        return reply(StatusCode::BAD_REQUEST, b"{}".to_vec());
    };
    let answer = review(request, strategy, |ns| {
        offloadings.store.get(ns, names::NAMESPACE_OFFLOADING)
    });
    reply(
        StatusCode::OK,
        serde_json::to_vec(&answer).unwrap_or_default(),
    )
}

/// Keeps `tx` holding a TLS configuration with the certificate of
/// [`TLS_SECRET`], read now and every [`TLS_REFRESH`], and `able` true
/// while there is one or the Secret does not exist.
async fn keep_tls(
    client: kube::Client,
    tx: watch::Sender<Option<Arc<rustls::ServerConfig>>>,
    able: watch::Sender<bool>,
) {
    let secrets: Api<Secret> = Api::namespaced(client, names::NAMESPACE);
    let mut last: Option<(Vec<u8>, Vec<u8>)> = None;
    let mut logged: Option<String> = None;
    loop {
        let read = match secrets.get_opt(TLS_SECRET).await {
            // Where MutatingAdmissionPolicy places pods, install makes no
            // webhook: nothing to serve, and nothing wrong.
            Ok(None) => {
                able.send_replace(true);
                if logged.as_deref() != Some(NOT_INSTALLED) {
                    tracing::info!("placement webhook: not installed on this cluster");
                    logged = Some(NOT_INSTALLED.to_owned());
                }
                tokio::time::sleep(TLS_REFRESH).await;
                continue;
            }
            Ok(Some(s)) => Ok(s),
            Err(e) => Err(CertificateError::Read(e)),
        };
        let read = read.and_then(|s| {
            let data = s.data.unwrap_or_default();
            let get = |k: &'static str| {
                data.get(k)
                    .map(|b| b.0.clone())
                    .ok_or(CertificateError::Missing(k))
            };
            Ok((get("tls.crt")?, get("tls.key")?))
        });
        match read {
            Ok(pair) if last.as_ref() == Some(&pair) => {}
            Ok(pair) => match server_config(&pair.0, &pair.1) {
                Ok(config) => {
                    tracing::info!("placement webhook: serving certificate loaded");
                    tx.send_replace(Some(config));
                    last = Some(pair);
                    logged = None;
                }
                Err(why) => log_once(&mut logged, &why),
            },
            Err(why) => log_once(&mut logged, &why),
        }
        // A certificate that cannot be read again is still served.
        able.send_replace(tx.borrow().is_some());
        tokio::time::sleep(if last.is_some() {
            TLS_REFRESH
        } else {
            TLS_RETRY
        })
        .await;
    }
}

/// Why the webhook has no serving certificate.
#[derive(Debug, thiserror::Error)]
enum CertificateError {
    #[error("reading the Secret {}/{TLS_SECRET}", names::NAMESPACE)]
    Read(#[source] kube::Error),
    #[error("the Secret {TLS_SECRET} has no {0}")]
    Missing(&'static str),
    #[error("the certificate is not PEM")]
    CertificateNotPem(#[source] rustls::pki_types::pem::Error),
    #[error("the key is not PEM")]
    KeyNotPem(#[source] rustls::pki_types::pem::Error),
    #[error("the TLS provider's protocol versions")]
    Protocols(#[source] rustls::Error),
    #[error("the certificate and key do not go together")]
    Mismatch(#[source] rustls::Error),
}

fn log_once(last: &mut Option<String>, why: &CertificateError) {
    let why = liqo_agent_runtime::error_chain(why);
    if last.as_ref() != Some(&why) {
        tracing::warn!(%why, "placement webhook: no serving certificate");
        *last = Some(why);
    }
}

fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<rustls::ServerConfig>, CertificateError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(CertificateError::CertificateNotPem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(CertificateError::KeyNotPem)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(CertificateError::Protocols)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(CertificateError::Mismatch)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "p", "namespace": "shop" },
            "spec": spec,
        }))
        .expect("a pod")
    }

    fn selector(terms: Value) -> NodeSelector {
        serde_json::from_value(json!({ "nodeSelectorTerms": terms })).expect("a selector")
    }

    /// The pod's spec once `ops` are applied, as the API server would.
    fn applied(pod: &Pod, ops: &json_patch::Patch) -> Value {
        let mut value = serde_json::to_value(pod).expect("json");
        json_patch::patch(&mut value, ops).expect("the patch applies");
        value["spec"].clone()
    }

    const TAINT: &str = names::VIRTUAL_NODE_TAINT;

    #[test]
    fn a_pod_tolerates_and_selects_as_its_strategy_says() {
        let plain = pod(json!({ "containers": [{ "name": "c" }] }));
        let spec = applied(&plain, &patch(&plain, Strategy::LocalAndRemote, None));
        assert_eq!(spec["tolerations"][0]["key"], TAINT);
        assert_eq!(spec["tolerations"][0]["effect"], "NoExecute");
        assert!(spec["nodeSelector"].is_null());
        let spec = applied(&plain, &patch(&plain, Strategy::Remote, None));
        assert_eq!(spec["nodeSelector"][labels::VIRTUAL_NODE], "true");
        // Without a selector, two terms: room on one of the provider's
        // nodes, or a virtual node that does not say.
        let terms = &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(terms.as_array().map(Vec::len), Some(2));
        assert_eq!(
            terms[0]["matchExpressions"],
            serde_json::to_value(liqo_api::capacity::room(&plain)).expect("json")
        );
        assert_eq!(
            terms[1]["matchExpressions"][0]["operator"], "DoesNotExist",
            "{terms}"
        );
        // Its own tolerations and selector are kept; nothing twice.
        let own = pod(json!({
            "containers": [{ "name": "c" }],
            "tolerations": [{ "key": "other", "operator": "Exists" }],
            "nodeSelector": { "disk": "ssd" },
        }));
        let ops = patch(&own, Strategy::Remote, None);
        let spec = applied(&own, &ops);
        assert_eq!(spec["tolerations"].as_array().map(Vec::len), Some(2));
        assert_eq!(spec["nodeSelector"]["disk"], "ssd");
        assert!(patch(&pod(spec), Strategy::Remote, None).0.is_empty());
    }

    #[test]
    fn the_selector_is_anded_with_the_pods_own_affinity() {
        let ours = selector(json!([
            { "matchExpressions": [{ "key": "region", "operator": "In", "values": ["eu"] }] },
            { "matchExpressions": [{ "key": "tier", "operator": "Exists" }] },
        ]));
        // No affinity of its own: ours, and for LocalAndRemote a term for
        // local nodes.
        let plain = pod(json!({ "containers": [{ "name": "c" }] }));
        let spec = applied(
            &plain,
            &patch(&plain, Strategy::LocalAndRemote, Some(&ours)),
        );
        let terms = &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(terms.as_array().map(Vec::len), Some(5));
        assert_eq!(terms[4]["matchExpressions"][0]["operator"], "DoesNotExist");
        assert_eq!(terms[4]["matchExpressions"][0]["key"], labels::VIRTUAL_NODE);
        // Each provider's term asks for room, or for a node that does not
        // say it; the local nodes' asks nothing more.
        let second = |i: usize| &terms[i]["matchExpressions"][1];
        assert_eq!(second(0)["key"], labels::LARGEST_FREE_CPU);
        // (Asking nothing: any value.)
        assert_eq!(second(0)["operator"], "Exists");
        assert_eq!(
            terms[0]["matchExpressions"][2]["key"],
            labels::LARGEST_FREE_MEMORY
        );
        assert_eq!(second(1)["operator"], "Exists");
        assert_eq!(second(2)["key"], labels::LARGEST_FREE_CPU);
        assert_eq!(second(2)["operator"], "DoesNotExist");
        assert_eq!(second(3)["operator"], "DoesNotExist");
        assert_eq!(
            terms[4]["matchExpressions"].as_array().map(Vec::len),
            Some(1)
        );
        // Five terms of its own (more than the policies unroll), a field,
        // and a pod affinity: each of its terms joined with each of ours,
        // fields kept, the pod affinity untouched.
        let own_terms: Vec<Value> = (0..5)
            .map(|i| {
                json!({
                    "matchExpressions": [{ "key": "disk", "operator": "In", "values": [format!("d{i}")] }],
                    "matchFields": [{ "key": "metadata.name", "operator": "NotIn", "values": ["n"] }],
                })
            })
            .collect();
        let own = pod(json!({
            "containers": [{ "name": "c" }],
            "affinity": {
                "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": own_terms,
                } },
                "podAffinity": { "preferredDuringSchedulingIgnoredDuringExecution": [] },
            },
        }));
        let spec = applied(&own, &patch(&own, Strategy::Remote, Some(&ours)));
        let terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(terms.len(), 20);
        assert_eq!(terms[19]["matchExpressions"][0]["values"][0], "d4");
        assert_eq!(terms[19]["matchExpressions"][1]["key"], "tier");
        assert_eq!(terms[19]["matchFields"][0]["key"], "metadata.name");
        assert!(spec["affinity"]["podAffinity"].is_object());
    }

    #[test]
    fn reviews_answer_with_a_patch_or_a_refusal() {
        // As the API server sends it.
        let request: AdmissionReview<Pod> = serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": { "group": "", "version": "v1", "kind": "Pod" },
                "resource": { "group": "", "version": "v1", "resource": "pods" },
                "requestKind": { "group": "", "version": "v1", "kind": "Pod" },
                "requestResource": { "group": "", "version": "v1", "resource": "pods" },
                "namespace": "shop",
                "operation": "CREATE",
                "userInfo": { "username": "system:serviceaccount:kube-system:replicaset-controller" },
                "object": {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": { "name": "p", "namespace": "shop" },
                    "spec": { "containers": [{ "name": "c" }] },
                },
                "dryRun": false,
            },
        }))
        .expect("a review");
        let offloading: NamespaceOffloading = serde_json::from_value(json!({
            "metadata": { "name": "offloading", "namespace": "shop" },
            "spec": {},
        }))
        .expect("an offloading");
        let offloading = Arc::new(offloading);
        let answer = serde_json::to_value(review(request.clone(), Strategy::Remote, |_| {
            Some(offloading.clone())
        }))
        .expect("json");
        assert_eq!(answer["response"]["uid"], "u-1");
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(answer["response"]["patchType"], "JSONPatch");
        // Bytes, as kube writes them (a JSON array, which the API server
        // reads into its []byte as it reads base64).
        let patch: Vec<u8> =
            serde_json::from_value(answer["response"]["patch"].clone()).expect("a patch");
        let ops: Vec<Value> = serde_json::from_slice(&patch).expect("json");
        assert_eq!(
            ops.len(),
            3,
            "tolerations, node selector, affinity: {ops:?}"
        );
        let answer =
            serde_json::to_value(review(request, Strategy::Remote, |_| None)).expect("json");
        assert_eq!(answer["response"]["uid"], "u-1");
        assert_eq!(answer["response"]["allowed"], false);
        assert_eq!(answer["response"]["status"]["code"], 409);
        assert!(
            answer["response"]["status"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("not known yet"))
        );
        assert_eq!(
            Strategy::of_path("/placement/remote"),
            Some(Strategy::Remote)
        );
        assert_eq!(Strategy::of_path("/other"), None);
    }
}
