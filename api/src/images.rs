//! The images of the agents: their names, the registry they are published
//! under, and how `liqoctl install` names them on a cluster's nodes. The
//! archives `liqo-images` writes are named here too, so that a message can
//! tell a user which file to load.

use std::fmt;
use std::str::FromStr;

/// Where the images are published unless `liqoctl install` is told
/// another registry.
pub const DEFAULT_REGISTRY: &str = "ghcr.io/liqo-rs";
/// The images' names, which are their binaries' names.
pub const GATEWAY: &str = "liqo-gateway";
pub const VIRTUAL_KUBELET: &str = "liqo-virtual-kubelet";
pub const LIQOCTL: &str = "liqoctl";

/// When a node pulls an image, as a container's `imagePullPolicy` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PullPolicy {
    Always,
    /// What Kubernetes does for a tag other than `latest`: an image loaded
    /// into the nodes by hand is used as it is.
    #[default]
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

impl fmt::Display for PullPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PullPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            PullPolicy::Always,
            PullPolicy::IfNotPresent,
            PullPolicy::Never,
        ]
        .into_iter()
        .find(|p| p.as_str().eq_ignore_ascii_case(s))
        .ok_or_else(|| format!("{s:?} is not Always, IfNotPresent or Never"))
    }
}

/// Where a cluster's nodes get the agents' images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSource {
    /// `host[:port][/path]`, without a trailing slash.
    pub registry: String,
    pub tag: String,
    pub pull_policy: PullPolicy,
}

impl Default for ImageSource {
    fn default() -> Self {
        Self {
            registry: DEFAULT_REGISTRY.to_owned(),
            tag: crate::VERSION.to_owned(),
            pull_policy: PullPolicy::default(),
        }
    }
}

impl ImageSource {
    /// `registry/name:tag`.
    pub fn reference(&self, name: &str) -> String {
        format!("{}/{name}:{}", self.registry, self.tag)
    }

    /// The registry and tag of `reference` if it names the image `name`
    /// (`registry/name:tag`), as a Deployment of ours holds it.
    pub fn parse(reference: &str, name: &str) -> Option<(String, String)> {
        let (repository, tag) = reference.rsplit_once(':')?;
        let registry = repository.strip_suffix(name)?.strip_suffix('/')?;
        (!tag.contains('/') && !registry.is_empty()).then(|| (registry.to_owned(), tag.to_owned()))
    }
}

/// Checks `registry` as a reference's registry and path: a host with an
/// optional port, then lower-case path components.
pub fn check_registry(registry: &str) -> Result<(), String> {
    let mut parts = registry.split('/');
    let host = parts.next().unwrap_or_default();
    let (name, port) = match host.split_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    };
    let host_ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    let path_ok = parts.all(|part| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
    });
    if host_ok && path_ok {
        Ok(())
    } else {
        Err(format!(
            "{registry:?} is not a registry: give HOST[:PORT][/PATH], such as \
             registry.example.com:5000/team (lower-case path, no trailing slash)"
        ))
    }
}

/// Checks `tag` as an image tag: up to 128 letters, digits, `_`, `.` and
/// `-`, not starting with `.` or `-`.
pub fn check_tag(tag: &str) -> Result<(), String> {
    let ok = tag.len() <= 128
        && tag
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{tag:?} is not an image tag: up to 128 letters, digits, '_', '.' and '-', \
             not starting with '.' or '-'"
        ))
    }
}

/// The file `liqo-images` writes for image `name` at `tag`.
pub fn archive_name(name: &str, tag: &str) -> String {
    format!("{name}-{tag}.oci.tar")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_is_read_back_into_its_registry_and_tag() {
        let source = ImageSource {
            registry: "registry.local:5000/team".into(),
            tag: "0.1.0-rc1".into(),
            pull_policy: PullPolicy::Never,
        };
        let reference = source.reference(GATEWAY);
        assert_eq!(reference, "registry.local:5000/team/liqo-gateway:0.1.0-rc1");
        assert_eq!(
            ImageSource::parse(&reference, GATEWAY),
            Some(("registry.local:5000/team".into(), "0.1.0-rc1".into()))
        );
        // Another image, a reference without a tag or without a registry.
        assert_eq!(ImageSource::parse(&reference, VIRTUAL_KUBELET), None);
        assert_eq!(
            ImageSource::parse("registry.local:5000/liqo-gateway", GATEWAY),
            None
        );
        assert_eq!(ImageSource::parse("liqo-gateway:1", GATEWAY), None);
    }

    #[test]
    fn the_default_names_the_published_images() {
        let source = ImageSource::default();
        assert_eq!(
            source.reference(GATEWAY),
            format!("{}:{}", crate::names::GATEWAY_IMAGE, crate::VERSION)
        );
        assert_eq!(
            source.reference(VIRTUAL_KUBELET),
            format!("{}:{}", crate::names::VIRTUAL_KUBELET_IMAGE, crate::VERSION)
        );
    }

    #[test]
    fn registries_and_tags_are_checked_as_references_spell_them() {
        for good in [
            "ghcr.io/liqo-rs",
            "localhost:5000",
            "registry.local:5000/a/b-c",
            "r",
        ] {
            assert_eq!(check_registry(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "ghcr.io/",
            "ghcr.io/Team",
            "host:0",
            "host:port",
            "a b",
            "ghcr.io//x",
            "h@sha256",
        ] {
            assert!(check_registry(bad).is_err(), "{bad}");
        }
        for good in ["0.1.0", "v1", "latest", "_x", "1.2.3-rc.1"] {
            assert_eq!(check_tag(good), Ok(()), "{good}");
        }
        let long = "a".repeat(129);
        for bad in ["", ".x", "-x", "a:b", "a/b", long.as_str()] {
            assert!(check_tag(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pull_policies_parse_as_kubernetes_spells_them() {
        assert_eq!("ifnotpresent".parse(), Ok(PullPolicy::IfNotPresent));
        assert_eq!("Never".parse(), Ok(PullPolicy::Never));
        assert!("sometimes".parse::<PullPolicy>().is_err());
    }
}
