#!/usr/bin/env bash
# Builds the test clusters' binaries (kube-apiserver, kubelet,
# kube-controller-manager, kube-scheduler, kube-proxy, kubectl, etcd, kwok),
# metrics-server (which scrapes kubelets, the virtual kubelet among them),
# CoreDNS (the clusters' DNS) and local-path-provisioner (the real nodes'
# storage) from the Go modules pinned beside this script, into a cache
# outside the repository.
#
# The cache folder is keyed by the hash of the pins (go.mod, go.sum, the
# sources here and build_rev below), so a build happens only when a pin changes. The folder's
# path is printed as the last line of stdout.
#
#   LIQO_TOOLCHAIN_CACHE  where cached builds live
#                         (default: ${XDG_CACHE_HOME:-$HOME/.cache}/liqo-rs/toolchain)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${LIQO_TOOLCHAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/liqo-rs/toolchain}
# Bump when the way the binaries are built changes (flags, list).
build_rev=4
key=$( (echo "$build_rev"; cd "$here" && cat go.work go.work.sum */go.mod */go.sum */*.go) | sha256sum | cut -c1-16)
out="$cache_root/$key"
bins=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl etcd kwok metrics-server coredns
  local-path-provisioner)

complete() {
  for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done
}

if complete; then
  echo "$out"
  exit 0
fi

command -v go >/dev/null || { echo "error: Go is needed to build the test clusters' binaries" >&2; exit 1; }
mkdir -p "$cache_root"
# One build at a time: parallel test processes wait for the first one.
exec 9>"$cache_root/.lock"
flock 9
if complete; then
  echo "$out"
  exit 0
fi
staging=$(mktemp -d "$cache_root/.build-XXXXXX")
trap 'rm -rf "$staging"' EXIT

export CGO_ENABLED=0 GOWORK="$here/go.work"
flags=(-trimpath -ldflags=-s\ -w)
start=$(date +%s)
echo "building control-plane binaries into $out (this takes a while once)" >&2
# Stamp the version the way Kubernetes' own build does, so that the servers
# and kubectl report the pinned release rather than v0.0.0-master.
k8s_version=$(cd "$here/kubernetes" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=${k8s_version#v1.}; minor=${minor%%.*}
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
# Kubernetes' own, then the workspace's others (go.work: one set of
# Kubernetes' libraries, each package compiled once for all); then those
# built on their own pins.
(cd "$here/kubernetes" && go build -trimpath -ldflags="-s -w$stamp" -o "$staging/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kubectl)
(cd "$here/kubernetes" && go build "${flags[@]}" -o "$staging/" sigs.k8s.io/metrics-server/cmd/metrics-server)
(cd "$here/coredns" && go build "${flags[@]}" -o "$staging/coredns" .)
export GOWORK=off
(cd "$here/etcd" && go build "${flags[@]}" -o "$staging/etcd" .)
(cd "$here/kwok" && go build "${flags[@]}" -o "$staging/" sigs.k8s.io/kwok/cmd/kwok)
(cd "$here/local-path-provisioner" && go build "${flags[@]}" -o "$staging/" github.com/rancher/local-path-provisioner)
echo "built in $(( $(date +%s) - start ))s" >&2

# Publish whole or not at all: a run interrupted above leaves no half cache.
rm -rf "$out"
mv "$staging" "$out"
trap - EXIT
echo "$out"
