//! The Multi-Cluster Services API's CRDs (KEP-1645, `ServiceExport` and
//! `ServiceImport` of `multicluster.x-k8s.io`, served as v1alpha1 and
//! v1beta1, stored as v1beta1), as `sigs.k8s.io/mcs-api` v0.5.0 ships
//! them (`mcs/`, its `config/crd/` files as they are, Apache-2.0).
//!
//! They are a shared API, not ours: a cluster may have them already from
//! another implementation, and other tools read them. So `install`
//! creates them where they are missing (labelled as ours), updates only
//! those it created, and leaves anyone else's alone; `uninstall --purge`
//! removes them only when ours and no ServiceExport or ServiceImport is
//! left (docs/install.md).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use super::{Manifest, common_labels};

/// The files as the module ships them.
const FILES: [(&str, &str); 2] = [
    ("serviceexports", include_str!("mcs/serviceexports.yaml")),
    ("serviceimports", include_str!("mcs/serviceimports.yaml")),
];

/// The MCS API's CRDs, labelled as ours for when install creates them.
pub fn crds() -> Vec<Manifest> {
    FILES
        .iter()
        .map(|(name, text)| {
            let mut crd: CustomResourceDefinition = serde_yaml::from_str(text)
                .unwrap_or_else(|e| panic!("invariant: the mcs-api CRD {name} parses: {e}"));
            crd.metadata
                .labels
                .get_or_insert_default()
                .extend(common_labels("mcs-api"));
            Manifest::Crd(Box::new(crd))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The API group, and the version of the module the CRDs come from.
    const GROUP: &str = "multicluster.x-k8s.io";
    const MCS_API_VERSION: &str = "v0.5.0";

    #[test]
    fn the_crds_are_the_modules_v1beta1_and_v1alpha1_served() {
        let crds = crds();
        let names: Vec<_> = crds.iter().map(Manifest::name).collect();
        assert_eq!(
            names,
            [
                "serviceexports.multicluster.x-k8s.io",
                "serviceimports.multicluster.x-k8s.io"
            ]
        );
        for manifest in &crds {
            let Manifest::Crd(crd) = manifest else {
                panic!("a CRD");
            };
            assert_eq!(crd.spec.group, GROUP);
            let versions: Vec<_> = crd
                .spec
                .versions
                .iter()
                .map(|v| (v.name.as_str(), v.served, v.storage))
                .collect();
            assert_eq!(
                versions,
                [("v1alpha1", true, false), ("v1beta1", true, true)]
            );
            let labels = crd.metadata.labels.as_ref().expect("labels");
            assert_eq!(
                labels
                    .get("multicluster.x-k8s.io/release-version")
                    .map(String::as_str),
                Some(MCS_API_VERSION),
                "the module's own label is kept"
            );
            assert_eq!(
                labels
                    .get("app.kubernetes.io/managed-by")
                    .map(String::as_str),
                Some("liqoctl")
            );
        }
    }
}
