#!/usr/bin/env bash
# A plan for `bench_gpu.sh background`: agentic 8k at c=1 and 8 on the Qwen3-Next shape with vLLM's default CUDA
# graphs, upstream PD first, then ours (the placement model picks D alone, P to the boundary or P to N-1 per turn,
# and logs each choice), then the colocated engine. Each line appends to /root/res/done.txt ("q-all" at the end).
set -u
GRAPHS=${GRAPHS:-full}
. deploy/gpu/plans/common.sh
for s in upstream hybrid-pd-1p1d colocated; do run qwen3next $s q; done
echo q-all >> "$R/done.txt"
