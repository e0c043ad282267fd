//! `install`'s flags, checked before the cluster is contacted.

use super::*;

/// The flags, checked before the cluster is contacted.
pub(super) struct Flags {
    pub(super) cluster_id: Option<ClusterId>,
    pub(super) cluster_name: Option<String>,
    pub(super) labels: Option<BTreeMap<String, String>>,
    pub(super) pod_cidr: Option<IpNet>,
    pub(super) service_cidr: Option<IpNet>,
    /// `None` keeps the installed agents' selector; `--node-selector ''`
    /// clears it.
    pub(super) node_selector: Option<BTreeMap<String, String>>,
    /// Likewise for `--toleration`.
    pub(super) tolerations: Option<Vec<Toleration>>,
    /// `None` keeps the installed gateway's setting.
    pub(super) announce: Option<bool>,
    pub(super) advertise_address: Option<ApiAddress>,
    /// `None`s keep the installed gateway's.
    pub(super) tunnels: manifests::agents::TunnelSettings,
    /// `None` keeps the installed Service type; `Some(None)` removes it.
    pub(super) service_type: Option<Option<GatewayServiceType>>,
    /// `None`s keep the installed agents' registry, tag and pull policy.
    pub(super) image_registry: Option<String>,
    pub(super) image_tag: Option<String>,
    pub(super) image_pull_policy: Option<PullPolicy>,
}

impl Flags {
    pub(super) fn parse(args: &InstallArgs) -> Result<Self, UserError> {
        let usage = |e: String| UserError::Usage(e);
        let cluster_id = args
            .cluster_id
            .as_deref()
            .map(|id| ClusterId::new(id).map_err(|e| usage(format!("--cluster-id: {e}"))))
            .transpose()?;
        if let Some(name) = &args.cluster_name {
            identity::check_cluster_name(name)
                .map_err(|e| usage(format!("--cluster-name: {e}")))?;
        }
        let cidr = |flag: &'static str, v: &Option<String>| {
            v.as_deref()
                .map(|v| {
                    let net = liqo_api::networking::parse_cidr(flag, v).map_err(usage)?;
                    identity::check_cidr(flag, &net).map_err(|e| usage(e.to_string()))?;
                    Ok(net)
                })
                .transpose()
        };
        let labels = (!args.cluster_labels.is_empty())
            .then(|| parse_pairs("--cluster-labels", &args.cluster_labels))
            .transpose()?;
        if let Some(labels) = &labels {
            identity::check_labels(labels).map_err(|e| usage(format!("--cluster-labels: {e}")))?;
        }
        let placement = args.placement.parse()?;
        Ok(Self {
            cluster_id,
            cluster_name: args.cluster_name.clone(),
            labels,
            pod_cidr: cidr("--pod-cidr", &args.pod_cidr)?,
            service_cidr: cidr("--service-cidr", &args.service_cidr)?,
            node_selector: placement.node_selector,
            tolerations: placement.tolerations,
            announce: args.announce,
            advertise_address: args
                .advertise_address
                .as_deref()
                .map(|a| {
                    ApiAddress::parse(a).map_err(|e| usage(format!("--advertise-address: {e}")))
                })
                .transpose()?,
            tunnels: tunnel_settings(args)?,
            service_type: service_type(args)?,
            image_registry: args
                .image_registry
                .as_deref()
                .map(|r| {
                    let r = r.trim_end_matches('/');
                    images::check_registry(r)
                        .map(|()| r.to_owned())
                        .map_err(|e| usage(format!("--image-registry: {e}")))
                })
                .transpose()?,
            image_tag: args
                .image_tag
                .as_deref()
                .map(|t| {
                    images::check_tag(t)
                        .map(|()| t.to_owned())
                        .map_err(|e| usage(format!("--image-tag: {e}")))
                })
                .transpose()?,
            image_pull_policy: args
                .image_pull_policy
                .as_deref()
                .map(|p| {
                    p.parse()
                        .map_err(|e| usage(format!("--image-pull-policy: {e}")))
                })
                .transpose()?,
        })
    }
}

/// The tunnel flags, checked as the gateway will read them, so that a
/// mistake is told now rather than by a gateway that does not start.
pub(super) fn tunnel_settings(
    args: &InstallArgs,
) -> Result<manifests::agents::TunnelSettings, UserError> {
    let usage = |e: String| UserError::Usage(e);
    if let Some(host) = &args.gateway_address {
        let valid = host.parse::<std::net::IpAddr>().is_ok()
            || liqo_api::validation::dns_subdomain(host).is_ok();
        if !valid {
            return Err(usage(format!(
                "--gateway-address {host:?} is neither an IP address nor a DNS name"
            )));
        }
    }
    let ports = match &args.tunnel_ports {
        Some(text) => Some(
            text.replace(' ', "")
                .parse::<PortRange>()
                .ok()
                .filter(|p| p.first < p.last || text.contains('-'))
                .ok_or_else(|| {
                    usage(format!(
                        "--tunnel-ports {text:?} is not FIRST-LAST with 1 <= FIRST <= LAST <= 65535"
                    ))
                })?,
        ),
        None => None,
    };
    let mut remap_pool = Vec::new();
    if let Some(pool) = &args.remap_pool {
        for cidr in pool.split(',') {
            let net = liqo_api::networking::parse_cidr("--remap-pool", cidr).map_err(usage)?;
            if let Some(what) = liqo_api::networking::reserved_overlap(&net) {
                return Err(usage(format!("--remap-pool {net} overlaps {what}")));
            }
            remap_pool.push(net);
        }
    }
    if let (Some(range), Some(kind)) = (ports, &args.gateway_service_type) {
        let width = u32::from(range.last - range.first);
        if kind != "None" && width >= MAX_SERVICE_PORTS {
            return Err(usage(format!(
                "--tunnel-ports {range} is more than {MAX_SERVICE_PORTS} ports for a Service \
                 in front of the gateway: give a narrower range"
            )));
        }
    }
    Ok(manifests::agents::TunnelSettings {
        endpoint_address: args.gateway_address.clone(),
        ports,
        remap_pool,
        service_type: None,
    })
}

/// `--gateway-service-type`: `None` when not given (kept), `Some(None)` to
/// have no Service.
pub(super) fn service_type(
    args: &InstallArgs,
) -> Result<Option<Option<GatewayServiceType>>, UserError> {
    args.gateway_service_type
        .as_deref()
        .map(|t| match t {
            "None" => Ok(None),
            other => other
                .parse()
                .map(Some)
                .map_err(|e| UserError::Usage(format!("--gateway-service-type: {e}, nor None"))),
        })
        .transpose()
}
