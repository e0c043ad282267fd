#!/usr/bin/env bash
# The demo: two real Kubernetes clusters on this machine, "home" and
# "foreign", with liqo-rs installed on both (its agents running as real
# processes on each cluster's host-process node), "home" peered with
# "foreign" (a virtual node standing for foreign's grant), left running so
# you can look at them with kubectl and liqoctl.
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
echo
"$liqoctl" --kubeconfig .liqo-demo/home/kubeconfig info
