#!/usr/bin/env bash
# Counts the consumer's pods one minute after `kubectl create deployment
# web --image=nginx --replicas=20` in a namespace offloaded Remote (an
# image that runs as root), under the provider's default terms
# (baseline) and under restricted (docs/offloading.md, "A pod the
# provider's terms refuse"): what a refused workload costs the consumer.
# The reference, in the same run: the same Deployment in a namespace
# that is not offloaded.
#   bash tests/bench/refusals.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/bench/lib.sh
source tests/bench/lib.sh
bench_build debug
trap bench_cleanup EXIT
"$testbed" up --dir "$dir/tb" --cluster consumer --cluster provider --nodes 1 >/dev/null
consumer=$(kubeconfig consumer)
provider=$(kubeconfig provider)
install_on consumer provider
"$liqoctl" --kubeconfig "$consumer" peer --remote-kubeconfig "$provider" --timeout 120 --yes \
  >"$dir/peer.log" 2>&1 || { cat "$dir/peer.log" >&2; exit 1; }

k() { "$kubectl" --kubeconfig "$consumer" "$@"; }
# The terms the consumer's virtual kubelet last read are $1.
read_level() {
  for _ in $(seq 600); do
    got=$(k get foreignclusters.liqo.io provider -o jsonpath='{.status.admission.podSecurity}' 2>/dev/null || true)
    [ "$got" = "$1" ] && return 0
    sleep 0.1
  done
  echo "the consumer never read level $1" >&2
  return 1
}
# Pods in namespace $1, all phases, and how many Failed, one minute after
# the Deployment is made there; offloaded Remote when $2 is "offloaded".
one_minute() {
  local ns=$1
  k create namespace "$ns" >/dev/null
  if [ "$2" = offloaded ]; then
    "$liqoctl" --kubeconfig "$consumer" offload namespace "$ns" --pod-offloading-strategy Remote \
      --wait --timeout 120 >"$dir/offload.log" 2>&1 || { cat "$dir/offload.log" >&2; return 1; }
  fi
  k -n "$ns" create deployment web --image=nginx --replicas=20 >/dev/null 2>"$dir/create.log"
  sleep 60
  local all failed running
  all=$(k -n "$ns" get pods --no-headers 2>/dev/null | wc -l)
  failed=$(k -n "$ns" get pods --no-headers --field-selector status.phase=Failed 2>/dev/null | wc -l)
  running=$(k -n "$ns" get pods --no-headers --field-selector status.phase=Running 2>/dev/null | wc -l)
  printf '%-34s %6s %8s %8s\n' "$3" "$all" "$running" "$failed"
}

printf '%-34s %6s %8s %8s\n' "one minute after 20 replicas" pods running failed
read_level baseline
one_minute reference plain "not offloaded (reference)"
one_minute shop offloaded "offloaded, default terms (baseline)"
"$liqoctl" --kubeconfig "$provider" sharing-policy set --pod-security restricted >/dev/null 2>&1
read_level restricted
one_minute shop2 offloaded "offloaded, restricted"
k -n shop2 get replicasets -o jsonpath='{range .items[*]}{.status.conditions[0].reason}: {.status.conditions[0].message}{"\n"}{end}' | cut -c1-160
