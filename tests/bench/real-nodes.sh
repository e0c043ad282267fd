#!/usr/bin/env bash
# Offloading on real nodes (docs/testbed.md, "Real nodes") with the images
# users get: the release, static images `liqo-images` writes (built first,
# cached in target/images), imported into each node's containerd. Side by
# side with the same work done directly on the provider, in the same run:
# - peer and unpeer with network (`liqoctl peer -v` prints each phase's
#   time), three runs;
# - start latency: N pods of a Deployment until all are Ready, through
#   the virtual node (home's Deployment, its pods offloaded to foreign's
#   real node) and directly on foreign's real node;
# - TCP throughput (iperf3, 10 s, one stream and four): from a pod of home
#   to an offloaded pod on foreign (through the two gateways' WireGuard
#   tunnel), and between two pods of foreign's node; with the CPU time of
#   the whole machine per Gbit carried, the segments TCP retransmitted
#   and the machine's time its hypervisor took (steal); four streams
#   across again after 20 s idle; the first four runs again with each
#   cluster on a core of its own (its control plane, node and pods); and
#   what was dropped during each (full UDP socket buffers, links' drops,
#   TCP receivers' drops, packets conntrack found invalid, in every
#   network namespace).
#   bash tests/bench/real-nodes.sh [--pods N]     # default 50
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
shipped_images
bench_build debug
trap bench_cleanup EXIT
"$testbed" up --dir "$dir/tb" -c home -c foreign --nodes 0 --real-node --agent-images "$images" >/dev/null
home=$(kubeconfig home)
foreign=$(kubeconfig foreign)
for c in "$home" "$foreign"; do
  "$liqoctl" --kubeconfig "$c" install --yes >"$dir/install.log" 2>&1 || { cat "$dir/install.log" >&2; exit 1; }
done

# Peer and unpeer three times, each phase timed by `-v`; the last peering
# stays for what follows.
peer() {
  "$liqoctl" --kubeconfig "$home" -v peer --remote-kubeconfig "$foreign" --pods $((pods + 10)) --yes
}
unpeer() { "$liqoctl" --kubeconfig "$home" -v unpeer --remote-kubeconfig "$foreign" --yes; }
# The timed lines of a -v run: "✔ Phase…: detail (0.12 s)" as "Phase 0.12",
# and "done in 1.84 s" as "total 1.84".
phases() {
  sed -n -E 's/^✔ ([A-Z][a-z]+)[^(]*\(([0-9.]+) s\)$/\1 \2/p; s/^done in ([0-9.]+) s$/total \1/p' "$1"
}
for run in 1 2 3; do
  peer >"$dir/peer.log" 2>&1 || { cat "$dir/peer.log" >&2; exit 1; }
  phases "$dir/peer.log" | awk -v r="$run" '{ printf "%s%s %s", (NR > 1 ? ", " : "peer run " r ": "), $1, $2 } END { print "" }' \
    >>"$dir/peer-times"
  [ "$run" = 3 ] && break
  unpeer >"$dir/unpeer.log" 2>&1 || { cat "$dir/unpeer.log" >&2; exit 1; }
  phases "$dir/unpeer.log" | awk -v r="$run" '$1 == "total" { print "unpeer run " r ": " $2 " s" }' \
    >>"$dir/peer-times"
done
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
# Gbit/s received with $4 streams, from iperf3's JSON, the CPU seconds
# the whole machine spent per Gbit meanwhile (/proc/stat), the segments
# TCP retransmitted, and the share of the machine's time its hypervisor
# took (steal: a VM's cores slowed from outside would show there).
busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
stolen() { awk '/^cpu / { print $9 }' /proc/stat; }
# Drops summed over every network namespace of the machine that has a
# process (the nodes', the pods', the gateways'): UDP datagrams refused
# for a full socket buffer, received and sent, and packets the links
# dropped, received and sent (a TUN device's full queue counts there),
# and segments TCP receivers dropped (backlog or receive queue full,
# out-of-order queue pruned, zero window), and packets conntrack found
# invalid (kube-proxy's rules drop those). Beside them, what says that
# TCP retransmitted without a loss: the times a sender found segments
# reordered, and the duplicate segments receivers reported back (DSACK:
# each a retransmission that was not needed).
drops() {
  local pid
  for pid in $(for p in /proc/[0-9]*; do echo "$(readlink "$p/ns/net" 2>/dev/null) ${p#/proc/}"; done |
    awk 'NF == 2 && !seen[$1]++ { print $2 }'); do
    nsenter -t "$pid" -n sh -c 'cat /proc/net/snmp /proc/net/netstat /proc/net/dev
      sed "s/^/conntrack /" /proc/net/stat/nf_conntrack' 2>/dev/null || true
  done | awk '
    function hex(h, i, n) { for (i = 1; i <= length(h); i++) n = n * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1; return n }
    # Per CPU, in hex: the fifth figure is what conntrack found invalid.
    /^conntrack [0-9a-f]+ / { invalid += hex($6); next }
    /^conntrack / { next }
    /^Udp: [0-9]/ { rcvbuf += $6; sndbuf += $7; next }
    /^TcpExt: [A-Z]/ { for (i = 2; i <= NF; i++) name[i] = $i; next }
    /^TcpExt: [0-9]/ {
      for (i = 2; i <= NF; i++) {
        if (name[i] ~ /^(TCPBacklogDrop|TCPRcvQDrop|TCPOFODrop|TCPZeroWindowDrop|OfoPruned|RcvPruned)$/) tcp += $i
        if (name[i] ~ /^(TCPSACKReorder|TCPTSReorder|TCPRenoReorder)$/) reorder += $i
        if (name[i] == "TCPDSACKRecv") dsack += $i
      }
      next
    }
    /^[A-Za-z]+: / || /\|/ { next }
    /:/ { split($0, side, ":"); n = split(side[2], f, " "); if (n >= 16) { rx += f[4]; tx += f[12] } }
    END { print rcvbuf + 0, sndbuf + 0, rx + 0, tx + 0, tcp + 0, invalid + 0, reorder + 0, dsack + 0 }'
}
gbits() {
  local before steal_before drops_before after steal_after drops_after json
  # The drops read outside the CPU's bracket: reading them costs CPU too.
  drops_before=$(drops)
  before=$(busy)
  steal_before=$(stolen)
  json=$("$kubectl" --kubeconfig "$1" -n "$2" exec deploy/client -- iperf3 -c "$3" -p 5201 -t 10 -P "$4" -J)
  after=$(busy)
  steal_after=$(stolen)
  drops_after=$(drops)
  # What was dropped meanwhile, on a line of its own in $dir/drops.
  paste -d ' ' <(echo "$drops_before") <(echo "$drops_after") |
    awk -v what="$5" '{ printf "%-34s UDP buffer full: %d received, %d sent; links dropped: %d received, %d sent; TCP receivers dropped: %d; conntrack invalid: %d; TCP reorderings seen: %d, needless retransmissions reported (DSACK): %d\n", what, $9 - $1, $10 - $2, $11 - $3, $12 - $4, $13 - $5, $14 - $6, $15 - $7, $16 - $8 }' \
    >>"$dir/drops"
  awk -F: -v ticks="$((after - before))" -v stolen="$((steal_after - steal_before))" \
    -v hz="$(getconf CLK_TCK)" -v cpus="$(nproc)" '
    /"sum_sent"/ { sent = 1 }
    sent && !r && /"retransmits"/ { gsub(/[ ,]/, "", $2); r = $2 + 0 }
    /"sum_received"/ { s = 1 }
    s && /"bits_per_second"/ { gsub(/[ ,]/, "", $2); g = $2 / 1e9; exit }
    END { printf "%.2f Gb/s %.2f CPU-s/Gbit %d retr %.1f%% steal", g, (ticks / hz) / (g * 10), r, 100 * stolen / (hz * cpus * 10) }' <<<"$json"
}
server_home=$(server_ip "$home" bench)
server_foreign=$(server_ip "$foreign" direct)
across1=$(gbits "$home" default "$server_home" 1 "across, 1 stream")
inside1=$(gbits "$foreign" direct "$server_foreign" 1 "inside, 1 stream")
across4=$(gbits "$home" default "$server_home" 4 "across, 4 streams")
inside4=$(gbits "$foreign" direct "$server_foreign" 4 "inside, 4 streams")
# Four streams across once more, after the machine was idle a while:
# whether what ran just before weighs on them.
sleep 20
again4=$(gbits "$home" default "$server_home" 4 "across, 4 streams, after idle")
# The same with each cluster on a core of its own, as peered clusters
# have machines of their own: the transfer inside foreign then has one
# core for both its ends, the one across has home's core for the sender
# and its gateway, foreign's for the receiver and its gateway.
pin_clusters home=0 foreign=1
pinned_across1=$(gbits "$home" default "$server_home" 1 "pinned: across, 1 stream")
pinned_inside1=$(gbits "$foreign" direct "$server_foreign" 1 "pinned: inside, 1 stream")
pinned_across4=$(gbits "$home" default "$server_home" 4 "pinned: across, 4 streams")
pinned_inside4=$(gbits "$foreign" direct "$server_foreign" 4 "pinned: inside, 4 streams")

echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo); agents: the release images of target/images"
cat "$dir/peer-times"
printf '%-40s %12s %12s\n' "" "virtual" "direct"
printf '%-40s %11ss %11ss\n' "start of $pods pods, until all Ready" "$virtual" "$direct"
printf '%-40s %46s %46s\n' "" "across the tunnel" "inside foreign"
printf '%-40s %46s %46s\n' "TCP pod to pod, iperf3 10 s, 1 stream" "$across1" "$inside1"
printf '%-40s %46s %46s\n' "TCP pod to pod, iperf3 10 s, 4 streams" "$across4" "$inside4"
printf '%-40s %46s\n' "the same, again after 20 s idle" "$again4"
echo "each cluster on a core of its own (home: 0, foreign: 1):"
printf '%-40s %46s %46s\n' "TCP pod to pod, iperf3 10 s, 1 stream" "$pinned_across1" "$pinned_inside1"
printf '%-40s %46s %46s\n' "TCP pod to pod, iperf3 10 s, 4 streams" "$pinned_across4" "$pinned_inside4"
echo "dropped during each run:"
cat "$dir/drops"
