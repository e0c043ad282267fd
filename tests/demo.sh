#!/usr/bin/env bash
# The demo: two real Kubernetes clusters on this machine, "home" and
# "foreign", with liqo-rs installed on both (its agents running as real
# processes on each cluster's host-process node), "home" peered with
# "foreign" (a virtual node standing for foreign's grant), the namespace
# "demo" offloaded, and a Deployment of home's whose pods run on foreign
# (on its kwok nodes), their logs read on home with kubectl logs, left
# running so you can look at them with kubectl and liqoctl.
# Run it again to start afresh; stop with
#   target/debug/liqo-testbed down --dir .liqo-demo
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

toolchain=$(bash tests/setup.sh | tail -n 1)
export LIQO_TOOLCHAIN_DIR="$toolchain"
cargo build --workspace --bins --locked

testbed=target/debug/liqo-testbed
liqoctl=target/debug/liqoctl
"$testbed" down --dir .liqo-demo >/dev/null
"$testbed" up --dir .liqo-demo --cluster home --cluster foreign

for cluster in home foreign; do
  echo
  echo "== liqoctl install on $cluster"
  "$liqoctl" --kubeconfig "$("$testbed" get --dir .liqo-demo "$cluster" kubeconfig)" install \
    --cluster-name "$cluster" --cluster-labels "demo=true" \
    --pod-cidr "$("$testbed" get --dir .liqo-demo "$cluster" pod-cidr)" \
    --node-selector testbed.liqo.io/host-process=true --toleration testbed.liqo.io/host-process=true:NoSchedule --yes
done
echo
echo "== liqoctl peer: home consumes foreign's resources"
"$liqoctl" --kubeconfig .liqo-demo/home/kubeconfig peer \
  --remote-kubeconfig .liqo-demo/foreign/kubeconfig --cpu 2 --memory 2Gi --pods 20
echo
echo "== kubectl get nodes on home: the virtual node stands for foreign"
"$toolchain/kubectl" --kubeconfig .liqo-demo/home/kubeconfig get nodes -o wide
kubectl_home() { "$toolchain/kubectl" --kubeconfig .liqo-demo/home/kubeconfig "$@"; }
kubectl_foreign() { "$toolchain/kubectl" --kubeconfig .liqo-demo/foreign/kubeconfig "$@"; }
echo
echo "== liqoctl offload namespace demo: its pods run on foreign"
kubectl_home create namespace demo
"$liqoctl" --kubeconfig .liqo-demo/home/kubeconfig offload namespace demo \
  --pod-offloading-strategy Remote --wait
echo
echo "== a Deployment on home, its pods on the virtual node"
# Within Pod Security's "restricted" level, which foreign gives its peers
# unless its sharing policy says otherwise (docs/offloading.md).
kubectl_home apply -f - <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: { name: hello, namespace: demo }
spec:
  replicas: 3
  selector: { matchLabels: { app: hello } }
  template:
    metadata: { labels: { app: hello } }
    spec:
      securityContext:
        runAsNonRoot: true
        runAsUser: 65534
        seccompProfile: { type: RuntimeDefault }
      containers:
        - name: agnhost
          image: registry.k8s.io/e2e-test-images/agnhost:2.53
          securityContext:
            allowPrivilegeEscalation: false
            capabilities: { drop: [ALL] }
YAML
kubectl_home -n demo rollout status deployment/hello --timeout=120s
kubectl_home -n demo get pods -o wide
echo
echo "== the same pods on foreign, in home's twin namespace"
kubectl_foreign get pods -A -l liqo.io/local-pod-uid -o wide
echo
echo "== kubectl logs on home: what foreign's node serves for the remote pod"
# foreign's kwok serves this file (container runtime log format) as every
# container's logs; home's API server asks the virtual kubelet, which
# asks foreign's API server.
echo "$(date -u +%Y-%m-%dT%H:%M:%S.%NZ) stdout F hello from foreign" >>.liqo-demo/foreign/kwok-pods.log
kubectl_home -n demo logs deployment/hello
echo
"$liqoctl" --kubeconfig .liqo-demo/home/kubeconfig info
