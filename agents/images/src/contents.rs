//! What each image holds: one static program, the user it runs as, and
//! for the gateway the two host tools it runs (`nft` for its NAT table,
//! `ip` for its route) with exactly the shared libraries they load.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::layer::{Compression, File, Files};
use crate::oci::Image;

/// The user every image runs as unless its pod says otherwise (the
/// gateway's does: it needs root with NET_ADMIN alone).
pub const USER: &str = "65532:65532";

/// One of the images this project ships.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    Gateway,
    VirtualKubelet,
    Liqoctl,
}

impl Program {
    pub const ALL: [Program; 3] = [Program::Gateway, Program::VirtualKubelet, Program::Liqoctl];

    /// The binary's name, also the image's.
    pub fn name(self) -> &'static str {
        match self {
            Program::Gateway => liqo_api::images::GATEWAY,
            Program::VirtualKubelet => liqo_api::images::VIRTUAL_KUBELET,
            Program::Liqoctl => liqo_api::images::LIQOCTL,
        }
    }

    /// The cargo package that builds it.
    pub fn package(self) -> &'static str {
        self.name()
    }

    fn description(self) -> &'static str {
        match self {
            Program::Gateway => "WireGuard gateway linking peered clusters' pod networks",
            Program::VirtualKubelet => "Virtual kubelet of one outgoing peering",
            Program::Liqoctl => "Command-line tool to install, peer and offload",
        }
    }

    /// Host tools the program runs, by their path here and in the image.
    fn tools(self) -> &'static [&'static str] {
        match self {
            Program::Gateway => &["/usr/sbin/nft", "/usr/sbin/ip"],
            Program::VirtualKubelet | Program::Liqoctl => &[],
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {0}")]
    Read(PathBuf, #[source] std::io::Error),
    #[error("reading the libraries of {0}")]
    Libraries(PathBuf, #[source] lddtree::Error),
    #[error("{0} needs the library {1}, which is not installed here")]
    Missing(PathBuf, String),
    #[error(
        "{0} is not a static executable (it needs {1}); build it for x86_64-unknown-linux-musl"
    )]
    NotStatic(PathBuf, String),
}

/// The image of `program`, whose static binary is `binary`, named
/// `registry/name:tag`.
pub fn image(program: Program, binary: &Path, registry: &str, tag: &str) -> Result<Image, Error> {
    let mut files = accounts();
    let dependencies = lddtree::DependencyAnalyzer::new("/".into())
        .analyze(binary)
        .map_err(|e| Error::Libraries(binary.to_owned(), e))?;
    if let Some(needed) = dependencies
        .interpreter
        .or(dependencies.needed.first().cloned())
    {
        return Err(Error::NotStatic(binary.to_owned(), needed));
    }
    let entrypoint = format!("/usr/local/bin/{}", program.name());
    files.insert(entrypoint.clone(), File::executable(read(binary)?));
    let mut tool_versions = Vec::new();
    for tool in program.tools() {
        files.extend(with_libraries(Path::new(tool))?);
        tool_versions.push(version_of(tool));
    }
    let mut annotations = std::collections::BTreeMap::from([
        (
            "org.opencontainers.image.title".to_owned(),
            program.name().to_owned(),
        ),
        (
            "org.opencontainers.image.description".to_owned(),
            program.description().to_owned(),
        ),
        (
            "org.opencontainers.image.version".to_owned(),
            tag.to_owned(),
        ),
        (
            "org.opencontainers.image.licenses".to_owned(),
            "Apache-2.0".to_owned(),
        ),
    ]);
    if !tool_versions.is_empty() {
        // The tools come from this machine's packages: two machines with
        // other versions of them build other digests, and this says why.
        annotations.insert("io.liqo.image.tools".to_owned(), tool_versions.join("; "));
    }
    Ok(Image {
        reference: format!("{registry}/{}:{tag}", program.name()),
        files,
        entrypoint: vec![entrypoint],
        user: USER.to_owned(),
        annotations,
        compression: Compression::Gzip,
    })
}

/// The image of `program` from a build of this machine that loads shared
/// libraries (the test clusters' images, made from the tests' own build):
/// the binary stripped of its symbols, with the loader and libraries it
/// needs, its layer not compressed. It runs as the shipped image does.
pub fn local_image(
    program: Program,
    binary: &Path,
    registry: &str,
    tag: &str,
) -> Result<Image, Error> {
    let mut files = accounts();
    let stripped = stripped(binary)?;
    let entrypoint = format!("/usr/local/bin/{}", program.name());
    files.extend(with_libraries(binary)?);
    files.remove(&path_of(binary));
    files.insert(entrypoint.clone(), File::executable(stripped));
    for tool in program.tools() {
        files.extend(with_libraries(Path::new(tool))?);
    }
    Ok(Image {
        reference: format!("{registry}/{}:{tag}", program.name()),
        files,
        entrypoint: vec![entrypoint],
        user: USER.to_owned(),
        annotations: std::collections::BTreeMap::from([(
            "org.opencontainers.image.title".to_owned(),
            program.name().to_owned(),
        )]),
        compression: Compression::None,
    })
}

/// An image of this machine's programs, each with the libraries it loads,
/// running `entrypoint` as root: the test clusters' pause and workload
/// images. `names` are further names of a multi-call program (busybox's
/// applets), links in the same folder as the program.
pub fn tools_image(
    reference: &str,
    programs: &[&Path],
    names: &[(&Path, Vec<String>)],
    entrypoint: &[&str],
) -> Result<Image, Error> {
    let mut files = accounts();
    for program in programs {
        files.extend(with_libraries(program)?);
    }
    for (program, others) in names {
        let folder = program.parent().map(path_of).unwrap_or_default();
        for name in others {
            let at = format!("{folder}/{name}");
            files
                .entry(at)
                .or_insert_with(|| File::symlink(path_of(program)));
        }
    }
    Ok(Image {
        reference: reference.to_owned(),
        files,
        entrypoint: entrypoint.iter().map(|s| (*s).to_owned()).collect(),
        user: "0:0".to_owned(),
        annotations: std::collections::BTreeMap::new(),
        compression: Compression::None,
    })
}

/// `binary` without its symbols (`strip`), or whole if `strip` is missing.
fn stripped(binary: &Path) -> Result<Vec<u8>, Error> {
    // Unique in the process: images may be built on several threads.
    static COPIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let copy = COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!(
        "liqo-images-{}-{copy}-{}",
        std::process::id(),
        binary
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let ran = Command::new("strip")
        .arg("-o")
        .arg(&out)
        .arg(binary)
        .status()
        .is_ok_and(|s| s.success());
    let bytes = if ran { read(&out) } else { read(binary) };
    let _ = std::fs::remove_file(&out);
    bytes
}

/// `/etc/passwd` and `/etc/group` naming root and the image's user, so
/// that the programs and the tools find a name for their ids.
fn accounts() -> Files {
    Files::from([
        (
            "/etc/passwd".to_owned(),
            File::readable(
                "root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n",
            ),
        ),
        (
            "/etc/group".to_owned(),
            File::readable("root:x:0:\nnonroot:x:65532:\n"),
        ),
    ])
}

/// `tool`, the dynamic loader and every library it loads, each at the path
/// the loader looks for it.
pub fn with_libraries(tool: &Path) -> Result<Files, Error> {
    let tree = lddtree::DependencyAnalyzer::new("/".into())
        .analyze(tool)
        .map_err(|e| Error::Libraries(tool.to_owned(), e))?;
    let mut files = Files::new();
    files.insert(path_of(tool), File::executable(read(tool)?));
    if let Some(interpreter) = &tree.interpreter {
        let interpreter = Path::new(interpreter);
        files.insert(path_of(interpreter), File::executable(read(interpreter)?));
    }
    for library in tree.libraries.values() {
        if !library.found() {
            return Err(Error::Missing(tool.to_owned(), library.name.clone()));
        }
        // The content of what the path links to, at the path itself: the
        // image holds no links.
        let source = library.realpath.as_ref().unwrap_or(&library.path);
        files.insert(path_of(&library.path), File::executable(read(source)?));
    }
    Ok(files)
}

fn path_of(path: &Path) -> String {
    path.display().to_string()
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::Read(path.to_owned(), e))
}

/// What `tool` says its version is, or that it would not say.
fn version_of(tool: &str) -> String {
    let flag = if tool.ends_with("/ip") {
        "-V"
    } else {
        "--version"
    };
    Command::new(tool)
        .arg(flag)
        .output()
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| format!("{tool}: version unknown"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `files` under `root`, as the image's layer would unpack.
    fn unpack(files: &Files, root: &Path) {
        for (path, file) in files {
            let at = root.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(at.parent().expect("a parent")).expect("a folder");
            std::fs::write(&at, &file.content).expect("a file");
            let mut permissions = std::fs::metadata(&at).expect("metadata").permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, file.mode);
            std::fs::set_permissions(&at, permissions).expect("a mode");
        }
    }

    #[test]
    fn the_gateways_tools_run_from_the_images_files_alone() {
        let root = tempfile::tempdir().expect("a folder");
        let mut files = accounts();
        for tool in Program::Gateway.tools() {
            files.extend(with_libraries(Path::new(tool)).expect("the tool and its libraries"));
        }
        unpack(&files, root.path());
        for (tool, flag) in [("/usr/sbin/nft", "--version"), ("/usr/sbin/ip", "-V")] {
            let out = Command::new("chroot")
                .arg(root.path())
                .args([tool, flag])
                .output()
                .expect("chroot runs");
            assert!(
                out.status.success(),
                "{tool} in the image's files: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // And nothing runs there that was not put there.
        let out = Command::new("chroot")
            .arg(root.path())
            .args(["/bin/sh", "-c", "true"])
            .output()
            .expect("chroot runs");
        assert!(!out.status.success(), "a shell in the image");
    }

    #[test]
    fn a_dynamic_binary_is_refused_as_an_images_program() {
        let err =
            image(Program::Liqoctl, Path::new("/usr/sbin/nft"), "r", "1").expect_err("an error");
        assert!(matches!(err, Error::NotStatic(..)), "{err}");
        assert!(
            err.to_string().contains("x86_64-unknown-linux-musl"),
            "{err}"
        );
    }
}
