#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on the vLLM 0.33 wheelhouse (VLLM=0.33.0 build_wheelhouse.sh): our
# connector and upstream's on the Qwen3-Next shape, agentic 8k at c=1 and 8, each set-up fresh. Decode-only CUDA
# graphs by default (GRAPHS=full for vLLM's defaults: the first engine compiles for minutes on a new torch).
# Each line appends to /root/res/done.txt ("v-all" at the end).
set -u
DEADLINE_S=900
. deploy/gpu/plans/common.sh
for s in hybrid-pd-1p1d upstream; do run qwen3next $s v; done
echo v-all >> "$R/done.txt"
