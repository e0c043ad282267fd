//! `liqoctl discover`: lists the clusters announced on the LAN (mDNS) and
//! published in DNS (DNS-SD), once each. Finding a cluster proves nothing
//! about it: the output says so, and peering still takes a token
//! (docs/discovery.md). The record format is `liqo_api::discovery`'s.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use comfy_table::{Table, presets::UTF8_BORDERS_ONLY};
use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::{ResolveError, TokioResolver};
use liqo_api::discovery::{self, ClusterRecord, MDNS_SERVICE_TYPE};
use mdns_sd::{ServiceDaemon, ServiceEvent};
use serde::Serialize;

use crate::cli::DiscoverArgs;
use crate::error::UserError;
use crate::printer::Printer;

/// What the user is told about every cluster found.
pub const NOT_AUTHENTICATED: &str = "Discovery does not authenticate: anyone can announce any \
     cluster. To peer, get a peering token from the cluster's administrator (`liqoctl generate \
     peering-token` on it) and run `liqoctl peer --token ...`.";

/// A cluster as listed.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Found {
    pub name: String,
    pub cluster_id: String,
    pub labels: BTreeMap<String, String>,
    pub api_address: String,
    pub version: String,
    /// `lan`, or `dns:<domain>`, for each way it was found.
    pub found_via: Vec<String>,
    /// Always false: nothing found here is proven to be who it says.
    pub authenticated: bool,
}

#[derive(Debug, Serialize)]
struct Discovered {
    clusters: Vec<Found>,
}

/// The flags, checked before anything is sent.
#[derive(Debug)]
struct Search {
    lan: bool,
    domains: Vec<String>,
    dns_server: Option<SocketAddr>,
    timeout: Duration,
    expect: Option<usize>,
}

impl Search {
    fn parse(args: &DiscoverArgs) -> Result<Self, UserError> {
        let usage = UserError::Usage;
        let timeout =
            parse_duration(&args.timeout).map_err(|e| usage(format!("--timeout: {e}")))?;
        let domains = args
            .domains
            .iter()
            .map(|d| discovery::parse_domain(d).map_err(|e| usage(format!("--domain: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let dns_server = args
            .dns_server
            .as_deref()
            .map(|s| parse_server(s).map_err(|e| usage(format!("--dns-server: {e}"))))
            .transpose()?;
        if dns_server.is_some() && domains.is_empty() {
            return Err(usage("--dns-server needs --domain".to_owned()));
        }
        if args.expect == Some(0) {
            return Err(usage("--expect must be at least 1".to_owned()));
        }
        Ok(Self {
            lan: args.lan || domains.is_empty(),
            domains,
            dns_server,
            timeout,
            expect: args.expect,
        })
    }
}

pub async fn run(args: &DiscoverArgs, printer: Printer) -> anyhow::Result<()> {
    let search = Search::parse(args)?;
    let mut found = Clusters::default();
    if !search.domains.is_empty() {
        let resolver = resolver(search.dns_server, search.timeout)?;
        for domain in &search.domains {
            for record in lookup_domain(&resolver, domain, &search, &printer).await? {
                found.add(record, format!("dns:{domain}"), &printer);
            }
        }
    }
    if search.lan && search.expect.is_none_or(|n| found.len() < n) {
        browse_lan(&search, &mut found, &printer).await?;
    }
    let clusters = found.into_list();
    let short = search.expect.filter(|n| clusters.len() < *n);
    match args.output.output {
        Some(format) => printer.structured(
            &Discovered {
                clusters: clusters.clone(),
            },
            format,
        )?,
        None if clusters.is_empty() => {}
        None => {
            printer.result(render(&clusters).to_string());
            printer.info(NOT_AUTHENTICATED);
        }
    }
    if let Some(n) = short {
        return Err(UserError::Timeout(format!(
            "found {} of the {n} clusters expected within {}",
            clusters.len(),
            args.timeout
        ))
        .into());
    }
    if clusters.is_empty() {
        printer.info(format!(
            "No clusters found ({})",
            where_looked(&search, &args.timeout)
        ));
    }
    Ok(())
}

fn where_looked(search: &Search, timeout: &str) -> String {
    let mut places = Vec::new();
    if !search.domains.is_empty() {
        places.push(format!("looked in DNS under {}", search.domains.join(", ")));
    }
    if search.lan {
        places.push(format!("browsed the LAN for {timeout}"));
    }
    places.join("; ")
}

/// The clusters found so far, once per cluster ID.
#[derive(Debug, Default)]
struct Clusters(BTreeMap<String, Found>);

impl Clusters {
    fn add(&mut self, record: ClusterRecord, via: String, printer: &Printer) {
        let id = record.cluster_id.to_string();
        match self.0.get_mut(&id) {
            Some(known) => {
                if known.api_address != record.api.as_str() {
                    printer.info(format!(
                        "warning: cluster ID {id} is announced with two API addresses: {} ({}) \
                         and {} ({via}); showing the first",
                        known.api_address,
                        known.found_via.join(", "),
                        record.api
                    ));
                }
                if !known.found_via.contains(&via) {
                    known.found_via.push(via);
                }
            }
            None => {
                self.0.insert(
                    id.clone(),
                    Found {
                        name: record.cluster_name,
                        cluster_id: id,
                        labels: record.labels,
                        api_address: record.api.to_string(),
                        version: record.version,
                        found_via: vec![via],
                        authenticated: false,
                    },
                );
            }
        }
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    /// Sorted by name, then ID.
    fn into_list(self) -> Vec<Found> {
        let mut list: Vec<Found> = self.0.into_values().collect();
        list.sort_by(|a, b| (&a.name, &a.cluster_id).cmp(&(&b.name, &b.cluster_id)));
        list
    }
}

/// Browses `_liqo._tcp.local.` until the timeout, or until `--expect`
/// clusters are known. A service withdrawn meanwhile (goodbye) is dropped.
async fn browse_lan(
    search: &Search,
    found: &mut Clusters,
    printer: &Printer,
) -> anyhow::Result<()> {
    let daemon = ServiceDaemon::new()
        .map_err(|e| UserError::Refused(format!("cannot browse the LAN with mDNS: {e}")))?;
    let events = daemon
        .browse(MDNS_SERVICE_TYPE)
        .map_err(|e| UserError::Refused(format!("cannot browse the LAN with mDNS: {e}")))?;
    let started = tokio::time::Instant::now();
    let deadline = started + search.timeout;
    // By mDNS instance name: what a goodbye names.
    let mut on_lan = BTreeMap::<String, ClusterRecord>::new();
    let mut warned = std::collections::BTreeSet::new();
    let known = |on_lan: &BTreeMap<String, ClusterRecord>| {
        let mut ids: Vec<&str> = on_lan.values().map(|r| r.cluster_id.as_str()).collect();
        ids.extend(found.0.keys().map(String::as_str));
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    };
    loop {
        if search.expect.is_some_and(|n| known(&on_lan) >= n) {
            break;
        }
        let event = match tokio::time::timeout_at(deadline, events.recv_async()).await {
            Ok(Ok(event)) => event,
            Ok(Err(_)) | Err(_) => break,
        };
        tracing::trace!(after_ms = started.elapsed().as_millis(), ?event, "mDNS");
        match event {
            ServiceEvent::ServiceResolved(service) => {
                let txt = service
                    .txt_properties
                    .iter()
                    .map(|p| (p.key().to_owned(), p.val_str().to_owned()));
                match ClusterRecord::from_txt(txt) {
                    Ok(record) => {
                        tracing::debug!(
                            fullname = %service.fullname,
                            id = %record.cluster_id,
                            after_ms = started.elapsed().as_millis(),
                            "found on the LAN"
                        );
                        on_lan.insert(service.fullname.clone(), record);
                    }
                    Err(e) => {
                        if warned.insert(service.fullname.clone()) {
                            printer.info(format!(
                                "warning: skipped {}: its announcement is malformed: {e}",
                                service.fullname
                            ));
                        }
                    }
                }
            }
            ServiceEvent::ServiceRemoved(_, fullname) => {
                tracing::debug!(%fullname, "gone from the LAN");
                on_lan.remove(&fullname);
            }
            _ => {}
        }
    }
    if let Ok(done) = daemon.shutdown() {
        let _ = tokio::time::timeout(Duration::from_secs(1), done.recv_async()).await;
    }
    for record in on_lan.into_values() {
        found.add(record, "lan".to_owned(), printer);
    }
    Ok(())
}

fn resolver(server: Option<SocketAddr>, timeout: Duration) -> anyhow::Result<TokioResolver> {
    let mut builder = match server {
        Some(addr) => {
            let mut config = ResolverConfig::new();
            // TCP for answers too long for a datagram.
            config.add_name_server(NameServerConfig::new(addr, Protocol::Udp));
            config.add_name_server(NameServerConfig::new(addr, Protocol::Tcp));
            TokioResolver::builder_with_config(config, TokioConnectionProvider::default())
        }
        None => TokioResolver::builder_tokio().map_err(|e| {
            UserError::Config(format!(
                "cannot read the system's DNS configuration ({e}); pass --dns-server"
            ))
        })?,
    };
    let options = builder.options_mut();
    options.timeout = timeout;
    options.attempts = 1;
    options.edns0 = true;
    Ok(builder.build())
}

/// DNS-SD in `domain` (RFC 6763): the PTR records of `_liqo._tcp.<domain>`
/// name the instances; each instance's TXT says who it is. An instance
/// whose records are missing or malformed is skipped with a warning.
async fn lookup_domain(
    resolver: &TokioResolver,
    domain: &str,
    search: &Search,
    printer: &Printer,
) -> anyhow::Result<Vec<ClusterRecord>> {
    let service = discovery::service_name(domain);
    let unreachable = |e: &ResolveError| {
        let server = match search.dns_server {
            Some(s) => format!("the DNS server {s}"),
            None => "the system's DNS servers".to_owned(),
        };
        UserError::Unreachable(format!(
            "{server} did not answer for {service} within {:?} ({e}); check --dns-server and the network",
            search.timeout
        ))
    };
    let instances = match resolver.lookup(service.as_str(), RecordType::PTR).await {
        Ok(lookup) => lookup
            .iter()
            .filter_map(|r| match r {
                RData::PTR(ptr) => Some(ptr.0.to_ascii()),
                _ => None,
            })
            .collect::<Vec<_>>(),
        Err(e) if e.is_nx_domain() || e.is_no_records_found() => {
            printer.info(format!("No {} records under {domain}", discovery::SERVICE));
            return Ok(Vec::new());
        }
        Err(e) => return Err(unreachable(&e).into()),
    };
    let mut out = Vec::new();
    for instance in instances {
        let txt = match resolver.txt_lookup(instance.as_str()).await {
            Ok(txt) => txt,
            Err(e) if e.is_nx_domain() || e.is_no_records_found() => {
                printer.info(format!("warning: skipped {instance}: it has no TXT record"));
                continue;
            }
            Err(e) => return Err(unreachable(&e).into()),
        };
        // One instance has one TXT record; its strings are the entries.
        let strings: Vec<String> = txt
            .iter()
            .next()
            .map(|t| {
                t.txt_data()
                    .iter()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        match ClusterRecord::from_txt_strings(&strings) {
            Ok(record) => out.push(record),
            Err(e) => printer.info(format!(
                "warning: skipped {instance}: its TXT record is malformed: {e}"
            )),
        }
    }
    Ok(out)
}

/// `3s`, `500ms`, `2m`, or plain seconds; more than zero.
fn parse_duration(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let split = value
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{value:?} is not a duration such as 3s, 500ms or 1m"))?;
    let seconds = match unit {
        "" | "s" => number,
        "ms" => number / 1000.0,
        "m" => number * 60.0,
        _ => return Err(format!("{value:?}: the unit must be ms, s or m")),
    };
    if !(seconds > 0.0 && seconds <= 3600.0) {
        return Err(format!("{value:?} must be more than 0 and at most an hour"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// `ADDR[:PORT]`, port 53 by default; IPv6 with a port in brackets.
fn parse_server(value: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = value.parse::<SocketAddr>() {
        return Ok(addr);
    }
    value
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| format!("{value:?} is not an IP address with an optional port"))
}

fn render(clusters: &[Found]) -> Table {
    let mut table = Table::new();
    table.load_style(UTF8_BORDERS_ONLY).set_header(vec![
        "NAME",
        "CLUSTER ID",
        "LABELS",
        "API ADDRESS",
        "FOUND VIA",
    ]);
    for c in clusters {
        let labels: Vec<String> = c.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        table.add_row(vec![
            c.name.clone(),
            c.cluster_id.clone(),
            labels.join("\n"),
            c.api_address.clone(),
            c.found_via.join(", "),
        ]);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, name: &str, api: &str) -> ClusterRecord {
        ClusterRecord::from_txt_strings([
            format!("id={id}"),
            format!("name={name}"),
            format!("api={api}"),
        ])
        .expect("valid")
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        for bad in ["0", "0s", "", "s", "3h", "-1s", "2d", "99999"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn dns_servers() {
        assert_eq!(
            parse_server("127.0.0.1:5353"),
            Ok(([127, 0, 0, 1], 5353).into())
        );
        assert_eq!(parse_server("10.0.0.1"), Ok(([10, 0, 0, 1], 53).into()));
        assert_eq!(
            parse_server("[::1]:54").map(|s| s.port()),
            Ok(54),
            "IPv6 with a port"
        );
        assert_eq!(parse_server("::1").map(|s| s.port()), Ok(53));
        assert!(parse_server("dns.example.org").is_err());
    }

    #[test]
    fn clusters_found_twice_are_listed_once_with_both_sources() {
        let printer = Printer::new(true);
        let mut found = Clusters::default();
        found.add(
            record("c2", "b", "https://10.0.0.2"),
            "lan".into(),
            &printer,
        );
        found.add(
            record("c1", "a", "https://10.0.0.1"),
            "lan".into(),
            &printer,
        );
        found.add(
            record("c1", "a", "https://10.0.0.1"),
            "dns:example.org".into(),
            &printer,
        );
        let list = found.into_list();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].cluster_id, "c1");
        assert_eq!(list[0].found_via, ["lan", "dns:example.org"]);
        assert!(!list[0].authenticated);
    }

    #[test]
    fn the_table_has_the_columns_and_labels() {
        let mut r = record("c1", "home", "https://10.0.0.1:6443");
        r.labels.insert("region".into(), "eu".into());
        let mut found = Clusters::default();
        found.add(r, "lan".into(), &Printer::new(true));
        let text = render(&found.into_list()).to_string();
        for want in [
            "NAME",
            "CLUSTER ID",
            "LABELS",
            "API ADDRESS",
            "FOUND VIA",
            "home",
            "region=eu",
            "https://10.0.0.1:6443",
            "lan",
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
    }
}
