//! `liqo-gateway`: links the pod networks of peered clusters over a
//! userspace WireGuard tunnel.

use clap::Parser;

#[derive(Parser, Debug)]
#[command(version = liqo_api::VERSION, about = "The liqo-rs network gateway")]
struct Args {}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().init();
    let _args = Args::parse();
    anyhow::bail!("the gateway cannot run yet")
}
