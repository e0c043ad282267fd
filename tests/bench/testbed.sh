#!/usr/bin/env bash
# Measures the testbed: how long clusters take to start from the binary
# cache, and how much memory each running cluster holds. The reference is
# one cluster alone, measured in the same run: two clusters on this
# machine's two cores should cost little more than one.
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

# Seconds until `liqo-testbed up` returns usable clusters.
start_time() {
  local start end
  start=$(date +%s.%N)
  "$testbed" up --dir "$dir/tb" "$@" >/dev/null
  end=$(date +%s.%N)
  awk "BEGIN { printf \"%.1f\", $end - $start }"
}

echo "toolchain cache check (no build):"
TIMEFORMAT="  %Rs"
time bash tests/toolchain/build.sh >/dev/null

printf '\n%-5s %-22s %-22s\n' run "one cluster (ref)" "two clusters"
for i in $(seq "$runs"); do
  one=$(start_time --cluster solo)
  "$testbed" down --dir "$dir/tb" >/dev/null
  two=$(start_time --cluster cluster-1 --cluster cluster-2)
  if [ "$i" -lt "$runs" ]; then
    "$testbed" down --dir "$dir/tb" >/dev/null
  fi
  printf '%-5s %-22s %-22s\n' "$i" "${one}s" "${two}s"
done

echo
echo "memory of the running clusters, after 20 s idle:"
sleep 20
"$testbed" status --dir "$dir/tb"
