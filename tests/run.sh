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
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace --locked "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# One closing line for the whole run: cargo prints one per test binary,
# the last of which is often a crate's empty doc-test run.
awk '/^test result:/ { passed += $4; failed += $6; ignored += $8 }
     END { printf "tests: %d passed, %d failed, %d skipped\n", passed, failed, ignored }' "$log"
exit "$status"
