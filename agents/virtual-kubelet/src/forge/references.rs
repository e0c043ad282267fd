//! Pure decision of whether a pod may start yet as far as the ConfigMaps
//! and Secrets it references are concerned, as a kubelet decides: a
//! missing optional reference is ignored; a missing mandatory volume
//! source keeps every container in `ContainerCreating` with a
//! `FailedMount` Event; a missing mandatory `env`/`envFrom` source (or key)
//! keeps the container in `CreateContainerConfigError`. Volumes come
//! first, as a kubelet mounts them before it creates containers.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateWaiting, ContainerStatus, PodCondition, PodSpec, PodStatus,
};

/// The kubelet's waiting reason of containers whose volumes cannot be
/// mounted yet.
pub const CONTAINER_CREATING: &str = "ContainerCreating";
/// The kubelet's waiting reason of a container whose env cannot be built.
pub const CONFIG_ERROR: &str = "CreateContainerConfigError";
/// The kubelet's Event reason for a volume that cannot be mounted.
pub const FAILED_MOUNT: &str = "FailedMount";

/// The kind of a referenced object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    ConfigMap,
    Secret,
}

impl Source {
    fn word(self) -> &'static str {
        match self {
            Self::ConfigMap => "configmap",
            Self::Secret => "secret",
        }
    }
}

/// Why a pod cannot start yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// A volume's source is missing: the message of the `FailedMount` Event.
    Mount { message: String },
    /// A container's env source is missing: the container and the message
    /// of its waiting state.
    Config { container: String, message: String },
}

/// What exists, for [`wait`]: the keys of a ConfigMap or Secret, `None`
/// when it does not exist.
pub trait Lookup {
    fn keys(&self, source: Source, name: &str) -> Option<BTreeSet<String>>;
}

impl<F> Lookup for F
where
    F: Fn(Source, &str) -> Option<BTreeSet<String>>,
{
    fn keys(&self, source: Source, name: &str) -> Option<BTreeSet<String>> {
        self(source, name)
    }
}

fn not_found(source: Source, name: &str) -> String {
    format!("{} \"{name}\" not found", source.word())
}

/// Why `spec` cannot start yet given what `lookup` says exists, or `None`
/// when it can.
pub fn wait(spec: &PodSpec, lookup: &impl Lookup) -> Option<Wait> {
    for volume in spec.volumes.iter().flatten() {
        let mut refs: Vec<(Source, &str, bool)> = Vec::new();
        if let Some(c) = &volume.config_map {
            refs.push((Source::ConfigMap, &c.name, c.optional == Some(true)));
        }
        if let Some(s) = &volume.secret {
            let name = s.secret_name.as_deref().unwrap_or_default();
            refs.push((Source::Secret, name, s.optional == Some(true)));
        }
        for p in volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
        {
            if let Some(c) = &p.config_map {
                refs.push((Source::ConfigMap, &c.name, c.optional == Some(true)));
            }
            if let Some(s) = &p.secret {
                refs.push((Source::Secret, &s.name, s.optional == Some(true)));
            }
        }
        let missing = refs
            .into_iter()
            .find(|(source, name, optional)| !optional && lookup.keys(*source, name).is_none());
        if let Some((source, name, _)) = missing {
            return Some(Wait::Mount {
                message: format!(
                    "MountVolume.SetUp failed for volume \"{}\" : {}",
                    volume.name,
                    not_found(source, name)
                ),
            });
        }
    }
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    for c in containers {
        for from in c.env_from.iter().flatten() {
            let r = from
                .config_map_ref
                .as_ref()
                .map(|r| (Source::ConfigMap, r.name.as_str(), r.optional))
                .or_else(|| {
                    from.secret_ref
                        .as_ref()
                        .map(|r| (Source::Secret, r.name.as_str(), r.optional))
                });
            if let Some((source, name, optional)) = r
                && optional != Some(true)
                && lookup.keys(source, name).is_none()
            {
                return Some(Wait::Config {
                    container: c.name.clone(),
                    message: not_found(source, name),
                });
            }
        }
        for env in c.env.iter().flatten() {
            let Some(from) = &env.value_from else {
                continue;
            };
            let r = from
                .config_map_key_ref
                .as_ref()
                .map(|r| (Source::ConfigMap, r.name.as_str(), &r.key, r.optional))
                .or_else(|| {
                    from.secret_key_ref
                        .as_ref()
                        .map(|r| (Source::Secret, r.name.as_str(), &r.key, r.optional))
                });
            let Some((source, name, key, optional)) = r else {
                continue;
            };
            if optional == Some(true) {
                continue;
            }
            let message = match lookup.keys(source, name) {
                None => not_found(source, name),
                Some(keys) if !keys.contains(key) => {
                    format!("couldn't find key {key} in {} {name}", source.word())
                }
                Some(_) => continue,
            };
            return Some(Wait::Config {
                container: c.name.clone(),
                message,
            });
        }
    }
    None
}

/// The status of a pod that waits for `why`, as a kubelet shows it:
/// Pending, not ready, every container waiting (the one whose env failed
/// with the message, the others `ContainerCreating`).
pub fn waiting_status(spec: &PodSpec, why: &Wait) -> PodStatus {
    let statuses = spec
        .containers
        .iter()
        .map(|c| {
            let (reason, message) = match why {
                Wait::Config { container, message } if *container == c.name => {
                    (CONFIG_ERROR, Some(message.clone()))
                }
                _ => (CONTAINER_CREATING, None),
            };
            ContainerStatus {
                name: c.name.clone(),
                image: c.image.clone().unwrap_or_default(),
                image_id: String::new(),
                ready: false,
                restart_count: 0,
                started: Some(false),
                state: Some(ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(reason.to_owned()),
                        message,
                    }),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }
        })
        .collect();
    let condition = |type_: &str| PodCondition {
        type_: type_.to_owned(),
        status: "False".to_owned(),
        reason: Some("ContainersNotReady".to_owned()),
        ..PodCondition::default()
    };
    PodStatus {
        phase: Some("Pending".to_owned()),
        conditions: Some(vec![condition("ContainersReady"), condition("Ready")]),
        container_statuses: Some(statuses),
        ..PodStatus::default()
    }
}

/// Whether `have` already shows the waiting status `want` (conditions'
/// times aside).
pub fn shows_waiting(have: Option<&PodStatus>, want: &PodStatus) -> bool {
    let Some(have) = have else {
        return false;
    };
    let states = |s: &PodStatus| -> Vec<(String, Option<ContainerState>)> {
        s.container_statuses
            .iter()
            .flatten()
            .map(|c| (c.name.clone(), c.state.clone()))
            .collect()
    };
    have.phase == want.phase && states(have) == states(want)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, ConfigMapKeySelector, ConfigMapProjection, ConfigMapVolumeSource,
        Container, EnvFromSource, EnvVar, EnvVarSource, ProjectedVolumeSource, SecretEnvSource,
        SecretKeySelector, SecretVolumeSource, Volume, VolumeProjection,
    };

    /// The cluster of the table: ConfigMap `cfg` with key `a`, Secret `sec`
    /// with key `p`.
    fn lookup(source: Source, name: &str) -> Option<BTreeSet<String>> {
        match (source, name) {
            (Source::ConfigMap, "cfg") => Some(BTreeSet::from(["a".to_owned()])),
            (Source::Secret, "sec") => Some(BTreeSet::from(["p".to_owned()])),
            _ => None,
        }
    }

    fn spec(volume: Option<Volume>, container: Container) -> PodSpec {
        PodSpec {
            volumes: volume.map(|v| vec![v]),
            containers: vec![
                container,
                Container {
                    name: "side".to_owned(),
                    ..Container::default()
                },
            ],
            ..PodSpec::default()
        }
    }

    fn app() -> Container {
        Container {
            name: "app".to_owned(),
            image: Some("nginx".to_owned()),
            ..Container::default()
        }
    }

    fn cm_volume(name: &str, optional: Option<bool>) -> Volume {
        Volume {
            name: "conf".to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: name.to_owned(),
                optional,
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        }
    }

    fn secret_volume(name: &str, optional: Option<bool>) -> Volume {
        Volume {
            name: "creds".to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(name.to_owned()),
                optional,
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        }
    }

    fn projected(name: &str) -> Volume {
        Volume {
            name: "all".to_owned(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: name.to_owned(),
                        ..ConfigMapProjection::default()
                    }),
                    ..VolumeProjection::default()
                }]),
                ..ProjectedVolumeSource::default()
            }),
            ..Volume::default()
        }
    }

    fn env_from_cm(name: &str, optional: Option<bool>) -> Container {
        Container {
            env_from: Some(vec![EnvFromSource {
                config_map_ref: Some(ConfigMapEnvSource {
                    name: name.to_owned(),
                    optional,
                }),
                ..EnvFromSource::default()
            }]),
            ..app()
        }
    }

    fn env_from_secret(name: &str) -> Container {
        Container {
            env_from: Some(vec![EnvFromSource {
                secret_ref: Some(SecretEnvSource {
                    name: name.to_owned(),
                    optional: None,
                }),
                ..EnvFromSource::default()
            }]),
            ..app()
        }
    }

    fn env_cm_key(name: &str, key: &str, optional: Option<bool>) -> Container {
        Container {
            env: Some(vec![EnvVar {
                name: "X".to_owned(),
                value_from: Some(EnvVarSource {
                    config_map_key_ref: Some(ConfigMapKeySelector {
                        name: name.to_owned(),
                        key: key.to_owned(),
                        optional,
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            }]),
            ..app()
        }
    }

    fn env_secret_key(name: &str, key: &str) -> Container {
        Container {
            env: Some(vec![EnvVar {
                name: "X".to_owned(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: name.to_owned(),
                        key: key.to_owned(),
                        optional: None,
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            }]),
            ..app()
        }
    }

    fn mount(volume: &str, what: &str) -> Option<Wait> {
        Some(Wait::Mount {
            message: format!("MountVolume.SetUp failed for volume \"{volume}\" : {what}"),
        })
    }

    fn config(message: &str) -> Option<Wait> {
        Some(Wait::Config {
            container: "app".to_owned(),
            message: message.to_owned(),
        })
    }

    #[test]
    fn wait_table() {
        let cases: Vec<(&str, PodSpec, Option<Wait>)> = vec![
            ("nothing referenced", spec(None, app()), None),
            (
                "volume present",
                spec(Some(cm_volume("cfg", None)), app()),
                None,
            ),
            (
                "volume missing",
                spec(Some(cm_volume("nope", None)), app()),
                mount("conf", "configmap \"nope\" not found"),
            ),
            (
                "volume missing, optional",
                spec(Some(cm_volume("nope", Some(true))), app()),
                None,
            ),
            (
                "secret volume missing",
                spec(Some(secret_volume("nope", None)), app()),
                mount("creds", "secret \"nope\" not found"),
            ),
            (
                "secret volume present",
                spec(Some(secret_volume("sec", Some(false))), app()),
                None,
            ),
            (
                "projected source missing",
                spec(Some(projected("nope")), app()),
                mount("all", "configmap \"nope\" not found"),
            ),
            (
                "envFrom missing",
                spec(None, env_from_cm("nope", None)),
                config("configmap \"nope\" not found"),
            ),
            (
                "envFrom missing, optional",
                spec(None, env_from_cm("nope", Some(true))),
                None,
            ),
            (
                "envFrom secret missing",
                spec(None, env_from_secret("nope")),
                config("secret \"nope\" not found"),
            ),
            (
                "envFrom secret present",
                spec(None, env_from_secret("sec")),
                None,
            ),
            (
                "env key present",
                spec(None, env_cm_key("cfg", "a", None)),
                None,
            ),
            (
                "env key missing",
                spec(None, env_cm_key("cfg", "b", None)),
                config("couldn't find key b in configmap cfg"),
            ),
            (
                "env key missing, optional",
                spec(None, env_cm_key("cfg", "b", Some(true))),
                None,
            ),
            (
                "env secret missing",
                spec(None, env_secret_key("nope", "p")),
                config("secret \"nope\" not found"),
            ),
            (
                "volume before env",
                spec(Some(cm_volume("nope", None)), env_from_cm("nope", None)),
                mount("conf", "configmap \"nope\" not found"),
            ),
        ];
        for (what, spec, want) in cases {
            assert_eq!(wait(&spec, &lookup), want, "{what}");
        }
    }

    #[test]
    fn init_containers_are_checked() {
        let spec = PodSpec {
            init_containers: Some(vec![env_from_cm("nope", None)]),
            containers: vec![app()],
            ..PodSpec::default()
        };
        assert_eq!(wait(&spec, &lookup), config("configmap \"nope\" not found"));
    }

    #[test]
    fn waiting_status_says_the_kubelets_reasons() {
        let s = spec(None, env_from_cm("nope", None));
        let why = wait(&s, &lookup).expect("waits");
        let status = waiting_status(&s, &why);
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        let reasons: Vec<_> = status
            .container_statuses
            .iter()
            .flatten()
            .map(|c| {
                let w = c
                    .state
                    .as_ref()
                    .and_then(|s| s.waiting.as_ref())
                    .expect("waiting");
                (c.name.as_str(), w.reason.as_deref(), w.message.as_deref())
            })
            .collect();
        assert_eq!(
            reasons,
            [
                (
                    "app",
                    Some(CONFIG_ERROR),
                    Some("configmap \"nope\" not found")
                ),
                ("side", Some(CONTAINER_CREATING), None),
            ]
        );
        assert!(shows_waiting(Some(&status), &status));
        assert!(!shows_waiting(None, &status));
        let mount = waiting_status(
            &s,
            &Wait::Mount {
                message: "m".to_owned(),
            },
        );
        assert!(!shows_waiting(Some(&mount), &status));
        assert!(mount.container_statuses.iter().flatten().all(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.as_deref())
                == Some(CONTAINER_CREATING)
        }));
    }
}
