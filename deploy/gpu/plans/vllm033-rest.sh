#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on the vLLM 0.33 wheelhouse, after vllm033.sh (upstream and ours): the
# toy PD script on one GPU (deploy/gpu/pd_two_gpu.sh 0 0, the tiny model, its output against one engine's), the
# colocated engine on the agentic 8k workload (the floor for vllm033.sh's ratios), then the family checks in
# groups of two (tests/connector/test_families.py on the GPU), each group's result as soon as it ends. Each line
# appends to /root/res/done.txt ("r-all" at the end).
set -u
DEADLINE_S=900
. deploy/gpu/plans/common.sh
export TRITON_PRINT_AUTOTUNING=1  # each autotuning in the engine logs: where a first shape pays
export PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH} PATH=/root/site/bin:$PATH
mkdir -p "$R/two"
bash deploy/gpu/pd_two_gpu.sh "$R/two" 0 0 > "$R/two/plan.log" 2>&1
echo "two rc=$?" >> "$R/done.txt"
run qwen3next colocated v
for group in qwen3_5,nemotron_h granite_moe_hybrid,falcon_h1 jamba,zamba2 qwen3_next,lfm2; do
  mkdir -p "$R/fam-$group"
  bash deploy/gpu/bench_gpu.sh families "$R/fam-$group" "$group" > "$R/fam-$group/plan.log" 2>&1
  echo "fam $group rc=$?" >> "$R/done.txt"
done
echo r-all >> "$R/done.txt"
