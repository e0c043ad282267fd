#!/usr/bin/env bash
# The test command: formatting, lints, then every test, the end-to-end ones
# against real clusters started on loopback.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Packages first (a C compiler for jemalloc, among others); then the test
# clusters' binaries build from their Go modules (minutes on a new
# machine, nothing once cached) while cargo builds ours: each build alone
# leaves part of the machine idle (downloads, links). The lints run beside
# the end-to-end tests, which mostly wait on API servers and timers, at the
# lowest priority and in a target folder of their own (cargo locks its
# folder while it builds).
# Where the time goes, printed last: each phase's seconds.
times=()
mark=$SECONDS
phase() { times+=("$1 $((SECONDS - mark)) s"); mark=$SECONDS; }
bash tests/setup.sh --without-toolchain
phase setup
log=$(mktemp)
toolchain_out=$(mktemp)
toolchain_err=$(mktemp)
bash tests/toolchain/build.sh >"$toolchain_out" 2>"$toolchain_err" &
toolchain_build=$!
# Stopped if a step below fails first (it publishes a build whole or not
# at all).
stop_toolchain_build() {
  if [ -n "$toolchain_build" ]; then
    pkill -P "$toolchain_build" 2>/dev/null || true
    kill "$toolchain_build" 2>/dev/null || true
  fi
}
lints_log=$(mktemp)
lints=""
stop_lints() {
  if [ -n "$lints" ]; then
    pkill -P "$lints" 2>/dev/null || true
    kill "$lints" 2>/dev/null || true
  fi
}
trap 'stop_toolchain_build; stop_lints; rm -f "$log" "$toolchain_out" "$toolchain_err" "$lints_log"' EXIT

cargo fmt --all --check
# The end-to-end tests run the binaries as users do.
cargo build --workspace --bins --locked
phase "build"
cargo test --workspace --locked --no-run
phase "test build"
if ! wait "$toolchain_build"; then
  cat "$toolchain_err" >&2
  echo "error: building the test clusters' binaries failed (tests/toolchain/build.sh)" >&2
  exit 1
fi
toolchain_build=""
phase "waiting for the clusters' binaries"
cat "$toolchain_err" >&2
export LIQO_TOOLCHAIN_DIR
LIQO_TOOLCHAIN_DIR=$(tail -n 1 "$toolchain_out")
# The end-to-end tests mostly wait on API servers, kubelets and timers:
# four at a time keep two cores busy (about 18 minutes here, against 33
# one binary after another).
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"
CARGO_TARGET_DIR=target/lints nice -n 19 \
  cargo clippy --workspace --all-targets --locked -- -D warnings >"$lints_log" 2>&1 &
lints=$!
set +e
# Every test binary, also after one fails: a failure of the end-to-end
# tests does not hide the crates' own.
cargo test --workspace --locked --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
phase tests
wait "$lints"
lints_status=$?
lints=""
phase "waiting for the lints"
set -e
if [ "$lints_status" -ne 0 ]; then
  cat "$lints_log" >&2
  echo "error: cargo clippy found problems (above)" >&2
  [ "$status" -ne 0 ] || status=$lints_status
fi
# One closing line for the whole run: cargo prints one per test binary,
# the last of which is often a crate's empty doc-test run.
awk '/^test result:/ { passed += $4; failed += $6; ignored += $8 }
     END { printf "tests: %d passed, %d failed, %d skipped\n", passed, failed, ignored }' "$log"
(IFS=,; echo "time: ${times[*]}; total $SECONDS s" | sed 's/,/, /g')
exit "$status"
