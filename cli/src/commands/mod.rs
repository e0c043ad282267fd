//! One module per verb, each with one async entry point.

pub mod completion;
pub mod version;
