#!/usr/bin/env bash
# Measures liqoctl install / re-install / uninstall on a testbed cluster,
# beside a reference: the same objects (from `install --dry-run`) applied
# and removed with kubectl, waiting for the same things (the gateway
# rolled out; everything deleted).
#   bash tests/bench/install.sh [runs]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
runs=${1:-3}
toolchain=$(bash tests/setup.sh | tail -n 1)
export LIQO_TOOLCHAIN_DIR="$toolchain"
cargo build --quiet --locked --workspace --bins
testbed=target/debug/liqo-testbed
liqoctl=target/debug/liqoctl
kubectl="$toolchain/kubectl"
dir=$(mktemp -d)
trap '"$testbed" down --dir "$dir/tb" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
"$testbed" up --dir "$dir/tb" --cluster bench --nodes 1 >/dev/null
export KUBECONFIG="$dir/tb/bench/kubeconfig"
flags=(--cluster-id bench --pod-cidr 10.201.0.0/16 --service-cidr 10.101.0.0/16
  --node-selector testbed.liqo.io/host-process=true --toleration testbed.liqo.io/host-process=true:NoSchedule --timeout 120)

seconds() { # runs "$@" quietly, prints its wall time
  local start end
  start=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  end=$(date +%s.%N)
  awk "BEGIN { printf \"%.2fs\", $end - $start }"
}

kubectl_install() {
  "$kubectl" apply --server-side --field-manager bench -f "$dir/objects.yaml"
  "$kubectl" -n liqo rollout status deploy/liqo-gateway --timeout 120s
}
kubectl_uninstall() {
  "$kubectl" delete --wait -f "$dir/objects.yaml"
}

"$liqoctl" install "${flags[@]}" --dry-run > "$dir/objects.yaml"

printf '%-4s | %-14s %-14s %-16s | %-18s %-18s\n' run "liqoctl install" "again (no-op)" "uninstall --purge" "kubectl apply+wait" "kubectl delete"
for i in $(seq "$runs"); do
  install=$(seconds "$liqoctl" install "${flags[@]}")
  again=$(seconds "$liqoctl" install "${flags[@]}")
  uninstall=$(seconds "$liqoctl" uninstall --purge --yes)
  ref_install=$(seconds kubectl_install)
  ref_uninstall=$(seconds kubectl_uninstall)
  printf '%-4s | %-14s %-14s %-16s | %-18s %-18s\n' "$i" "$install" "$again" "$uninstall" "$ref_install" "$ref_uninstall"
done
