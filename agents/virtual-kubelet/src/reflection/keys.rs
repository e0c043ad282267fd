//! Gathering a kind's keys from both sides without holding them twice.
//!
//! A kind's keys are the objects of one side and those of the other
//! that the first does not have (a copy left behind, a remote pod made
//! before its wrapper). At 10,000 pods both sides name the same 10,000
//! objects: appending both and deduplicating held 20,000–40,000 keys
//! (and as many new names) at every sweep, megabytes for a moment.
//! [`Gathered`] keeps the first side's keys sorted and adds a key of the
//! other side only when it is not among them.

use std::sync::Arc;

use super::ObjectKey;

/// The keys of one side, then those of the other side it lacks.
#[derive(Debug, Default)]
pub struct Gathered {
    keys: Vec<ObjectKey>,
    /// How many of `keys`, from the start, are sorted and unique: the
    /// first side's.
    sorted: usize,
}

impl Gathered {
    /// Starts from the keys of the first side (in any order, repeats
    /// allowed).
    pub fn from_first(mut keys: Vec<ObjectKey>) -> Self {
        keys.sort_unstable();
        keys.dedup();
        let sorted = keys.len();
        Self { keys, sorted }
    }

    /// Whether the first side has `namespace`/`name`.
    fn in_first(&self, namespace: &str, name: &str) -> bool {
        self.keys[..self.sorted]
            .binary_search_by(|(ns, n)| (&**ns, &**n).cmp(&(namespace, name)))
            .is_ok()
    }

    /// Adds `namespace`/`name` from the other side unless the first has
    /// it; `name_of` makes the name's shared text only then.
    pub fn add(&mut self, namespace: &Arc<str>, name: &str, name_of: impl FnOnce() -> Arc<str>) {
        if !self.in_first(namespace, name) {
            self.keys.push((namespace.clone(), name_of()));
        }
    }

    /// Every key gathered, sorted, each once.
    pub fn into_keys(mut self) -> Vec<ObjectKey> {
        if self.keys.len() > self.sorted {
            self.keys.sort_unstable();
            self.keys.dedup();
        }
        self.keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, name: &str) -> ObjectKey {
        (Arc::from(ns), Arc::from(name))
    }

    #[test]
    fn the_other_side_adds_only_what_the_first_lacks() {
        let ns: Arc<str> = Arc::from("a");
        let mut gathered = Gathered::from_first(vec![
            key("a", "web-2"),
            key("a", "web-1"),
            key("a", "web-1"),
        ]);
        let mut made = Vec::new();
        for name in ["web-1", "web-3", "web-2", "web-3"] {
            gathered.add(&ns, name, || {
                made.push(name);
                Arc::from(name)
            });
        }
        // Only the missing name was made, once per time it was missing.
        assert_eq!(made, ["web-3", "web-3"]);
        assert_eq!(
            gathered.into_keys(),
            [key("a", "web-1"), key("a", "web-2"), key("a", "web-3")]
        );
    }

    #[test]
    fn a_name_of_another_namespace_is_another_key() {
        let mut gathered = Gathered::from_first(vec![key("a", "web"), key("c", "web")]);
        gathered.add(&Arc::from("b"), "web", || Arc::from("web"));
        gathered.add(&Arc::from("c"), "web", || Arc::from("web"));
        assert_eq!(
            gathered.into_keys(),
            [key("a", "web"), key("b", "web"), key("c", "web")]
        );
    }

    #[test]
    fn nothing_first_keeps_everything_else() {
        let mut gathered = Gathered::from_first(Vec::new());
        gathered.add(&Arc::from("a"), "y", || Arc::from("y"));
        gathered.add(&Arc::from("a"), "x", || Arc::from("x"));
        assert_eq!(gathered.into_keys(), [key("a", "x"), key("a", "y")]);
    }
}
