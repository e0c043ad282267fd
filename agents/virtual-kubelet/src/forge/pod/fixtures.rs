//! Pods and specs shared by the pod translation's test tables.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, Pod, PodAntiAffinity, PodSpec, PodStatus, Toleration,
    Volume, VolumeMount,
};
use kube::core::ObjectMeta;
use liqo_api::names::{self, labels};

pub(super) fn container() -> Container {
    Container {
        name: "app".to_owned(),
        image: Some("nginx".to_owned()),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "kube-api-access-abcde".to_owned(),
                mount_path: "/var/run/secrets/kubernetes.io/serviceaccount".to_owned(),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "config".to_owned(),
                mount_path: "/etc/app".to_owned(),
                ..VolumeMount::default()
            },
        ]),
        ..Container::default()
    }
}

pub(super) fn toleration(key: &str) -> Toleration {
    Toleration {
        key: Some(key.to_owned()),
        operator: Some("Exists".to_owned()),
        ..Toleration::default()
    }
}

pub(super) fn volume(name: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        config_map: Some(k8s_openapi::api::core::v1::ConfigMapVolumeSource {
            name: name.to_owned(),
            ..Default::default()
        }),
        ..Volume::default()
    }
}

pub(super) fn local_spec() -> PodSpec {
    PodSpec {
        node_name: Some("liqo-prov".to_owned()),
        node_selector: Some(BTreeMap::from([(
            labels::VIRTUAL_NODE.to_owned(),
            "true".to_owned(),
        )])),
        tolerations: Some(vec![
            toleration(names::VIRTUAL_NODE_TAINT),
            toleration("node.kubernetes.io/not-ready"),
        ]),
        affinity: Some(Affinity {
            node_affinity: Some(NodeAffinity::default()),
            pod_anti_affinity: Some(PodAntiAffinity::default()),
            ..Affinity::default()
        }),
        service_account_name: Some("builder".to_owned()),
        priority: Some(1000),
        priority_class_name: Some("high".to_owned()),
        scheduler_name: Some("default-scheduler".to_owned()),
        containers: vec![container()],
        volumes: Some(vec![volume("kube-api-access-abcde"), volume("config")]),
        ..PodSpec::default()
    }
}

pub(super) fn job_pod(restart: Option<&str>, phase: Option<&str>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("batch-x1".to_owned()),
            uid: Some("u-2".to_owned()),
            labels: Some(BTreeMap::from([
                ("app".to_owned(), "batch".to_owned()),
                ("job-name".to_owned(), "batch".to_owned()),
                ("controller-uid".to_owned(), "local-job".to_owned()),
                (
                    "batch.kubernetes.io/job-name".to_owned(),
                    "batch".to_owned(),
                ),
                (
                    "batch.kubernetes.io/controller-uid".to_owned(),
                    "local-job".to_owned(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: restart.map(str::to_owned),
            ..local_spec()
        }),
        status: phase.map(|p| PodStatus {
            phase: Some(p.to_owned()),
            ..PodStatus::default()
        }),
    }
}
