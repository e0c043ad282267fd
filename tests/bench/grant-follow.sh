#!/usr/bin/env bash
# Measures how long a change of the provider's free capacity takes to
# reach the consumer's virtual node (docs/peering.md, "A grant that
# follows the load"): a kwok node of 8 CPUs added to the provider, then
# deleted; timed from the kubectl command to the virtual node's new CPU
# capacity and to its new largest-free-node label (what the placement
# policy reads: docs/offloading.md, "A pod no node can hold"), beside a
# reference in the same run: the provider's own new
# node Ready (kwok's answer to the same command), and its going.
# The consumer peers with the built-in policy (half of each free
# resource); each run waits out the policy's least interval (10 s).
#   bash tests/bench/grant-follow.sh [runs]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
runs=${1:-5}
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

node_yaml() {
  cat <<EOF
apiVersion: v1
kind: Node
metadata:
  name: bench-extra
  annotations: { kwok.x-k8s.io/node: fake }
  labels: { type: kwok, kubernetes.io/hostname: bench-extra }
status:
  capacity: { cpu: "8", memory: 32Gi, pods: "110" }
  allocatable: { cpu: "8", memory: 32Gi, pods: "110" }
EOF
}

now() { date +%s.%N; }
since() { awk "BEGIN { printf \"%.2f\", $(now) - $1 }"; }
vcpu() {
  "$kubectl" --kubeconfig "$consumer" get node liqo-provider \
    -o jsonpath='{.status.capacity.cpu}'
}
vlabel() {
  "$kubectl" --kubeconfig "$consumer" get node liqo-provider \
    -o jsonpath='{.metadata.labels.liqo\.io/largest-free-cpu-millis}'
}
ready() {
  "$kubectl" --kubeconfig "$provider" get node bench-extra \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true
}

# Polls every 0.1 s, for at most 60 s, until the provider's node is
# Ready (or gone, $1 = gone), the virtual node's CPU differs from $2 and
# its label from $3; prints the seconds since $4 of each:
# "<reference> <virtual node> <label>".
watch_all() {
  local want=$1 from=$2 label_from=$3 start=$4 ref="" vnode="" label=""
  for _ in $(seq 600); do
    if [ -z "$ref" ]; then
      case "$want:$(ready)" in
        ready:True | gone:) ref=$(since "$start") ;;
      esac
    fi
    [ -z "$vnode" ] && [ "$(vcpu)" != "$from" ] && vnode=$(since "$start")
    [ -z "$label" ] && [ "$(vlabel)" != "$label_from" ] && label=$(since "$start")
    [ -n "$ref" ] && [ -n "$vnode" ] && [ -n "$label" ] && { echo "$ref $vnode $label"; return 0; }
    sleep 0.1
  done
  echo "no change within 60 s (provider node: ${ref:-no}, virtual node: ${vnode:-no}, label: ${label:-no})" >&2
  return 1
}

printf '%-4s | %-12s %-12s %-24s | %-14s %-14s %-22s\n' run "vnode grows" "label grows" \
  "ref: provider node Ready" "vnode shrinks" "label shrinks" "ref: provider node gone"
for i in $(seq "$runs"); do
  sleep 11
  before=$(vcpu)
  label_before=$(vlabel)
  start=$(now)
  node_yaml | "$kubectl" --kubeconfig "$provider" create -f - >/dev/null
  read -r ref_ready grow label_grow < <(watch_all ready "$before" "$label_before" "$start")
  [ -n "${grow:-}" ] || exit 1
  sleep 11
  before=$(vcpu)
  label_before=$(vlabel)
  start=$(now)
  "$kubectl" --kubeconfig "$provider" delete node bench-extra --wait=false >/dev/null
  read -r ref_gone shrink label_shrink < <(watch_all gone "$before" "$label_before" "$start")
  [ -n "${shrink:-}" ] || exit 1
  printf '%-4s | %-12s %-12s %-24s | %-14s %-14s %-22s\n' "$i" "${grow}s" "${label_grow}s" \
    "${ref_ready}s" "${shrink}s" "${label_shrink}s" "${ref_gone}s"
done
