//! `liqo-images`: builds the agents' and liqoctl's static binaries and
//! packs each into an OCI image archive under `target/images/`, with no
//! container engine and no registry. The same commit gives the same
//! digests (docs/install.md, "Images").

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context as _, bail};
use clap::Parser;
use liqo_api::images::{DEFAULT_REGISTRY, archive_name};

use liqo_images::contents::{self, Program};
use liqo_images::oci;

/// The static target every image's program is built for.
const TARGET: &str = "x86_64-unknown-linux-musl";

/// Builds the images' archives (OCI image layouts, one tar each).
#[derive(Debug, Parser)]
#[command(version = liqo_api::VERSION)]
struct Args {
    /// Where the archives go; `target/images` of the workspace by default.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Take the static binaries from this folder instead of building them.
    #[arg(long)]
    binaries: Option<PathBuf>,
    /// The cargo profile the binaries are built with: `release` for what
    /// ships; `dev` builds faster, for tests of the images themselves.
    #[arg(long, default_value = "release")]
    profile: String,
    /// The registry the images are named under.
    #[arg(long, default_value = DEFAULT_REGISTRY)]
    registry: String,
    /// The images' tag.
    #[arg(long, default_value = liqo_api::VERSION)]
    tag: String,
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let workspace = workspace();
    let binaries = match &args.binaries {
        Some(folder) => folder.clone(),
        None => build(&workspace, &args.profile)?,
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| workspace.join("target/images"));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    println!("{:<22} {:>9}  DIGEST", "IMAGE", "SIZE");
    for program in Program::ALL {
        let binary = binaries.join(program.name());
        let image = contents::image(program, &binary, &args.registry, &args.tag)
            .with_context(|| format!("collecting the image of {}", program.name()))?;
        let archive = oci::pack(&image).with_context(|| format!("packing {}", image.reference))?;
        let path = out.join(archive_name(program.name(), &args.tag));
        write_whole(&path, &archive.bytes)?;
        println!(
            "{:<22} {:>6.1} MB  {}  {}",
            program.name(),
            archive.bytes.len() as f64 / 1e6,
            archive.digest,
            path.display()
        );
    }
    Ok(())
}

/// The workspace's root: this crate lives in `agents/images`.
fn workspace() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// Builds the programs for [`TARGET`] with cargo's `profile`, with the paths of this machine
/// mapped to fixed ones (so that they appear in no binary and two clones
/// build the same bytes), and returns their folder.
fn build(workspace: &Path, profile: &str) -> anyhow::Result<PathBuf> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .context("neither CARGO_HOME nor HOME is set")?;
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    // The last prefix that matches wins: the target folder (generated
    // sources) may lie inside the workspace.
    let rustflags = [
        format!("--remap-path-prefix={}=/liqo-rs", workspace.display()),
        format!("--remap-path-prefix={}=/cargo", cargo_home.display()),
        format!("--remap-path-prefix={}=/target", target_dir.display()),
        "-Cstrip=symbols".to_owned(),
    ]
    .join("\x1f");
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command
        .current_dir(workspace)
        .args([
            "build",
            "--locked",
            "--target",
            TARGET,
            "--profile",
            profile,
        ])
        // Applies to the target's crates only: the host's build scripts
        // and macros keep their cache.
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
        .env_remove("RUSTFLAGS");
    for program in Program::ALL {
        command.args(["-p", program.package()]);
    }
    let status = command.status().context("running cargo")?;
    if !status.success() {
        bail!(
            "building the static binaries failed; the target needs `rustup target add {TARGET}` \
             and a musl C compiler (Debian's musl-tools)"
        );
    }
    // Cargo's folder for its `dev` profile is named for the old `debug`.
    let folder = if profile == "dev" { "debug" } else { profile };
    Ok(target_dir.join(TARGET).join(folder))
}

/// Writes `bytes` beside `path` and renames it over, so that a reader
/// never sees half an archive.
fn write_whole(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, bytes).with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("writing {}", path.display()))
}
