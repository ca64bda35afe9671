#!/usr/bin/env bash
# A plan for `bench_gpu.sh background`: agentic 8k at c=1 and 8 on the Qwen3-Next shape, every set-up on this
# machine, ours with P at the block boundary (the default) and at N-1 tokens; then the Nemotron-H shape.
# Each line appends to /root/res/done.txt ("q-all" after the Qwen3-Next shape, "all" at the end).
# N1=0 skips the N-1 variant. GRAPHS=full runs vLLM's default CUDA graphs (piecewise + compile; the first engine compiles for minutes).
set -u
. deploy/gpu/plans/common.sh
mkdir -p "$R/q" "$R/n"
for s in colocated upstream hybrid-pd-1p1d; do run qwen3next $s q; done
[ "${N1:-1}" = 1 ] && HYBRID_PD_PREFILL_TO_BOUNDARY=0 run qwen3next hybrid-pd-1p1d q --tag=-n1
echo q-all >> "$R/done.txt"
bash deploy/gpu/bench_gpu.sh model nemotronh > "$R/n/model.log" 2>&1
for s in colocated upstream hybrid-pd-1p1d; do run nemotronh $s n; done
echo all >> "$R/done.txt"
