//! `liqo-testbed-cni`: the last plugin of a real node's CNI network (see
//! `liqo_testbed`'s real-node mode). It asks the node, on the Unix socket
//! named in its configuration, to put a relay to the API servers in the
//! pod's namespace (ADD) or to take it away (DEL), and passes the previous
//! plugins' result on, as a chained CNI plugin does.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

use liqo_testbed::cni_protocol::{OK, Request};

/// The CNI versions this plugin speaks.
const VERSIONS: [&str; 3] = ["0.4.0", "1.0.0", "1.1.0"];

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // CNI's error result, on stdout.
            let error = serde_json::json!({
                "cniVersion": "1.0.0",
                "code": 999,
                "msg": "liqo-testbed-cni",
                "details": e,
            });
            println!("{error}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let command = std::env::var("CNI_COMMAND").map_err(|_| "CNI_COMMAND is not set")?;
    if command == "VERSION" {
        println!(
            "{}",
            serde_json::json!({"cniVersion": "1.0.0", "supportedVersions": VERSIONS})
        );
        return Ok(());
    }
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| e.to_string())?;
    let conf: serde_json::Value = serde_json::from_str(&input).map_err(|e| e.to_string())?;
    match command.as_str() {
        "ADD" | "DEL" => {
            let socket = conf["socket"]
                .as_str()
                .ok_or("the configuration names no socket")?;
            let request = Request {
                command: command.clone(),
                container: std::env::var("CNI_CONTAINERID").unwrap_or_default(),
                netns: std::env::var("CNI_NETNS").unwrap_or_default(),
            };
            // A DEL of a pod whose namespace is gone has nothing to do there.
            if command == "ADD" || !request.container.is_empty() {
                ask(socket, &request)?;
            }
            if command == "ADD" {
                let mut result = conf
                    .get("prevResult")
                    .cloned()
                    .ok_or("no previous result to pass on")?;
                result["cniVersion"] = conf["cniVersion"].clone();
                println!("{result}");
            }
            Ok(())
        }
        "CHECK" | "GC" | "STATUS" => Ok(()),
        other => Err(format!("unknown CNI_COMMAND {other}")),
    }
}

fn ask(socket: &str, request: &Request) -> Result<(), String> {
    let mut stream = UnixStream::connect(socket).map_err(|e| format!("{socket}: {e}"))?;
    let line = serde_json::to_string(request).map_err(|e| e.to_string())?;
    stream
        .write_all(format!("{line}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut reply = String::new();
    BufReader::new(stream)
        .read_line(&mut reply)
        .map_err(|e| e.to_string())?;
    match reply.trim() {
        OK => Ok(()),
        "" => Err("the node did not answer".into()),
        why => Err(why.to_owned()),
    }
}
