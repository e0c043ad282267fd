//! Compact forms of the identifiers every stored object carries: a UID
//! held as its 16 bytes (a `String` of it is 24 bytes inline and a
//! 36-byte allocation), a resource version as a number. Both are opaque
//! strings to the API: a value that is not in the usual form is kept as
//! its text, and every value reads back exactly as it was given. And
//! shared copies of the short texts that many stored objects repeat
//! ([`shared`]).

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};

/// A UID: a canonical UUID (lowercase, hyphenated, as the API server
/// makes them) as its 128 bits (two halves: a `u128` would align the
/// whole to 16 bytes), anything else as its text.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Uid {
    Uuid(u64, u64),
    Other(Box<str>),
}

impl Uid {
    pub fn new(text: &str) -> Self {
        let hex: String = text.split('-').collect();
        let groups: Vec<usize> = text.split('-').map(str::len).collect();
        match u128::from_str_radix(&hex, 16) {
            Ok(n)
                if groups == [8, 4, 4, 4, 12]
                    && hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase()) =>
            {
                Self::Uuid((n >> 64) as u64, n as u64)
            }
            _ => Self::Other(text.into()),
        }
    }
}

impl fmt::Display for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Uuid(high, low) => {
                let n = (u128::from(*high) << 64) | u128::from(*low);
                let hex = format!("{n:032x}");
                write!(
                    f,
                    "{}-{}-{}-{}-{}",
                    &hex[..8],
                    &hex[8..12],
                    &hex[12..16],
                    &hex[16..20],
                    &hex[20..]
                )
            }
            Self::Other(text) => f.write_str(text),
        }
    }
}

impl PartialEq<str> for Uid {
    fn eq(&self, other: &str) -> bool {
        *self == Self::new(other)
    }
}

/// A resource version: a decimal number without leading zeros (what
/// etcd-backed API servers give) as that number, anything else as its
/// text.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Version {
    Number(u64),
    Other(Box<str>),
}

impl Version {
    pub fn new(text: &str) -> Self {
        match text.parse::<u64>() {
            Ok(n) if n.to_string() == text => Self::Number(n),
            _ => Self::Other(text.into()),
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Other(text) => f.write_str(text),
        }
    }
}

/// An object's UID and version, each when it has one: what a
/// fingerprint of a stored object is made of.
pub fn identity(meta: &kube::core::ObjectMeta) -> (Option<Uid>, Option<Version>) {
    (
        meta.uid.as_deref().map(Uid::new),
        meta.resource_version.as_deref().map(Version::new),
    )
}

/// Whether two values stored of an object are of the same version of it
/// (their UIDs and versions, from [`identity`], are equal and the
/// version is known): what a list may keep a settled value by
/// ([`crate::follow::Options::keep`]).
pub fn same_version(
    a: (&Option<Uid>, &Option<Version>),
    b: (&Option<Uid>, &Option<Version>),
) -> bool {
    a.1.is_some() && a == b
}

/// How many distinct texts [`shared`] keeps.
const SHARED_MAX: usize = 1024;

/// A copy of `text` shared with every other value that says the same:
/// for the texts that thousands of stored objects repeat from a small
/// set (an Event's reason, type, reporting component and the container
/// it is about; a pod's phase and reason), one allocation in all rather
/// than one each. The first
/// [`SHARED_MAX`] distinct texts are kept for the life of the process;
/// past them, each value gets a copy of its own.
pub fn shared(text: &str) -> Arc<str> {
    static TEXTS: LazyLock<Mutex<HashSet<Arc<str>>>> = LazyLock::new(Mutex::default);
    let Ok(mut texts) = TEXTS.lock() else {
        return Arc::from(text);
    };
    if let Some(known) = texts.get(text) {
        return known.clone();
    }
    let new: Arc<str> = Arc::from(text);
    if texts.len() < SHARED_MAX {
        texts.insert(new.clone());
    }
    new
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_texts_are_one_allocation_up_to_the_bound() {
        let a = shared("Scheduled");
        let b = shared(&String::from("Scheduled"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*a, "Scheduled");
        assert!(!Arc::ptr_eq(&a, &shared("Started")));
        // Past the bound, values are still right, only not shared.
        for i in 0..SHARED_MAX {
            shared(&format!("filler-{i}"));
        }
        let (c, d) = (shared("unseen until now"), shared("unseen until now"));
        assert_eq!((&*c, &*d), ("unseen until now", "unseen until now"));
        assert!(!Arc::ptr_eq(&c, &d));
        assert!(
            Arc::ptr_eq(&a, &shared("Scheduled")),
            "known ones stay shared"
        );
    }

    #[test]
    fn every_value_reads_back_as_given() {
        for (text, compact) in [
            ("0f3c2a5e-4b1e-4c2a-9d7f-00000000002a", true),
            ("00000000-0000-0000-0000-000000000000", true),
            ("0F3C2A5E-4B1E-4C2A-9D7F-00000000002A", false),
            ("0f3c2a5e4b1e4c2a9d7f00000000002a", false),
            ("0f3c2a5e-4b1e-4c2a-9d7f-00000000002", false),
            ("+f3c2a5e-4b1e-4c2a-9d7f-00000000002a", false),
            ("not-a-uuid", false),
            ("", false),
        ] {
            let uid = Uid::new(text);
            assert_eq!(uid.to_string(), text);
            assert_eq!(matches!(uid, Uid::Uuid(..)), compact, "{text}");
            assert!(uid == *text);
        }
        assert!(
            Uid::new("0f3c2a5e-4b1e-4c2a-9d7f-00000000002a")
                != *"0f3c2a5e-4b1e-4c2a-9d7f-00000000002b"
        );
        for (text, compact) in [
            ("1", true),
            ("184467440737095516", true),
            ("0", true),
            ("007", false),
            ("18446744073709551616", false),
            ("-1", false),
            ("+1", false),
            ("abc", false),
            ("", false),
        ] {
            let version = Version::new(text);
            assert_eq!(version.to_string(), text);
            assert_eq!(matches!(version, Version::Number(_)), compact, "{text}");
        }
    }
}
