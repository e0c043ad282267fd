#!/usr/bin/env bash
# Measures the testbed: how long two clusters take to start from the
# binary cache, and how much memory each running cluster holds.
#   bash tests/bench/testbed.sh [runs]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
runs=${1:-3}
toolchain=$(bash tests/setup.sh | tail -n 1)
export LIQO_TOOLCHAIN_DIR="$toolchain"
cargo build --quiet --locked -p liqo-testbed -p liqo-gateway
testbed=target/debug/liqo-testbed
dir=$(mktemp -d)
trap '"$testbed" down --dir "$dir/tb" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT

echo "toolchain cache check (no build):"
TIMEFORMAT="  %Rs"
time bash tests/toolchain/build.sh >/dev/null
for i in $(seq "$runs"); do
  start=$(date +%s.%N)
  "$testbed" up --dir "$dir/tb" >/dev/null
  end=$(date +%s.%N)
  printf 'run %d: two clusters usable after %.1fs (wall, including the supervisor start)\n' "$i" "$(awk "BEGIN { print $end - $start }")"
  if [ "$i" -eq "$runs" ]; then
    sleep 20 # let the controllers settle before reading memory
    "$testbed" status --dir "$dir/tb"
  fi
  "$testbed" down --dir "$dir/tb" >/dev/null
done
