//! The cluster's identity: kept from an earlier install, or made from the
//! flags and what the cluster says of its pod and service CIDRs.

use super::*;

pub(super) async fn resolve_identity(
    cluster: &ClusterClient,
    flags: &Flags,
    existing: Option<&ClusterIdentity>,
    notes: &mut Vec<String>,
) -> anyhow::Result<ClusterIdentity> {
    let cluster_id = match (existing, &flags.cluster_id) {
        (Some(old), Some(new)) if &old.cluster_id != new => {
            return Err(UserError::Refused(format!(
                "cluster {} is already installed with cluster ID {}; a cluster ID never changes: \
                 drop --cluster-id, or uninstall first",
                cluster.name, old.cluster_id
            ))
            .into());
        }
        (Some(old), _) => old.cluster_id.clone(),
        (None, Some(new)) => new.clone(),
        (None, None) => ClusterId::new(uuid::Uuid::new_v4().to_string())
            .expect("invariant: a UUID is a DNS label"),
    };
    let cluster_name = match (&flags.cluster_name, existing) {
        (Some(name), _) => name.clone(),
        (None, Some(old)) => old.cluster_name.clone(),
        (None, None) => default_name(&cluster.name, &cluster_id),
    };
    let pod_cidr = match (flags.pod_cidr, existing) {
        (Some(cidr), _) => cidr,
        (None, Some(old)) => old.pod_cidr,
        (None, None) => {
            let (cidr, source) = detect_pod_cidr(cluster).await?;
            notes.push(format!(
                "pod CIDR {cidr} found from {source} (set it with --pod-cidr)"
            ));
            cidr
        }
    };
    let service_cidr = match (flags.service_cidr, existing) {
        (Some(cidr), _) => cidr,
        (None, Some(old)) => old.service_cidr,
        (None, None) => detect_service_cidr(cluster).await?,
    };
    let identity = ClusterIdentity {
        cluster_id,
        cluster_name,
        labels: flags
            .labels
            .clone()
            .or_else(|| existing.map(|e| e.labels.clone()))
            .unwrap_or_default(),
        pod_cidr,
        service_cidr,
        version: liqo_api::VERSION.to_owned(),
    };
    // What was found in the cluster is checked like what was given.
    identity.validate().map_err(|e| {
        UserError::Usage(format!(
            "the identity for cluster {} is not valid: {e}; set it with \
             --cluster-name, --cluster-labels, --pod-cidr or --service-cidr",
            cluster.name
        ))
    })?;
    Ok(identity)
}

/// The context's name made a DNS label, or one made from the cluster ID.
pub(super) fn default_name(context: &str, id: &ClusterId) -> String {
    let mut name: String = context
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    name.truncate(63);
    let name = name.trim_matches('-').to_owned();
    if identity::check_cluster_name(&name).is_ok() && !name.starts_with("https") {
        name
    } else {
        format!("cluster-{}", &id.as_str()[..id.as_str().len().min(8)])
    }
}

/// Where the pod CIDR is found, best source first: the controller-manager's
/// `--cluster-cidr` (a kubeadm-style static pod), kubeadm's
/// `networking.podSubnet` (its `kubeadm-config` ConfigMap, as kind
/// clusters have it), kube-proxy's `clusterCIDR` (its kubeadm ConfigMap),
/// else the smallest network holding every node's pod CIDR (virtual nodes
/// stand for other clusters and do not count). Returns the CIDR and where
/// it came from.
pub(super) async fn detect_pod_cidr(
    cluster: &ClusterClient,
) -> anyhow::Result<(IpNet, &'static str)> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "kube-system");
    // Reading kube-system is a courtesy: without the right, look elsewhere.
    if let Ok(list) = pods
        .list(&ListParams::default().labels("component=kube-controller-manager"))
        .await
    {
        let flags = list
            .items
            .iter()
            .filter_map(|p| p.spec.as_ref())
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.command.iter().flatten().chain(c.args.iter().flatten()));
        if let Some(cidr) = flags
            .filter_map(|f| f.strip_prefix("--cluster-cidr="))
            .find_map(first_cidr)
        {
            return Ok((cidr, "the controller-manager's --cluster-cidr"));
        }
    }
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "kube-system");
    if let Ok(Some(kubeadm)) = maps.get_opt("kubeadm-config").await
        && let Some(cidr) = kubeadm
            .data
            .unwrap_or_default()
            .get("ClusterConfiguration")
            .and_then(|c| kubeadm_pod_subnet(c))
    {
        return Ok((cidr, "kubeadm's networking.podSubnet"));
    }
    if let Ok(Some(proxy)) = maps.get_opt("kube-proxy").await
        && let Some(cidr) = proxy
            .data
            .unwrap_or_default()
            .values()
            .find_map(|c| kube_proxy_cidr(c))
    {
        return Ok((cidr, "kube-proxy's clusterCIDR"));
    }
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let list = nodes
        .list(&ListParams::default().labels(&format!("!{}", labels::VIRTUAL_NODE)))
        .await
        .map_err(|e| cluster.explain(e, "listing nodes to find the pod CIDR"))?;
    let cidrs = list
        .items
        .iter()
        .filter_map(|n| n.spec.as_ref()?.pod_cidr.as_deref())
        .filter_map(|c| c.parse::<IpNet>().ok());
    let nodes = cidrs.clone().count();
    match covering(cidrs) {
        // One node's range is not the cluster's: the next node's is
        // another.
        Some(net) if nodes == 1 => Ok((
            net,
            "its only node's pod CIDR, which a node added later would not cover",
        )),
        Some(net) => Ok((net, "the nodes' pod CIDRs")),
        None => Err(UserError::NotFound(format!(
            "cannot find the pod CIDR of cluster {}: no kube-controller-manager pod with \
             --cluster-cidr, no kube-proxy ConfigMap with clusterCIDR, and no node with \
             spec.podCIDR; give it with --pod-cidr",
            cluster.name
        ))
        .into()),
    }
}

/// `networking.podSubnet` of a kubeadm ClusterConfiguration document (the
/// `ClusterConfiguration` key of its `kubeadm-config` ConfigMap).
pub(super) fn kubeadm_pod_subnet(config: &str) -> Option<IpNet> {
    let doc: serde_yaml::Value = serde_yaml::from_str(config).ok()?;
    first_cidr(doc.get("networking")?.get("podSubnet")?.as_str()?)
}

/// `clusterCIDR` of a KubeProxyConfiguration document (the `config.conf`
/// key of kubeadm's kube-proxy ConfigMap), parsed as YAML.
pub(super) fn kube_proxy_cidr(config: &str) -> Option<IpNet> {
    let doc: serde_yaml::Value = serde_yaml::from_str(config).ok()?;
    first_cidr(doc.get("clusterCIDR")?.as_str()?)
}

/// The first CIDR of a comma-separated list (dual-stack clusters list one
/// per family), normalised.
pub(super) fn first_cidr(list: &str) -> Option<IpNet> {
    let first = list.split(',').next()?;
    liqo_api::networking::parse_cidr("", first).ok()
}

/// The smallest network containing all of `nets` (all of one family).
pub(super) fn covering(mut nets: impl Iterator<Item = IpNet>) -> Option<IpNet> {
    let first = nets.next()?;
    nets.try_fold(first.trunc(), |acc, net| {
        let mut acc = acc;
        while !acc.contains(&net) {
            acc = acc.supernet()?;
        }
        Some(acc)
    })
}

pub(super) async fn detect_service_cidr(cluster: &ClusterClient) -> anyhow::Result<IpNet> {
    let cidrs: Api<ServiceCIDR> = Api::all(cluster.client.clone());
    let found = match cidrs.get_opt("kubernetes").await {
        Ok(cidr) => cidr.and_then(|c| c.spec?.cidrs?.into_iter().next()),
        // Clusters older than the ServiceCIDR API, or that hide it.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => None,
        Err(e) => return Err(cluster.explain(e, "reading the service CIDR")),
    };
    found.as_deref().and_then(first_cidr).ok_or_else(|| {
        UserError::Config(format!(
            "cannot find the service CIDR of cluster {}; pass --service-cidr",
            cluster.name
        ))
        .into()
    })
}
