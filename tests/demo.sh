#!/usr/bin/env bash
# The demo: two real Kubernetes clusters on this machine, "home" and
# "foreign", left running so you can look at them with kubectl.
# Run it again to start afresh; stop with
#   target/debug/liqo-testbed down --dir .liqo-demo
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

toolchain=$(bash tests/setup.sh | tail -n 1)
export LIQO_TOOLCHAIN_DIR="$toolchain"
cargo build --workspace --bins --locked

testbed=target/debug/liqo-testbed
"$testbed" down --dir .liqo-demo >/dev/null
"$testbed" up --dir .liqo-demo --cluster home --cluster foreign
