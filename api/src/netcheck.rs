//! What `liqoctl test network` and its probe pods (`liqo-gateway netcheck`)
//! say to each other: the targets a probe is given, the answer a server
//! sends, and the report a probe leaves in its termination message.

use serde::{Deserialize, Serialize};

/// The port netcheck servers listen on in `liqoctl test network`'s pods.
pub const PORT: u16 = 8080;

/// One thing to reach: `NAME=HOST:PORT` on the probe's command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    pub address: String,
}

impl Target {
    pub fn parse(text: &str) -> Result<Self, String> {
        let (name, address) = text
            .split_once('=')
            .ok_or_else(|| format!("target {text:?} is not NAME=HOST:PORT"))?;
        let port_ok = address.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if name.is_empty() || !port_ok {
            return Err(format!("target {text:?} is not NAME=HOST:PORT"));
        }
        Ok(Self {
            name: name.to_owned(),
            address: address.to_owned(),
        })
    }

    /// The form [`Target::parse`] reads.
    pub fn arg(&self) -> String {
        format!("{}={}", self.name, self.address)
    }
}

/// A netcheck server's answer: who it is, and the address the connection
/// came from as it saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    pub server: String,
    pub seen_from: String,
}

/// How one target went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub name: String,
    pub address: String,
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<Answer>,
    /// Why the last attempt failed, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.answer.is_some()
    }
}

/// What a probe found, as it leaves it in its termination message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeReport {
    pub from: String,
    pub results: Vec<Outcome>,
}

impl ProbeReport {
    pub fn passed(&self) -> bool {
        self.results.iter().all(Outcome::passed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_name_host_and_port() {
        let t = Target::parse("pod=10.0.0.1:8080").expect("valid");
        assert_eq!(t.name, "pod");
        assert_eq!(t.address, "10.0.0.1:8080");
        assert_eq!(Target::parse(&t.arg()), Ok(t));
        assert!(Target::parse("svc=[fd00::1]:80").is_ok());
        for bad in [
            "10.0.0.1:80",
            "=10.0.0.1:80",
            "a=10.0.0.1",
            "a=:80",
            "a=h:0",
            "a=h:x",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_report_passes_when_every_target_answered() {
        let answered = Outcome {
            name: "pod".into(),
            address: "10.0.0.1:8080".into(),
            attempts: 1,
            rtt_ms: Some(0.4),
            answer: Some(Answer {
                server: "s".into(),
                seen_from: "10.1.0.2".into(),
            }),
            error: None,
        };
        let failed = Outcome {
            answer: None,
            rtt_ms: None,
            error: Some("connection refused".into()),
            ..answered.clone()
        };
        let report = |results| ProbeReport {
            from: "c".into(),
            results,
        };
        assert!(report(vec![answered.clone()]).passed());
        assert!(!report(vec![answered, failed.clone()]).passed());
        let text = serde_json::to_string(&report(vec![failed])).expect("json");
        assert!(text.contains("\"error\":\"connection refused\""), "{text}");
        assert!(!text.contains("rttMs"), "{text}");
    }
}
