//! The route of a peer's pods into its tunnel's device.

use std::process::{Command, Stdio};

use ipnet::IpNet;

use super::Error;

/// Routes `dest` into `device` (replacing any route to it).
pub fn route(dest: IpNet, device: &str) -> Result<(), Error> {
    let args = ["route", "replace", &dest.to_string(), "dev", device];
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Spawn("ip", e))?;
    if !out.status.success() {
        return Err(Error::Refused {
            what: "ip",
            input: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}
