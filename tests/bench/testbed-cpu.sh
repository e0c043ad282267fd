#!/usr/bin/env bash
# What starting pods costs one testbed cluster: a Deployment of N pods
# (1,000 by default) on its two kwok nodes; the time until every pod is
# Running, the nodes that went NotReady meanwhile (a node whose heartbeat
# came late under the load), and the CPU seconds of each process. It is
# the reference the offloading benchmarks' direct runs stand on.
#
# With testbed flags after `--`, runs alternate between the default
# testbed and one with those flags, side by side: what a testbed option
# costs (e.g. `-- --without-mutating-admission-policy`).
#   bash tests/bench/testbed-cpu.sh [--pods N] [--runs R] [-- TESTBED-FLAGS...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
pods=1000
runs=2
while [ $# -gt 0 ]; do
  case "$1" in
    --pods) pods=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: $0 [--pods N] [--runs R] [-- TESTBED-FLAGS...]" >&2; exit 2 ;;
  esac
done
flags=("$@")
# shellcheck source=tests/bench/lib.sh
source tests/bench/lib.sh
bench_build release
trap bench_cleanup EXIT

# One run, with the testbed's extra flags $3...: prints the seconds until
# every pod is Running (counted from a watch) and how many NodeNotReady
# events the nodes got meanwhile, and leaves the CPU seconds per program
# in $dir/cpu.<label $1>.<run $2>.
measure() {
  local label=$1 run=$2 kubeconfig took not_ready
  shift 2
  "$testbed" up --dir "$dir/tb" --cluster solo --nodes 2 --node-pods $((pods + 100)) \
    --node-cpu 64 --node-memory 256Gi --timeout 300 "$@" >/dev/null
  kubeconfig=$(kubeconfig solo)
  "$kubectl" --kubeconfig "$kubeconfig" create namespace bench >/dev/null
  stamped "$dir/$label.$run.w" --kubeconfig "$kubeconfig" -n bench get pods -w --no-headers \
    -o 'custom-columns=U:.metadata.uid,N:.spec.nodeName,P:.status.phase'
  sleep 10
  cpu_ticks >"$dir/ticks.0"
  deployment bench direct | "$kubectl" --kubeconfig "$kubeconfig" apply -f - >/dev/null
  took=$(until_running "$dir/$label.$run.w" "$pods")
  cpu_ticks >"$dir/ticks.1"
  unwatch
  not_ready=$("$kubectl" --kubeconfig "$kubeconfig" get events -A --no-headers \
    --field-selector reason=NodeNotReady,involvedObject.kind=Node 2>/dev/null | grep -c . || true)
  cpu_spent "$dir/ticks.0" "$dir/ticks.1" | sed 's|^solo/||' >"$dir/cpu.$label.$run"
  "$testbed" down --dir "$dir/tb" >/dev/null
  echo "${took}s, NodeNotReady: $not_ready"
}

# The mean CPU seconds per program of the runs labelled $1.
mean_cpu() {
  cat "$dir"/cpu."$1".* | awk -v n="$runs" '{ s[$1] += $2 } END { for (p in s) printf "%s %.1f\n", p, s[p] / n }' | sort
}

with="${flags[*]:-}"
printf '%-5s %-32s %s\n' run "default testbed" "${with:+with $with}"
for i in $(seq "$runs"); do
  plain=$(measure default "$i")
  other=""
  if [ ${#flags[@]} -gt 0 ]; then other=$(measure flags "$i" "${flags[@]}"); fi
  printf '%-5s %-32s %s\n' "$i" "$plain" "$other"
done

echo
echo "CPU seconds per process while $pods pods started, mean of $runs runs (machine: $(nproc) cores)"
if [ ${#flags[@]} -eq 0 ]; then
  mean_cpu default | sort -k2 -n -r | awk '{ printf "%-28s %10.1f\n", $1, $2; t += $2 } END { printf "%-28s %10.1f\n", "total", t }'
else
  printf '%-28s %10s %10s\n' process default "with flags"
  join -a 1 -a 2 -e 0 -o 0,1.2,2.2 <(mean_cpu default) <(mean_cpu flags) |
    sort -k2 -n -r | awk '{ printf "%-28s %10.1f %10.1f\n", $1, $2, $3; a += $2; b += $3 }
      END { printf "%-28s %10.1f %10.1f\n", "total", a, b }'
fi
