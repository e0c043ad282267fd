#!/usr/bin/env bash
# Builds the images (docs/install.md, "Images") and proves them where a
# node runs them: imported into a containerd of the test's own and run by
# runc, each program in its container and the gateway's nft and ip in
# theirs (tests/e2e/tests/images.rs); then the mission on two clusters of
# real nodes holding them (kubelet, containerd, runc, CNI): install, peer,
# offload, requests both ways across the tunnel, unpeer
# (tests/e2e/tests/real_nodes/, with LIQO_AGENT_IMAGES). Installs what
# it needs first: the musl target, Debian's musl-tools, containerd and
# runc, and the test clusters' binaries.
#   bash tests/images.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rustup target list --installed | grep -q '^x86_64-unknown-linux-musl$' \
  || rustup target add x86_64-unknown-linux-musl
packages=()
command -v musl-gcc >/dev/null || packages+=(musl-tools)
command -v containerd >/dev/null || packages+=(containerd)
command -v runc >/dev/null || packages+=(runc)
if [ ${#packages[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}"
fi
start=$(date +%s)
cargo run --locked -q -p liqo-images
echo "images built in $(( $(date +%s) - start )) s"
cargo test --locked -p liqo-e2e --test e2e -- --ignored images::
LIQO_TOOLCHAIN_DIR=$(bash tests/setup.sh | tail -n 1)
export LIQO_TOOLCHAIN_DIR
cargo build --locked --workspace --bins
LIQO_AGENT_IMAGES="$PWD/target/images" \
  cargo test --locked -p liqo-e2e --test e2e -- real_nodes::the_mission_runs_on_real_nodes
