//! The folders a testbed makes, and the rule that keeps it from deleting
//! anything else: every folder it makes holds a [`MARKER`] file, and it
//! clears or deletes a folder only if that file is there. A folder given by
//! a user (`--dir .`, the working tree, a home folder) has no marker, so a
//! mistyped `--dir` refuses instead of wiping it.

use std::path::Path;

use crate::{Error, io_error};

/// The file that marks a folder as made by a testbed.
pub const MARKER: &str = ".made-by-liqo-testbed";

const MARKER_TEXT: &str = "This folder was made by liqo-testbed (liqo-rs's local test clusters).\n\
liqo-testbed deletes or clears a folder only if this file is in it;\n\
remove this file to keep liqo-testbed from ever deleting the folder.\n";

/// Whether `dir` holds the marker of a testbed.
pub fn made_by_testbed(dir: &Path) -> bool {
    dir.join(MARKER).is_file()
}

/// Whether `dir` is missing, or a folder with nothing in it.
fn absent_or_empty(dir: &Path) -> Result<bool, Error> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(source) => Err(Error::Io {
            path: dir.to_owned(),
            source,
        }),
    }
}

/// Whether a testbed may use `dir` as its own: it is missing, empty, or
/// was made by a testbed. A failure names the folder.
pub fn may_use(dir: &Path) -> Result<(), Error> {
    if made_by_testbed(dir) || absent_or_empty(dir)? {
        Ok(())
    } else {
        Err(Error::NotMadeByTestbed {
            path: dir.to_owned(),
        })
    }
}

fn mark(dir: &Path) -> Result<(), Error> {
    let marker = dir.join(MARKER);
    std::fs::write(&marker, MARKER_TEXT).map_err(io_error(&marker))
}

/// Makes `dir` (and its parents) if missing and marks it, keeping what a
/// testbed left in it; refuses a folder that holds something and no marker.
pub fn claim(dir: &Path) -> Result<(), Error> {
    may_use(dir)?;
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    mark(dir)
}

/// Makes `dir` empty but for its marker: clears a folder a testbed made,
/// makes a missing one, marks an empty one; refuses a folder that holds
/// something and no marker, leaving it as it is.
pub fn make_fresh(dir: &Path) -> Result<(), Error> {
    may_use(dir)?;
    if made_by_testbed(dir) {
        std::fs::remove_dir_all(dir).map_err(io_error(dir))?;
    }
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    mark(dir)
}

/// Deletes `dir` if a testbed made it; a missing folder is fine; a folder
/// without the marker, even an empty one, is refused and left as it is.
pub fn remove(dir: &Path) -> Result<(), Error> {
    if !dir.exists() {
        return Ok(());
    }
    if !made_by_testbed(dir) {
        return Err(Error::NotMadeByTestbed {
            path: dir.to_owned(),
        });
    }
    std::fs::remove_dir_all(dir).map_err(io_error(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_folder_is_refused_and_kept() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let users = tmp.path().join("users");
        std::fs::create_dir(&users).expect("mkdir");
        std::fs::write(users.join("notes.txt"), "mine").expect("write");

        assert!(matches!(
            make_fresh(&users),
            Err(Error::NotMadeByTestbed { .. })
        ));
        assert!(matches!(claim(&users), Err(Error::NotMadeByTestbed { .. })));
        assert!(matches!(
            remove(&users),
            Err(Error::NotMadeByTestbed { .. })
        ));
        assert!(users.join("notes.txt").is_file());
        assert!(!users.join(MARKER).exists());
    }

    #[test]
    fn a_folder_the_testbed_made_is_cleared_and_removed() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("a").join("b");
        make_fresh(&dir).expect("a missing folder is made");
        assert!(made_by_testbed(&dir));
        std::fs::write(dir.join("left-over"), "x").expect("write");
        claim(&dir).expect("claiming keeps the folder");
        assert!(dir.join("left-over").exists());
        make_fresh(&dir).expect("a marked folder is cleared");
        assert!(!dir.join("left-over").exists());
        assert!(made_by_testbed(&dir));
        remove(&dir).expect("a marked folder is removed");
        assert!(!dir.exists());
        remove(&dir).expect("a missing folder is fine");
    }

    #[test]
    fn an_empty_folder_is_used_but_not_removed_unmarked() {
        let tmp = tempfile::tempdir().expect("temp dir");
        assert!(matches!(
            remove(tmp.path()),
            Err(Error::NotMadeByTestbed { .. })
        ));
        make_fresh(tmp.path()).expect("an empty folder may be used");
        assert!(made_by_testbed(tmp.path()));
    }
}
