#!/usr/bin/env bash
# Measures pod offloading through the virtual kubelet (release build)
# between two testbed clusters, beside the same work done directly on the
# provider in the same run:
#
#   (a) time to all Running: a Deployment of N pods (1,000 by default)
#       created on the consumer in an offloaded namespace, its pods bound
#       to the virtual node, against the same Deployment created directly
#       on the provider; wall time from the create until every pod of the
#       Deployment is Running (on the consumer for the first: the status
#       the virtual kubelet brings back), and the ratio of the two;
#   (b) added start latency per offloaded pod, p50 and p99: what the
#       virtual kubelet adds to a pod's start, both ways, as seen by
#       watches this script runs on both clusters (one clock):
#         (remote ReplicaSet first seen − local pod first seen bound to
#          the virtual node)
#       + (local pod first seen Running − remote pod first seen Running).
#       What lies between (the provider's ReplicaSet controller, scheduler
#       and kwok starting the pod) is the provider's own work, which the
#       direct Deployment of (a) does too;
#   (c) the virtual kubelet's peak resident memory (VmHWM in
#       /proc/PID/status) with N offloaded pods Running, and with 10,000
#       when --with-10k is given (long: the clusters are sized for it).
#
#   bash tests/bench/offload.sh [--pods N] [--with-10k]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
pods=1000
with_10k=false
while [ $# -gt 0 ]; do
  case "$1" in
    --pods) pods=$2; shift 2 ;;
    --with-10k) with_10k=true; shift ;;
    *) echo "usage: $0 [--pods N] [--with-10k]" >&2; exit 2 ;;
  esac
done
max=$pods
if $with_10k && [ "$max" -lt 10000 ]; then max=10000; fi

toolchain=$(bash tests/setup.sh | tail -n 1)
export LIQO_TOOLCHAIN_DIR="$toolchain"
cargo build --quiet --release --locked --workspace --bins
# The testbed's host-process nodes run the agents of this folder: release.
testbed=target/release/liqo-testbed
liqoctl=target/release/liqoctl
kubectl="$toolchain/kubectl"
dir=$(mktemp -d)
watchers=()
cleanup() {
  for pid in "${watchers[@]}"; do kill "$pid" 2>/dev/null || true; done
  "$testbed" down --dir "$dir/tb" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

# Two worker nodes per cluster, each with room for every pod: the default
# grant (half of the provider's free capacity) then allows `max` pods.
"$testbed" up --dir "$dir/tb" --cluster consumer --cluster provider --nodes 2 \
  --node-pods $((max + 100)) --node-cpu 64 --node-memory 256Gi --timeout 300 >/dev/null
kubeconfig() { "$testbed" get --dir "$dir/tb" "$1" kubeconfig; }
consumer=$(kubeconfig consumer)
provider=$(kubeconfig provider)
for cluster in consumer provider; do
  "$liqoctl" --kubeconfig "$(kubeconfig "$cluster")" install --cluster-id "$cluster" \
    --cluster-name "$cluster" --pod-cidr "$("$testbed" get --dir "$dir/tb" "$cluster" pod-cidr)" \
    --node-selector testbed.liqo.io/host-process=true \
    --toleration testbed.liqo.io/host-process=true:NoSchedule --timeout 120 --yes \
    >"$dir/install.log" 2>&1 || { cat "$dir/install.log" >&2; exit 1; }
done
"$liqoctl" --kubeconfig "$consumer" peer --remote-kubeconfig "$provider" --timeout 120 --yes \
  >"$dir/peer.log" 2>&1 || { cat "$dir/peer.log" >&2; exit 1; }
kc() { "$kubectl" --kubeconfig "$consumer" "$@"; }
kp() { "$kubectl" --kubeconfig "$provider" "$@"; }
kc create namespace bench >/dev/null
"$liqoctl" --kubeconfig "$consumer" offload namespace bench --wait --timeout 120 \
  >"$dir/offload.log" 2>&1 || { cat "$dir/offload.log" >&2; exit 1; }
twin=bench-consumer
kp create namespace bench-direct >/dev/null

# The Deployment; on the virtual node when $2 is "virtual".
deployment() {
  local ns=$1 where=$2 placement=""
  if [ "$where" = virtual ]; then
    placement='
      nodeSelector: { liqo.io/virtual-node: "true" }
      tolerations: [{ key: virtual-node.liqo.io/not-allowed, operator: Exists, effect: NoExecute }]'
  fi
  cat <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: { name: bench, namespace: $ns }
spec:
  replicas: $pods
  selector: { matchLabels: { app: bench } }
  template:
    metadata: { labels: { app: bench } }
    spec:$placement
      terminationGracePeriodSeconds: 0
      containers:
        - name: app
          image: nginx
          resources: { requests: { cpu: 1m, memory: 1Mi } }
EOF
}

# How many pods of the Deployment are Running.
running() {
  "$kubectl" --kubeconfig "$1" -n "$2" get pods -l app=bench --no-headers \
    -o custom-columns=P:.status.phase 2>/dev/null | grep -c '^Running$' || true
}

# Seconds from now until `want` pods of namespace $2 on cluster $1 are
# Running (fails after 30 minutes).
until_running() {
  local kubeconfig=$1 ns=$2 want=$3 start now
  start=$(date +%s.%N)
  for _ in $(seq 3600); do
    if [ "$(running "$kubeconfig" "$ns")" -ge "$want" ]; then
      now=$(date +%s.%N)
      awk "BEGIN { printf \"%.1f\", $now - $start }"
      return 0
    fi
    sleep 0.5
  done
  echo "timed out waiting for $want Running pods in $ns" >&2
  return 1
}

# Starts `kubectl "$@"` (a `get -w`) in the background, each line it
# prints written to file $1 with the time it was seen; the watch is
# stopped with the others.
stamped() {
  local out=$1
  shift
  "$kubectl" "$@" 2>/dev/null \
    > >(perl -MTime::HiRes=time -ne '$|=1; printf "%.3f %s", time, $_' >"$out") &
  watchers+=($!)
}

# The virtual kubelet's peak resident memory in MiB: the process whose
# KUBECONFIG lies in the consumer's testbed folder.
vk_peak_mib() {
  local pid env
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = liqo-virtual-ku ] || continue
    env=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null || true)
    if grep -q "^KUBECONFIG=$dir/tb/consumer/" <<<"$env"; then
      awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$pid/status"
      return 0
    fi
  done
  echo "n/a"
}

# (a) direct on the provider, then removed.
deployment bench-direct direct | kp apply -f - >/dev/null
direct_time=$(until_running "$provider" bench-direct "$pods")
kp -n bench-direct delete deployment bench --wait >/dev/null
kp delete namespace bench-direct --wait --timeout 600s >/dev/null

# (a) and (b) through the virtual node, with the watches of (b).
stamped "$dir/local.w" --kubeconfig "$consumer" -n bench get pods -l app=bench -w --no-headers \
  -o 'custom-columns=U:.metadata.uid,N:.spec.nodeName,P:.status.phase'
stamped "$dir/rs.w" --kubeconfig "$provider" -n "$twin" get replicasets -w --no-headers \
  -o 'custom-columns=U:.metadata.labels.liqo\.io/local-pod-uid'
stamped "$dir/remote.w" --kubeconfig "$provider" -n "$twin" get pods -w --no-headers \
  -o 'custom-columns=U:.metadata.labels.liqo\.io/local-pod-uid,P:.status.phase'
sleep 2
deployment bench virtual | kc apply -f - >/dev/null
virtual_time=$(until_running "$consumer" bench "$pods")
rss_n=$(vk_peak_mib)
sleep 2
for pid in "${watchers[@]}"; do kill "$pid" 2>/dev/null || true; done
watchers=()

# Per local pod UID: first bound, RS, remote Running, local Running.
awk -v L="$dir/local.w" -v R="$dir/rs.w" -v P="$dir/remote.w" '
  FILENAME == L && $3 != "<none>" && !($2 in bound) { bound[$2] = $1 }
  FILENAME == L && $4 == "Running" && !($2 in lrun) { lrun[$2] = $1 }
  FILENAME == R && $2 != "<none>" && !($2 in rs) { rs[$2] = $1 }
  FILENAME == P && $3 == "Running" && !($2 in rrun) { rrun[$2] = $1 }
  END {
    for (u in lrun)
      if ((u in bound) && (u in rs) && (u in rrun))
        printf "%.3f %.3f %.3f\n", (rs[u] - bound[u]) + (lrun[u] - rrun[u]), rs[u] - bound[u], lrun[u] - rrun[u]
  }' "$dir/local.w" "$dir/rs.w" "$dir/remote.w" >"$dir/added"
measured=$(wc -l <"$dir/added")
# Percentile $1 of column $2 of the added latencies (1: total, 2: bound
# to wrapper, 3: remote Running to local Running).
pct() {
  awk -v c="$2" '{ print $c }' "$dir/added" | sort -n |
    awk -v p="$1" '{ v[NR] = $1 } END { if (NR == 0) { print "n/a"; exit } i = int((NR - 1) * p / 100) + 1; printf "%.0f ms", v[i] * 1000 }'
}
p50=$(pct 50 1)
p99=$(pct 99 1)

rss_10k="not measured (--with-10k)"
if $with_10k; then
  kc -n bench scale deployment bench --replicas 10000 >/dev/null
  until_running "$consumer" bench 10000 >/dev/null
  rss_10k="$(vk_peak_mib) MiB"
fi

ratio=$(awk "BEGIN { printf \"%.2f\", $virtual_time / $direct_time }")
echo
printf '%-52s %s\n' "figure" "value"
printf '%-52s %s\n' "(a) $pods pods Running, direct on the provider" "${direct_time}s"
printf '%-52s %s\n' "(a) $pods pods Running, through the virtual node" "${virtual_time}s"
printf '%-52s %s\n' "(a) ratio virtual / direct (target <= 1.3)" "$ratio"
printf '%-52s %s\n' "(b) added start latency p50 ($measured pods)" "$p50"
printf '%-52s %s\n' "(b) added start latency p99 (target <= 100 ms)" "$p99"
printf '%-52s %s\n' "(b)   of which bound -> wrapper seen, p50 / p99" "$(pct 50 2) / $(pct 99 2)"
printf '%-52s %s\n' "(b)   of which remote Running -> local Running, p50 / p99" "$(pct 50 3) / $(pct 99 3)"
printf '%-52s %s\n' "(c) VK peak RSS at $pods pods" "$rss_n MiB"
printf '%-52s %s\n' "(c) VK peak RSS at 10000 pods (target <= 60 MB)" "$rss_10k"
