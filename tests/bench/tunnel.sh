#!/usr/bin/env bash
# The tunnel's throughput, latency and CPU, side by side with the
# references, all in one run on this machine: between two network
# namespaces joined by a veth pair, the same iperf3 and ping through
#   - plain veth (no tunnel: the ceiling),
#   - our gateway (`liqo-gateway tunnel`, release build) at both ends,
#     built for this host (glibc) and as the images ship it (static,
#     musl: `liqo-images`),
#   - the current wireguard-go, built from its Go module pinned in
#     tests/wireguard-go (with its TUN and UDP offloads),
#   - Debian's wireguard-go (2022),
#   - boringtun-cli (cargo install, cached).
# For each: TCP throughput with one and with four streams (iperf3, 5 s),
# the tunnel processes' CPU time per gigabit sent (both ends, from
# /proc/PID/stat), and ping's average round trip (200 pings). Then the
# encryption alone on one core (agents/gateway/benches/seal.rs, and
# OpenSSL's where `openssl` is installed).
#
#   sudo bash tests/bench/tunnel.sh [seconds]
# Needs root, iproute2, iperf3, wireguard-tools, wireguard-go, Go, cargo.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
secs=${1:-5}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/liqo-rs
bash tests/setup.sh >/dev/null
source tests/bench/lib.sh
cargo build --quiet --locked --release -p liqo-gateway
ours=$PWD/target/release/liqo-gateway
# The static binary the gateway's image holds.
shipped_images
shipped=$PWD/target/x86_64-unknown-linux-musl/release/liqo-gateway

# The current wireguard-go, built once per pin.
wggo_current=$(bash tests/wireguard-go/build.sh)
wggo_debian=$(command -v wireguard-go)
boringtun=$cache/boringtun-cli/bin/boringtun-cli
if [ ! -x "$boringtun" ]; then
  cargo install --quiet --locked --root "$cache/boringtun-cli" boringtun-cli ||
    cargo install --quiet --root "$cache/boringtun-cli" boringtun-cli
fi

work=$(mktemp -d)
a=lqbench-a-$$ b=lqbench-b-$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
umask 077
wg genkey >"$work/a"; wg genkey >"$work/b"
pub_a=$(wg pubkey <"$work/a"); pub_b=$(wg pubkey <"$work/b")
export WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD=1

setup_link() {
  ip netns add "$a"; ip netns add "$b"
  ip link add va netns "$a" type veth peer name vb netns "$b"
  ip -n "$a" addr add 192.168.77.1/24 dev va; ip -n "$b" addr add 192.168.77.2/24 dev vb
  for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
  ip -n "$a" link set va up; ip -n "$b" link set vb up
}
teardown_link() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  sleep 0.5
}

# Ends of a wg-configured userspace implementation ($1: the binary,
# started in the foreground with the device name).
start_wg() {
  local bin=$1
  for side in a b; do
    # Each end's control socket is named after its device, in a folder
    # that every namespace shares: one name per end.
    local ns=${!side} dev=lq$side$$ addr peer_pub endpoint=()
    if [ "$side" = a ]; then addr=10.99.0.1; peer_pub=$pub_b; endpoint=(endpoint 192.168.77.2:51820)
    else addr=10.99.0.2; peer_pub=$pub_a; fi
    if [ "$bin" = "$boringtun" ]; then
      ip netns exec "$ns" "$bin" --foreground --disable-drop-privileges "$dev" >"$work/$side.log" 2>&1 &
    else
      ip netns exec "$ns" "$bin" -f "$dev" >"$work/$side.log" 2>&1 &
    fi
    pids+=($!)
    for _ in $(seq 50); do ip -n "$ns" link show "$dev" >/dev/null 2>&1 && break; sleep 0.1; done
    ip netns exec "$ns" wg set "$dev" listen-port 51820 private-key "$work/$side" \
      peer "$peer_pub" allowed-ips 10.99.0.0/24 "${endpoint[@]}"
    ip -n "$ns" addr add "$addr/24" dev "$dev"
    ip -n "$ns" link set "$dev" mtu 1420 up
  done
}

# Both ends of our tunnel, with the gateway binary $1.
start_ours() {
  local ours=$1
  ip netns exec "$a" "$ours" tunnel --interface lqb0 --address 10.99.0.1/24 \
    --private-key-file "$work/a" --peer-public-key "$pub_b" \
    --peer-endpoint 192.168.77.2:51820 --allowed-ips 10.99.0.0/24 >"$work/a.log" 2>&1 &
  pids+=($!)
  ip netns exec "$b" "$ours" tunnel --interface lqb0 --address 10.99.0.2/24 \
    --private-key-file "$work/b" --peer-public-key "$pub_a" \
    --allowed-ips 10.99.0.0/24 >"$work/b.log" 2>&1 &
  pids+=($!)
  for ns in "$a" "$b"; do
    for _ in $(seq 50); do ip -n "$ns" link show lqb0 >/dev/null 2>&1 && break; sleep 0.1; done
  done
}

# CPU seconds (user + system) used so far by the tunnel processes and
# their children (ip netns exec forks into them).
cpu() {
  local total=0 p t
  for p in "${pids[@]}"; do
    for t in $(pgrep -P "$p") "$p"; do
      [ -r "/proc/$t/stat" ] || continue
      total=$(awk -v t="$total" '{ print t + $14 + $15 }' "/proc/$t/stat")
    done
  done
  echo "$total"
}

# Bits per second received, from a client in $a to a one-off server in $b.
iperf() {
  local target=$1; shift
  ip netns exec "$b" iperf3 -s -1 >/dev/null 2>&1 &
  local server=$!
  for _ in $(seq 50); do
    ip netns exec "$b" ss -ltn | grep -q ':5201 ' && break
    sleep 0.1
  done
  ip netns exec "$a" iperf3 -c "$target" -t "$secs" -J "$@" >"$work/iperf.json" || true
  wait "$server" 2>/dev/null || true
  local bps
  bps=$(jq -r '.end.sum_received.bits_per_second // empty' "$work/iperf.json")
  if [ -z "$bps" ]; then
    echo "iperf3 failed: $(jq -r '.error // "?"' "$work/iperf.json")" >&2
    echo 0
  else
    echo "$bps"
  fi
}

# One row: name, then the measurements to 10.99.0.2 (or $2).
measure() {
  local name=$1 target=${2:-10.99.0.2}
  # Handshake first.
  for _ in $(seq 40); do ip netns exec "$a" ping -c1 -W1 "$target" >/dev/null 2>&1 && break; done
  local hz c0 c1 one four rtt
  hz=$(getconf CLK_TCK)
  c0=$(cpu)
  one=$(iperf "$target")
  c1=$(cpu)
  four=$(iperf "$target" -P 4)
  rtt=$(ip netns exec "$a" ping -c 200 -i 0.005 -q "$target" | awk -F/ '/^rtt/ { print $5 }')
  local cpu_per_gbit="-"
  if [ "${#pids[@]}" -gt 0 ]; then
    cpu_per_gbit=$(awk -v c="$((c1 - c0))" -v hz="$hz" -v b="$one" -v s="$secs" \
      'BEGIN { printf "%.2f", (c / hz) / (b * s / 1e9) }')
  fi
  awk -v n="$name" -v one="$one" -v four="$four" -v c="$cpu_per_gbit" -v r="$rtt" \
    'BEGIN { printf "%-28s %10.2f %10.2f %14s %10s\n", n, one / 1e9, four / 1e9, c, r }'
}

command -v jq >/dev/null || { echo "error: jq is needed (apt-get install jq)" >&2; exit 1; }
printf '%-28s %10s %10s %14s %10s\n' "path" "1 stream" "4 streams" "CPU s/Gbit" "RTT ms"
printf '%-28s %10s %10s %14s %10s\n' "" "Gbit/s" "Gbit/s" "(1 stream)" "(avg)"
setup_link; measure "plain veth" 192.168.77.2; teardown_link
setup_link; start_ours "$ours"; measure "liqo-gateway (ours)"; teardown_link
setup_link; start_ours "$shipped"; measure "liqo-gateway (ours, static)"; teardown_link
setup_link; start_wg "$wggo_current"; measure "wireguard-go (current)"; teardown_link
setup_link; start_wg "$wggo_debian"; measure "wireguard-go (Debian)"; teardown_link
setup_link; start_wg "$boringtun"; measure "boringtun-cli"; teardown_link

# The ceiling: the encryption alone, on one core, in a loop (nothing
# else running), as the gateway does it (boringtun, with ring's code)
# and as the fastest code this processor runs does it (OpenSSL's).
echo
cargo bench --quiet --locked -p liqo-gateway --bench seal
if command -v openssl >/dev/null; then
  openssl speed -seconds 2 -bytes 1420 -evp chacha20-poly1305 2>/dev/null |
    awk '$1 == "ChaCha20-Poly1305" { v = $2; sub(/k$/, "", v); printf "OpenSSL, 1420-byte packets on one core: seal %.2f Gbit/s\n", v * 8 / 1e6 }'
fi
