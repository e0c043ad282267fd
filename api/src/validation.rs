//! The checks the Kubernetes API server applies to names, label keys and
//! label values, so that liqo-rs refuses a bad value before a cluster does
//! (and says why in the same words).

/// Why a value is not valid; the message follows apimachinery's wording.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

const NAME_CHARS: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// A DNS-1123 label: 1 to 63 lowercase letters, digits and '-', starting
/// and ending with a letter or digit (namespace names, cluster IDs).
pub fn dns_label(value: &str) -> Result<(), Invalid> {
    if value.is_empty() || value.len() > 63 {
        return Err(Invalid("must be 1 to 63 characters long".to_owned()));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(Invalid(
            "must consist of lowercase letters, digits and '-'".to_owned(),
        ));
    }
    if value.starts_with('-') || value.ends_with('-') {
        return Err(Invalid(
            "must start and end with a letter or digit".to_owned(),
        ));
    }
    Ok(())
}

/// A DNS-1123 subdomain: at most 253 characters, dot-separated DNS labels
/// (the prefix of a label key, most object names).
pub fn dns_subdomain(value: &str) -> Result<(), Invalid> {
    if value.is_empty() || value.len() > 253 {
        return Err(Invalid("must be 1 to 253 characters long".to_owned()));
    }
    for part in value.split('.') {
        dns_label(part).map_err(|_| {
            Invalid(
                "must consist of lowercase letters, digits, '-' and '.', and each dot-separated part \
                 must start and end with a letter or digit"
                    .to_owned(),
            )
        })?;
    }
    Ok(())
}

/// A label key: an optional DNS subdomain prefix and `/`, then a name of 1
/// to 63 characters.
pub fn label_key(key: &str) -> Result<(), Invalid> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            dns_subdomain(prefix).map_err(|e| Invalid(format!("prefix part {e}")))?;
            name
        }
        None => key,
    };
    if name.is_empty() || name.len() > 63 {
        return Err(Invalid(
            "name part must be 1 to 63 characters long".to_owned(),
        ));
    }
    if !name_chars_ok(name) {
        return Err(Invalid(format!("name part {NAME_CHARS}")));
    }
    Ok(())
}

/// A label value: empty, or up to 63 characters of the label name set.
pub fn label_value(value: &str) -> Result<(), Invalid> {
    if value.len() > 63 {
        return Err(Invalid("must be no more than 63 characters".to_owned()));
    }
    if !value.is_empty() && !name_chars_ok(value) {
        return Err(Invalid(format!("a label value {NAME_CHARS}")));
    }
    Ok(())
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]` without a regex engine.
fn name_chars_ok(s: &str) -> bool {
    let bytes = s.as_bytes();
    let edge_ok = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    edge_ok(bytes.first())
        && edge_ok(bytes.last())
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(b))
}

/// Checks a whole label set: each key and each value.
pub fn labels<'a>(
    labels: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), Invalid> {
    for (key, value) in labels {
        label_key(key).map_err(|e| Invalid(format!("label key {key:?}: {e}")))?;
        label_value(value)
            .map_err(|e| Invalid(format!("label value {value:?} of {key:?}: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid DNS subdomain of `len` characters (three 63-character labels
    /// and a last one), invalid only by its length when over 253.
    fn long_prefix(len: usize) -> String {
        format!(
            "{}.{}",
            vec!["p".repeat(63); 3].join("."),
            "p".repeat(len - 192)
        )
    }

    #[test]
    fn label_keys_as_kubernetes_checks_them() {
        for good in [
            "a",
            "region",
            "topology.kubernetes.io/region",
            "liqo.io/virtual-node",
            "A_b.c-D",
            &"x".repeat(63),
            &format!("{}/n", long_prefix(253)),
        ] {
            assert_eq!(label_key(good), Ok(()), "{good:?}");
        }
        for bad in [
            "",
            "/name",
            "prefix/",
            "Upper.Case/name",
            "-lead",
            "trail.",
            "sp ace",
            "a/b/c",
            "ünï",
            &"x".repeat(64),
            &format!("{}/n", long_prefix(254)),
            &format!("{}/n", "p".repeat(64)),
        ] {
            assert!(label_key(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn label_values_as_kubernetes_checks_them() {
        for good in ["", "eu-west-1", "v1.2_3", "A", &"x".repeat(63)] {
            assert_eq!(label_value(good), Ok(()), "{good:?}");
        }
        for bad in ["-x", "x-", "a b", "a/b", "é", &"x".repeat(64)] {
            assert!(label_value(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn dns_labels_and_subdomains() {
        assert!(dns_label("home-1").is_ok());
        for bad in ["", "Home", "a_b", "-a", "a-", "a.b", &"x".repeat(64)] {
            assert!(dns_label(bad).is_err(), "{bad:?} accepted");
        }
        assert!(dns_subdomain("a.b-c.d").is_ok());
        for bad in ["", "a..b", ".a", "a.", "A.b", &"x".repeat(254)] {
            assert!(dns_subdomain(bad).is_err(), "{bad:?} accepted");
        }
    }
}
