#!/usr/bin/env bash
# How long the clusterset takes to make a Service's name resolvable in
# another cluster, and to follow its endpoints, beside the same on one
# cluster (its own cluster DNS) as the reference. Runs on the clusters
# tests/mcs.sh leaves (a and b, peered with network):
#   bash tests/mcs.sh && bash tests/bench/clusterset.sh [DIR]
# Each figure is from the change (kubectl returns) to the first answer
# that shows it, asked with nslookup from a pod of b every 0.2 s (the
# kubectl exec of each question adds about 0.1 s). The testbed's CoreDNS
# keeps answers 5 s (its `ttl 5`), negative ones too: a name asked for
# before it exists, or whose endpoints change, shows the change once the
# cached answer expires, on one cluster as across the clusterset.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
dir=${1:-.liqo-mcs}
toolchain=$(bash tests/toolchain/build.sh | tail -n 1)
ka() { "$toolchain/kubectl" --kubeconfig "$dir/a/kubeconfig" "$@"; }
kb() { "$toolchain/kubectl" --kubeconfig "$dir/b/kubeconfig" "$@"; }
for n in a b; do [ -f "$dir/$n/kubeconfig" ] || { echo "error: no cluster $n in $dir; run tests/mcs.sh first" >&2; exit 1; }; done
ns=bench-$(date +%s)
ka create namespace "$ns" >/dev/null
kb create namespace "$ns" >/dev/null
trap 'ka delete namespace "$ns" --wait=false >/dev/null 2>&1; kb delete namespace "$ns" --wait=false >/dev/null 2>&1' EXIT

ka -n "$ns" apply -f - >/dev/null <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: { name: hello }
spec:
  replicas: 1
  selector: { matchLabels: { app: hello } }
  template:
    metadata: { labels: { app: hello } }
    spec:
      containers:
        - { name: hello, image: liqo.test/toolbox:1, command: [sh, -c, "exec httpd -f -p 8080 -h /"] }
---
apiVersion: v1
kind: Service
metadata: { name: hello }
spec: { selector: { app: hello }, ports: [{ name: http, port: 80, targetPort: 8080 }] }
---
apiVersion: v1
kind: Service
metadata: { name: hello-h }
spec: { clusterIP: None, selector: { app: hello }, ports: [{ name: http, port: 8080 }] }
YAML
for k in ka kb; do
  $k -n "$ns" run ask --image docker.io/nicolaka/netshoot:v0.15 --restart Never -- /bin/sh -ec 'while :; do sleep 5; done' >/dev/null
  $k -n "$ns" wait --for=condition=Ready pod/ask --timeout=60s >/dev/null
done
ka -n "$ns" rollout status deployment/hello --timeout=60s >/dev/null

now() { date +%s.%N; }
# addresses K NAME: how many addresses the name resolves to from that cluster's pod.
addresses() {
  "$1" -n "$ns" exec ask -- nslookup -type=A "$2." 2>/dev/null | awk '/^Name:/{n=1} n&&/^Address:/{c++} END{print c+0}'
}
# until K NAME COUNT: seconds until NAME resolves to COUNT addresses (60 s at most).
until_count() {
  local start end
  start=$(now)
  for _ in $(seq 300); do
    if [ "$(addresses "$1" "$2")" = "$3" ]; then
      end=$(now); awk -v s="$start" -v e="$end" 'BEGIN{printf "%.2f", e-s}'; return
    fi
    sleep 0.2
  done
  echo "timeout"
}

echo "clusterset names, from the change to the first answer that shows it (s):"
printf '%-44s %10s %10s\n' "" "clusterset" "reference"

# A new name: exported from a, asked on b; the reference is a new Service
# of b asked on b.
kb -n "$ns" create service clusterip local-ref --tcp=80:8080 >/dev/null
ref=$(until_count kb "local-ref.$ns.svc.cluster.local" 1)
ka -n "$ns" apply -f - >/dev/null <<'YAML'
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceExport
metadata: { name: hello }
spec: {}
YAML
start=$(now)
api="timeout"
for _ in $(seq 300); do
  if kb -n "$ns" get serviceimport hello >/dev/null 2>&1; then
    api=$(awk -v s="$start" -v e="$(now)" 'BEGIN{printf "%.2f", e-s}'); break
  fi
  sleep 0.1
done
got=$(until_count kb "hello.$ns.svc.clusterset.local" 1)
dns=$(awk -v a="$api" -v g="$got" 'BEGIN{printf "%.2f", a+g}')
printf '%-44s %10s %10s\n' "ServiceExport -> ServiceImport on b (API)" "$api" "-"
printf '%-44s %10s %10s\n' "ServiceExport -> name resolvable on b" "$dns" "$ref"

# Endpoints of a headless Service: asked on b by their clusterset name; the
# reference is the same Service's own name asked on a.
ka -n "$ns" apply -f - >/dev/null <<'YAML'
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceExport
metadata: { name: hello-h }
spec: {}
YAML
until_count kb "hello-h.$ns.svc.clusterset.local" 1 >/dev/null
# both KREF NAMEREF K NAME COUNT: the two waits at once, from the same start.
both() {
  local tmp; tmp=$(mktemp -d)
  until_count "$1" "$2" "$5" > "$tmp/ref" &
  until_count "$3" "$4" "$5" > "$tmp/got" &
  wait
  echo "$(cat "$tmp/got") $(cat "$tmp/ref")"
  rm -rf "$tmp"
}
ka -n "$ns" scale deployment/hello --replicas 2 >/dev/null
read -r up up_ref < <(both ka "hello-h.$ns.svc.cluster.local" kb "hello-h.$ns.svc.clusterset.local" 2)
printf '%-44s %10s %10s\n' "a new endpoint -> in the answer on b" "$up" "$up_ref"
ka -n "$ns" scale deployment/hello --replicas 1 >/dev/null
read -r down down_ref < <(both ka "hello-h.$ns.svc.cluster.local" kb "hello-h.$ns.svc.clusterset.local" 1)
printf '%-44s %10s %10s\n' "an endpoint gone -> out of the answer on b" "$down" "$down_ref"
