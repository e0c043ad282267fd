#!/usr/bin/env bash
# The virtual kubelet's memory at scale, and where it goes (release build,
# two testbed clusters): a Deployment of N pods (10,000 by default) on the
# virtual node, then
#
#   - peak resident size (VmHWM) when every pod is Running, and resident
#     size (VmRSS) then;
#   - both clusters' API servers restarted with the pods Running: every
#     watch of the agent fails and lists its store again (a relist, as
#     after a watch expires): peak since then and resident 90 s later;
#   - the agent killed (SIGKILL) and restarted by its node with the pods
#     Running: peak and resident 90 s later (its first lists, every key
#     converged once);
#   - at each of these points, jemalloc's own figures, which the agent
#     logs on SIGUSR1: what the program holds (allocated), the pages
#     holding it (active), what of jemalloc's is resident, and what it
#     keeps mapped or retained; the rest of the resident size is the
#     agent's code and stacks (the split anon + file says which);
#   - beside them, the same figures with no pod at all, taken before the
#     Deployment is made: what the agent costs before any pod.
#
# With --malloc-conf CONF, the agent runs with jemalloc options CONF
# (`_RJEM_MALLOC_CONF`, e.g. `narenas:8,dirty_decay_ms:10000`, jemalloc's
# defaults on 2 cores), over those built into it (`MALLOC_CONF` in
# agents/virtual-kubelet/src/main.rs), so that two runs compare
# allocator settings.
#
# With --heap-profile, the agent is built with jemalloc's heap profiler
# (the `heap-profile` feature) and runs with it on: a profile is dumped
# at each new high of the memory jemalloc maps (`prof_gdump`) and at each
# SIGUSR1. The script keeps them in target/bench/vk-heap/ and prints, with
# jemalloc's `jeprof`, what the agent's code held at the last high (the
# scale-up's peak) beyond what it held once every pod was Running. The
# profiler's own records cost memory: take sizes from a run without it.
#
#   bash tests/bench/vk-memory.sh [--pods N] [--kcm-qps Q] [--malloc-conf CONF] [--heap-profile]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
pods=10000
kcm_qps=200
malloc_conf=""
heap_profile=false
while [ $# -gt 0 ]; do
  case "$1" in
    --pods) pods=$2; shift 2 ;;
    --kcm-qps) kcm_qps=$2; shift 2 ;;
    --malloc-conf) malloc_conf=$2; shift 2 ;;
    --heap-profile) heap_profile=true; shift ;;
    *) echo "usage: $0 [--pods N] [--kcm-qps Q] [--malloc-conf CONF] [--heap-profile]" >&2; exit 2 ;;
  esac
done

# shellcheck source=tests/bench/lib.sh
source tests/bench/lib.sh
if $heap_profile; then
  bench_build release --features liqo-virtual-kubelet/heap-profile
  mkdir -p "$dir/heap"
  # A sample every 128 KiB allocated (jemalloc's default is 512 KiB).
  malloc_conf="prof:true,prof_gdump:true,lg_prof_sample:17,prof_prefix:$dir/heap/vk${malloc_conf:+,$malloc_conf}"
else
  bench_build release
fi
trap bench_cleanup EXIT

"$testbed" up --dir "$dir/tb" --cluster consumer --cluster provider --nodes 2 \
  --node-pods $((pods + 100)) --node-cpu 64 --node-memory 256Gi --timeout 300 \
  --controller-manager-qps "$kcm_qps" >/dev/null
offload_bench
kc() { "$kubectl" --kubeconfig "$consumer" "$@"; }

vk_deployment=deployment/liqo-vk-provider
if [ -n "$malloc_conf" ]; then
  kc -n liqo set env "$vk_deployment" "_RJEM_MALLOC_CONF=$malloc_conf" >/dev/null
  kc -n liqo rollout status "$vk_deployment" --timeout 120s >/dev/null
fi

# Field $2 (VmHWM, VmRSS) of process $1, in MiB.
mib() { awk -v f="$2:" '$1 == f { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
# Peak and resident size of process $1, and the resident size split
# into its anonymous pages (the heap) and file-backed ones (its code).
sizes() {
  echo "$(mib "$1" VmHWM) / $(mib "$1" VmRSS) MiB ($(mib "$1" RssAnon) + $(mib "$1" RssFile))"
}
# jemalloc's figures, as agent $1 logs them on SIGUSR1.
jemalloc() {
  local start
  start=$(stat -c %s "$vk_log")
  kill -USR1 "$1"
  sleep 1
  tail -c +"$((start + 1))" "$vk_log" | grep ' memory ' | tail -n 1 |
    perl -ne 'for my $f (qw(allocated active resident mapped retained)) {
      printf "%s %s  ", $f, $1 if /${f}_mib=([0-9.]+)/ } print "(MiB)"'
}

# Running pods on the consumer with app=bench.
running() {
  kc -n bench get pods -l app=bench --no-headers --field-selector status.phase=Running 2>/dev/null | wc -l
}
# Waits until $1 pods are Running: 40 minutes at most. Every 5 s notes
# the seconds since $start, the pods Running and the agent's resident
# size and peak (MiB) in $dir/timeline, to see when the peak comes.
until_pods_running() {
  local n
  for _ in $(seq 480); do
    n=$(running)
    echo "$(($(date +%s) - start)) $n $(mib "$pid" VmRSS) $(mib "$pid" VmHWM)" >>"$dir/timeline"
    # Of the profiles dumped at each new high, only the last matters.
    $heap_profile && ls -v "$dir/heap/vk.$pid".*.u*.heap 2>/dev/null | head -n -1 | xargs -r rm -f
    [ "$n" -ge "$1" ] && return 0
    sleep 5
  done
  echo "timed out waiting for $1 Running pods" >&2
  return 1
}

# What the scale-up's agent held at its last high of mapped memory
# (its last `prof_gdump` profile) beyond what it held once every pod was
# Running (its second SIGUSR1 profile, the first being the idle one's),
# by jeprof from jemalloc's sources (those cargo built the agent with);
# the profiles and the binary they refer to are kept in target/bench/vk-heap/.
heap_report() {
  local out=target/bench/vk-heap agent lock_version jeprof peak running
  rm -rf "$out"
  mkdir -p "$out"
  cp "$dir"/heap/*.heap "$out"/
  # jeprof finds the binary by the path the profiles' maps give.
  agent=$PWD/target/release/liqo-virtual-kubelet
  lock_version=$(grep -A1 '^name = "tikv-jemalloc-sys"' Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p')
  # jemalloc's script, with this build's symbol prefix (_rjem_) and Rust's
  # names kept whole (it cuts C++ templates, which are Rust's types).
  jeprof=$out/jeprof
  sed -e 's/@jemalloc_version@/5.3/' -e 's/@JEMALLOC_PREFIX@/_rjem_/g' \
    -e "s/'je_/'_rjem_je_/g; s/'void je_/'void _rjem_je_/g" \
    -e 's/^sub ShortFunctionName {$/&\n  return shift =~ s{<[0-9a-f]{16}>$}{}r;/' \
    "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"tikv-jemalloc-sys-$lock_version/jemalloc/bin/jeprof.in" >"$jeprof"
  peak=$(ls -v "$out/vk.$scale_up_pid".*.u*.heap | tail -n 1)
  running=$(ls -v "$out/vk.$scale_up_pid".*.m*.heap | sed -n 2p)
  echo
  echo "held at the scale-up's last high ($(basename "$peak")) beyond every pod Running ($(basename "$running")),"
  echo "by what called the allocation, cumulative, the runtime's frames left out"
  echo "(whole in $out/peak-over-running.txt; perl $jeprof --help for more):"
  perl "$jeprof" --text --cum --inuse_space --base="$running" "$agent" "$peak" \
    >"$out/peak-over-running.txt" 2>/dev/null
  grep -v -E 'tokio::runtime|Future>::poll|std::|core::ops::function|clone3|start_thread|__libc|_start$| main$' \
    "$out/peak-over-running.txt" | head -n 50 | cut -c 1-200 || true
}

pid=$(vk_pid)
# The log of the pod the rollout made (the newest).
vk_log=$(ls -t $(find "$dir/tb" -name "liqo_liqo-vk-*_virtual-kubelet.log") | head -n 1)
sleep 30
idle=$(sizes "$pid")
idle_je=$(jemalloc "$pid")

log_at=$(stat -c %s "$vk_log")
deployment bench virtual | kc apply -f - >/dev/null
start=$(date +%s)
until_pods_running "$pods"
scale_up_s=$(($(date +%s) - start))
up=$(sizes "$pid")
up_je=$(jemalloc "$pid")
# The watches that failed during the scale-up, each followed by a list
# of its whole store (held beside the old one until it ends).
relists=$(tail -c +"$((log_at + 1))" "$vk_log" | grep 'listing again' |
  grep -o 'what="[^"]*"\|what=[^ ]*' | sort | uniq -c | tr -s ' \n' ' ' || true)

# Both clusters' API servers restarted with every pod Running: each watch
# of the agent fails and lists its whole store again while the store it
# replaces is still held. Its peak is reset first (clear_refs), so that
# the peak read 90 s later is the relists'.
echo 5 >"/proc/$pid/clear_refs"
log_at=$(stat -c %s "$vk_log")
"$testbed" apiserver restart consumer --dir "$dir/tb" >/dev/null
"$testbed" apiserver restart provider --dir "$dir/tb" >/dev/null
sleep 90
relisted=$(sizes "$pid")
relisted_je=$(jemalloc "$pid")
relisted_watches=$(tail -c +"$((log_at + 1))" "$vk_log" | grep -c 'listing again' || true)

scale_up_pid=$pid
kill -KILL "$pid"
pid=$(new_vk "$pid")
sleep 90
restarted=$(sizes "$pid")
restarted_je=$(jemalloc "$pid")

echo
printf '%-44s %s\n' "pods" "$pods (Running after ${scale_up_s}s)"
printf '%-44s %s\n' "controller-managers' --kube-api-qps" "$kcm_qps"
printf '%-44s %s\n' "jemalloc options" "${malloc_conf:-built into the agent (narenas:1,dirty_decay_ms:0,tcache:false)}"
printf '%-44s %s\n' "no pod: peak / resident" "$idle"
printf '%-44s %s\n' "no pod: jemalloc" "$idle_je"
printf '%-44s %s\n' "every pod Running: peak / resident" "$up"
printf '%-44s %s\n' "every pod Running: jemalloc" "$up_je"
printf '%-44s %s\n' "API servers restarted, 90 s later: peak / resident" "$relisted (peak since the restarts)"
printf '%-44s %s\n' "API servers restarted: jemalloc" "$relisted_je"
printf '%-44s %s\n' "API servers restarted: watches listed again" "$relisted_watches"
printf '%-44s %s\n' "restarted, 90 s later: peak / resident" "$restarted"
printf '%-44s %s\n' "restarted, 90 s later: jemalloc" "$restarted_je"
printf '%-44s %s\n' "watches failed during the scale-up" "${relists:-none}"
$heap_profile && heap_report
echo
echo "scale-up, every 30 s, at the highest sample and where the peak was first reached:"
echo "seconds, pods Running, resident MiB, peak MiB"
awk 'NR % 6 == 1 { print }
     $3 > max { max = $3; at = $0 }
     $4 > hwm { hwm = $4; hwm_at = $0 }
     END { print "highest: " at; print "peak first seen: " hwm_at }' "$dir/timeline"
