#!/usr/bin/env bash
# On a GPU machine without a package index: reassemble the wheelhouse built by build_wheelhouse.sh (its split
# parts may arrive over several calls), verify it, and install it with --no-deps on top of the image (vLLM 0.33's
# wheelhouse brings its own torch, which then shadows the image's). Then check_site.py walks the requirements of
# vLLM, hybrid-pd and NIXL through what Python finds first, SITE_DIR before the image: it lists the versions that
# differ from a pin and fails if one is missing.
#   bash deploy/gpu/install_wheelhouse.sh WHEELHOUSE_DIR SITE_DIR ; export PYTHONPATH=SITE_DIR
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=${1:?wheelhouse folder}; SITE=${2:?site folder}
cd "$SRC"
for first in *.whl.part00; do
  [ -e "$first" ] || continue
  whl=${first%.part00}; cat "$whl".part* > "$whl"
done
sha256sum --quiet -c SHA256SUMS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" ./*.whl
PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} python3 "$HERE/check_site.py" "$HERE/image-packages.txt" vllm hybrid-pd nixl
echo "installed into $SITE: export PYTHONPATH=$SITE"
