#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on ONE GPU, after x1-prefill-burst.sh's model (/root/models/nemotronh) and
# engines' compile caches are in place: the Nemotron-H shape's agentic 8k at c = CONC (default 8) only, ours with its
# own decider pricing P's stall of D's streams at half of D's own (--shared-device-stall 0.5) and, on the same
# engines, every turn through P (--pd-policy always-remote), then upstream PD. Results under j8, "j8-all" at the end.
set -u
export KIND=nemotronh
. deploy/gpu/plans/common.sh
export PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH} PATH=/root/site/bin:$PATH
run nemotronh hybrid-pd-1p1d j8 --proxy-args="--shared-device-stall 0.5" --proxy-variants="--pd-policy always-remote" \
  --concurrency "${CONC:-8}"
run nemotronh upstream j8 --concurrency "${CONC:-8}"
echo j8-all >> "$R/done.txt"
