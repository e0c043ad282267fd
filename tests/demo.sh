#!/usr/bin/env bash
# The demo: two real Kubernetes clusters on this machine, "home" and
# "foreign", each with a real node (a kubelet with containerd, runc and
# CNI; docs/testbed.md, "Real nodes") holding liqo-rs's images, built here.
# liqo-rs is installed on both from those images, "home" peers with
# "foreign" (a virtual node standing for foreign's grant), the namespace
# "demo" is offloaded, and a Deployment of home's runs its containers on
# foreign's node: they print their own greeting, read on home with kubectl
# logs, and a pod of home reaches them through their Service, by its name
# (the clusters' CoreDNS), across the gateways' WireGuard tunnel. Left running so you can look at them with
# kubectl and liqoctl. Run it again to start afresh; stop with
#   target/debug/liqo-testbed down --dir .liqo-demo
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

toolchain=$(bash tests/setup.sh | tail -n 1)
export LIQO_TOOLCHAIN_DIR="$toolchain"
cargo build --workspace --bins --locked

start=$(date +%s.%N)
testbed=target/debug/liqo-testbed
liqoctl=target/debug/liqoctl
kubectl_home() { "$toolchain/kubectl" --kubeconfig .liqo-demo/home/kubeconfig "$@"; }
kubectl_foreign() { "$toolchain/kubectl" --kubeconfig .liqo-demo/foreign/kubeconfig "$@"; }
"$testbed" down --dir .liqo-demo >/dev/null
"$testbed" up --dir .liqo-demo --cluster home --cluster foreign --nodes 0 --real-node

for cluster in home foreign; do
  echo
  echo "== liqoctl install on $cluster (its agents from the images on its node)"
  "$liqoctl" --kubeconfig ".liqo-demo/$cluster/kubeconfig" install \
    --cluster-name "$cluster" --cluster-labels "demo=true" --yes
done
echo
echo "== liqoctl peer: home consumes foreign's resources"
"$liqoctl" --kubeconfig .liqo-demo/home/kubeconfig peer \
  --remote-kubeconfig .liqo-demo/foreign/kubeconfig --cpu 1 --memory 2Gi --pods 20
echo
echo "== kubectl get nodes on home: its real node, and the virtual node that stands for foreign"
kubectl_home get nodes -o wide
kubectl_home -n liqo get pods -o wide
echo
echo "== liqoctl offload namespace demo: its pods run on foreign"
kubectl_home create namespace demo
"$liqoctl" --kubeconfig .liqo-demo/home/kubeconfig offload namespace demo \
  --pod-offloading-strategy Remote --wait
echo
echo "== a Deployment and its Service on home; the containers run on foreign's node"
# Within Pod Security's "restricted" level, which foreign gives its peers
# unless its sharing policy says otherwise (docs/offloading.md). The image
# is the testbed's toolbox (busybox, curl), which its nodes hold.
kubectl_home apply -f - <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: { name: hello, namespace: demo }
spec:
  replicas: 2
  selector: { matchLabels: { app: hello } }
  template:
    metadata: { labels: { app: hello } }
    spec:
      securityContext:
        runAsNonRoot: true
        runAsUser: 65534
        seccompProfile: { type: RuntimeDefault }
      containers:
        - name: hello
          image: liqo.test/toolbox:1
          command: [sh, -c]
          args:
            - echo "hello from $POD_NAME, running on $NODE_NAME" | tee /www/index.html;
              exec httpd -f -p 8080 -h /www
          env:
            - { name: POD_NAME, valueFrom: { fieldRef: { fieldPath: metadata.name } } }
            - { name: NODE_NAME, valueFrom: { fieldRef: { fieldPath: spec.nodeName } } }
          ports: [{ containerPort: 8080 }]
          volumeMounts: [{ name: www, mountPath: /www }]
          securityContext:
            allowPrivilegeEscalation: false
            capabilities: { drop: [ALL] }
      volumes: [{ name: www, emptyDir: {} }]
---
apiVersion: v1
kind: Service
metadata: { name: hello, namespace: demo }
spec:
  selector: { app: hello }
  ports: [{ port: 80, targetPort: 8080 }]
YAML
kubectl_home -n demo rollout status deployment/hello --timeout=120s
kubectl_home -n demo get pods -o wide
echo
echo "== the same pods on foreign, in home's twin namespace, on foreign's real node"
kubectl_foreign get pods -A -l liqo.io/local-pod-uid -o wide
echo
echo "== kubectl logs on home: what the containers on foreign wrote"
kubectl_home -n demo logs deployment/hello
echo
echo "== curl from a pod of home to the Service, by its name: answered by a pod on foreign"
kubectl_home run curl --image liqo.test/toolbox:1 --restart Never --command -- sleep 3600 >/dev/null
kubectl_home wait --for=condition=Ready pod/curl --timeout=60s >/dev/null
kubectl_home -n kube-system rollout status deployment/coredns --timeout=60s >/dev/null
for _ in 1 2 3; do
  kubectl_home exec curl -- curl -s -m 5 --retry 3 --retry-connrefused "http://hello.demo/"
done
echo
"$liqoctl" --kubeconfig .liqo-demo/home/kubeconfig info
echo
awk -v start="$start" -v end="$(date +%s.%N)" \
  'BEGIN { printf "demo done in %.0f s, from the start of the clusters\n", end - start }'
