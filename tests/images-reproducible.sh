#!/usr/bin/env bash
# Builds the images twice from the same commit, each time from nothing in
# a target folder of its own, and compares their digests and bytes: the
# same commit must give the same images (docs/install.md, "Images").
# Takes two release builds (about 10 minutes each on 2 cores).
#   bash tests/images-reproducible.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo build --locked -q -p liqo-images
for run in a b; do
  CARGO_TARGET_DIR="$work/target-$run" ./target/debug/liqo-images --out "$work/images-$run" \
    | tee "$work/digests-$run"
done
if ! diff <(awk 'NR > 1 { print $1, $4 }' "$work/digests-a") <(awk 'NR > 1 { print $1, $4 }' "$work/digests-b"); then
  echo "error: two builds of the same commit gave other digests" >&2
  exit 1
fi
for archive in "$work"/images-a/*.oci.tar; do
  cmp "$archive" "$work/images-b/$(basename "$archive")"
done
echo "reproducible: $(ls "$work/images-a" | wc -l) images, the same digests and bytes twice"
