#!/usr/bin/env bash
# Offloading on real nodes (docs/testbed.md, "Real nodes"), side by side
# with the same work done directly on the provider, in the same run:
# - start latency: 50 pods of a Deployment until all are Ready, through
#   the virtual node (home's Deployment, its pods offloaded to foreign's
#   real node) and directly on foreign's real node;
# - TCP throughput (iperf3, 10 s): from a pod of home to an offloaded pod on
#   foreign (through the two gateways' WireGuard tunnel), and between two
#   pods of foreign's node.
#   bash tests/bench/real-nodes.sh [--pods N]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tests/bench/lib.sh
pods=50
while [ $# -gt 0 ]; do
  case "$1" in
    --pods) pods=$2; shift 2 ;;
    *) echo "usage: $0 [--pods N]" >&2; exit 2 ;;
  esac
done
command -v iperf3 >/dev/null || { echo "error: iperf3 is needed (tests/setup.sh)" >&2; exit 1; }
bench_build debug
trap bench_cleanup EXIT
"$testbed" up --dir "$dir/tb" -c home -c foreign --nodes 0 --real-node >/dev/null
home=$(kubeconfig home)
foreign=$(kubeconfig foreign)
for c in "$home" "$foreign"; do
  "$liqoctl" --kubeconfig "$c" install --yes >"$dir/install.log" 2>&1 || { cat "$dir/install.log" >&2; exit 1; }
done
"$liqoctl" --kubeconfig "$home" peer --remote-kubeconfig "$foreign" --pods $((pods + 10)) --yes \
  >"$dir/peer.log" 2>&1 || { cat "$dir/peer.log" >&2; exit 1; }
"$kubectl" --kubeconfig "$home" create namespace bench >/dev/null
"$liqoctl" --kubeconfig "$home" offload namespace bench --pod-offloading-strategy Remote --wait \
  >"$dir/offload.log" 2>&1 || { cat "$dir/offload.log" >&2; exit 1; }
"$kubectl" --kubeconfig "$foreign" create namespace direct >/dev/null

# A Deployment of $3 pods of the toolbox in namespace $2 of cluster $1,
# its pods under Pod Security's restricted level.
deployment() {
  "$kubectl" --kubeconfig "$1" -n "$2" apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: { name: $4 }
spec:
  replicas: $3
  selector: { matchLabels: { app: $4 } }
  template:
    metadata: { labels: { app: $4 } }
    spec:
      securityContext: { runAsNonRoot: true, runAsUser: 65534, seccompProfile: { type: RuntimeDefault } }
      containers:
        - name: main
          image: liqo.test/toolbox:1
          command: [sh, -c, "$5"]
          securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: [ALL] } }
          # iperf3 writes its buffers to a file there.
          volumeMounts: [{ name: tmp, mountPath: /tmp }]
      volumes: [{ name: tmp, emptyDir: {} }]
YAML
}

# Seconds until Deployment $3 of namespace $2 of cluster $1 has all its pods Ready.
time_ready() {
  local start end
  start=$(date +%s.%N)
  "$kubectl" --kubeconfig "$1" -n "$2" rollout status "deployment/$3" --timeout=300s >/dev/null
  end=$(date +%s.%N)
  awk -v s="$start" -v e="$end" 'BEGIN { printf "%.1f", e - s }'
}

deployment "$home" bench "$pods" sleepers "sleep 3600"
virtual=$(time_ready "$home" bench sleepers)
deployment "$foreign" direct "$pods" sleepers "sleep 3600"
direct=$(time_ready "$foreign" direct sleepers)
"$kubectl" --kubeconfig "$home" -n bench delete deployment sleepers --wait >/dev/null
"$kubectl" --kubeconfig "$foreign" -n direct delete deployment sleepers --wait >/dev/null

# Throughput: an iperf3 server offloaded to foreign, a client on home; and
# a server and a client both on foreign's node.
deployment "$home" bench 1 server "exec iperf3 -s -p 5201"
deployment "$foreign" direct 1 server "exec iperf3 -s -p 5201"
"$kubectl" --kubeconfig "$home" -n bench rollout status deployment/server --timeout=120s >/dev/null
"$kubectl" --kubeconfig "$foreign" -n direct rollout status deployment/server --timeout=120s >/dev/null
deployment "$home" default 1 client "sleep 3600"
deployment "$foreign" direct 1 client "sleep 3600"
"$kubectl" --kubeconfig "$home" rollout status deployment/client --timeout=120s >/dev/null
"$kubectl" --kubeconfig "$foreign" -n direct rollout status deployment/client --timeout=120s >/dev/null
server_ip() { "$kubectl" --kubeconfig "$1" -n "$2" get pods -l app=server -o jsonpath='{.items[0].status.podIP}'; }
# Gbit/s received, from iperf3's JSON.
gbits() {
  "$kubectl" --kubeconfig "$1" -n "$2" exec deploy/client -- iperf3 -c "$3" -p 5201 -t 10 -J \
    | awk -F: '/"sum_received"/ { s = 1 } s && /"bits_per_second"/ { gsub(/[ ,]/, "", $2); printf "%.2f", $2 / 1e9; exit }'
}
across=$(gbits "$home" default "$(server_ip "$home" bench)")
inside=$(gbits "$foreign" direct "$(server_ip "$foreign" direct)")

echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo); agents and testbed: debug build"
printf '%-48s %12s %12s\n' "" "virtual" "direct"
printf '%-48s %11ss %11ss\n' "start of $pods pods, until all Ready" "$virtual" "$direct"
printf '%-48s %12s %12s\n' "" "across" "inside"
printf '%-48s %7s Gb/s %7s Gb/s\n' "TCP pod to pod (iperf3, 10 s)" "$across" "$inside"
