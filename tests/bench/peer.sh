#!/usr/bin/env bash
# Measures liqoctl peer (until the virtual node is Ready: peer waits for
# it) and unpeer (until both clusters are clean: unpeer waits for it)
# between two testbed clusters, and the same with a peering token
# (docs/tokens.md: generate on the provider, then peer --token and unpeer
# --cluster-id with the consumer's kubeconfig only; the token's unpeer
# does not wait for the provider's garbage collector), beside references
# on the same clusters in the same run:
#   - for peer: a namespace, a ServiceAccount, its RoleBinding and
#     ClusterRoleBinding and a Deployment of the gateway's image on the
#     host-process node, applied with `kubectl apply --server-side` and
#     waited for with `kubectl wait --for=condition=Available`: what
#     starting one agent with its rights takes at least on this machine;
#   - for unpeer: `kubectl delete namespace --wait` of an empty namespace,
#     the slowest thing unpeer waits for (its tenant namespace).
#   bash tests/bench/peer.sh [runs]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
runs=${1:-3}
# shellcheck source=tests/bench/lib.sh
source tests/bench/lib.sh
bench_build debug
trap '"$testbed" down --dir "$dir/tb" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
"$testbed" up --dir "$dir/tb" --cluster consumer --cluster provider --nodes 1 >/dev/null
consumer=$(kubeconfig consumer)
provider=$(kubeconfig provider)
install_on consumer provider

# Runs "$@" quietly and prints its wall time; on failure, shows its output
# and stops the benchmark (a failed run's time means nothing).
seconds() {
  local start end
  start=$(date +%s.%N)
  if ! "$@" >"$dir/last.log" 2>&1; then
    echo "failed: $*" >&2
    cat "$dir/last.log" >&2
    return 1
  fi
  end=$(date +%s.%N)
  awk "BEGIN { printf \"%.2fs\", $end - $start }"
}

peer() {
  "$liqoctl" --kubeconfig "$consumer" peer --remote-kubeconfig "$provider" \
    --cpu 2 --memory 1Gi --pods 10 --timeout 120
}
unpeer() {
  "$liqoctl" --kubeconfig "$consumer" unpeer --remote-kubeconfig "$provider" --timeout 120
}

token_generate() {
  "$liqoctl" --kubeconfig "$provider" generate peering-token --cpu 2 --memory 1Gi --pods 10 \
    >"$dir/token" 2>/dev/null
}
token_peer() {
  "$liqoctl" --kubeconfig "$consumer" peer --token-file "$dir/token" --timeout 120
}
token_unpeer() {
  "$liqoctl" --kubeconfig "$consumer" unpeer --cluster-id provider --timeout 120
}
# The provider's garbage collector removing a token tenant, untimed: the
# next run starts from a clean provider.
tenants_gone() {
  for _ in $(seq 120); do
    [ -z "$("$kubectl" --kubeconfig "$provider" get tenants -o name)" ] && return 0
    sleep 1
  done
  echo "the token tenant is still on the provider" >&2
  return 1
}

# The reference agent: the gateway's image under its own account, in its
# own namespace, reading the cluster's identity in liqo as the gateway does.
cat > "$dir/reference.yaml" <<'EOF'
apiVersion: v1
kind: Namespace
metadata: { name: bench-ref }
---
apiVersion: v1
kind: ServiceAccount
metadata: { name: bench-ref, namespace: bench-ref }
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: bench-ref, namespace: liqo }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: Role, name: liqo-gateway }
subjects: [{ kind: ServiceAccount, name: bench-ref, namespace: bench-ref }]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: { name: bench-ref }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: liqo-gateway }
subjects: [{ kind: ServiceAccount, name: bench-ref, namespace: bench-ref }]
---
apiVersion: apps/v1
kind: Deployment
metadata: { name: bench-ref, namespace: bench-ref }
spec:
  replicas: 1
  selector: { matchLabels: { app: bench-ref } }
  template:
    metadata: { labels: { app: bench-ref } }
    spec:
      serviceAccountName: bench-ref
      nodeSelector: { testbed.liqo.io/host-process: "true" }
      tolerations: [{ key: testbed.liqo.io/host-process, value: "true", effect: NoSchedule }]
      containers:
        - name: gateway
          image: ghcr.io/liqo-rs/liqo-gateway:bench
          args: ["--health-addr=$(POD_IP):8081"]
          env:
            - { name: POD_IP, valueFrom: { fieldRef: { fieldPath: status.podIP } } }
            - { name: POD_NAMESPACE, value: liqo }
          readinessProbe: { httpGet: { path: /readyz, port: 8081 }, periodSeconds: 2 }
EOF
reference_start() {
  "$kubectl" --kubeconfig "$consumer" apply --server-side --field-manager bench -f "$dir/reference.yaml"
  "$kubectl" --kubeconfig "$consumer" -n bench-ref wait deploy/bench-ref \
    --for condition=Available --timeout 120s
}
reference_remove() {
  "$kubectl" --kubeconfig "$consumer" delete --wait -f "$dir/reference.yaml"
}
empty_namespace_delete() {
  "$kubectl" --kubeconfig "$provider" create namespace bench-empty
  local start end
  start=$(date +%s.%N)
  "$kubectl" --kubeconfig "$provider" delete namespace bench-empty --wait
  end=$(date +%s.%N)
  awk "BEGIN { printf \"%.2f\", $end - $start }" > "$dir/empty.time"
}

printf '%-4s | %-10s %-10s | %-10s %-13s %-13s | %-22s %-22s\n' run peer unpeer \
  "generate" "peer --token" "unpeer (tok)" "ref: apply+wait agent" "ref: delete empty ns"
for i in $(seq "$runs"); do
  peer_time=$(seconds peer)
  # Untimed: the virtual node peer waited for is Ready indeed.
  "$kubectl" --kubeconfig "$consumer" wait node/liqo-provider --for condition=Ready --timeout 0s >/dev/null
  unpeer_time=$(seconds unpeer)
  generate_time=$(seconds token_generate)
  token_peer_time=$(seconds token_peer)
  "$kubectl" --kubeconfig "$consumer" wait node/liqo-provider --for condition=Ready --timeout 0s >/dev/null
  token_unpeer_time=$(seconds token_unpeer)
  tenants_gone
  ref_start=$(seconds reference_start)
  seconds reference_remove >/dev/null
  # Only the delete is timed, not the create before it.
  seconds empty_namespace_delete >/dev/null
  ref_delete="$(cat "$dir/empty.time")s"
  printf '%-4s | %-10s %-10s | %-10s %-13s %-13s | %-22s %-22s\n' "$i" "$peer_time" "$unpeer_time" \
    "$generate_time" "$token_peer_time" "$token_unpeer_time" "$ref_start" "$ref_delete"
done
