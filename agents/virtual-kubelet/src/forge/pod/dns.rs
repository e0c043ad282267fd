//! Where a remote pod resolves names: as at home. A pod whose DNS policy
//! is the cluster's (`ClusterFirst`, the default, or
//! `ClusterFirstWithHostNet`) is given the names server of its twin
//! (`crate::reflection::nameserver`) and the search path it has at
//! home, that of its local namespace, so that `svc`, `svc.ns` and
//! `svc.ns.svc.<domain>` name the same Service as on the consumer, even
//! when the twin namespace has another name. What the pod states itself
//! (its own `dnsConfig`) is kept after ours; a pod with the `Default` or
//! `None` policy resolves as it says.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{PodDNSConfig, PodDNSConfigOption, PodSpec};

/// Kubernetes' limits on a pod's resolver: nameservers and search domains.
const MAX_NAMESERVERS: usize = 3;
const MAX_SEARCHES: usize = 32;

/// Makes `spec`, of a pod of local namespace `namespace`, resolve with
/// `nameserver` in the consumer's cluster domain `domain`.
pub fn resolve_at_home(spec: &mut PodSpec, namespace: &str, domain: &str, nameserver: IpAddr) {
    let cluster_policy = matches!(
        spec.dns_policy.as_deref(),
        None | Some("ClusterFirst" | "ClusterFirstWithHostNet")
    );
    if !cluster_policy {
        return;
    }
    let own = spec.dns_config.take().unwrap_or_default();
    let mut nameservers = vec![nameserver.to_string()];
    nameservers.extend(own.nameservers.into_iter().flatten());
    nameservers.dedup();
    nameservers.truncate(MAX_NAMESERVERS);
    let mut searches = vec![
        format!("{namespace}.svc.{domain}"),
        format!("svc.{domain}"),
        domain.to_owned(),
    ];
    for search in own.searches.into_iter().flatten() {
        if !searches.contains(&search) {
            searches.push(search);
        }
    }
    searches.truncate(MAX_SEARCHES);
    let mut options = own.options.unwrap_or_default();
    if !options.iter().any(|o| o.name.as_deref() == Some("ndots")) {
        options.insert(
            0,
            PodDNSConfigOption {
                name: Some("ndots".to_owned()),
                value: Some("5".to_owned()),
            },
        );
    }
    spec.dns_policy = Some("None".to_owned());
    spec.dns_config = Some(PodDNSConfig {
        nameservers: Some(nameservers),
        searches: Some(searches),
        options: Some(options),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(policy: Option<&str>, own: Option<PodDNSConfig>) -> PodSpec {
        let mut spec = PodSpec {
            dns_policy: policy.map(str::to_owned),
            dns_config: own,
            ..PodSpec::default()
        };
        resolve_at_home(
            &mut spec,
            "shop",
            "cluster.local",
            "10.96.4.2".parse().expect("an address"),
        );
        spec
    }

    #[test]
    fn a_pod_of_the_clusters_policy_resolves_as_in_its_home_namespace() {
        for policy in [None, Some("ClusterFirst"), Some("ClusterFirstWithHostNet")] {
            let spec = resolved(policy, None);
            assert_eq!(spec.dns_policy.as_deref(), Some("None"), "{policy:?}");
            let config = spec.dns_config.expect("a config");
            assert_eq!(
                config.nameservers.as_deref(),
                Some(&["10.96.4.2".to_owned()][..])
            );
            assert_eq!(
                config.searches.as_deref(),
                Some(
                    &[
                        "shop.svc.cluster.local".to_owned(),
                        "svc.cluster.local".to_owned(),
                        "cluster.local".to_owned(),
                    ][..]
                )
            );
            let options = config.options.expect("options");
            assert_eq!(options[0].name.as_deref(), Some("ndots"));
            assert_eq!(options[0].value.as_deref(), Some("5"));
        }
    }

    #[test]
    fn what_the_pod_states_is_kept_after_ours_within_the_limits() {
        let own = PodDNSConfig {
            nameservers: Some(vec![
                "1.1.1.1".to_owned(),
                "2.2.2.2".to_owned(),
                "3.3.3.3".to_owned(),
            ]),
            searches: Some(vec![
                "corp.example".to_owned(),
                "svc.cluster.local".to_owned(),
            ]),
            options: Some(vec![PodDNSConfigOption {
                name: Some("ndots".to_owned()),
                value: Some("2".to_owned()),
            }]),
        };
        let config = resolved(Some("ClusterFirst"), Some(own))
            .dns_config
            .expect("a config");
        assert_eq!(
            config.nameservers.as_deref(),
            Some(
                &[
                    "10.96.4.2".to_owned(),
                    "1.1.1.1".to_owned(),
                    "2.2.2.2".to_owned()
                ][..]
            )
        );
        let searches = config.searches.expect("searches");
        assert_eq!(searches.last().map(String::as_str), Some("corp.example"));
        assert_eq!(searches.len(), 4, "no search twice: {searches:?}");
        let options = config.options.expect("options");
        assert_eq!(options.len(), 1, "its own ndots stands");
        assert_eq!(options[0].value.as_deref(), Some("2"));
    }

    #[test]
    fn a_pod_that_chose_its_resolver_keeps_it() {
        for policy in ["Default", "None"] {
            let spec = resolved(Some(policy), None);
            assert_eq!(spec.dns_policy.as_deref(), Some(policy));
            assert!(spec.dns_config.is_none());
        }
    }
}
