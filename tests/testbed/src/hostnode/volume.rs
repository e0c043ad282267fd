//! A pod's volumes, as a kubelet makes them: each `secret`, `configMap`,
//! `downwardAPI`, `projected` (of those and `serviceAccountToken`) and
//! `emptyDir` volume is a folder `<pod dir>/volumes/<volume>/`, kept up to
//! date with its objects (polled, level-triggered), each file replaced
//! whole (written aside and renamed over); and the bind mounts that show a
//! container its volumes at their `mountPath`s (see
//! [`crate::process::with_mounts`]). Other kinds of volume are refused.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, Volume,
};
use kube::api::Api;

use super::{StartError, env};
use crate::process::{BindMount, mounted_anywhere};

/// How often the volumes of a running pod are brought up to date.
pub(super) const REFRESH: Duration = Duration::from_secs(1);
/// A kubelet's default file mode in a volume.
const DEFAULT_MODE: i32 = 0o644;
/// How often a projected service-account token is replaced (at the latest
/// at 80% of its life, as a kubelet does).
const TOKEN_REFRESH: Duration = Duration::from_secs(20 * 60);

/// One file of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct VolumeFile {
    /// Relative to the volume's folder.
    pub(super) path: PathBuf,
    pub(super) data: Vec<u8>,
    pub(super) mode: u32,
}

/// The volumes of one pod.
#[derive(Debug)]
pub(super) struct Volumes {
    /// `<pod dir>/volumes`.
    dir: PathBuf,
    /// Projected service-account tokens by (audience, lifetime): the token
    /// and when it was requested.
    tokens: BTreeMap<(String, i64), (String, Instant)>,
    refreshed: Option<Instant>,
    /// The last refresh failure logged, so that it is logged once.
    failure: Option<String>,
    /// `hostPath` volumes of character devices (such as `/dev/net/tun`):
    /// volume name → the device, bound as it is.
    devices: BTreeMap<String, PathBuf>,
}

impl Volumes {
    pub(super) fn new(pod_dir: &Path) -> Self {
        Self {
            dir: pod_dir.join("volumes"),
            tokens: BTreeMap::new(),
            refreshed: None,
            failure: None,
            devices: BTreeMap::new(),
        }
    }

    /// Whether the volumes are due for a refresh.
    pub(super) fn due(&self) -> bool {
        self.refreshed.is_none_or(|at| at.elapsed() >= REFRESH)
    }

    /// Notes a refresh failure; true if it is new (worth logging).
    pub(super) fn failed(&mut self, message: String) -> bool {
        let new = self.failure.as_ref() != Some(&message);
        self.failure = Some(message);
        new
    }

    /// Brings every volume's folder up to date with its objects.
    pub(super) async fn sync(
        &mut self,
        client: &kube::Client,
        pod: &Pod,
        ips: env::Addresses,
    ) -> Result<(), StartError> {
        self.refreshed = Some(Instant::now());
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_deref());
        for volume in volumes.unwrap_or_default() {
            if let Some(device) = host_device(volume)? {
                self.devices.insert(volume.name.clone(), device);
                continue;
            }
            let dir = self.dir.join(checked_name(&volume.name)?);
            match self.files(client, pod, ips, volume).await? {
                Some(files) => write_volume(&dir, &files),
                // An emptyDir: the container's own.
                None => std::fs::create_dir_all(&dir),
            }
            .map_err(|source| StartError::Write {
                path: dir.clone(),
                source,
            })?;
        }
        self.failure = None;
        Ok(())
    }

    /// What a volume holds: its files, or `None` for an `emptyDir`.
    async fn files(
        &mut self,
        client: &kube::Client,
        pod: &Pod,
        ips: env::Addresses,
        volume: &Volume,
    ) -> Result<Option<Vec<VolumeFile>>, StartError> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        if let Some(secret) = &volume.secret {
            let name = secret.secret_name.clone().unwrap_or_default();
            let data = secret_data(client, namespace, &name).await?;
            return key_files(
                "secret",
                namespace,
                &name,
                data.as_ref(),
                secret.items.as_deref(),
                secret.default_mode.unwrap_or(DEFAULT_MODE),
                secret.optional.unwrap_or(false),
            )
            .map(Some);
        }
        if let Some(cm) = &volume.config_map {
            let data = config_map_data(client, namespace, &cm.name).await?;
            return key_files(
                "configmap",
                namespace,
                &cm.name,
                data.as_ref(),
                cm.items.as_deref(),
                cm.default_mode.unwrap_or(DEFAULT_MODE),
                cm.optional.unwrap_or(false),
            )
            .map(Some);
        }
        if let Some(downward) = &volume.downward_api {
            let mode = downward.default_mode.unwrap_or(DEFAULT_MODE);
            return downward_files(pod, ips, downward.items.as_deref(), mode).map(Some);
        }
        if let Some(projected) = &volume.projected {
            let mode = projected.default_mode.unwrap_or(DEFAULT_MODE);
            let mut files = Vec::new();
            for source in projected.sources.iter().flatten() {
                if let Some(secret) = &source.secret {
                    let data = secret_data(client, namespace, &secret.name).await?;
                    files.extend(key_files(
                        "secret",
                        namespace,
                        &secret.name,
                        data.as_ref(),
                        secret.items.as_deref(),
                        mode,
                        secret.optional.unwrap_or(false),
                    )?);
                } else if let Some(cm) = &source.config_map {
                    let data = config_map_data(client, namespace, &cm.name).await?;
                    files.extend(key_files(
                        "configmap",
                        namespace,
                        &cm.name,
                        data.as_ref(),
                        cm.items.as_deref(),
                        mode,
                        cm.optional.unwrap_or(false),
                    )?);
                } else if let Some(downward) = &source.downward_api {
                    files.extend(downward_files(pod, ips, downward.items.as_deref(), mode)?);
                } else if let Some(token) = &source.service_account_token {
                    let audience = token.audience.clone().unwrap_or_default();
                    let seconds = token.expiration_seconds.unwrap_or(env::TOKEN_SECONDS);
                    let token_value = self.token(client, pod, audience, seconds).await?;
                    files.push(VolumeFile {
                        path: relative(&token.path)?,
                        data: token_value.into_bytes(),
                        mode: file_mode(mode),
                    });
                } else {
                    return Err(StartError::Unsupported(format!(
                        "volume {}: projected sources other than secret, configMap, downwardAPI \
                         and serviceAccountToken",
                        volume.name
                    )));
                }
            }
            return Ok(Some(files));
        }
        if volume.empty_dir.is_some() {
            return Ok(None);
        }
        Err(StartError::Unsupported(format!(
            "volume {} ({})",
            volume.name,
            kind(volume)
        )))
    }

    /// A token of the pod's service account for `audience`, requested anew
    /// once it has lived [`TOKEN_REFRESH`] or 80% of its `seconds`.
    async fn token(
        &mut self,
        client: &kube::Client,
        pod: &Pod,
        audience: String,
        seconds: i64,
    ) -> Result<String, StartError> {
        let life = Duration::from_secs(u64::try_from(seconds).unwrap_or(0) * 4 / 5);
        let key = (audience, seconds);
        if let Some((token, at)) = self.tokens.get(&key)
            && at.elapsed() < life.min(TOKEN_REFRESH)
        {
            return Ok(token.clone());
        }
        let audiences: Vec<&str> = [key.0.as_str()]
            .into_iter()
            .filter(|a| !a.is_empty())
            .collect();
        let token = env::request_token(client, pod, &audiences, seconds).await?;
        self.tokens.insert(key, (token.clone(), Instant::now()));
        Ok(token)
    }

    /// The bind mounts of `container`'s `volumeMounts`, parents first;
    /// `subPathExpr` is expanded from `vars`, the container's environment.
    pub(super) fn mounts(
        &self,
        container: &Container,
        vars: &BTreeMap<String, String>,
    ) -> Result<Vec<BindMount>, StartError> {
        let mut mounts = Vec::new();
        for m in container.volume_mounts.iter().flatten() {
            let target = PathBuf::from(&m.mount_path);
            if !target.is_absolute() {
                return Err(StartError::Unsupported(format!(
                    "the relative mountPath {:?}",
                    m.mount_path
                )));
            }
            if let Some(p) = m.mount_propagation.as_deref().filter(|p| *p != "None") {
                return Err(StartError::Unsupported(format!("mountPropagation {p}")));
            }
            if m.recursive_read_only
                .as_deref()
                .is_some_and(|r| r != "Disabled")
            {
                return Err(StartError::Unsupported("recursiveReadOnly".to_owned()));
            }
            if let Some(device) = self.devices.get(&m.name) {
                mounts.push(BindMount {
                    source: device.clone(),
                    target,
                    read_only: m.read_only.unwrap_or(false),
                });
                continue;
            }
            let mut source = self.dir.join(checked_name(&m.name)?);
            let sub_path = match (&m.sub_path, &m.sub_path_expr) {
                (Some(path), _) => path.clone(),
                (None, Some(expr)) => env::expand(expr, vars),
                (None, None) => String::new(),
            };
            if !sub_path.is_empty() {
                source = source.join(relative(&sub_path)?);
                // As a kubelet: a missing subPath is made a folder.
                if !source.exists() {
                    std::fs::create_dir_all(&source).map_err(|e| StartError::Write {
                        path: source.clone(),
                        source: e,
                    })?;
                }
            }
            mounts.push(BindMount {
                source,
                target,
                read_only: m.read_only.unwrap_or(false),
            });
        }
        // A folder is mounted before what is mounted inside it.
        mounts.sort_by_key(|m| m.target.components().count());
        Ok(mounts)
    }
}

/// The device of a `hostPath` volume of `type: CharDevice` (what a
/// gateway asks for `/dev/net/tun`), which must exist as a kubelet checks
/// it; other `hostPath` volumes are refused as every unsupported kind is.
fn host_device(volume: &Volume) -> Result<Option<PathBuf>, StartError> {
    let Some(host) = &volume.host_path else {
        return Ok(None);
    };
    if host.type_.as_deref() != Some("CharDevice") {
        return Err(StartError::Unsupported(format!(
            "volume {}: hostPath volumes other than of type CharDevice",
            volume.name
        )));
    }
    use std::os::unix::fs::FileTypeExt as _;
    let path = PathBuf::from(&host.path);
    match std::fs::metadata(&path) {
        Ok(m) if m.file_type().is_char_device() => Ok(Some(path)),
        _ => Err(StartError::Unsupported(format!(
            "volume {}: {} is not a character device on this host",
            volume.name, host.path
        ))),
    }
}

/// A volume's kind, for a refusal: the field set besides its name.
fn kind(volume: &Volume) -> String {
    let value = serde_json::to_value(volume).unwrap_or_default();
    let kinds: Vec<String> = value
        .as_object()
        .map(|o| o.keys().filter(|k| *k != "name").cloned().collect())
        .unwrap_or_default();
    if kinds.is_empty() {
        "no source".to_owned()
    } else {
        format!("{} volumes", kinds.join(", "))
    }
}

/// A volume name as a folder name: never a path.
fn checked_name(name: &str) -> Result<&str, StartError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(StartError::Unsupported(format!("the volume name {name:?}")));
    }
    Ok(name)
}

/// A path inside a volume: relative, and never out of it.
fn relative(path: &str) -> Result<PathBuf, StartError> {
    let p = Path::new(path);
    let inside = !path.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    if !inside {
        return Err(StartError::Unsupported(format!(
            "the path {path:?} (it must be relative, without \"..\")"
        )));
    }
    Ok(p.to_owned())
}

fn file_mode(mode: i32) -> u32 {
    u32::try_from(mode).unwrap_or(0o644) & 0o777
}

/// The files of a Secret's or ConfigMap's `data` (absent: `None`), as a
/// kubelet lays them out: every key as a file of `default_mode`, or only
/// the `items`, each at its path with its own mode if any. An absent
/// object, or an absent key of `items`, is an error unless `optional`.
pub(super) fn key_files(
    kind: &'static str,
    namespace: &str,
    name: &str,
    data: Option<&BTreeMap<String, Vec<u8>>>,
    items: Option<&[KeyToPath]>,
    default_mode: i32,
    optional: bool,
) -> Result<Vec<VolumeFile>, StartError> {
    let Some(data) = data else {
        return if optional {
            Ok(Vec::new())
        } else {
            Err(StartError::Missing {
                kind,
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })
        };
    };
    let Some(items) = items.filter(|i| !i.is_empty()) else {
        return data
            .iter()
            .map(|(key, value)| {
                Ok(VolumeFile {
                    path: relative(key)?,
                    data: value.clone(),
                    mode: file_mode(default_mode),
                })
            })
            .collect();
    };
    let mut files = Vec::new();
    for item in items {
        let Some(value) = data.get(&item.key) else {
            if optional {
                continue;
            }
            return Err(StartError::MissingKey {
                kind,
                name: name.to_owned(),
                key: item.key.clone(),
            });
        };
        files.push(VolumeFile {
            path: relative(&item.path)?,
            data: value.clone(),
            mode: file_mode(item.mode.unwrap_or(default_mode)),
        });
    }
    Ok(files)
}

/// The files of a `downwardAPI` volume or source: `fieldRef` items only.
fn downward_files(
    pod: &Pod,
    ips: env::Addresses,
    items: Option<&[DownwardAPIVolumeFile]>,
    default_mode: i32,
) -> Result<Vec<VolumeFile>, StartError> {
    let mut files = Vec::new();
    for item in items.unwrap_or_default() {
        let Some(field) = &item.field_ref else {
            return Err(StartError::Unsupported(format!(
                "downwardAPI item {}: resourceFieldRef",
                item.path
            )));
        };
        files.push(VolumeFile {
            path: relative(&item.path)?,
            data: env::field_value(pod, &field.field_path, ips)?.into_bytes(),
            mode: file_mode(item.mode.unwrap_or(default_mode)),
        });
    }
    Ok(files)
}

async fn secret_data(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, StartError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = api.get_opt(name).await.map_err(|source| StartError::Read {
        kind: "secret",
        name: name.to_owned(),
        source,
    })?;
    Ok(secret.map(|s| {
        (s.data.unwrap_or_default().into_iter())
            .map(|(k, v)| (k, v.0))
            .collect()
    }))
}

async fn config_map_data(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, StartError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let cm = api.get_opt(name).await.map_err(|source| StartError::Read {
        kind: "configmap",
        name: name.to_owned(),
        source,
    })?;
    Ok(cm.map(|cm| {
        let mut data: BTreeMap<String, Vec<u8>> = (cm.data.unwrap_or_default().into_iter())
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        data.extend((cm.binary_data.unwrap_or_default().into_iter()).map(|(k, v)| (k, v.0)));
        data
    }))
}

/// Makes `dir` hold exactly `files`: each file that differs (content or
/// mode) is written aside and renamed over, so that a reader sees the old
/// file or the new one, never half of one; files and folders not in
/// `files` go.
pub(super) fn write_volume(dir: &Path, files: &[VolumeFile]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir)?;
    let mut wanted = BTreeSet::new();
    for file in files {
        let path = dir.join(&file.path);
        wanted.extend(file.path.ancestors().map(Path::to_owned));
        let same = std::fs::read(&path).is_ok_and(|d| d == file.data)
            && std::fs::metadata(&path).is_ok_and(|m| m.permissions().mode() & 0o777 == file.mode);
        if same {
            continue;
        }
        let parent = path.parent().unwrap_or(dir);
        std::fs::create_dir_all(parent)?;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = parent.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, &file.data)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(file.mode))?;
        std::fs::rename(&tmp, &path)?;
    }
    remove_unwanted(dir, Path::new(""), &wanted)
}

/// Removes what lies under `dir/at` and is not in `wanted`.
fn remove_unwanted(dir: &Path, at: &Path, wanted: &BTreeSet<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir.join(at))? {
        let entry = entry?;
        let relative = at.join(entry.file_name());
        if wanted.contains(&relative) {
            if entry.file_type()?.is_dir() {
                remove_unwanted(dir, &relative, wanted)?;
            }
        } else if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Makes `target`, a mount point, exist: a folder, or an empty file when
/// `file`. Records in `created` what did not exist, parents first, so that
/// [`remove_created`] can take it away again.
pub(super) fn ensure_target(
    target: &Path,
    file: bool,
    created: &mut Vec<PathBuf>,
) -> std::io::Result<()> {
    let mut missing: Vec<&Path> = target
        .ancestors()
        .take_while(|p| std::fs::symlink_metadata(p).is_err())
        .collect();
    missing.reverse();
    for path in missing {
        if file && path == target {
            std::fs::File::options()
                .write(true)
                .create_new(true)
                .open(path)?;
        } else {
            std::fs::create_dir(path)?;
        }
        created.push(path.to_owned());
    }
    Ok(())
}

/// Removes what [`ensure_target`] created and no pod needs any more:
/// deepest first, only if empty, not in or above a path of `in_use`, and
/// not a mount point of any process. Keeps in `created` what stays.
pub(super) fn remove_created(created: &mut Vec<PathBuf>, in_use: &BTreeSet<PathBuf>) {
    let mut kept = Vec::new();
    while let Some(path) = created.pop() {
        let needed = in_use.iter().any(|p| p.starts_with(&path));
        let gone = !needed
            && !mounted_anywhere(&path)
            && match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => std::fs::remove_dir(&path).is_ok(),
                Ok(m) if m.len() == 0 => std::fs::remove_file(&path).is_ok(),
                Ok(_) => false,
                Err(_) => true,
            };
        if !gone {
            kept.push(path);
        }
    }
    kept.reverse();
    *created = kept;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
            .collect()
    }

    fn items(value: serde_json::Value) -> Vec<KeyToPath> {
        serde_json::from_value(value).expect("items")
    }

    fn file(path: &str, data: &str, mode: u32) -> VolumeFile {
        VolumeFile {
            path: PathBuf::from(path),
            data: data.as_bytes().to_vec(),
            mode,
        }
    }

    #[test]
    fn key_files_lay_out_every_key_or_the_items() {
        let d = data(&[("a", "1"), ("b", "2")]);
        assert_eq!(
            key_files("secret", "ns", "s", Some(&d), None, 0o400, false).expect("all keys"),
            [file("a", "1", 0o400), file("b", "2", 0o400)]
        );
        let chosen = items(json!([
            { "key": "b", "path": "sub/dir/b.txt" },
            { "key": "a", "path": "a.txt", "mode": 0o600 },
        ]));
        assert_eq!(
            key_files(
                "configmap",
                "ns",
                "c",
                Some(&d),
                Some(&chosen),
                0o644,
                false
            )
            .expect("items"),
            [file("sub/dir/b.txt", "2", 0o644), file("a.txt", "1", 0o600)]
        );
    }

    #[test]
    fn key_files_refuse_what_is_missing_unless_optional() {
        let d = data(&[("a", "1")]);
        let missing_key =
            items(json!([{ "key": "nope", "path": "x" }, { "key": "a", "path": "a" }]));
        assert!(matches!(
            key_files(
                "secret",
                "ns",
                "s",
                Some(&d),
                Some(&missing_key),
                0o644,
                false
            ),
            Err(StartError::MissingKey { .. })
        ));
        assert_eq!(
            key_files(
                "secret",
                "ns",
                "s",
                Some(&d),
                Some(&missing_key),
                0o644,
                true
            )
            .expect("optional"),
            [file("a", "1", 0o644)]
        );
        assert!(matches!(
            key_files("secret", "ns", "s", None, None, 0o644, false),
            Err(StartError::Missing { .. })
        ));
        assert_eq!(
            key_files("secret", "ns", "s", None, None, 0o644, true).expect("optional"),
            []
        );
        for path in ["../x", "/etc/passwd", "a/../../x", ""] {
            let escape = items(json!([{ "key": "a", "path": path }]));
            assert!(
                key_files("secret", "ns", "s", Some(&d), Some(&escape), 0o644, false).is_err(),
                "{path:?}"
            );
        }
    }

    #[test]
    fn write_volume_replaces_changed_files_and_removes_stale_ones() {
        use std::os::unix::fs::PermissionsExt as _;
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("vol");
        write_volume(&dir, &[file("a", "1", 0o600), file("sub/b", "2", 0o644)]).expect("write");
        assert_eq!(std::fs::read_to_string(dir.join("a")).expect("a"), "1");
        assert_eq!(std::fs::read_to_string(dir.join("sub/b")).expect("b"), "2");
        let mode = |p: &str| {
            std::fs::metadata(dir.join(p))
                .expect("metadata")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("a"), 0o600);

        let inode = |p: &str| {
            use std::os::unix::fs::MetadataExt as _;
            std::fs::metadata(dir.join(p)).expect("metadata").ino()
        };
        let unchanged = inode("a");
        write_volume(&dir, &[file("a", "1", 0o600), file("c", "3", 0o640)]).expect("rewrite");
        assert_eq!(inode("a"), unchanged, "an unchanged file is left alone");
        assert!(!dir.join("sub").exists(), "stale folder removed");
        assert_eq!(mode("c"), 0o640);
        write_volume(&dir, &[file("a", "changed", 0o600)]).expect("update");
        assert_eq!(
            std::fs::read_to_string(dir.join("a")).expect("a"),
            "changed"
        );
        assert_ne!(inode("a"), unchanged, "replaced by a rename");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["a"], "no temporary file left");
    }

    #[test]
    fn mount_targets_are_made_and_removed_when_unused() {
        let root = tempfile::tempdir().expect("tempdir");
        let target = root.path().join("x/y/z");
        let mut created = Vec::new();
        ensure_target(&target, false, &mut created).expect("make");
        assert!(target.is_dir());
        assert_eq!(
            created,
            [
                root.path().join("x"),
                root.path().join("x/y"),
                target.clone()
            ]
        );
        let file = root.path().join("x/f");
        ensure_target(&file, true, &mut created).expect("make file");
        assert!(file.is_file());

        remove_created(&mut created, &BTreeSet::from([target.clone()]));
        assert!(target.is_dir(), "still in use");
        assert!(!file.exists(), "unused");
        remove_created(&mut created, &BTreeSet::new());
        assert!(!root.path().join("x").exists());
        assert!(created.is_empty());
    }

    #[test]
    fn mounts_follow_volume_mounts_parents_first() {
        let volumes = Volumes::new(Path::new("/pods/ns_p"));
        let container: Container = serde_json::from_value(json!({
            "name": "c",
            "volumeMounts": [
                { "name": "inner", "mountPath": "/etc/app/inner", "readOnly": true },
                { "name": "outer", "mountPath": "/etc/app" },
                { "name": "sub", "mountPath": "/etc/other", "subPathExpr": "$(WHICH)" },
            ],
        }))
        .expect("container");
        let vars = BTreeMap::from([("WHICH".to_owned(), "../escape".to_owned())]);
        assert!(
            volumes.mounts(&container, &vars).is_err(),
            "subPath escapes"
        );
        let mut container = container;
        container.volume_mounts.as_mut().expect("mounts").pop();
        let mounts = volumes.mounts(&container, &vars).expect("mounts");
        assert_eq!(
            mounts,
            [
                BindMount {
                    source: PathBuf::from("/pods/ns_p/volumes/outer"),
                    target: PathBuf::from("/etc/app"),
                    read_only: false,
                },
                BindMount {
                    source: PathBuf::from("/pods/ns_p/volumes/inner"),
                    target: PathBuf::from("/etc/app/inner"),
                    read_only: true,
                },
            ]
        );
    }
}
