#!/usr/bin/env bash
# What the virtual kubelet's reflection stores hold in memory per
# offloaded pod, without a cluster: the unit measurement
# `reflection::footprint` (agents/virtual-kubelet) fills every store the
# agent keeps per pod (local pods, remote pods, remote ReplicaSets, token
# Secrets, and Events on both sides) with objects read from JSON shaped
# as the API serves them, and prints the heap each store holds, beside
# the same objects held by a plain kube-runtime reflector.
#
#   bash tests/bench/stores.sh [pods]      (default 10000)
#
# The agent's resident memory with real clusters is measured by
# tests/bench/offload.sh --with-10k.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
FOOTPRINT_PODS=${1:-10000} cargo test --quiet --locked --release -p liqo-virtual-kubelet \
  reflection::footprint::footprint -- --ignored --exact --nocapture --test-threads=1 2>&1 |
  sed -n '/stores of/,/^(remote events, new)/{s/^test .* \.\.\. //;p}'
