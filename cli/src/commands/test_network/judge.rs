//! Turns what the clients report into checks, and says for each failure
//! where it lies as far as the other checks and the tunnels' state tell.

use k8s_openapi::api::core::v1::{ContainerState, Pod};
use kube::api::Api;
use liqo_api::names;
use liqo_api::netcheck::ProbeReport;
use liqo_api::networking::Connection;
use serde::Serialize;

use super::plan::{Peer, Servers, condition_message, server_name};
use crate::factory::ClusterClient;

/// One connection attempted by a client pod, and how it went.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Check {
    /// The cluster the client ran on.
    pub(super) from: String,
    /// The cluster of the pod or Service it reached for.
    pub(super) to: String,
    /// `pod`, `service`, or `clusterset` (the consumer's Service by its
    /// clusterset name).
    pub(super) kind: &'static str,
    /// The server pod, or its Service, by name.
    pub(super) name: String,
    pub(super) address: String,
    pub(super) passed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) rtt_ms: Option<f64>,
    /// The client's address as the server saw it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) seen_from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) error: Option<String>,
    /// Where the failure lies, as far as the other checks tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) hint: Option<String>,
    /// The provider of the peering crossed (an index into the peers).
    #[serde(skip)]
    pub(super) peer: usize,
    /// Whether the client ran on the consumer.
    #[serde(skip)]
    pub(super) outbound: bool,
}

/// Why a pod will not start by waiting longer (an image that cannot be
/// pulled, a configuration error), as its containers say.
pub(super) fn cannot_start(pod: &Pod) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses.iter().find_map(|c| {
        let waiting = c.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.as_deref()?;
        matches!(
            reason,
            "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" | "CreateContainerConfigError"
        )
        .then(|| {
            format!(
                "{reason}: {} (give another image with --image)",
                waiting.message.as_deref().unwrap_or("no message")
            )
        })
    })
}

pub(super) fn ready_ip(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .as_ref()?
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    ready.then(|| status.pod_ip.clone()).flatten()
}

/// The report a client left, once it has ended.
pub(super) fn report_of(pod: &Pod) -> Option<Result<ProbeReport, String>> {
    let status = pod.status.as_ref()?;
    if !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let terminated = status
        .container_statuses
        .as_ref()
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s: &ContainerState| s.terminated.as_ref());
    let Some(terminated) = terminated else {
        return Some(Err(format!(
            "the pod ended ({}) without a container status",
            status.phase.as_deref().unwrap_or_default()
        )));
    };
    let message = terminated.message.as_deref().unwrap_or_default();
    Some(
        serde_json::from_str::<ProbeReport>(message.trim()).map_err(|_| {
            format!(
                "the client exited {} without a report{}",
                terminated.exit_code,
                if message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", message.trim())
                }
            )
        }),
    )
}

/// Turns the reports into checks, each failure with where it lies as
/// far as the other checks tell. `clusterset`: whether the providers'
/// clients were also given the consumer's Service by its clusterset name.
pub(super) fn judge(
    local: &str,
    peers: &[Peer],
    servers: &Servers,
    reports: &[(Option<usize>, Result<ProbeReport, String>)],
    down: &[Option<String>],
    clusterset: bool,
) -> Vec<Check> {
    let mut checks = Vec::new();
    for (side, report) in reports {
        // What each client was to reach: (target name, the peer crossed,
        // kind), pod then Service, in the order its targets were given.
        let expected: Vec<(String, usize, &'static str)> = match side {
            None => (0..peers.len())
                .flat_map(|i| {
                    [
                        (format!("pod-{i}"), i, "pod"),
                        (format!("service-{i}"), i, "service"),
                    ]
                })
                .collect(),
            Some(i) => {
                let mut kinds = vec!["pod", "service"];
                if clusterset {
                    kinds.push("clusterset");
                }
                kinds.into_iter().map(|k| (k.into(), *i, k)).collect()
            }
        };
        for (target, peer, kind) in expected {
            let outbound = side.is_none();
            let (from, to, server) = if outbound {
                (
                    local.to_owned(),
                    peers[peer].name().to_owned(),
                    server_name(Some(peer)),
                )
            } else {
                (
                    peers[peer].name().to_owned(),
                    local.to_owned(),
                    server_name(None),
                )
            };
            let outcome = report
                .as_ref()
                .ok()
                .and_then(|r| r.results.iter().find(|o| o.name == target));
            let error = match (report, outcome) {
                (_, Some(o)) => o.error.clone(),
                (Err(why), None) => Some(why.clone()),
                (Ok(_), None) => Some("the client's report does not mention it".into()),
            };
            checks.push(Check {
                from,
                to,
                kind,
                name: server,
                address: outcome.map(|o| o.address.clone()).unwrap_or_default(),
                passed: outcome.is_some_and(|o| o.passed()),
                rtt_ms: outcome
                    .and_then(|o| o.rtt_ms)
                    .map(|ms| (ms * 100.0).round() / 100.0),
                seen_from: outcome
                    .and_then(|o| o.answer.as_ref())
                    .map(|a| a.seen_from.clone()),
                error,
                hint: None,
                peer,
                outbound,
            });
        }
    }
    add_hints(&mut checks, peers, servers, down);
    checks
}

/// Each peering's tunnel as the consumer's gateway says it is now: `Some`
/// (its reason) when down. Read after the checks, since a tunnel that
/// broke during them is the likeliest cause of their failure.
pub(super) async fn tunnels_down(consumer: &ClusterClient, peers: &[Peer]) -> Vec<Option<String>> {
    let api: Api<Connection> = Api::namespaced(consumer.client.clone(), names::NAMESPACE);
    let mut down = Vec::new();
    for peer in peers {
        down.push(match api.get_opt(peer.id()).await {
            Ok(Some(c)) if c.is_established() => None,
            Ok(Some(c)) => Some(condition_message(&c)),
            Ok(None) => Some("its Connection was removed".into()),
            // Unknown: the checks speak for themselves.
            Err(_) => None,
        });
    }
    down
}

/// Says, for each failed check, which hop is at fault as far as can be
/// told from outside: a Service that fails where its pod answers is the
/// Service's translation on the client's cluster; a pod that does not
/// answer lies across the tunnel, whose hops are named with addresses.
fn add_hints(checks: &mut [Check], peers: &[Peer], servers: &Servers, down: &[Option<String>]) {
    // Checks come in groups per peering and direction: the pod, its
    // Service, and the Service by its clusterset name where it was given.
    for group in checks.chunk_by_mut(|a, b| (a.peer, a.outbound) == (b.peer, b.outbound)) {
        let (pod, rest) = match group {
            [pod, rest @ ..] if pod.kind == "pod" => (pod, rest),
            _ => continue,
        };
        let (service, rest) = match rest {
            [service, rest @ ..] if service.kind == "service" => (service, rest),
            _ => continue,
        };
        let by_name = rest.first_mut().filter(|c| c.kind == "clusterset");
        let peer = &peers[pod.peer];
        if let Some(why) = down.get(pod.peer).cloned().flatten()
            && !(pod.passed && service.passed && by_name.as_ref().is_none_or(|c| c.passed))
        {
            let hint = format!(
                "the tunnel between {} and {} is down ({why}); `liqoctl info peer {}` shows it",
                if pod.outbound { &pod.from } else { &pod.to },
                peer.name(),
                peer.name()
            );
            for check in [Some(pod), Some(service), by_name].into_iter().flatten() {
                if !check.passed {
                    check.hint = Some(hint.clone());
                }
            }
            continue;
        }
        if !pod.passed {
            // Where the client's cluster sees the server's pods, and the
            // server pod's own address in its cluster.
            let (end, real) = if pod.outbound {
                (
                    &peer.here,
                    servers.remote_real.get(pod.peer).cloned().flatten(),
                )
            } else {
                (&peer.there, Some(servers.local_pod_ip.clone()))
            };
            let seen = end
                .status
                .as_ref()
                .and_then(|s| s.peer_seen_as.clone())
                .unwrap_or_else(|| end.spec.pod_cidr.clone());
            pod.hint = Some(format!(
                "the hops: the pod on {from} to its gateway (the node must route {seen} to the \
                 gateway's node, unmasqueraded), the tunnel between the gateways, {to}'s \
                 gateway to the pod at {real} (network policies must let the peer's pods in); \
                 docs/network.md",
                from = pod.from,
                to = pod.to,
                real = real.as_deref().unwrap_or("its address"),
            ));
        }
        if !service.passed && pod.passed {
            service.hint = Some(format!(
                "the pod answers at its address, so the Service is at fault on {}: its \
                 ClusterIP {} must lead to {} (kube-proxy, and the Service's EndpointSlices \
                 there)",
                service.from, service.address, pod.address
            ));
        }
        if let Some(by_name) = by_name.filter(|c| !c.passed && service.passed) {
            by_name.hint = Some(format!(
                "the Service answers at its ClusterIP, so its export is at fault: {to}'s gateway \
                 imports it (`kubectl -n {ns} get serviceexport,serviceimport`), {to}'s virtual \
                 kubelet for {from} copies the Service of its clusterset IP, {derived}, into \
                 the twin namespace on {from} and answers the name (its log); docs/services.md",
                to = by_name.to,
                from = by_name.from,
                ns = servers.namespace,
                derived = liqo_api::clusterset::derived_name(&by_name.name),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, PodStatus};
    use liqo_api::ClusterId;
    use liqo_api::netcheck::{Answer, Outcome};

    use super::*;
    use crate::peering::outgoing::Outgoing;

    fn ended(phase: &str, exit_code: i32, message: Option<&str>) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                container_statuses: Some(vec![ContainerStatus {
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code,
                            message: message.map(Into::into),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_report_is_read_from_the_termination_message_once_the_pod_ended() {
        let running = Pod {
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(report_of(&running).is_none());
        let report = r#"{"from":"client-local","results":[]}"#;
        let read = report_of(&ended("Succeeded", 0, Some(report))).expect("ended");
        assert_eq!(read.expect("a report").from, "client-local");
        let err = report_of(&ended("Failed", 2, Some("error: bad flag")))
            .expect("ended")
            .expect_err("no report");
        assert_eq!(err, "the client exited 2 without a report: error: bad flag");
    }

    fn outcome(name: &str, address: &str, passed: bool) -> Outcome {
        Outcome {
            name: name.into(),
            address: address.into(),
            attempts: 1,
            rtt_ms: passed.then_some(0.5),
            answer: passed.then(|| Answer {
                server: "s".into(),
                seen_from: "100.64.1.2".into(),
            }),
            error: (!passed).then(|| "no answer to the connection within 2 s".into()),
        }
    }

    // A kube client (never called) needs a runtime to be made.
    #[tokio::test]
    async fn a_failed_service_whose_pod_answers_is_blamed_on_the_service() {
        let report = ProbeReport {
            from: "client-local".into(),
            results: vec![
                outcome("pod-0", "100.64.2.3:8080", true),
                outcome("service-0", "10.96.0.20:8080", false),
            ],
        };
        let peer = connection_pair();
        let servers = Servers {
            namespace: "liqo-test-network-x".into(),
            local_pod_ip: "10.200.1.2".into(),
            remote: vec![("100.64.2.3".into(), "10.96.0.20".into())],
            remote_real: vec![Some("10.200.2.3".into())],
        };
        let checks = judge(
            "home",
            &[peer],
            &servers,
            &[(None, Ok(report))],
            &[None],
            false,
        );
        assert_eq!(checks.len(), 2);
        assert!(checks[0].passed && checks[0].hint.is_none());
        assert_eq!(checks[0].seen_from.as_deref(), Some("100.64.1.2"));
        let hint = checks[1].hint.as_deref().expect("a hint");
        assert!(hint.contains("the Service is at fault on home"), "{hint}");
        assert!(
            hint.contains("10.96.0.20:8080 must lead to 100.64.2.3:8080"),
            "{hint}"
        );
    }

    // A kube client (never called) needs a runtime to be made.
    #[tokio::test]
    async fn a_pod_that_does_not_answer_names_the_hops_with_their_addresses() {
        let report = ProbeReport {
            from: "client-remote-0".into(),
            results: vec![
                outcome("pod", "100.64.1.2:8080", false),
                outcome("service", "10.97.0.9:8080", false),
                outcome(
                    "clusterset",
                    "server-local.liqo-test-network-x.svc.clusterset.local:8080",
                    false,
                ),
            ],
        };
        let servers = Servers {
            namespace: "liqo-test-network-x".into(),
            local_pod_ip: "10.200.1.2".into(),
            remote: vec![("100.64.2.3".into(), "10.96.0.20".into())],
            remote_real: vec![Some("10.200.2.3".into())],
        };
        let reports = [(Some(0), Ok(report))];
        let checks = judge(
            "home",
            &[connection_pair()],
            &servers,
            &reports,
            &[None],
            true,
        );
        assert_eq!(
            (checks[0].from.as_str(), checks[0].to.as_str()),
            ("foreign", "home")
        );
        let hint = checks[0].hint.as_deref().expect("a hint");
        assert!(hint.contains("the pod on foreign to its gateway"), "{hint}");
        assert!(hint.contains("must route 100.64.0.0/16"), "{hint}");
        assert!(
            hint.contains("home's gateway to the pod at 10.200.1.2"),
            "{hint}"
        );
        // The Service and the name failed too, with the pod: no separate
        // blame.
        assert_eq!(checks.len(), 3);
        assert!(checks[1].hint.is_none() && checks[2].hint.is_none());

        // With the tunnel down now, that is what both failures are put on.
        let down = [Some(
            "no handshake with the peer's gateway at 192.0.2.1:51820".into(),
        )];
        let checks = judge(
            "home",
            &[connection_pair()],
            &servers,
            &reports,
            &down,
            true,
        );
        assert_eq!(checks.len(), 3);
        for check in &checks {
            assert_eq!(
                check.hint.as_deref(),
                Some(
                    "the tunnel between home and foreign is down (no handshake with the peer's \
                     gateway at 192.0.2.1:51820); `liqoctl info peer foreign` shows it"
                )
            );
        }
    }

    // A kube client (never called) needs a runtime to be made.
    #[tokio::test]
    async fn a_client_without_a_report_fails_each_of_its_checks() {
        let servers = Servers {
            namespace: "liqo-test-network-x".into(),
            local_pod_ip: "10.200.1.2".into(),
            remote: vec![("100.64.2.3".into(), "10.96.0.20".into())],
            remote_real: vec![None],
        };
        let checks = judge(
            "home",
            &[connection_pair()],
            &servers,
            &[(None, Err("ImagePullBackOff: nope".into()))],
            &[None],
            true,
        );
        assert_eq!(checks.len(), 2);
        assert!(checks.iter().all(|c| !c.passed));
        assert_eq!(checks[1].error.as_deref(), Some("ImagePullBackOff: nope"));
    }

    // A kube client (never called) needs a runtime to be made.
    #[tokio::test]
    async fn a_name_that_fails_where_its_service_answers_is_blamed_on_the_export() {
        let report = |by_name: bool| ProbeReport {
            from: "client-remote-0".into(),
            results: vec![
                outcome("pod", "100.64.1.2:8080", true),
                outcome("service", "10.97.0.9:8080", true),
                outcome(
                    "clusterset",
                    "server-local.liqo-test-network-x.svc.clusterset.local:8080",
                    by_name,
                ),
            ],
        };
        let servers = Servers {
            namespace: "liqo-test-network-x".into(),
            local_pod_ip: "10.200.1.2".into(),
            remote: vec![("100.64.2.3".into(), "10.96.0.20".into())],
            remote_real: vec![None],
        };
        let checks = judge(
            "home",
            &[connection_pair()],
            &servers,
            &[(Some(0), Ok(report(false)))],
            &[None],
            true,
        );
        assert_eq!(
            checks
                .iter()
                .map(|c| (c.kind, c.passed))
                .collect::<Vec<_>>(),
            [("pod", true), ("service", true), ("clusterset", false)]
        );
        let hint = checks[2].hint.as_deref().expect("a hint");
        assert!(
            hint.contains("kubectl -n liqo-test-network-x get serviceexport,serviceimport"),
            "{hint}"
        );
        assert!(hint.contains("liqo-mcs-server-local"), "{hint}");

        let checks = judge(
            "home",
            &[connection_pair()],
            &servers,
            &[(Some(0), Ok(report(true)))],
            &[None],
            true,
        );
        assert!(checks.iter().all(|c| c.passed && c.hint.is_none()));
    }

    /// A peering with provider `p1` whose both ends see the other's pods
    /// as 100.64.0.0/16.
    fn connection_pair() -> Peer {
        let end = |peer: &str| {
            let mut c = Connection::new(
                peer,
                liqo_api::networking::ConnectionSpec {
                    cluster_id: ClusterId::new(peer.to_owned()).expect("id"),
                    cluster_name: peer.into(),
                    public_key: String::new(),
                    endpoint: None,
                    pod_cidr: "10.200.0.0/16".into(),
                    exports: None,
                },
            );
            c.status = Some(liqo_api::networking::ConnectionStatus {
                peer_seen_as: Some("100.64.0.0/16".into()),
                ..Default::default()
            });
            c
        };
        let client = |name: &str| ClusterClient {
            client: kube::Client::try_from(kube::Config::new(
                "https://127.0.0.1:1".parse().expect("url"),
            ))
            .expect("a client that is never called"),
            name: name.into(),
            server: "https://127.0.0.1:1".into(),
            ca_der: None,
        };
        Peer {
            peering: Outgoing {
                consumer: client("home"),
                provider: client("p1"),
                provider_id: ClusterId::new("p1".to_owned()).expect("id"),
                provider_name: "foreign".into(),
                tenant_namespace: "liqo-tenant-home".into(),
            },
            here: end("p1"),
            there: end("home"),
        }
    }
}
