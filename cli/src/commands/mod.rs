//! One module per verb, each with one async entry point.

pub mod completion;
pub mod discover;
pub mod exchange;
pub mod generate_dns;
pub mod info;
pub mod install;
pub mod network;
pub mod offload;
pub mod peer;
pub mod peering_token;
pub mod sharing_policy;
pub mod test_network;
pub mod tether;
pub mod uninstall;
pub mod unpeer;
pub mod version;

/// The text of a file named on the command line; `-` is standard input.
pub(crate) fn read_input(path: &std::path::Path) -> std::io::Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)?;
        return Ok(text);
    }
    std::fs::read_to_string(path)
}
