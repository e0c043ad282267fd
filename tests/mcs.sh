#!/usr/bin/env bash
# The sig-multicluster conformance suite of the Multi-Cluster Services API
# (../shared/mcs-conformance, pinned to mcs-api v0.5.0) against two or
# three real testbed clusters with real nodes, peered with network so that
# they form one clusterset: a peers with b (and with c, and b with c, when
# three). Writes the suite's report.yaml and report.html into
# target/mcs-conformance/<the run's folder name>/ and prints its counts.
# CI runs it (.ci/run) after the test command:
#   bash tests/mcs.sh [--clusters 2|3] [--same-pod-cidrs] [--dir DIR] [--down] [-- SUITE FLAGS]
# With --build-suite, it only builds the suite into its cache (CI does so
# beside the test command, at the lowest priority).
# The clusters are left running for a look (but with --down); stop them with
#   target/debug/liqo-testbed down --dir DIR
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
clusters=2
same=false
down=false
build_only=false
dir=.liqo-mcs
while [ $# -gt 0 ]; do
  case "$1" in
    --clusters) clusters=$2; shift 2 ;;
    --same-pod-cidrs) same=true; shift ;;
    --dir) dir=$2; shift 2 ;;
    --down) down=true; shift ;;
    --build-suite) build_only=true; shift ;;
    --) shift; break ;;
    *) echo "usage: $0 [--clusters 2|3] [--same-pod-cidrs] [--dir DIR] [--down] [--build-suite] [-- SUITE FLAGS]" >&2; exit 2 ;;
  esac
done
case "$clusters" in 2) names=(a b) ;; 3) names=(a b c) ;; *) echo "error: --clusters is 2 or 3" >&2; exit 2 ;; esac
suite_src=$(cd .. && pwd)/shared/mcs-conformance
[ -d "$suite_src" ] || { echo "error: the suite is not at $suite_src" >&2; exit 1; }

# The suite, built once into the cache (from a copy: its folder is left
# as it is; one build at a time).
cache=${XDG_CACHE_HOME:-$HOME/.cache}/liqo-rs/mcs-conformance
suite="$cache/$( (cat "$suite_src"/go.mod "$suite_src"/go.sum "$suite_src"/*.go) | sha256sum | cut -c1-16)"
mkdir -p "$cache"
(
  flock 9
  if [ ! -x "$suite/mcs-conformance" ]; then
    work=$(mktemp -d)
    cp -r "$suite_src"/. "$work"
    (cd "$work" && GOWORK=off go test -c -o "$work/mcs-conformance" .)
    mkdir -p "$suite"
    mv "$work/mcs-conformance" "$suite/"
    rm -rf "$work"
  fi
) 9>"$cache/.lock"
if $build_only; then exit 0; fi

toolchain=$(bash tests/setup.sh | tail -n 1)
export LIQO_TOOLCHAIN_DIR="$toolchain"
cargo build --workspace --bins --locked
testbed=target/debug/liqo-testbed
liqoctl=target/debug/liqoctl
"$testbed" down --dir "$dir" >/dev/null
args=()
for n in "${names[@]}"; do args+=(--cluster "$n"); done
if $same; then args+=(--same-pod-cidr); fi
"$testbed" up --dir "$dir" "${args[@]}" --nodes 0 --real-node
if $down; then trap '"$testbed" down --dir "$dir" >/dev/null 2>&1 || true' EXIT; fi
for n in "${names[@]}"; do
  "$liqoctl" --kubeconfig "$dir/$n/kubeconfig" install --cluster-name "$n" --yes
done
peer() {
  "$liqoctl" --kubeconfig "$dir/$1/kubeconfig" peer --remote-kubeconfig "$dir/$2/kubeconfig" \
    --cpu 2 --memory 4Gi --pods 50 --yes
}
peer a b
if [ "$clusters" = 3 ]; then peer a c; peer b c; fi
for n in "${names[@]}"; do
  "$toolchain/kubectl" --kubeconfig "$dir/$n/kubeconfig" -n kube-system rollout status deployment/coredns --timeout=120s >/dev/null
done

# One kubeconfig, a context per cluster (their users renamed apart).
merged="$dir/merged.kubeconfig"
files=()
for n in "${names[@]}"; do
  sed "s/testbed-admin/$n-admin/g" "$dir/$n/kubeconfig" > "$dir/$n/kubeconfig.renamed"
  files+=("$dir/$n/kubeconfig.renamed")
done
KUBECONFIG=$(IFS=:; echo "${files[*]}") "$toolchain/kubectl" config view --flatten > "$merged"

contexts=$(IFS=,; echo "${names[*]}")
reports="target/mcs-conformance/$(basename "$dir")"
mkdir -p "$reports"
merged=$(cd "$(dirname "$merged")" && pwd)/$(basename "$merged")
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
start=$(date +%s)
status=0
(cd "$reports" && "$suite/mcs-conformance" -kubeconfig "$merged" -contexts "$contexts" \
  -organization liqo-rs -project liqo-rs -version "$version" \
  -url https://example.invalid/liqo-rs "$@") || status=$?
echo "suite ran in $(( $(date +%s) - start )) s against ${#names[@]} clusters (exit $status); report: $reports/report.yaml"
exit "$status"
