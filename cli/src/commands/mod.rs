//! One module per verb, each with one async entry point.

pub mod completion;
pub mod discover;
pub mod exchange;
pub mod generate_dns;
pub mod info;
pub mod install;
pub mod offload;
pub mod peer;
pub mod sharing_policy;
pub mod token;
pub mod uninstall;
pub mod unpeer;
pub mod version;
