#!/usr/bin/env bash
# Claims kept on a provider against the same on the provider directly, on
# two real-node clusters (home peers with foreign; both run
# local-path-provisioner, docs/testbed.md "Storage"):
#  - the time from creating a StatefulSet of 3 with a 64Mi claim each to
#    its 3 pods Running: offloaded from home (claims of the class liqo,
#    kept on foreign in local-path), and made on foreign directly (the
#    reference);
#  - sequential write throughput into a claim, dd of 1 GiB with fsync at
#    the end, from an offloaded pod and from a pod of foreign, on the same
#    node and the same disk.
#   bash tests/bench/storage.sh [DIR]      (default .liqo-storage; left running)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
dir=${1:-.liqo-storage}
toolchain=$(bash tests/setup.sh | tail -n 1)
export LIQO_TOOLCHAIN_DIR="$toolchain"
cargo build --workspace --bins --locked >/dev/null 2>&1
testbed=target/debug/liqo-testbed
liqoctl=target/debug/liqoctl
kh() { "$toolchain/kubectl" --kubeconfig "$dir/home/kubeconfig" "$@"; }
kf() { "$toolchain/kubectl" --kubeconfig "$dir/foreign/kubeconfig" "$@"; }
"$testbed" down --dir "$dir" >/dev/null
"$testbed" up --dir "$dir" --cluster home --cluster foreign --nodes 0 --real-node >/dev/null
for c in home foreign; do
  "$liqoctl" --kubeconfig "$dir/$c/kubeconfig" install --cluster-name "$c" --yes >/dev/null
done
"$liqoctl" --kubeconfig "$dir/foreign/kubeconfig" sharing-policy set \
  --storage 4Gi --claims 10 --storage-classes local-path >/dev/null
"$liqoctl" --kubeconfig "$dir/home/kubeconfig" peer \
  --remote-kubeconfig "$dir/foreign/kubeconfig" --cpu 1 --memory 2Gi --pods 20 >/dev/null
kh create namespace db >/dev/null
"$liqoctl" --kubeconfig "$dir/home/kubeconfig" offload namespace db \
  --pod-offloading-strategy Remote --wait >/dev/null
kf create namespace ref >/dev/null

now() { date +%s.%N; }
secure='securityContext: { runAsNonRoot: true, runAsUser: 65534, seccompProfile: { type: RuntimeDefault } }'
container_secure='securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: [ALL] } }'
stateful_set() {
  cat <<YAML
apiVersion: apps/v1
kind: StatefulSet
metadata: { name: db, namespace: $1 }
spec:
  serviceName: db
  replicas: 3
  selector: { matchLabels: { app: db } }
  template:
    metadata: { labels: { app: db } }
    spec:
      terminationGracePeriodSeconds: 1
      $secure
      containers:
        - name: db
          image: liqo.test/toolbox:1
          command: [sh, -c, 'date > /data/started; exec sleep 100000']
          volumeMounts: [{ name: data, mountPath: /data }]
          $container_secure
  volumeClaimTemplates:
    - metadata: { name: data }
      spec: { accessModes: [ReadWriteOnce], resources: { requests: { storage: 64Mi } } }
YAML
}
# ready K NS: seconds from the StatefulSet's creation to its 3 pods Running.
ready() {
  local k=$1 ns=$2 start
  start=$(now)
  stateful_set "$ns" | $k apply -f - >/dev/null
  $k -n "$ns" rollout status statefulset/db --timeout=300s >/dev/null
  awk -v s="$start" -v e="$(now)" 'BEGIN { printf "%.1f", e - s }'
}
# write K NS: dd's throughput writing 1 GiB into a claim.
write() {
  local k=$1 ns=$2
  $k -n "$ns" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: { name: dd, namespace: $ns }
spec: { accessModes: [ReadWriteOnce], resources: { requests: { storage: 1200Mi } } }
---
apiVersion: v1
kind: Pod
metadata: { name: dd, namespace: $ns }
spec:
  restartPolicy: Never
  $secure
  containers:
    - name: dd
      image: liqo.test/toolbox:1
      command: [sh, -c, 's=\$(cut -d" " -f1 /proc/uptime); dd if=/dev/zero of=/data/f bs=1M count=1024 conv=fsync 2>/dev/null; e=\$(cut -d" " -f1 /proc/uptime); awk -v s="\$s" -v e="\$e" "BEGIN { printf \\"%.0f MiB/s (%.2f s)\\", 1024 / (e - s), e - s }"']
      volumeMounts: [{ name: data, mountPath: /data }]
      $container_secure
  volumes: [{ name: data, persistentVolumeClaim: { claimName: dd } }]
YAML
  for _ in $(seq 1 300); do
    case $($k -n "$ns" get pod dd -o jsonpath='{.status.phase}') in
      Succeeded | Failed) break ;;
    esac
    sleep 1
  done
  $k -n "$ns" logs dd | tail -n 1
}

offloaded=$(ready kh db)
reference=$(ready kf ref)
echo "StatefulSet of 3 with claims, to all Running: offloaded ${offloaded} s, on the provider directly ${reference} s"
echo "dd 1 GiB (fsync), offloaded pod:        $(write kh db)"
echo "dd 1 GiB (fsync), provider's own pod:   $(write kf ref)"
echo "clusters left in $dir: $testbed down --dir $dir"
