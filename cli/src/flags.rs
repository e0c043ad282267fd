//! Flag values that more than one command takes, parsed and checked
//! before any cluster is contacted: label-like `KEY=VALUE` pairs, node
//! selectors and tolerations, and the amounts a consumer asks for.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use liqo_api::sharing::{self, Amounts};

use crate::cli::NodePlacementArgs;
use crate::error::UserError;

/// `--node-selector` and `--toleration`, parsed: each `None` when not
/// given.
#[derive(Debug, Clone, Default)]
pub struct NodePlacement {
    pub node_selector: Option<BTreeMap<String, String>>,
    pub tolerations: Option<Vec<Toleration>>,
}

impl NodePlacementArgs {
    pub fn parse(&self) -> Result<NodePlacement, UserError> {
        Ok(NodePlacement {
            node_selector: (!self.node_selector.is_empty())
                .then(|| parse_pairs("--node-selector", &self.node_selector))
                .transpose()?,
            tolerations: (!self.tolerations.is_empty())
                .then(|| parse_tolerations(&self.tolerations))
                .transpose()?,
        })
    }
}

/// Parses `key=value` pairs; keys and values checked as the API server
/// checks labels, and the reason given in its words.
pub fn parse_pairs(flag: &str, pairs: &[String]) -> Result<BTreeMap<String, String>, UserError> {
    let mut out = BTreeMap::new();
    for pair in pairs.iter().filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(UserError::Usage(format!(
                "{flag}: {pair:?} is not KEY=VALUE"
            )));
        };
        let label = BTreeMap::from([(key.to_owned(), value.to_owned())]);
        liqo_api::validation::labels(&label)
            .map_err(|e| UserError::Usage(format!("{flag}: {pair:?}: {e}")))?;
        out.extend(label);
    }
    Ok(out)
}

/// Parses `--toleration KEY[=VALUE][:EFFECT]` (kubectl taint's syntax): with
/// a value the toleration matches it exactly, without one any value; with
/// no effect it tolerates every effect.
pub fn parse_tolerations(values: &[String]) -> Result<Vec<Toleration>, UserError> {
    const EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];
    let usage = |v: &str, why: String| UserError::Usage(format!("--toleration: {v:?}: {why}"));
    let mut out = Vec::new();
    for value in values.iter().filter(|v| !v.is_empty()) {
        let (rest, effect) = match value.rsplit_once(':') {
            Some((rest, effect)) if EFFECTS.contains(&effect) => (rest, Some(effect.to_owned())),
            Some((_, effect)) => {
                return Err(usage(
                    value,
                    format!("the effect {effect:?} is none of {}", EFFECTS.join(", ")),
                ));
            }
            None => (value.as_str(), None),
        };
        let (key, val) = match rest.split_once('=') {
            Some((key, val)) => (key, Some(val.to_owned())),
            None => (rest, None),
        };
        liqo_api::validation::label_key(key).map_err(|e| usage(value, format!("key {e}")))?;
        if let Some(val) = &val {
            liqo_api::validation::label_value(val)
                .map_err(|e| usage(value, format!("value {e}")))?;
        }
        out.push(Toleration {
            operator: Some(if val.is_some() { "Equal" } else { "Exists" }.to_owned()),
            key: Some(key.to_owned()),
            value: val,
            effect,
            ..Default::default()
        });
    }
    Ok(out)
}

/// The amounts asked for with `--cpu`, `--memory` and `--pods`, if any.
pub fn parse_request(args: &crate::cli::RequestArgs) -> Result<Option<Amounts>, UserError> {
    let crate::cli::RequestArgs {
        cpu,
        memory,
        pods,
        storage,
        claims,
        ..
    } = args;
    if [cpu, memory, pods, storage, claims]
        .iter()
        .all(|v| v.is_none())
    {
        return Ok(None);
    }
    let quantity = |flag: &str, v: &Option<String>, parse: fn(&str) -> Option<u64>| {
        v.as_deref()
            .map(|text| match parse(text) {
                None => Err(UserError::Usage(format!(
                    "{flag}: {text:?} is not a quantity such as 2, 500m or 4Gi"
                ))),
                // Zero would ask for nothing, which a grant reads as "all
                // that is offered": said, rather than taken.
                Some(0) => Err(UserError::Usage(format!(
                    "{flag}: {text:?} asks for nothing; ask for more than 0, or leave {flag} out \
                     to take what the provider offers"
                ))),
                Some(n) => Ok(n),
            })
            .transpose()
            .map(Option::unwrap_or_default)
    };
    Ok(Some(Amounts {
        cpu_millis: quantity("--cpu", cpu, sharing::parse_cpu_millis)?,
        memory_bytes: quantity("--memory", memory, sharing::parse_bytes)?,
        pods: quantity("--pods", pods, |s| s.parse().ok())?,
        storage_bytes: quantity("--storage", storage, sharing::parse_bytes)?,
        claims: quantity("--claims", claims, |s| s.parse().ok())?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_parse_and_bad_ones_are_named() {
        let ok = parse_pairs(
            "--x",
            &["a=b".into(), "topology.kubernetes.io/region=eu".into()],
        )
        .expect("valid");
        assert_eq!(
            ok.get("topology.kubernetes.io/region").map(String::as_str),
            Some("eu")
        );
        for bad in [
            "novalue",
            "=v",
            "k=bad value",
            "k=-x",
            "Bad.Prefix/k=v",
            "a/b/c=v",
        ] {
            let err = parse_pairs("--x", &[bad.into()]).expect_err(bad);
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn tolerations_follow_kubectl_taint_syntax() {
        let parsed = parse_tolerations(&[
            "testbed.liqo.io/host-process=true:NoSchedule".into(),
            "dedicated:NoExecute".into(),
            "infra".into(),
        ])
        .expect("valid");
        let summary: Vec<_> = parsed
            .iter()
            .map(|t| {
                (
                    t.key.as_deref(),
                    t.operator.as_deref(),
                    t.value.as_deref(),
                    t.effect.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (
                    Some("testbed.liqo.io/host-process"),
                    Some("Equal"),
                    Some("true"),
                    Some("NoSchedule")
                ),
                (Some("dedicated"), Some("Exists"), None, Some("NoExecute")),
                (Some("infra"), Some("Exists"), None, None),
            ]
        );
        for bad in ["k=v:Never", "bad key:NoSchedule", "k=bad value"] {
            let err = parse_tolerations(&[bad.into()]).expect_err(bad);
            assert!(err.to_string().contains("--toleration"), "{err}");
        }
    }
}
