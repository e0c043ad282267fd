#!/usr/bin/env bash
# A soak on real nodes with the shipped images (as real-nodes.sh): two
# clusters, home peered with foreign, churn for MINUTES (default 30):
# Deployments of two offloaded namespaces scaled up and down, pods
# deleted, a namespace unoffloaded and offloaded again, and faults: an
# agent (either gateway, the virtual kubelet) killed with SIGKILL, an API
# server paused for 20 to 40 s then resumed, or restarted. Every minute it
# prints the agents' resident memory and the pods on both sides. At the
# end, once churn stops and things settle, it checks:
#   - no pod lost or duplicated: each offloaded Deployment has its
#     replicas Ready at home, and foreign runs exactly one pod for each;
#   - nothing left behind: after unoffload and unpeer, neither cluster
#     holds an object it did not hold before the peering (names of every
#     namespaced and cluster-wide object, as the end-to-end tests compare);
#   - the agents' memory is flat after the warm-up (first and last minute
#     after it, side by side);
#   - `liqoctl info` is green before the teardown: the peering Ready, the
#     tunnel up, both namespaces Ready, every agent ready.
# Exits non-zero if a check fails. A seed makes the churn repeatable.
#   bash tests/bench/soak.sh [--minutes M] [--seed S]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tests/bench/lib.sh
minutes=30
seed=$RANDOM
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    *) echo "usage: $0 [--minutes M] [--seed S]" >&2; exit 2 ;;
  esac
done
RANDOM=$seed
shipped_images
bench_build debug
trap bench_cleanup EXIT
"$testbed" up --dir "$dir/tb" -c home -c foreign --nodes 0 --real-node \
  --agent-images "$images" >/dev/null
home=$(kubeconfig home)
foreign=$(kubeconfig foreign)
k() { local c=$1; shift; "$kubectl" --kubeconfig "$c" "$@"; }
for c in "$home" "$foreign"; do
  "$liqoctl" --kubeconfig "$c" install --yes >"$dir/install.log" 2>&1 || { cat "$dir/install.log" >&2; exit 1; }
done
# Every object's kind, namespace and name, sorted; what changes by itself
# (leases, events, the agents' own pods and ReplicaSets restarted by the
# faults, endpoint slices) left out.
objects() {
  local kinds
  kinds=$(k "$1" api-resources --verbs=list -o name | grep -v -E \
    '^(events|leases|endpoints|endpointslices|pods|replicasets|controllerrevisions|componentstatuses|tokenreviews|bindings)(\.|$)' \
    | grep -v -E '\.metrics\.k8s\.io$' | paste -sd, -)
  k "$1" get "$kinds" -A -o custom-columns=KIND:.kind,NS:.metadata.namespace,NAME:.metadata.name \
    --no-headers 2>/dev/null | sort
}
objects "$home" >"$dir/home.before"
objects "$foreign" >"$dir/foreign.before"
"$liqoctl" --kubeconfig "$home" peer --remote-kubeconfig "$foreign" --pods 60 --yes >"$dir/peer.log" 2>&1 \
  || { cat "$dir/peer.log" >&2; exit 1; }
namespaces=(soak-a soak-b)
for ns in "${namespaces[@]}"; do
  k "$home" create namespace "$ns" >/dev/null
  "$liqoctl" --kubeconfig "$home" offload namespace "$ns" --pod-offloading-strategy Remote --wait \
    >"$dir/offload.log" 2>&1 || { cat "$dir/offload.log" >&2; exit 1; }
  for app in web worker; do
    k "$home" -n "$ns" apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: { name: $app }
spec:
  replicas: 3
  selector: { matchLabels: { app: $app } }
  template:
    metadata: { labels: { app: $app } }
    spec:
      terminationGracePeriodSeconds: 1
      securityContext: { runAsNonRoot: true, runAsUser: 65534, seccompProfile: { type: RuntimeDefault } }
      containers:
        - name: main
          image: liqo.test/toolbox:1
          command: [sleep, "86400"]
          resources: { requests: { cpu: 5m, memory: 8Mi } }
          securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: [ALL] } }
YAML
  done
done

# The PID of agent $2 (liqo-gateway, liqo-virtual-kubelet) of cluster $1:
# the process of the image's program (not the gateway's tunnel process,
# `liqo-gateway tunnel`) whose KUBERNETES_SERVICE_HOST is that cluster's
# (the gateway runs in the node's network, so its HOSTNAME is the node's).
agent_pid() {
  local api pid host
  api=$(k "$1" get service kubernetes -o jsonpath='{.spec.clusterIP}')
  for pid in $(pgrep -f "^/usr/local/bin/$2 --" || true); do
    host=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^KUBERNETES_SERVICE_HOST=//p')
    if [ "$host" = "$api" ]; then echo "$pid"; return; fi
  done
}
rss() { awk '/^VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo "-"; }
memory_line() {
  local vk gwh gwf
  vk=$(agent_pid "$home" liqo-virtual-kubelet || true)
  gwh=$(agent_pid "$home" liqo-gateway || true)
  gwf=$(agent_pid "$foreign" liqo-gateway || true)
  printf '%s virtual-kubelet %s MiB, gateway home %s MiB, gateway foreign %s MiB, pods home %s foreign %s\n' \
    "$1" "$( [ -n "$vk" ] && rss "$vk" || echo -)" "$( [ -n "$gwh" ] && rss "$gwh" || echo -)" \
    "$( [ -n "$gwf" ] && rss "$gwf" || echo -)" \
    "$(k "$home" get pods -A --no-headers 2>/dev/null | wc -l)" \
    "$(k "$foreign" get pods -A --no-headers 2>/dev/null | wc -l)"
}

echo "seed $seed; churn for $minutes min"
start=$(date +%s)
end=$((start + minutes * 60))
next_minute=$((start + 60))
minute=0
offloaded_b=true
KILL_EVERY=300
killed=(0 0 0)
while [ "$(date +%s)" -lt "$end" ]; do
  ns=${namespaces[RANDOM % 2]}
  app=$([ $((RANDOM % 2)) = 0 ] && echo web || echo worker)
  case $((RANDOM % 10)) in
    0|1|2) k "$home" -n "$ns" scale deployment "$app" --replicas $((RANDOM % 8)) >/dev/null 2>&1 || true ;;
    3|4) pod=$(k "$home" -n "$ns" get pods -l "app=$app" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)
         [ -z "$pod" ] || k "$home" -n "$ns" delete pod "$pod" --wait=false >/dev/null 2>&1 || true ;;
    5) if $offloaded_b; then
         "$liqoctl" --kubeconfig "$home" unoffload namespace soak-b --yes >/dev/null 2>&1 && offloaded_b=false
       else
         "$liqoctl" --kubeconfig "$home" offload namespace soak-b --pod-offloading-strategy Remote \
           >/dev/null 2>&1 && offloaded_b=true
       fi ;;
    # An agent killed, each at most once in KILL_EVERY seconds: a kubelet
    # restarts a container killed again and again ever later (up to 5
    # minutes), and an agent kept down tests only the queues.
    6|7) which=$((RANDOM % 3))
         if [ $(( $(date +%s) - ${killed[which]} )) -ge "$KILL_EVERY" ]; then
           case $which in
             0) pid=$(agent_pid "$home" liqo-virtual-kubelet) ;;
             1) pid=$(agent_pid "$home" liqo-gateway) ;;
             *) pid=$(agent_pid "$foreign" liqo-gateway) ;;
           esac
           if [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; then killed[which]=$(date +%s); fi
         fi ;;
    8) cluster=$([ $((RANDOM % 2)) = 0 ] && echo home || echo foreign)
       "$testbed" apiserver pause "$cluster" --dir "$dir/tb" >/dev/null
       sleep $((20 + RANDOM % 21))
       "$testbed" apiserver resume "$cluster" --dir "$dir/tb" >/dev/null ;;
    9) cluster=$([ $((RANDOM % 2)) = 0 ] && echo home || echo foreign)
       "$testbed" apiserver restart "$cluster" --dir "$dir/tb" >/dev/null ;;
  esac
  sleep $((5 + RANDOM % 10))
  if [ "$(date +%s)" -ge "$next_minute" ]; then
    minute=$((minute + 1))
    next_minute=$((next_minute + 60))
    memory_line "minute $minute:" | tee -a "$dir/memory"
  fi
done

# Settle: every namespace offloaded, every Deployment at a known size.
$offloaded_b || "$liqoctl" --kubeconfig "$home" offload namespace soak-b --pod-offloading-strategy Remote \
  --wait >/dev/null
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
for ns in "${namespaces[@]}"; do
  k "$home" -n "$ns" scale deployment web --replicas 4 >/dev/null
  k "$home" -n "$ns" scale deployment worker --replicas 2 >/dev/null
done
for ns in "${namespaces[@]}"; do
  for app in web worker; do
    k "$home" -n "$ns" rollout status "deployment/$app" --timeout=300s >/dev/null \
      || fail "$ns/$app did not become ready at home"
  done
done
sleep 20
memory_line "settled:" | tee -a "$dir/memory"

# Pods: each Deployment's replicas Running at home, and foreign runs one
# pod for each of those bound to the virtual node (pods made while soak-b
# was not offloaded run on home's own node, and stay there).
for ns in "${namespaces[@]}"; do
  twin=$(k "$home" -n "$ns" get namespaceoffloadings -o jsonpath='{.items[0].status.clusters[0].remoteNamespace}')
  for app in web worker; do
    want=$(k "$home" -n "$ns" get deployment "$app" -o jsonpath='{.spec.replicas}')
    running=$(k "$home" -n "$ns" get pods -l "app=$app" --no-headers -o wide | grep -c ' Running ' || true)
    offloaded=$(k "$home" -n "$ns" get pods -l "app=$app" --no-headers -o wide | grep ' Running ' | grep -c ' liqo-' || true)
    remote=$(k "$foreign" -n "$twin" get pods -l "app=$app" --no-headers 2>/dev/null | wc -l)
    remote_running=$(k "$foreign" -n "$twin" get pods -l "app=$app" --no-headers 2>/dev/null | grep -c ' Running ' || true)
    echo "$ns/$app: $want wanted, $running running at home ($offloaded on the virtual node), $remote on foreign ($remote_running running)"
    [ "$running" = "$want" ] || fail "$ns/$app: $running pods running at home for $want replicas"
    [ "$remote" = "$offloaded" ] || fail "$ns/$app: $remote pods on foreign for $offloaded offloaded (lost or duplicated)"
  done
done

# liqoctl info is green.
"$liqoctl" --kubeconfig "$home" info -o json >"$dir/info.json"
python3 - "$dir/info.json" <<'PY' || fail "liqoctl info is not green"
import json, sys
info = json.load(open(sys.argv[1]))
bad = [a["name"] for a in info["agents"] if not a["ready"]]
for p in info["peerings"]:
    if p.get("ready", {}).get("status") not in (None, "True"):
        bad.append(f"peering {p['name']}: {p['ready']}")
    if p.get("network") and not p["network"]["established"]:
        bad.append(f"tunnel to {p['name']}: {p['network'].get('reason')}")
for o in info["offloadedNamespaces"]:
    if not o["clusters"] or not all(c["ready"] for c in o["clusters"]):
        bad.append(f"namespace {o['namespace']}: {o['clusters']}")
print("liqoctl info:", "green" if not bad else "; ".join(map(str, bad)))
sys.exit(1 if bad else 0)
PY

# Memory: the first minute after the warm-up (the fifth) against the end,
# once settled (during the churn an agent may be down, killed).
awk -v warm=5 '/^minute/ && $2 + 0 == warm { first = $0 } /^settled/ { last = $0 }
  END { if (first) { print "after the warm-up: " first; print "at the end:        " last } }' "$dir/memory"

# Nothing left behind.
for ns in "${namespaces[@]}"; do
  "$liqoctl" --kubeconfig "$home" unoffload namespace "$ns" --yes >/dev/null
  k "$home" delete namespace "$ns" --wait >/dev/null
done
"$liqoctl" --kubeconfig "$home" unpeer --remote-kubeconfig "$foreign" --yes >/dev/null
objects "$home" >"$dir/home.after"
objects "$foreign" >"$dir/foreign.after"
for c in home foreign; do
  if ! diff "$dir/$c.before" "$dir/$c.after" >"$dir/$c.diff"; then
    fail "left behind on $c (> new, < gone):"
    cat "$dir/$c.diff"
  fi
done
echo "machine: $(nproc) CPUs; agents: the release images of target/images; seed $seed; $minutes min"
[ "$failures" = 0 ] && echo "soak: every check passed" || { echo "soak: $failures checks failed"; exit 1; }
