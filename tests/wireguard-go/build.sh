#!/usr/bin/env bash
# Builds the current wireguard-go (with its TUN and UDP offloads) from the
# Go module pinned beside this script, once per pin, into a cache outside
# the repository, and prints the binary's path. The tunnel's
# interoperability test and the tunnel benchmark run it.
#
#   LIQO_TOOLCHAIN_CACHE  where cached builds live
#                         (default: ${XDG_CACHE_HOME:-$HOME/.cache}/liqo-rs/toolchain)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${LIQO_TOOLCHAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/liqo-rs/toolchain}
pin=$(cat "$here/go.mod" "$here/go.sum" "$here/tools.go" | sha256sum | cut -c1-16)
out="$cache_root/wireguard-go-$pin/wireguard-go"
if [ -x "$out" ]; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null || { echo "error: Go is needed to build wireguard-go" >&2; exit 1; }
mkdir -p "$cache_root"
exec 9>"$cache_root/.lock-wireguard-go"
flock 9
if [ ! -x "$out" ]; then
  staging=$(mktemp -d "$cache_root/.build-wg-XXXXXX")
  trap 'rm -rf "$staging"' EXIT
  echo "building wireguard-go into $out" >&2
  (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$staging/wireguard-go" golang.zx2c4.com/wireguard)
  mkdir -p "$(dirname "$out")"
  mv "$staging/wireguard-go" "$out"
fi
echo "$out"
