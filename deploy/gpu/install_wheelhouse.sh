#!/usr/bin/env bash
# On a GPU machine without a package index: reassemble the wheelhouse built by build_wheelhouse.sh (its split
# parts may arrive over several calls), verify it, and install it with --no-deps on top of the image's torch.
#   bash deploy/gpu/install_wheelhouse.sh WHEELHOUSE_DIR SITE_DIR ; export PYTHONPATH=SITE_DIR
set -euo pipefail
SRC=${1:?wheelhouse folder}; SITE=${2:?site folder}
cd "$SRC"
for first in *.whl.part00; do
  [ -e "$first" ] || continue
  whl=${first%.part00}; cat "$whl".part* > "$whl"
done
sha256sum --quiet -c SHA256SUMS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" ./*.whl
echo "installed into $SITE: export PYTHONPATH=$SITE"
