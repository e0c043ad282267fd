//! How a cluster is described to those looking for peers, with DNS-SD
//! (RFC 6763) over mDNS on the LAN or over ordinary DNS: the service type,
//! the TXT record's keys, and the zone-file lines an administrator
//! publishes. Pure functions: the gateway announces and `liqoctl discover`
//! browses with them (docs/discovery.md).
//!
//! Nothing here authenticates anyone: anybody on a LAN can announce
//! anything. A record is checked only so that a malformed one is refused
//! whole instead of shown half right.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use serde::Serialize;

use crate::core::identity::{self, IdentityError};
use crate::{ClusterId, ClusterIdentity, validation};

/// The DNS-SD service of liqo-rs clusters; under a domain in DNS, under
/// `local.` in mDNS.
pub const SERVICE: &str = "_liqo._tcp";
/// The service type as mDNS browsers name it.
pub const MDNS_SERVICE_TYPE: &str = "_liqo._tcp.local.";

/// The TXT keys. Label keys are [`LABEL_PREFIX`] then the label's own key.
pub mod txt_keys {
    pub const ID: &str = "id";
    pub const NAME: &str = "name";
    pub const API: &str = "api";
    pub const VERSION: &str = "version";
    pub const LABEL_PREFIX: &str = "label.";
}

/// One character-string of a TXT record holds at most 255 bytes (RFC 1035).
const TXT_STRING_MAX: usize = 255;

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("the API address {url:?} is not valid: {why}")]
    BadApiAddress { url: String, why: String },
    #[error("the TXT record lacks its {0:?} key")]
    MissingKey(&'static str),
    #[error("the TXT record's {key:?} is not valid")]
    BadValue {
        key: String,
        #[source]
        source: IdentityError,
    },
    #[error("the TXT entry {0:?} is longer than the 255 bytes a TXT string holds")]
    TooLong(String),
    #[error("the domain {domain:?} is not valid: {why}")]
    BadDomain { domain: String, why: String },
}

/// The HTTPS URL of a cluster's API server, as peers should reach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(into = "String")]
pub struct ApiAddress {
    url: String,
    host: String,
    port: u16,
}

impl ApiAddress {
    /// Parses `https://HOST[:PORT][/PATH]`: HTTPS only (peers speak TLS to
    /// it), no user information (a URL must carry no secret), a host that
    /// is an IP address or a DNS name, and nothing a zone file would have
    /// to escape.
    pub fn parse(url: &str) -> Result<Self, DiscoveryError> {
        let bad = |why: &str| DiscoveryError::BadApiAddress {
            url: url.to_owned(),
            why: why.to_owned(),
        };
        let rest = url
            .strip_prefix("https://")
            .ok_or_else(|| bad("it must start with https://"))?;
        if url
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || "\"\\".contains(c))
        {
            return Err(bad("it holds spaces, quotes or backslashes"));
        }
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.contains('@') {
            return Err(bad("it must not carry user information"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("an IPv6 address lacks its ']'"))?;
            host.parse::<std::net::Ipv6Addr>()
                .map_err(|_| bad("the IPv6 address is not valid"))?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| bad("junk after ']'"))?),
            };
            (host.to_owned(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host.to_ascii_lowercase(), Some(port)),
                None => (authority.to_ascii_lowercase(), None),
            }
        };
        if host.is_empty() {
            return Err(bad("it has no host"));
        }
        if host.parse::<IpAddr>().is_err() {
            validation::dns_subdomain(host.trim_end_matches('.'))
                .map_err(|e| bad(&format!("the host {e}")))?;
        }
        let port = match port {
            None => 443,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| bad("the port must be a number from 1 to 65535"))?,
        };
        Ok(Self {
            url: url.to_owned(),
            host,
            port,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// The host: a DNS name or an IP address (IPv6 without brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The host as an IP address, when it is one.
    pub fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl From<ApiAddress> for String {
    fn from(a: ApiAddress) -> Self {
        a.url
    }
}

impl fmt::Display for ApiAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)
    }
}

/// What a cluster tells those looking for peers: who it is and where its
/// API server is. Never anything secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRecord {
    pub cluster_id: ClusterId,
    pub cluster_name: String,
    pub labels: BTreeMap<String, String>,
    pub api: ApiAddress,
    /// The liqo-rs version of the announcer; empty when it did not say.
    pub version: String,
}

impl ClusterRecord {
    /// The record of the local cluster, announced by this version.
    pub fn of(identity: &ClusterIdentity, api: ApiAddress) -> Self {
        Self {
            cluster_id: identity.cluster_id.clone(),
            cluster_name: identity.cluster_name.clone(),
            labels: identity.labels.clone(),
            api,
            version: crate::VERSION.to_owned(),
        }
    }

    /// Checks the name and labels as an identity's are checked.
    pub fn validate(&self) -> Result<(), DiscoveryError> {
        let bad = |key: &str| {
            let key = key.to_owned();
            move |source| DiscoveryError::BadValue { key, source }
        };
        identity::check_cluster_name(&self.cluster_name).map_err(bad(txt_keys::NAME))?;
        identity::check_labels(&self.labels).map_err(bad(txt_keys::LABEL_PREFIX))?;
        Ok(())
    }

    /// The TXT record as key/value pairs: `id`, `name`, `api`, `version`,
    /// then `label.<key>` for each label. Fails when an entry would not
    /// fit in one TXT string (a label with a very long key).
    pub fn to_txt(&self) -> Result<Vec<(String, String)>, DiscoveryError> {
        let mut out = vec![
            (txt_keys::ID.to_owned(), self.cluster_id.to_string()),
            (txt_keys::NAME.to_owned(), self.cluster_name.clone()),
            (txt_keys::API.to_owned(), self.api.to_string()),
            (txt_keys::VERSION.to_owned(), self.version.clone()),
        ];
        out.extend(
            self.labels
                .iter()
                .map(|(k, v)| (format!("{}{k}", txt_keys::LABEL_PREFIX), v.clone())),
        );
        if let Some((k, v)) = out
            .iter()
            .find(|(k, v)| k.len() + 1 + v.len() > TXT_STRING_MAX)
        {
            return Err(DiscoveryError::TooLong(format!("{k}={v}")));
        }
        Ok(out)
    }

    /// Reads a TXT record back, as key/value pairs in the record's order.
    /// Keys are case-insensitive and only the first of a key counts (RFC
    /// 6763, 6.4); unknown keys are ignored, so that later versions may
    /// add some. The result is validated whole.
    pub fn from_txt<K, V>(entries: impl IntoIterator<Item = (K, V)>) -> Result<Self, DiscoveryError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut seen = std::collections::BTreeSet::new();
        let mut fields = BTreeMap::<&'static str, String>::new();
        let mut labels = BTreeMap::new();
        for (key, value) in entries {
            let (key, value) = (key.as_ref(), value.as_ref());
            if !seen.insert(key.to_ascii_lowercase()) {
                continue;
            }
            let known = [
                txt_keys::ID,
                txt_keys::NAME,
                txt_keys::API,
                txt_keys::VERSION,
            ];
            if let Some(k) = known.into_iter().find(|k| k.eq_ignore_ascii_case(key)) {
                fields.insert(k, value.to_owned());
            } else if key.len() > txt_keys::LABEL_PREFIX.len()
                && key.is_char_boundary(txt_keys::LABEL_PREFIX.len())
                && key[..txt_keys::LABEL_PREFIX.len()].eq_ignore_ascii_case(txt_keys::LABEL_PREFIX)
            {
                labels.insert(
                    key[txt_keys::LABEL_PREFIX.len()..].to_owned(),
                    value.to_owned(),
                );
            }
        }
        let mut take =
            |key: &'static str| fields.remove(key).ok_or(DiscoveryError::MissingKey(key));
        let cluster_id =
            ClusterId::new(take(txt_keys::ID)?).map_err(|source| DiscoveryError::BadValue {
                key: txt_keys::ID.to_owned(),
                source,
            })?;
        let record = Self {
            cluster_id,
            cluster_name: take(txt_keys::NAME)?,
            api: ApiAddress::parse(&take(txt_keys::API)?)?,
            version: take(txt_keys::VERSION).unwrap_or_default(),
            labels,
        };
        record.validate()?;
        Ok(record)
    }

    /// The same as [`ClusterRecord::from_txt`], from `key=value` strings as
    /// DNS TXT records hold them (a string without `=` is a key with no
    /// value).
    pub fn from_txt_strings<S: AsRef<str>>(
        strings: impl IntoIterator<Item = S>,
    ) -> Result<Self, DiscoveryError> {
        let pairs: Vec<(String, String)> = strings
            .into_iter()
            .map(|s| match s.as_ref().split_once('=') {
                Some((k, v)) => (k.to_owned(), v.to_owned()),
                None => (s.as_ref().to_owned(), String::new()),
            })
            .collect();
        Self::from_txt(pairs)
    }

    /// The mDNS host name of the announcer: its own, so that it clashes
    /// with no machine's name on the LAN.
    pub fn mdns_host(&self) -> String {
        format!("liqo-{}.local.", self.cluster_id)
    }
}

/// A DNS domain for DNS-SD records, normalised: lowercase, no final dot.
pub fn parse_domain(domain: &str) -> Result<String, DiscoveryError> {
    let normal = domain.trim_end_matches('.').to_ascii_lowercase();
    validation::dns_subdomain(&normal).map_err(|e| DiscoveryError::BadDomain {
        domain: domain.to_owned(),
        why: e.0,
    })?;
    Ok(normal)
}

/// The name browsed for in `domain`: `_liqo._tcp.<domain>.`.
pub fn service_name(domain: &str) -> String {
    format!("{SERVICE}.{domain}.")
}

/// The DNS-SD records of `record` under `domain`, in RFC 1035 master-file
/// syntax: the PTR that lists the cluster, then its SRV and TXT. When the
/// API host is an IP address, the SRV points at the instance's own name,
/// which gets the A or AAAA record (an SRV target must be a name).
pub fn zone_records(
    record: &ClusterRecord,
    domain: &str,
    ttl: u32,
) -> Result<String, DiscoveryError> {
    let domain = parse_domain(domain)?;
    let service = service_name(&domain);
    let instance = format!("{}.{service}", record.cluster_name);
    let txt = record
        .to_txt()?
        .into_iter()
        .map(|(k, v)| quote(&format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(" ");
    let (target, address) = match record.api.ip() {
        Some(IpAddr::V4(ip)) => (instance.clone(), Some(format!("A\t{ip}"))),
        Some(IpAddr::V6(ip)) => (instance.clone(), Some(format!("AAAA\t{ip}"))),
        None => (
            format!("{}.", record.api.host().trim_end_matches('.')),
            None,
        ),
    };
    let mut out = format!(
        "; DNS-SD records of the liqo-rs cluster {name} (ID {id}), made by liqoctl {version}.\n\
         ; Finding a cluster here does not authenticate it: peers still need a peering token.\n\
         {service}\t{ttl}\tIN\tPTR\t{instance}\n\
         {instance}\t{ttl}\tIN\tSRV\t0 0 {port} {target}\n\
         {instance}\t{ttl}\tIN\tTXT\t{txt}\n",
        name = record.cluster_name,
        id = record.cluster_id,
        version = crate::VERSION,
        port = record.api.port(),
    );
    if let Some(address) = address {
        out.push_str(&format!("{instance}\t{ttl}\tIN\t{address}\n"));
    }
    Ok(out)
}

/// A master-file character-string: quoted, with `"` and `\` escaped.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> ClusterRecord {
        ClusterRecord {
            cluster_id: ClusterId::new("a1b2-c3").expect("valid"),
            cluster_name: "home".to_owned(),
            labels: BTreeMap::from([
                ("region".to_owned(), "eu-west".to_owned()),
                ("topology.kubernetes.io/zone".to_owned(), "z1".to_owned()),
            ]),
            api: ApiAddress::parse("https://api.home.example:6443").expect("valid"),
            version: "0.1.0".to_owned(),
        }
    }

    #[test]
    fn txt_round_trips() {
        let record = record();
        let txt = record.to_txt().expect("fits");
        assert_eq!(
            txt[..4],
            [
                ("id".to_owned(), "a1b2-c3".to_owned()),
                ("name".to_owned(), "home".to_owned()),
                ("api".to_owned(), "https://api.home.example:6443".to_owned()),
                ("version".to_owned(), "0.1.0".to_owned()),
            ]
        );
        assert!(txt.contains(&("label.region".to_owned(), "eu-west".to_owned())));
        assert_eq!(ClusterRecord::from_txt(txt).expect("back"), record);
        let strings = [
            "id=a1b2-c3",
            "name=home",
            "api=https://api.home.example:6443",
        ];
        let back = ClusterRecord::from_txt_strings(strings).expect("no version nor labels");
        assert_eq!(back.version, "");
        assert!(back.labels.is_empty());
    }

    #[test]
    fn txt_keys_are_case_insensitive_first_wins_unknown_ignored() {
        let back = ClusterRecord::from_txt_strings([
            "ID=x1",
            "id=x2",
            "Name=n",
            "api=https://10.0.0.1",
            "future=thing",
            "LABEL.k=v",
        ])
        .expect("valid");
        assert_eq!(back.cluster_id.as_str(), "x1");
        assert_eq!(back.labels.get("k").map(String::as_str), Some("v"));
        assert_eq!(back.api.port(), 443);
    }

    /// A malformed announcement is refused, each for its own reason.
    #[test]
    fn malformed_txt_is_refused_with_the_reason() {
        let good = ["id=x1", "name=n", "api=https://h:1"];
        let cases: [(&[&str], &str); 10] = [
            (&good[1..], "\"id\""),
            (&["id=x1", "api=https://h"], "\"name\""),
            (&["id=x1", "name=n"], "\"api\""),
            (&["id=Bad_ID", "name=n", "api=https://h"], "\"id\""),
            (&["id=x1", "name=Not A Name", "api=https://h"], "\"name\""),
            (&["id=x1", "name=n", "api=http://h"], "https://"),
            (&["id=x1", "name=n", "api=https://h:99999"], "port"),
            (&["id=x1", "name=n", "api=https://u:p@h"], "user"),
            (
                &["id=x1", "name=n", "api=https://h", "label.k=bad value"],
                "label",
            ),
            (
                &["id=x1", "name=n", "api=https://h", "label.liqo.io/x=y"],
                "label",
            ),
        ];
        for (txt, expected) in cases {
            let err = ClusterRecord::from_txt_strings(txt).expect_err(&txt.join(" "));
            assert!(err.to_string().contains(expected), "{txt:?}: {err}");
        }
    }

    #[test]
    fn api_addresses() {
        for (url, host, port) in [
            ("https://10.1.2.3:6443", "10.1.2.3", 6443),
            ("https://[fd00::1]:6443/", "fd00::1", 6443),
            ("https://[fd00::1]", "fd00::1", 443),
            ("https://API.Example.org/k8s", "api.example.org", 443),
        ] {
            let a = ApiAddress::parse(url).expect(url);
            assert_eq!((a.host(), a.port()), (host, port), "{url}");
        }
        for bad in [
            "",
            "10.1.2.3:6443",
            "https://",
            "https://:6443",
            "https://h:0",
            "https://h:x",
            "https://[fd00::1",
            "https://bad_host",
            "https://h/\"x",
            "https://h /",
        ] {
            assert!(ApiAddress::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_label_too_long_for_a_txt_string_is_refused() {
        let mut r = record();
        let key = format!("{}/{}", vec!["p".repeat(63); 3].join("."), "k".repeat(63));
        r.labels.insert(key, "v".repeat(63));
        assert!(matches!(r.to_txt(), Err(DiscoveryError::TooLong(_))));
    }

    #[test]
    fn zone_lines_for_a_named_api_host() {
        let zone = zone_records(&record(), "Example.ORG.", 300).expect("zone");
        let lines: Vec<&str> = zone.lines().filter(|l| !l.starts_with(';')).collect();
        assert_eq!(
            lines,
            [
                "_liqo._tcp.example.org.\t300\tIN\tPTR\thome._liqo._tcp.example.org.",
                "home._liqo._tcp.example.org.\t300\tIN\tSRV\t0 0 6443 api.home.example.",
                "home._liqo._tcp.example.org.\t300\tIN\tTXT\t\"id=a1b2-c3\" \"name=home\" \
                 \"api=https://api.home.example:6443\" \"version=0.1.0\" \"label.region=eu-west\" \
                 \"label.topology.kubernetes.io/zone=z1\"",
            ]
        );
    }

    #[test]
    fn zone_lines_for_an_ip_api_host_add_an_address_record() {
        let mut r = record();
        r.api = ApiAddress::parse("https://192.0.2.7:6443").expect("valid");
        let zone = zone_records(&r, "example.org", 60).expect("zone");
        assert!(
            zone.contains("SRV\t0 0 6443 home._liqo._tcp.example.org.\n"),
            "{zone}"
        );
        assert!(
            zone.contains("home._liqo._tcp.example.org.\t60\tIN\tA\t192.0.2.7\n"),
            "{zone}"
        );
        r.api = ApiAddress::parse("https://[2001:db8::7]:6443").expect("valid");
        let zone = zone_records(&r, "example.org", 60).expect("zone");
        assert!(zone.contains("IN\tAAAA\t2001:db8::7\n"), "{zone}");
    }

    #[test]
    fn domains() {
        assert_eq!(parse_domain("Example.Test.").expect("ok"), "example.test");
        for bad in ["", ".", "a..b", "bad_domain.org", "-x.org"] {
            assert!(parse_domain(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn quoting_escapes_quotes_and_backslashes() {
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
