#!/usr/bin/env bash
# Installs what the tests and the demo need on a fresh machine, and does
# nothing more when it is already there: Rust's rustfmt and clippy, Debian
# packages, and the control-plane binaries (built from pinned Go modules,
# cached outside the repository). Prints the binaries' folder last.
# With --without-toolchain, all but the control-plane binaries (the test
# command builds them beside cargo's builds: tests/toolchain/build.sh).
#   bash tests/setup.sh [--without-toolchain]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
with_toolchain=true
case "${1:-}" in
  "") ;;
  --without-toolchain) with_toolchain=false ;;
  *) echo "usage: $0 [--without-toolchain]" >&2; exit 2 ;;
esac

need() { command -v "$1" >/dev/null 2>&1; }

need cargo || { echo "error: cargo is needed (https://rustup.rs)" >&2; exit 1; }
need go || { echo "error: Go is needed to build the test clusters' binaries" >&2; exit 1; }
if need rustup; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt >&2
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy >&2
fi

# Debian packages: flock (util-linux) for the toolchain cache; python3
# serves HTTP for the stand-in agent of the host-process node's test; the
# tunnel's tests need iproute2, nftables, ping, and standard WireGuard
# (wireguard-tools, Debian's wireguard-go) to talk to; iperf3 is for the
# benchmark; curl fetches from pods in the testbed's pod-network test;
# a C compiler and make build jemalloc, the virtual kubelet's allocator;
# the testbed's real nodes run Debian's containerd, runc and CNI plugins,
# and their toolbox image holds busybox and curl.
packages=()
need cc || packages+=(gcc libc6-dev)
need make || packages+=(make)
need flock || packages+=(util-linux)
need python3 || packages+=(python3)
need ip || packages+=(iproute2)
need nft || packages+=(nftables)
need ping || packages+=(iputils-ping)
need wg || packages+=(wireguard-tools)
need wireguard-go || packages+=(wireguard-go)
need iperf3 || packages+=(iperf3)
need jq || packages+=(jq)
need curl || packages+=(curl)
need containerd || packages+=(containerd)
need runc || packages+=(runc)
[ -x /usr/lib/cni/ptp ] || packages+=(containernetworking-plugins)
[ -x /bin/busybox ] || packages+=(busybox)
# The Multi-Cluster Services conformance suite's images (tests/mcs.sh).
need socat || packages+=(socat)
need nslookup || packages+=(bind9-dnsutils)
need nc.openbsd || packages+=(netcat-openbsd)
need strip || packages+=(binutils)
if [ ${#packages[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: missing packages ${packages[*]}; install them (apt-get install ${packages[*]})" >&2
    exit 1
  fi
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
fi

# The current wireguard-go, which the tunnel's interoperability test runs.
bash tests/wireguard-go/build.sh >/dev/null
if $with_toolchain; then
  bash tests/toolchain/build.sh
fi
