//! One image layer: a gzipped tar of files, written so that the same files
//! always give the same bytes, whatever the machine, the time or the
//! order they were listed in: entries sorted by path, every parent folder
//! listed, owner root, modification time 0, no user or group names, and a
//! gzip header without a name or a time.

use std::collections::BTreeMap;
use std::io::Write as _;

use flate2::GzBuilder;
use sha2::{Digest as _, Sha256};

/// A regular file of a layer, or a symbolic link (`link`: its target).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    pub content: Vec<u8>,
    pub mode: u32,
    pub link: Option<String>,
}

impl File {
    /// A program or a shared library.
    pub fn executable(content: Vec<u8>) -> Self {
        Self {
            content,
            mode: 0o755,
            link: None,
        }
    }

    /// A file anyone may read.
    pub fn readable(content: impl Into<Vec<u8>>) -> Self {
        Self {
            content: content.into(),
            mode: 0o644,
            link: None,
        }
    }

    /// A symbolic link to `target` (a multi-call program's names).
    pub fn symlink(target: impl Into<String>) -> Self {
        Self {
            content: Vec::new(),
            mode: 0o777,
            link: Some(target.into()),
        }
    }
}

/// How a layer is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Gzip at its best level: what ships.
    Gzip,
    /// The tar itself: quicker to write and import, for images that never
    /// leave the machine (the test clusters' nodes).
    None,
}

/// A layer's files by their absolute path in the image (`/usr/...`).
pub type Files = BTreeMap<String, File>;

/// A layer as it is stored: its bytes and the two digests an image names
/// it by.
#[derive(Debug, Clone)]
pub struct Layer {
    /// The tar, gzipped unless [`Compression::None`].
    pub blob: Vec<u8>,
    pub compression: Compression,
    /// `sha256:…` of `blob`.
    pub digest: String,
    /// `sha256:…` of the tar before compression (the config's `diff_ids`).
    pub diff_id: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the path {0:?} is not absolute")]
    Relative(String),
    #[error("writing the layer's tar")]
    Tar(#[source] std::io::Error),
}

/// The layer holding exactly `files`.
pub fn build(files: &Files, compression: Compression) -> Result<Layer, Error> {
    let tar = tar(files)?;
    let diff_id = sha256(&tar);
    if compression == Compression::None {
        return Ok(Layer {
            digest: diff_id.clone(),
            diff_id,
            blob: tar,
            compression,
        });
    }
    // Level and header are fixed, and flate2's pure-Rust backend compresses
    // the same input to the same output on every machine.
    let mut gz = GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), flate2::Compression::best());
    gz.write_all(&tar).map_err(Error::Tar)?;
    let blob = gz.finish().map_err(Error::Tar)?;
    Ok(Layer {
        digest: sha256(&blob),
        diff_id,
        blob,
        compression,
    })
}

/// `sha256:<hex>` of `bytes`, as OCI names content.
pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The tar of `files`, with their folders, written as a layer's is.
pub fn tar(files: &Files) -> Result<Vec<u8>, Error> {
    let mut folders = std::collections::BTreeSet::new();
    for path in files.keys() {
        let relative = path
            .strip_prefix('/')
            .ok_or_else(|| Error::Relative(path.clone()))?;
        let mut parent = std::path::Path::new(relative).parent();
        while let Some(folder) = parent.filter(|p| !p.as_os_str().is_empty()) {
            folders.insert(format!("{}/", folder.display()));
            parent = folder.parent();
        }
    }
    // One sorted list, folders before what they hold ("a/" < "a/b").
    let mut entries: BTreeMap<String, Option<&File>> =
        folders.into_iter().map(|f| (f, None)).collect();
    for (path, file) in files {
        entries.insert(path.trim_start_matches('/').to_owned(), Some(file));
    }
    let mut builder = tar::Builder::new(Vec::new());
    for (path, file) in entries {
        let mut header = tar::Header::new_ustar();
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        match file {
            None => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                builder
                    .append_data(&mut header, &path, std::io::empty())
                    .map_err(Error::Tar)?;
            }
            Some(File {
                link: Some(target),
                mode,
                ..
            }) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_mode(*mode);
                header.set_size(0);
                builder
                    .append_link(&mut header, &path, target)
                    .map_err(Error::Tar)?;
            }
            Some(file) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(file.mode);
                header.set_size(file.content.len() as u64);
                builder
                    .append_data(&mut header, &path, file.content.as_slice())
                    .map_err(Error::Tar)?;
            }
        }
    }
    builder.into_inner().map_err(Error::Tar)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(order: &[(&str, &str)]) -> Files {
        order
            .iter()
            .map(|(p, c)| ((*p).to_owned(), File::readable(*c)))
            .collect()
    }

    #[test]
    fn the_same_files_give_the_same_digests_and_a_change_changes_them() {
        let a = build(
            &files(&[("/etc/passwd", "root"), ("/usr/bin/x", "x")]),
            Compression::Gzip,
        )
        .expect("invariant of the test");
        let b = build(
            &files(&[("/usr/bin/x", "x"), ("/etc/passwd", "root")]),
            Compression::Gzip,
        )
        .expect("invariant of the test");
        assert_eq!((a.digest.clone(), a.diff_id.clone()), (b.digest, b.diff_id));
        let c = build(
            &files(&[("/etc/passwd", "root"), ("/usr/bin/x", "y")]),
            Compression::Gzip,
        )
        .expect("invariant of the test");
        assert_ne!(a.digest, c.digest);
        assert_ne!(a.diff_id, c.diff_id);
    }

    #[test]
    fn folders_come_first_owned_by_root_at_time_zero() {
        let layer = build(
            &files(&[("/usr/local/bin/tool", "t"), ("/etc/group", "g")]),
            Compression::Gzip,
        )
        .expect("invariant of the test");
        let tar = flate2::read::GzDecoder::new(layer.blob.as_slice());
        let mut archive = tar::Archive::new(tar);
        let listed: Vec<(String, u64, u64)> = archive
            .entries()
            .expect("invariant of the test")
            .map(|e| {
                let e = e.expect("invariant of the test");
                let h = e.header();
                (
                    e.path()
                        .expect("invariant of the test")
                        .display()
                        .to_string(),
                    h.mtime().expect("invariant of the test"),
                    h.uid().expect("invariant of the test"),
                )
            })
            .collect();
        let paths: Vec<&str> = listed.iter().map(|(p, ..)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "etc/",
                "etc/group",
                "usr/",
                "usr/local/",
                "usr/local/bin/",
                "usr/local/bin/tool"
            ]
        );
        assert!(
            listed
                .iter()
                .all(|(_, mtime, uid)| *mtime == 0 && *uid == 0)
        );
    }

    #[test]
    fn a_relative_path_is_refused() {
        let err =
            build(&files(&[("etc/passwd", "root")]), Compression::Gzip).expect_err("an error");
        assert!(matches!(err, Error::Relative(p) if p == "etc/passwd"));
    }
}
