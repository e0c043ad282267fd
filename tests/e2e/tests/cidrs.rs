//! `liqoctl install` finds the pod and service CIDRs where clusters keep
//! them, best source first, and says where it found them.

use anyhow::Result;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, PostParams};
use liqo_e2e::fixture::{One, spec};
use liqo_e2e::liqoctl;
use serde_json::json;

/// The identity a dry run would write: (pod CIDR, service CIDR), and the
/// notes it printed.
fn dry_run(kubeconfig: &std::path::Path) -> (String, String, String) {
    let out = liqoctl(Some(kubeconfig), &["install", "--dry-run"]).success();
    let value = |key: &str| {
        out.stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{key}: ")))
            .unwrap_or_default()
            .to_owned()
    };
    (value("pod-cidr"), value("service-cidr"), out.stderr)
}

#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_cidr_comes_from_the_controller_manager_kubeadm_kube_proxy_or_the_nodes() -> Result<()>
{
    // Only kwok nodes: the pod CIDRs are theirs alone.
    let mut spec = spec("cidrs", 1, 2);
    spec.agent_bin_dir = None;
    let one = One::start(spec).await?;
    let (kubeconfig, client) = (one.cluster().kubeconfig_path(), one.client.clone());

    // Nothing but the nodes: the smallest network holding their /24s. The
    // service CIDR comes from the ServiceCIDR API.
    let (pod, service, notes) = dry_run(kubeconfig);
    assert_eq!(pod, "10.201.0.0/23");
    assert_eq!(service, "10.101.0.0/16");
    assert!(notes.contains("the nodes' pod CIDRs"), "{notes}");

    // kube-proxy's configuration, as kubeadm writes it.
    let proxy: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "kube-proxy" },
        "data": { "config.conf": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nclusterCIDR: 10.201.0.0/16\nkind: KubeProxyConfiguration\n" },
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &proxy)
        .await?;
    let (pod, _, notes) = dry_run(kubeconfig);
    assert_eq!(pod, "10.201.0.0/16");
    assert!(notes.contains("kube-proxy"), "{notes}");

    // kubeadm's own ClusterConfiguration (kind has it) before kube-proxy's.
    let kubeadm: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "kubeadm-config" },
        "data": { "ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\nnetworking:\n  podSubnet: 10.200.0.0/15\n  serviceSubnet: 10.96.0.0/16\n" },
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &kubeadm)
        .await?;
    let (pod, _, notes) = dry_run(kubeconfig);
    assert_eq!(pod, "10.200.0.0/15");
    assert!(notes.contains("kubeadm's networking.podSubnet"), "{notes}");

    // The controller-manager's own flag wins, the first of a dual-stack pair.
    let manager: Pod = serde_json::from_value(json!({
        "metadata": { "name": "kube-controller-manager-x", "labels": { "component": "kube-controller-manager" } },
        "spec": { "containers": [{
            "name": "kube-controller-manager",
            "image": "registry.k8s.io/kube-controller-manager:v1.34.4",
            "command": ["kube-controller-manager", "--allocate-node-cidrs=true", "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56"],
        }]},
    }))?;
    Api::<Pod>::namespaced(client, "kube-system")
        .create(&PostParams::default(), &manager)
        .await?;
    let (pod, _, notes) = dry_run(kubeconfig);
    assert_eq!(pod, "10.244.0.0/16");
    assert!(notes.contains("--cluster-cidr"), "{notes}");

    // A flag beats every guess.
    let out = liqoctl(
        Some(kubeconfig),
        &["install", "--dry-run", "--pod-cidr=10.9.0.0/16"],
    )
    .success();
    assert!(
        out.stdout.contains("pod-cidr: 10.9.0.0/16"),
        "{}",
        out.stdout
    );
    Ok(())
}
