#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on the vLLM 0.33 wheelhouse: judged.sh (upstream PD, ours with the peers'
# deciders and an ITL objective as proxy variants, the colocated floor; agentic 8k at c = 1, 8, 32) with
# decode-only CUDA graphs (as every 0.33 run so far: full graphs compile for minutes per engine there) and
# --jit-monitor-verbose (each kernel vLLM compiles while serving, not only its first compilation: where a first
# shape pays), all three set-ups on one machine; then the families not yet checked on 0.33, in groups of two.
# Each line appends to /root/res/done.txt ("k-all" at the end).
set -u
export GRAPHS=decode CONC=${CONC:-1,8,32} VLLM_ARGS=--jit-monitor-verbose
bash deploy/gpu/plans/judged.sh
R=/root/res
for group in jamba,zamba2 qwen3_next,lfm2 granite_moe_hybrid; do
  mkdir -p "$R/fam-$group"
  bash deploy/gpu/bench_gpu.sh families "$R/fam-$group" "$group" > "$R/fam-$group/plan.log" 2>&1
  echo "fam $group rc=$?" >> "$R/done.txt"
done
echo k-all >> "$R/done.txt"
