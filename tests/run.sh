#!/usr/bin/env bash
# The test command: formatting, lints, then every test, the end-to-end ones
# against real clusters started on loopback.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

toolchain=$(bash tests/setup.sh | tail -n 1)
export LIQO_TOOLCHAIN_DIR="$toolchain"

cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The end-to-end tests run the binaries as users do.
cargo build --workspace --bins --locked
cargo test --workspace --locked "$@"
