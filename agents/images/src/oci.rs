//! An image as an OCI image layout in one tar archive (`oci-archive:` to
//! skopeo, `ctr images import`, `kind load image-archive`): one layer, its
//! config, its manifest and an index naming it. JSON documents are written
//! with their keys sorted, and the archive like a layer, so that the same
//! image always gives the same bytes.

use std::collections::{BTreeMap, HashMap};

use oci_spec::image::{
    Arch, ConfigBuilder, Descriptor, DescriptorBuilder, ImageConfigurationBuilder,
    ImageIndexBuilder, ImageManifestBuilder, MediaType, OciLayoutBuilder, Os, RootFsBuilder,
};

use crate::layer::{self, Compression, File, Files, Layer};

/// What an image runs and holds.
#[derive(Debug, Clone)]
pub struct Image {
    /// `registry/name:tag`, as a cluster's nodes will know it.
    pub reference: String,
    pub files: Files,
    pub entrypoint: Vec<String>,
    /// `uid:gid`; the pod's security context may still choose another.
    pub user: String,
    /// `org.opencontainers.image.*` annotations of the manifest.
    pub annotations: BTreeMap<String, String>,
    /// How its layer is stored.
    pub compression: Compression,
}

/// An image packed: the archive and what it is named by.
#[derive(Debug, Clone)]
pub struct Archive {
    pub bytes: Vec<u8>,
    /// `sha256:…` of the manifest: the digest a registry or a node shows.
    pub digest: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("building the layer")]
    Layer(#[from] layer::Error),
    #[error("describing the image")]
    Spec(#[from] oci_spec::OciSpecError),
    #[error("encoding the image's JSON")]
    Json(#[from] serde_json::Error),
    #[error("the reference {0:?} has no tag")]
    NoTag(String),
}

/// Packs `image`.
pub fn pack(image: &Image) -> Result<Archive, Error> {
    let tag = image
        .reference
        .rsplit_once(':')
        .filter(|(_, tag)| !tag.contains('/'))
        .map(|(_, tag)| tag.to_owned())
        .ok_or_else(|| Error::NoTag(image.reference.clone()))?;
    let layer = layer::build(&image.files, image.compression)?;
    let config = ImageConfigurationBuilder::default()
        .architecture(Arch::Amd64)
        .os(Os::Linux)
        .config(
            ConfigBuilder::default()
                .user(image.user.clone())
                .entrypoint(image.entrypoint.clone())
                .env(vec![
                    "PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
                ])
                .working_dir("/".to_owned())
                .build()?,
        )
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(vec![layer.diff_id.clone()])
                .build()?,
        )
        .build()?;
    let config = canonical(&config)?;
    let config_descriptor = descriptor(MediaType::ImageConfig, &config)?;
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config_descriptor)
        .layers(vec![layer_descriptor(&layer)?])
        .annotations(
            image
                .annotations
                .clone()
                .into_iter()
                .collect::<HashMap<_, _>>(),
        )
        .build()?;
    let manifest = canonical(&manifest)?;
    let digest = layer::sha256(&manifest);
    let named = DescriptorBuilder::default()
        .media_type(MediaType::ImageManifest)
        .size(manifest.len() as u64)
        .digest(digest.parse::<oci_spec::image::Digest>()?)
        .annotations(HashMap::from([
            // The OCI name (the tag) and containerd's (the whole reference),
            // so that each tool that imports the archive names it alike.
            ("org.opencontainers.image.ref.name".to_owned(), tag),
            (
                "io.containerd.image.name".to_owned(),
                image.reference.clone(),
            ),
        ]))
        .build()?;
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![named])
        .build()?;
    let layout = OciLayoutBuilder::default()
        .image_layout_version("1.0.0".to_owned())
        .build()?;
    let mut files = Files::new();
    for (blob_digest, blob) in [
        (layer.digest.clone(), layer.blob.clone()),
        (layer::sha256(&config), config),
        (digest.clone(), manifest),
    ] {
        let hex = blob_digest.trim_start_matches("sha256:");
        files.insert(format!("/blobs/sha256/{hex}"), File::readable(blob));
    }
    files.insert("/index.json".into(), File::readable(canonical(&index)?));
    files.insert("/oci-layout".into(), File::readable(canonical(&layout)?));
    Ok(Archive {
        bytes: layer::tar(&files)?,
        digest,
    })
}

/// `value` as JSON with every object's keys sorted: the spec's maps are
/// hash maps, whose order would change from one run to the next.
fn canonical(value: &impl serde::Serialize) -> Result<Vec<u8>, serde_json::Error> {
    fn sorted(value: serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                let ordered: BTreeMap<String, serde_json::Value> =
                    map.into_iter().map(|(k, v)| (k, sorted(v))).collect();
                serde_json::Value::Object(ordered.into_iter().collect())
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.into_iter().map(sorted).collect())
            }
            other => other,
        }
    }
    serde_json::to_vec(&sorted(serde_json::to_value(value)?))
}

fn descriptor(media_type: MediaType, blob: &[u8]) -> Result<Descriptor, Error> {
    Ok(DescriptorBuilder::default()
        .media_type(media_type)
        .size(blob.len() as u64)
        .digest(layer::sha256(blob).parse::<oci_spec::image::Digest>()?)
        .build()?)
}

fn layer_descriptor(layer: &Layer) -> Result<Descriptor, Error> {
    Ok(DescriptorBuilder::default()
        .media_type(match layer.compression {
            Compression::Gzip => MediaType::ImageLayerGzip,
            Compression::None => MediaType::ImageLayer,
        })
        .size(layer.blob.len() as u64)
        .digest(layer.digest.parse::<oci_spec::image::Digest>()?)
        .build()?)
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    fn image(content: &str) -> Image {
        Image {
            reference: "registry.local:5000/liqo/tool:1.0".into(),
            files: Files::from([(
                "/usr/local/bin/tool".into(),
                File::executable(content.into()),
            )]),
            entrypoint: vec!["/usr/local/bin/tool".into()],
            user: "65532:65532".into(),
            annotations: BTreeMap::from([(
                "org.opencontainers.image.version".into(),
                "1.0".into(),
            )]),
            compression: Compression::Gzip,
        }
    }

    /// The archive's files by path.
    fn unpack(bytes: &[u8]) -> BTreeMap<String, Vec<u8>> {
        let mut archive = tar::Archive::new(bytes);
        archive
            .entries()
            .expect("invariant of the test")
            .filter_map(|e| {
                let mut e = e.expect("invariant of the test");
                let path = e
                    .path()
                    .expect("invariant of the test")
                    .display()
                    .to_string();
                let mut content = Vec::new();
                e.read_to_end(&mut content).expect("invariant of the test");
                (!path.ends_with('/')).then_some((path, content))
            })
            .collect()
    }

    fn json(files: &BTreeMap<String, Vec<u8>>, path: &str) -> serde_json::Value {
        serde_json::from_slice(&files[path]).expect("invariant of the test")
    }

    fn blob<'a>(files: &'a BTreeMap<String, Vec<u8>>, digest: &str) -> &'a [u8] {
        &files[&format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))]
    }

    #[test]
    fn the_same_image_packs_to_the_same_bytes_and_another_to_another_digest() {
        let a = pack(&image("program")).expect("invariant of the test");
        let b = pack(&image("program")).expect("invariant of the test");
        assert_eq!(a.digest, b.digest);
        assert!(a.bytes == b.bytes, "the archives differ");
        assert_ne!(
            pack(&image("other program"))
                .expect("invariant of the test")
                .digest,
            a.digest
        );
    }

    #[test]
    fn the_archive_is_an_image_layout_whose_digests_hold() {
        let archive = pack(&image("program")).expect("invariant of the test");
        let files = unpack(&archive.bytes);
        assert_eq!(json(&files, "oci-layout")["imageLayoutVersion"], "1.0.0");
        let index = json(&files, "index.json");
        let entry = &index["manifests"][0];
        assert_eq!(entry["digest"], archive.digest);
        assert_eq!(
            entry["annotations"]["org.opencontainers.image.ref.name"],
            "1.0"
        );
        assert_eq!(
            entry["annotations"]["io.containerd.image.name"],
            "registry.local:5000/liqo/tool:1.0"
        );
        // Every blob is stored under its own digest.
        for (path, content) in &files {
            if let Some(hex) = path.strip_prefix("blobs/sha256/") {
                assert_eq!(layer::sha256(content), format!("sha256:{hex}"));
            }
        }
        let manifest: serde_json::Value =
            serde_json::from_slice(blob(&files, &archive.digest)).expect("invariant of the test");
        let config: serde_json::Value = serde_json::from_slice(blob(
            &files,
            manifest["config"]["digest"]
                .as_str()
                .expect("invariant of the test"),
        ))
        .expect("invariant of the test");
        assert_eq!(config["config"]["User"], "65532:65532");
        assert_eq!(config["config"]["Entrypoint"][0], "/usr/local/bin/tool");
        assert_eq!(
            (config["os"].as_str(), config["architecture"].as_str()),
            (Some("linux"), Some("amd64"))
        );
        // The config names the layer by its uncompressed digest.
        let layer = blob(
            &files,
            manifest["layers"][0]["digest"]
                .as_str()
                .expect("invariant of the test"),
        );
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(layer)
            .read_to_end(&mut tar)
            .expect("invariant of the test");
        assert_eq!(config["rootfs"]["diff_ids"][0], layer::sha256(&tar));
        let inside = unpack(&tar);
        assert_eq!(inside["usr/local/bin/tool"], b"program");
    }

    #[test]
    fn a_reference_without_a_tag_is_refused() {
        let mut untagged = image("program");
        untagged.reference = "registry.local:5000/liqo/tool".into();
        assert!(matches!(pack(&untagged), Err(Error::NoTag(_))));
    }
}
