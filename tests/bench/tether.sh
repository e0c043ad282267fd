#!/usr/bin/env bash
# Measures how long `liqoctl tether` and `untether` take with 20 running
# pods on the tethered cluster (docs/tethering.md): the command itself,
# and until the 20 pods of its Deployment run again (through the anchor
# after tether; on the cluster's own node after untether). The reference,
# in the same run: `kubectl rollout restart` of the same Deployment with
# no tether, until its 20 new pods run.
#   bash tests/bench/tether.sh [runs]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
runs=${1:-3}
pods=20
# shellcheck source=tests/bench/lib.sh
source tests/bench/lib.sh
bench_build debug
trap bench_cleanup EXIT
"$testbed" up --dir "$dir/tb" --cluster consumer --cluster provider --nodes 1 >/dev/null
laptop=$(kubeconfig consumer)
company=$(kubeconfig provider)
install_on consumer provider

"$kubectl" --kubeconfig "$laptop" create namespace work >/dev/null
"$kubectl" --kubeconfig "$laptop" apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: { name: fleet, namespace: work }
spec:
  replicas: $pods
  selector: { matchLabels: { app: fleet } }
  template:
    metadata: { labels: { app: fleet } }
    spec:
      terminationGracePeriodSeconds: 0
      securityContext: { runAsNonRoot: true, runAsUser: 65534, seccompProfile: { type: RuntimeDefault } }
      containers:
        - name: app
          image: nginx
          resources: { requests: { cpu: 1m, memory: 1Mi } }
          securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: [ALL] } }
EOF

now() { date +%s.%N; }
since() { awk "BEGIN { printf \"%.2f\", $(now) - $1 }"; }
# How many of the Deployment's pods run on nodes whose name matches $1
# (an awk pattern), not being deleted.
running_on() {
  "$kubectl" --kubeconfig "$laptop" -n work get pods -l app=fleet --no-headers \
    -o custom-columns=NODE:.spec.nodeName,PHASE:.status.phase,GONE:.metadata.deletionTimestamp |
    awk -v want="$1" '$1 ~ want && $2 == "Running" && $3 == "<none>" { n++ } END { print n + 0 }'
}
# Waits (at most 300 s) until $pods pods run on nodes matching $1 and no
# other pod is left; prints the seconds since $2.
settled() {
  for _ in $(seq 3000); do
    total=$("$kubectl" --kubeconfig "$laptop" -n work get pods -l app=fleet --no-headers | wc -l)
    if [ "$(running_on "$1")" = "$pods" ] && [ "$total" = "$pods" ]; then
      since "$2"
      return 0
    fi
    sleep 0.1
  done
  echo "the pods did not settle on $1 within 300 s" >&2
  return 1
}
liqoctl_timed() {
  local start
  start=$(now)
  "$liqoctl" --kubeconfig "$laptop" "$@" --remote-kubeconfig "$company" --yes \
    >"$dir/$1.log" 2>&1 || { cat "$dir/$1.log" >&2; return 1; }
  since "$start"
}

settled '^consumer-worker' "$(now)" >/dev/null
printf '%-4s | %-12s %-16s | %-12s %-16s | %-26s\n' run "tether" "pods through" \
  "untether" "pods home" "ref: rollout restart"
for i in $(seq "$runs"); do
  start=$(now)
  "$kubectl" --kubeconfig "$laptop" -n work rollout restart deployment fleet >/dev/null
  ref=$(settled '^consumer-worker' "$start")

  start=$(now)
  tether=$(liqoctl_timed tether)
  through=$(settled '^liqo-provider' "$start")

  start=$(now)
  untether=$(liqoctl_timed untether)
  home=$(settled '^consumer-worker' "$start")
  printf '%-4s | %-12s %-16s | %-12s %-16s | %-26s\n' "$i" "${tether}s" "${through}s" \
    "${untether}s" "${home}s" "${ref}s"
done
