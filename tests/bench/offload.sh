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
#       and once more direct, in a namespace with a ResourceQuota shaped
#       like a twin's share (requests.cpu, requests.memory, pods), whose
#       admission every remote pod goes through: the quota's own cost;
#   (b) added start latency per offloaded pod, p50 and p99: what the
#       virtual kubelet adds to a pod's start, both ways, as seen by
#       watches this script runs on both clusters (one clock):
#         (first remote object first seen, the pod the virtual kubelet
#          makes or its ReplicaSet − local pod first seen bound to the
#          virtual node)
#       + (local pod first seen Running − remote pod first seen Running).
#       What lies between (the provider's scheduler and kwok starting the
#       pod) is the provider's own work, which the direct Deployment of
#       (a) does too;
#       Beside them, the time the provider's ResourceQuota admission took
#       for the creates it admitted (mean, and how many took over 100
#       ms, from the API server's admission histogram), for the virtual
#       run and for the direct one with a quota: what every create in a
#       twin namespace, which has the share's quota, waits for;
#       And the start latency of every pod of the burst, from its create
#       (first seen) to Running, through the virtual node (on the
#       consumer) against the direct Deployment with a quota (on the
#       provider): p50 and p99 of each, and how much the first's p99
#       exceeds the second's (target: at most 100 ms);
#   (c) the virtual kubelet's peak resident memory (VmHWM in
#       /proc/PID/status) with N offloaded pods Running, and with 10,000
#       when --with-10k is given (long: the clusters are sized for it),
#       then again 90 s after the agent is killed and restarted with the
#       10,000 pods Running.
#
#   With --kcm-qps Q, both clusters' controller-managers get
#   --kube-api-qps Q (burst 2Q) instead of their default 20 (burst 30):
#   the limit that (a) hits first at the default (docs/virtual-kubelet.md).
#
#   With --pin, each cluster's processes (control plane, kwok, agents, and
#   this script's watches of it) run on a core of their own, the consumer's
#   on core 0 and the provider's on core 1, from before each measured
#   phase: two peered clusters, each with its own machines, rather than
#   two clusters taking each other's CPU on one machine. The direct runs
#   then have the provider's core alone, as the provider has in the
#   virtual run.
#
#   With --agent-log FILE, the virtual kubelet logs its reflection at
#   trace level (when each key is scanned, starts and ends converging,
#   and what it made) from before the measured phases, and its log is
#   kept in FILE; beside the burst's slowest 1 %, the script prints each
#   pod's lines of it, timed from when the pod was seen bound. It costs
#   the agent some CPU: for finding where a pod waited, not for figures.
#
#   bash tests/bench/offload.sh [--pods N] [--with-10k] [--kcm-qps Q] [--pin] [--agent-log FILE]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
pods=1000
with_10k=false
pin=false
agent_log=""
kcm_qps=()
while [ $# -gt 0 ]; do
  case "$1" in
    --pods) pods=$2; shift 2 ;;
    --with-10k) with_10k=true; shift ;;
    --kcm-qps) kcm_qps=(--controller-manager-qps "$2"); shift 2 ;;
    --pin) pin=true; shift ;;
    --agent-log) agent_log=$2; shift 2 ;;
    *) echo "usage: $0 [--pods N] [--with-10k] [--kcm-qps Q] [--pin] [--agent-log FILE]" >&2; exit 2 ;;
  esac
done
max=$pods
if $with_10k && [ "$max" -lt 10000 ]; then max=10000; fi

# shellcheck source=tests/bench/lib.sh
source tests/bench/lib.sh
# The testbed's host-process nodes run the agents of this folder: release.
bench_build release
trap bench_cleanup EXIT

# Two worker nodes per cluster, each with room for every pod: the default
# grant (half of the provider's free capacity) then allows `max` pods.
"$testbed" up --dir "$dir/tb" --cluster consumer --cluster provider --nodes 2 \
  --node-pods $((max + 100)) --node-cpu 64 --node-memory 256Gi --timeout 300 "${kcm_qps[@]}" >/dev/null
offload_bench
kc() { "$kubectl" --kubeconfig "$consumer" "$@"; }
kp() { "$kubectl" --kubeconfig "$provider" "$@"; }
twin=bench-consumer
if [ -n "$agent_log" ]; then
  kc -n liqo set env deployment/liqo-vk-provider \
    RUST_LOG=info,liqo_virtual_kubelet::reflection=trace >/dev/null
  kc -n liqo rollout status deployment/liqo-vk-provider --timeout 120s >/dev/null
  kc wait node -l liqo.io/virtual-node=true --for=condition=Ready --timeout 120s >/dev/null
fi


# With --pin: every process of the consumer (all its threads) on core 0,
# every process of the provider on core 1. Run before each measured phase,
# so that the watches started for it are pinned too.
pin_if_asked() {
  if $pin; then pin_clusters consumer=0 provider=1; fi
}
# Its peak resident memory in MiB.
vk_peak_mib() {
  local pid
  pid=$(vk_pid)
  if [ -n "$pid" ]; then
    awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$pid/status"
  else
    echo "n/a"
  fi
}

# The provider's ResourceQuota admission of creates so far, from the
# API server's metrics kept in file $1 (by api_requests): "<count>
# <seconds> <count within 100 ms>" (its
# apiserver_admission_controller_admission_duration_seconds).
quota_admission() {
  awk '
    /^apiserver_admission_controller_admission_duration_seconds_/ && /name="ResourceQuota"/ &&
      /operation="CREATE"/ && /type="validate"/ {
      if ($1 ~ /_count\{/) n += $NF
      if ($1 ~ /_sum\{/) s += $NF
      if ($1 ~ /_bucket\{/ && $1 ~ /le="0.1"/) fast += $NF
    } END { printf "%d %.6f %d\n", n, s, fast }' "$1"
}
# Between two quota_admission files ($1 before, $2 after): "mean X ms,
# N of M over 100 ms".
quota_spent() {
  awk 'NR == 1 { n0 = $1; s0 = $2; f0 = $3; next } { n = $1 - n0; s = $2 - s0; f = $3 - f0 }
    END { if (n == 0) { print "none"; exit }
      printf "mean %.0f ms, %d of %d over 100 ms\n", s / n * 1000, n - f, n }' "$1" "$2"
}

# (a) direct on the provider, in namespace $1, made and removed here; with
# $2 = quota, the namespace has a ResourceQuota shaped like a twin's share
# (liqo-share: requests.cpu, requests.memory, pods, room for every pod).
# Sets direct_time; CPU ticks in $dir/cpu.$1.{0,1}.
direct() {
  local ns=$1 quota=${2:-}
  kp create namespace "$ns" >/dev/null
  if [ -n "$quota" ]; then
    kp -n "$ns" create quota liqo-share \
      --hard="requests.cpu=64,requests.memory=256Gi,pods=$((pods + 100))" >/dev/null
  fi
  stamped "$dir/$ns.w" --kubeconfig "$provider" -n "$ns" get pods -l app=bench -w --no-headers \
    -o 'custom-columns=U:.metadata.uid,N:.spec.nodeName,P:.status.phase'
  sleep 2
  pin_if_asked
  cpu_ticks >"$dir/cpu.$ns.0"
  api_requests "$provider" "$dir/metrics" >"$dir/req.$ns.0"
  quota_admission "$dir/metrics" >"$dir/quota.$ns.0"
  deployment "$ns" direct | kp apply -f - >/dev/null
  direct_time=$(until_running "$dir/$ns.w" "$pods")
  cpu_ticks >"$dir/cpu.$ns.1"
  api_requests "$provider" "$dir/metrics" >"$dir/req.$ns.1"
  quota_admission "$dir/metrics" >"$dir/quota.$ns.1"
  unwatch
  kp -n "$ns" delete deployment bench --wait >/dev/null
  kp delete namespace "$ns" --wait --timeout 600s >/dev/null
}
direct bench-direct-quota quota
quota_time=$direct_time
direct bench-direct

# The watches of (b), on the pods labelled app=$1, written to files
# $dir/$1.{local,rs,remote}.w; stopped by unwatch.
watch_pods() {
  local app=$1
  stamped "$dir/$app.local.w" --kubeconfig "$consumer" -n bench get pods -l "app=$app" -w --no-headers \
    -o 'custom-columns=U:.metadata.uid,N:.spec.nodeName,P:.status.phase,NAME:.metadata.name'
  stamped "$dir/$app.rs.w" --kubeconfig "$provider" -n "$twin" get replicasets -w --no-headers \
    -o 'custom-columns=U:.metadata.labels.liqo\.io/local-pod-uid'
  stamped "$dir/$app.remote.w" --kubeconfig "$provider" -n "$twin" get pods -l "app=$app" -w --no-headers \
    -o 'custom-columns=U:.metadata.labels.liqo\.io/local-pod-uid,P:.status.phase'
  sleep 2
}

# Per local pod UID of app $1: first bound, first remote object (pod or
# ReplicaSet), remote Running, local Running; one line per pod: added
# latency, bound -> first remote object, remote Running -> local Running
# (seconds), when it was bound (seconds since the epoch) and its name,
# into $dir/$1.added.
added() {
  local app=$1
  awk -v L="$dir/$app.local.w" -v R="$dir/$app.rs.w" -v P="$dir/$app.remote.w" '
    FILENAME == L && $3 != "<none>" && !($2 in bound) { bound[$2] = $1; name[$2] = $5 }
    FILENAME == L && $4 == "Running" && !($2 in lrun) { lrun[$2] = $1 }
    FILENAME == R && $2 != "<none>" && !($2 in rs) { rs[$2] = $1 }
    FILENAME == P && $2 != "<none>" && !($2 in rpod) { rpod[$2] = $1 }
    FILENAME == P && $3 == "Running" && !($2 in rrun) { rrun[$2] = $1 }
    END {
      for (u in lrun) {
        # The first remote object: the pod (made before its ReplicaSet),
        # or the ReplicaSet.
        if (u in rpod) made = rpod[u]
        if ((u in rs) && (!(u in rpod) || rs[u] < rpod[u])) made = rs[u]
        if ((u in bound) && ((u in rs) || (u in rpod)) && (u in rrun))
          printf "%.3f %.3f %.3f %.3f %s\n", (made - bound[u]) + (lrun[u] - rrun[u]), made - bound[u], lrun[u] - rrun[u], bound[u], name[u]
      }
    }' "$dir/$app.local.w" "$dir/$app.rs.w" "$dir/$app.remote.w" >"$dir/$app.added"
}
# Per pod of watch file $1 (lines: time uid node phase): seconds from its
# first line (its create) to its first Running, one per line, sorted.
start_latencies() {
  awk '!($2 in seen) { seen[$2] = $1 } $4 == "Running" && !($2 in run) { run[$2] = $1 }
    END { for (u in run) printf "%.3f\n", run[u] - seen[u] }' "$1" | sort -n
}
# Percentile $2 (in ms) of the sorted seconds of file $1.
pct_of() {
  awk -v p="$2" '{ v[NR] = $1 } END { if (NR == 0) { print "n/a"; exit } i = int((NR - 1) * p / 100) + 1; printf "%.0f", v[i] * 1000 }' "$1"
}

# Percentile $2 of column $3 of the added latencies of app $1 (column 1:
# total, 2: bound to first remote object, 3: remote Running to local Running).
pct() {
  awk -v c="$3" '{ print $c }' "$dir/$1.added" | sort -n |
    awk -v p="$2" '{ v[NR] = $1 } END { if (NR == 0) { print "n/a"; exit } i = int((NR - 1) * p / 100) + 1; printf "%.0f ms", v[i] * 1000 }'
}
# The slowest 1 % of the pods of app $1, one per line: when each was bound
# (seconds after the first pod was), its added latency and the two parts:
# whether the tail is a few stalls (the same moments) or spread out.
slowest() {
  local first
  first=$(sort -k4 -n "$dir/$1.added" | awk 'NR == 1 { print $4 }')
  slowest_added "$1" | awk -v t0="$first" \
    '{ printf "  bound at +%6.1f s: %5.0f ms (%4.0f + %4.0f) %s\n", $4 - t0, $1 * 1000, $2 * 1000, $3 * 1000, $5 }' |
    sort -k3 -n
}
# The lines of $dir/$1.added of the slowest 1 % of the pods of app $1,
# slowest first.
slowest_added() {
  sort -k1 -n -r "$dir/$1.added" | head -n "$(( ($(wc -l <"$dir/$1.added") + 99) / 100 ))"
}
# With --agent-log: the agent's log lines of each of the slowest 1 % of
# the pods of app $1, timed in ms from when the pod was seen bound
# (the agent logs UTC times of day; the watches, seconds since the epoch).
agent_lines() {
  local bound name
  slowest_added "$1" | while read -r _ _ _ bound name; do
    echo "  $name (bound at $(date -u -d "@$bound" +%T.%3N)):"
    grep -F -- "$name" "$agent_log" | sed 's/\x1b\[[0-9;]*m//g' |
      awk -v b="$bound" '{ split(substr($1, 12, 15), t, ":"); s = t[1] * 3600 + t[2] * 60 + t[3]
        printf "    %+7.0f ms  %s\n", (s - (b % 86400)) * 1000, substr($0, index($0, $2)) }'
  done
}

# (b) at a steady pace first, the clusters otherwise quiet: 100 pods, one
# replica more about every quarter second.
steady=100
deployment bench virtual steady 0 | kc apply -f - >/dev/null
watch_pods steady
pin_if_asked
for i in $(seq "$steady"); do
  kc -n bench scale deployment steady --replicas "$i" >/dev/null
  sleep 0.25
done
until_running "$dir/steady.local.w" "$steady" >/dev/null
unwatch
added steady
kc -n bench delete deployment steady --wait >/dev/null
kp -n "$twin" wait --for=delete pods -l app=steady --timeout 300s >/dev/null 2>&1 || true

# (a) and (b) through the virtual node: the burst.
watch_pods bench
pin_if_asked
cpu_ticks >"$dir/cpu.virtual.0"
api_requests "$consumer" >"$dir/req.consumer.0"
api_requests "$provider" "$dir/metrics" >"$dir/req.provider.0"
quota_admission "$dir/metrics" >"$dir/quota.virtual.0"
deployment bench virtual | kc apply -f - >/dev/null
virtual_time=$(until_running "$dir/bench.local.w" "$pods")
cpu_ticks >"$dir/cpu.virtual.1"
api_requests "$consumer" >"$dir/req.consumer.1"
api_requests "$provider" "$dir/metrics" >"$dir/req.provider.1"
quota_admission "$dir/metrics" >"$dir/quota.virtual.1"
rss_n=$(vk_peak_mib)
unwatch
added bench
measured=$(wc -l <"$dir/bench.added")
p50=$(pct bench 50 1)
p99=$(pct bench 99 1)
start_latencies "$dir/bench.local.w" >"$dir/start.virtual"
start_latencies "$dir/bench-direct-quota.w" >"$dir/start.direct-quota"

rss_10k="not measured (--with-10k)"
rss_10k_restart=$rss_10k
if $with_10k; then
  stamped "$dir/big.local.w" --kubeconfig "$consumer" -n bench get pods -l app=bench -w --no-headers \
    -o 'custom-columns=U:.metadata.uid,N:.spec.nodeName,P:.status.phase'
  sleep 2
  pin_if_asked
  kc -n bench scale deployment bench --replicas 10000 >/dev/null
  until_running "$dir/big.local.w" 10000 >/dev/null
  unwatch
  rss_10k="$(vk_peak_mib) MiB"
  # Killed and restarted by its host node with the 10,000 pods Running:
  # its peak is then its first lists and the convergence of every key.
  old_vk=$(vk_pid)
  kill -9 "$old_vk"
  new_vk "$old_vk" >/dev/null
  sleep 90
  rss_10k_restart="$(vk_peak_mib) MiB"
fi

ratio=$(awk "BEGIN { printf \"%.2f\", $virtual_time / $direct_time }")
echo
printf '%-52s %s\n' "figure" "value"
printf '%-52s %s\n' "controller-managers' --kube-api-qps" "${kcm_qps[1]:-default (20)}"
printf '%-52s %s\n' "clusters pinned to a core each (--pin)" "$pin"
printf '%-52s %s\n' "(a) $pods pods Running, direct on the provider" "${direct_time}s"
printf '%-52s %s\n' "(a) the same direct, in a namespace with a quota" "${quota_time}s"
printf '%-52s %s\n' "(a) $pods pods Running, through the virtual node" "${virtual_time}s"
printf '%-52s %s\n' "(a) ratio virtual / direct (target <= 1.3)" "$ratio"
printf '%-52s %s\n' "(a) ratio virtual / direct with a quota" "$(awk "BEGIN { printf \"%.2f\", $virtual_time / $quota_time }")"
printf '%-52s %s\n' "(b) added start latency p50 ($measured pods)" "$p50"
printf '%-52s %s\n' "(b) added start latency p99 (target <= 100 ms)" "$p99"
printf '%-52s %s\n' "(b)   of which bound -> remote object seen, p50 / p99" "$(pct bench 50 2) / $(pct bench 99 2)"
printf '%-52s %s\n' "(b)   of which remote Running -> local Running, p50 / p99" "$(pct bench 50 3) / $(pct bench 99 3)"
printf '%-52s %s\n' "(b) start, create -> Running: virtual p50 / p99" "$(pct_of "$dir/start.virtual" 50) / $(pct_of "$dir/start.virtual" 99) ms"
printf '%-52s %s\n' "(b) the same, direct with a quota: p50 / p99" "$(pct_of "$dir/start.direct-quota" 50) / $(pct_of "$dir/start.direct-quota" 99) ms"
printf '%-52s %s\n' "(b) virtual p99 over direct p99 (target <= 100 ms)" "$(( $(pct_of "$dir/start.virtual" 99) - $(pct_of "$dir/start.direct-quota" 99) )) ms"
echo "(b) the burst's slowest 1 % (added = to remote object + to local Running):"
slowest bench
if [ -n "$agent_log" ]; then
  cat "$(ls -t "$dir"/tb/consumer/pods/liqo_liqo-vk-provider-*.log | head -n 1)" >"$agent_log"
  echo "(b) the agent's log of the burst's slowest 1 % (all of it in $agent_log):"
  agent_lines bench
fi
printf '%-52s %s\n' "(b) provider's quota admission of creates, burst" "$(quota_spent "$dir/quota.virtual.0" "$dir/quota.virtual.1")"
printf '%-52s %s\n' "(b) the same, direct with a quota" "$(quota_spent "$dir/quota.bench-direct-quota.0" "$dir/quota.bench-direct-quota.1")"
printf '%-52s %s\n' "(b) at a steady pace ($(wc -l <"$dir/steady.added") pods, ~4/s): p50 / p99" "$(pct steady 50 1) / $(pct steady 99 1)"
printf '%-52s %s\n' "(b)   of which bound -> remote object seen, p50 / p99" "$(pct steady 50 2) / $(pct steady 99 2)"
printf '%-52s %s\n' "(b)   of which remote Running -> local Running, p50 / p99" "$(pct steady 50 3) / $(pct steady 99 3)"
# A restarted watch lists again: a pod that changed phase in between is
# seen late, so a burst figure with restarts overstates the latency. A
# watch this script stopped (kubectl killed: 143) is not counted.
restarts() { cat "$dir/$1".*.w.err 2>/dev/null | grep "watch ended" | grep -vc "(143)" || true; }
printf '%-52s %s\n' "(b) watches the API server ended (burst / steady)" "$(restarts bench) / $(restarts steady)"
printf '%-52s %s\n' "(c) VK peak RSS at $pods pods" "$rss_n MiB"
printf '%-52s %s\n' "(c) VK peak RSS at 10000 pods (target <= 60 MB)" "$rss_10k"
printf '%-52s %s\n' "(c) the same, restarted with 10000 pods Running (90 s)" "$rss_10k_restart"
echo
echo "CPU seconds per process while the pods started (machine: $(nproc) cores)"
printf '%-40s %10s %10s %10s\n' "process" "direct" "quota" "virtual"
join -a 1 -a 2 -e 0 -o 0,1.2,1.3,2.2 \
  <(join -a 1 -a 2 -e 0 -o 0,1.2,2.2 \
    <(cpu_spent "$dir/cpu.bench-direct.0" "$dir/cpu.bench-direct.1" | sort) \
    <(cpu_spent "$dir/cpu.bench-direct-quota.0" "$dir/cpu.bench-direct-quota.1" | sort)) \
  <(cpu_spent "$dir/cpu.virtual.0" "$dir/cpu.virtual.1" | sort) |
  sort -k4 -n -r | awk '{ printf "%-40s %10.1f %10.1f %10.1f\n", $1, $2, $3, $4; d += $2; q += $3; v += $4 }
    END { printf "%-40s %10.1f %10.1f %10.1f\n", "total", d, q, v }'
echo
echo "API requests per pod while the pods started (verb resource; >= 0.05 per pod)"
# "verb:resource per-pod" lines of the requests between files $1.0 and $1.1.
per_pod() { requests_per_pod "$dir/$1.0" "$dir/$1.1" "$pods" | awk '{ print $1 ":" $2, $3 }' | sort; }
table=$(join -a 1 -a 2 -e - -o 0,1.2,2.2 <(per_pod req.bench-direct) <(per_pod req.consumer) |
  join -a 1 -a 2 -e - -o 0,1.2,1.3,2.2 - <(per_pod req.provider) | sed 's/:/ /')
printf '%-40s %10s %18s %18s\n' request direct "virtual: consumer" "virtual: provider"
{ grep '^total ' <<<"$table" || true; grep -v '^total ' <<<"$table" || true; } |
  awk '{ printf "%-40s %10s %18s %18s\n", $1 " " $2, $3, $4, $5 }'
