//! What a request asks for, as pure functions: the endpoint a path names,
//! the node subresource a kubelet checks for it (its webhook
//! authorization), and the log options of `/containerLogs`.

use std::collections::BTreeMap;

/// The endpoints served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `/pods`: the pods bound to the node.
    Pods,
    /// `/stats/summary`.
    StatsSummary,
    /// `/metrics/resource`.
    MetricsResource,
    /// `/containerLogs/{namespace}/{pod}/{container}`.
    ContainerLogs {
        namespace: String,
        pod: String,
        container: String,
    },
    /// `/healthz`, as a kubelet answers it (authorized as `nodes/proxy`).
    Healthz,
    /// `/exec/{namespace}/{pod}/{container}` (an upgrade to SPDY/3.1).
    Exec {
        namespace: String,
        pod: String,
        container: String,
    },
}

/// The endpoint `method` and `path` name, or `None` (404).
pub fn endpoint(method: &http::Method, path: &str) -> Option<Endpoint> {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    if let ["exec", ns, pod, container] = parts.as_slice() {
        let post_or_get = method == http::Method::POST || method == http::Method::GET;
        return (post_or_get && !ns.is_empty() && !pod.is_empty() && !container.is_empty()).then(
            || Endpoint::Exec {
                namespace: (*ns).to_owned(),
                pod: (*pod).to_owned(),
                container: (*container).to_owned(),
            },
        );
    }
    if method != http::Method::GET {
        return None;
    }
    match parts.as_slice() {
        ["pods"] => Some(Endpoint::Pods),
        ["healthz"] => Some(Endpoint::Healthz),
        ["stats", "summary"] => Some(Endpoint::StatsSummary),
        ["metrics", "resource"] => Some(Endpoint::MetricsResource),
        ["containerLogs", ns, pod, container]
            if !ns.is_empty() && !pod.is_empty() && !container.is_empty() =>
        {
            Some(Endpoint::ContainerLogs {
                namespace: (*ns).to_owned(),
                pod: (*pod).to_owned(),
                container: (*container).to_owned(),
            })
        }
        _ => None,
    }
}

/// The node subresource and verb a kubelet asks the API server about for
/// a request, as its webhook authorizer does: `/stats/…` is `stats`,
/// `/metrics/…` is `metrics`, `/logs/…` is `log`, anything else `proxy`;
/// the verb follows the HTTP method.
pub fn node_attributes(method: &http::Method, path: &str) -> (&'static str, &'static str) {
    let verb = match *method {
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "get",
    };
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    let subresource = match first {
        "stats" => "stats",
        "metrics" => "metrics",
        "logs" => "log",
        _ => "proxy",
    };
    (subresource, verb)
}

/// The query of a URL as a map (the last value of a repeated key wins),
/// percent-decoded.
pub fn query(raw: Option<&str>) -> BTreeMap<String, String> {
    query_pairs(raw).into_iter().collect()
}

/// The query of a URL as its pairs, in order, percent-decoded.
pub fn query_pairs(raw: Option<&str>) -> Vec<(String, String)> {
    raw.unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

/// The log options of `/containerLogs`, as the kubelet takes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<i64>,
    pub since_seconds: Option<i64>,
    /// RFC 3339, passed on as given (the provider checks it).
    pub since_time: Option<String>,
    pub limit_bytes: Option<i64>,
}

/// A query the kubelet would refuse (400, "Unable to decode query", or
/// 422 for values out of range).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadQuery(pub String);

/// The log options of a `/containerLogs` query. `tail` is the old
/// spelling of `tailLines` (`all` for every line).
pub fn log_options(q: &BTreeMap<String, String>) -> Result<LogOptions, BadQuery> {
    let flag = |key: &str| -> Result<bool, BadQuery> {
        match q.get(key).map(String::as_str) {
            None | Some("false") | Some("0") => Ok(false),
            Some("" | "true" | "1") => Ok(true),
            Some(other) => Err(BadQuery(format!("{key}={other} is not a boolean"))),
        }
    };
    let number = |key: &str| -> Result<Option<i64>, BadQuery> {
        q.get(key)
            .map(|v| {
                v.parse::<i64>()
                    .map_err(|_| BadQuery(format!("{key}={v} is not a number")))
            })
            .transpose()
    };
    let mut tail_lines = number("tailLines")?;
    if let Some(tail) = q.get("tail") {
        tail_lines = match tail.as_str() {
            "all" => None,
            n => Some(
                n.parse::<i64>()
                    .map_err(|_| BadQuery(format!("tail={n} is not a number")))?,
            ),
        };
    }
    let opts = LogOptions {
        follow: flag("follow")?,
        previous: flag("previous")?,
        timestamps: flag("timestamps")?,
        tail_lines,
        since_seconds: number("sinceSeconds")?,
        since_time: q.get("sinceTime").cloned(),
        limit_bytes: number("limitBytes")?,
    };
    if opts.since_seconds.is_some() && opts.since_time.is_some() {
        return Err(BadQuery(
            "at most one of sinceTime or sinceSeconds may be given".to_owned(),
        ));
    }
    for (key, v, min) in [
        ("tailLines", opts.tail_lines, 0),
        ("sinceSeconds", opts.since_seconds, 1),
        ("limitBytes", opts.limit_bytes, 1),
    ] {
        if v.is_some_and(|v| v < min) {
            return Err(BadQuery(format!("{key} must be at least {min}")));
        }
    }
    Ok(opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn endpoints_by_path() {
        let logs = |ns: &str, pod: &str, c: &str| {
            Some(Endpoint::ContainerLogs {
                namespace: ns.into(),
                pod: pod.into(),
                container: c.into(),
            })
        };
        for (method, path, want) in [
            (Method::GET, "/pods", Some(Endpoint::Pods)),
            (Method::GET, "/pods/", Some(Endpoint::Pods)),
            (Method::GET, "/stats/summary", Some(Endpoint::StatsSummary)),
            (
                Method::GET,
                "/metrics/resource",
                Some(Endpoint::MetricsResource),
            ),
            (Method::GET, "/healthz", Some(Endpoint::Healthz)),
            (Method::GET, "/containerLogs/ns/p/c", logs("ns", "p", "c")),
            (Method::GET, "/containerLogs/ns/p", None),
            (Method::GET, "/containerLogs/ns//c", None),
            (Method::GET, "/containerLogs/ns/p/c/x", None),
            (Method::POST, "/pods", None),
            (
                Method::POST,
                "/exec/ns/p/c",
                Some(Endpoint::Exec {
                    namespace: "ns".into(),
                    pod: "p".into(),
                    container: "c".into(),
                }),
            ),
            (Method::DELETE, "/exec/ns/p/c", None),
            (Method::POST, "/exec/ns/p", None),
            (Method::GET, "/stats", None),
            (Method::GET, "/", None),
        ] {
            assert_eq!(endpoint(&method, path), want, "{method} {path}");
        }
    }

    #[test]
    fn node_subresources_as_a_kubelet_checks_them() {
        for (method, path, want) in [
            (Method::GET, "/stats/summary", ("stats", "get")),
            (Method::GET, "/metrics/resource", ("metrics", "get")),
            (Method::GET, "/logs/", ("log", "get")),
            (Method::GET, "/containerLogs/a/b/c", ("proxy", "get")),
            (Method::GET, "/pods", ("proxy", "get")),
            (Method::POST, "/exec/a/b/c", ("proxy", "create")),
            (Method::DELETE, "/pods", ("proxy", "delete")),
        ] {
            assert_eq!(node_attributes(&method, path), want, "{method} {path}");
        }
    }

    #[test]
    fn queries_are_decoded() {
        let q = query(Some(
            "sinceTime=2024-01-01T00%3A00%3A00Z&follow&a=b+c&tail=5",
        ));
        assert_eq!(q["sinceTime"], "2024-01-01T00:00:00Z");
        assert_eq!(q["follow"], "");
        assert_eq!(q["a"], "b c");
        assert_eq!(q["tail"], "5");
        assert!(query(None).is_empty());
        // A broken escape is kept as it is.
        assert_eq!(query(Some("x=%zz%4"))["x"], "%zz%4");
    }

    #[test]
    fn log_options_from_the_query() {
        let q = |s: &str| query(Some(s));
        for (raw, want) in [
            ("", Ok(LogOptions::default())),
            (
                "follow=true&previous=1&timestamps=true&tailLines=10&limitBytes=100",
                Ok(LogOptions {
                    follow: true,
                    previous: true,
                    timestamps: true,
                    tail_lines: Some(10),
                    limit_bytes: Some(100),
                    ..LogOptions::default()
                }),
            ),
            (
                "tail=3",
                Ok(LogOptions {
                    tail_lines: Some(3),
                    ..LogOptions::default()
                }),
            ),
            ("tailLines=3&tail=all", Ok(LogOptions::default())),
            (
                "sinceSeconds=60",
                Ok(LogOptions {
                    since_seconds: Some(60),
                    ..LogOptions::default()
                }),
            ),
            (
                "sinceTime=2024-01-01T00:00:00Z",
                Ok(LogOptions {
                    since_time: Some("2024-01-01T00:00:00Z".into()),
                    ..LogOptions::default()
                }),
            ),
            (
                "follow=maybe",
                Err(BadQuery("follow=maybe is not a boolean".into())),
            ),
            (
                "tailLines=x",
                Err(BadQuery("tailLines=x is not a number".into())),
            ),
            (
                "tailLines=-1",
                Err(BadQuery("tailLines must be at least 0".into())),
            ),
            (
                "sinceSeconds=0",
                Err(BadQuery("sinceSeconds must be at least 1".into())),
            ),
            (
                "sinceSeconds=5&sinceTime=2024-01-01T00:00:00Z",
                Err(BadQuery(
                    "at most one of sinceTime or sinceSeconds may be given".into(),
                )),
            ),
        ] {
            assert_eq!(log_options(&q(raw)), want, "{raw}");
        }
    }
}
