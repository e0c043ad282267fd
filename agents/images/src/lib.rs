//! Builds OCI image archives with no container engine and no registry:
//! the agents' and liqoctl's images (the `liqo-images` command), and the
//! test clusters' images of this machine's programs.
//!
//! - [`contents`]: what each image holds;
//! - [`layer`]: one deterministic layer;
//! - [`oci`]: the image layout and its archive.

pub mod contents;
pub mod layer;
pub mod oci;
