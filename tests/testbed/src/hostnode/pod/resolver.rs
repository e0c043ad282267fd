//! The resolver of a pod that states its own (`dnsPolicy: None` and a
//! `dnsConfig`), as a kubelet writes it: a `resolv.conf` bound over the
//! host's in the pod's processes' view, so that a name they resolve is
//! asked of the pod's nameservers (offloaded pods, whose names server is
//! the consumer's virtual kubelet). Other pods keep the host's resolver:
//! the host-process nodes' clusters run no cluster DNS.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::PodSpec;

use super::super::{HostNodeConfig, StartError};
use super::PodRuntime;

/// Where the resolver's configuration is read.
pub(super) const RESOLV_CONF: &str = "/etc/resolv.conf";

/// The `resolv.conf` of a pod that states its resolver, or none.
pub(super) fn resolv_conf(spec: &PodSpec) -> Option<String> {
    if spec.dns_policy.as_deref() != Some("None") {
        return None;
    }
    let config = spec.dns_config.as_ref()?;
    let mut text = String::new();
    let searches = config.searches.as_deref().unwrap_or_default();
    if !searches.is_empty() {
        text.push_str(&format!("search {}\n", searches.join(" ")));
    }
    for server in config.nameservers.iter().flatten() {
        text.push_str(&format!("nameserver {server}\n"));
    }
    let options: Vec<String> = (config.options.iter().flatten())
        .filter_map(|o| {
            let name = o.name.as_deref()?;
            Some(match o.value.as_deref() {
                Some(value) => format!("{name}:{value}"),
                None => name.to_owned(),
            })
        })
        .collect();
    if !options.is_empty() {
        text.push_str(&format!("options {}\n", options.join(" ")));
    }
    Some(text)
}

impl PodRuntime {
    /// The file of the pod's own `resolv.conf`, written anew, or none
    /// when it keeps the host's resolver.
    pub(super) fn resolver_file(
        &self,
        config: &HostNodeConfig,
        spec: &PodSpec,
    ) -> Result<Option<PathBuf>, StartError> {
        let Some(text) = resolv_conf(spec) else {
            return Ok(None);
        };
        let path = self.dir(config).join("resolv.conf");
        std::fs::write(&path, text).map_err(|source| StartError::Write {
            path: path.clone(),
            source,
        })?;
        Ok(Some(path))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodDNSConfig, PodDNSConfigOption};

    use super::*;

    #[test]
    fn a_pod_that_states_its_resolver_gets_it_and_others_keep_the_hosts() {
        let config = PodDNSConfig {
            nameservers: Some(vec!["10.96.0.53".into()]),
            searches: Some(vec![
                "shop.svc.cluster.local".into(),
                "svc.cluster.local".into(),
            ]),
            options: Some(vec![
                PodDNSConfigOption {
                    name: Some("ndots".into()),
                    value: Some("5".into()),
                },
                PodDNSConfigOption {
                    name: Some("edns0".into()),
                    value: None,
                },
            ]),
        };
        let stated = PodSpec {
            dns_policy: Some("None".into()),
            dns_config: Some(config.clone()),
            ..Default::default()
        };
        assert_eq!(
            resolv_conf(&stated).as_deref(),
            Some(
                "search shop.svc.cluster.local svc.cluster.local\n\
                 nameserver 10.96.0.53\n\
                 options ndots:5 edns0\n"
            )
        );
        let cluster_first = PodSpec {
            dns_policy: Some("ClusterFirst".into()),
            dns_config: Some(config),
            ..Default::default()
        };
        assert_eq!(resolv_conf(&cluster_first), None);
        assert_eq!(resolv_conf(&PodSpec::default()), None);
    }
}
