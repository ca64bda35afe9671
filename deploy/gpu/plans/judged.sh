#!/usr/bin/env bash
# A plan for `bench_gpu.sh background`: where PD is judged, on one machine, vLLM's default CUDA graphs: upstream PD,
# ours (the placement model, P's call learned under load, each turn logged), the colocated floor, then ours with
# the peers' deciders (Dynamo's isl-bounding, llm-d's non-cached-tokens) on the same engines' flags; agentic 8k at
# c = CONC (default 1,8,32). VLLM_ARGS: more vLLM flags for every engine (vLLM >= 0.32: --jit-monitor-verbose,
# every kernel compiled while serving). Each line appends to /root/res/done.txt ("j-all" at the end).
set -u
GRAPHS=${GRAPHS:-full}
. deploy/gpu/plans/common.sh
more=(--concurrency "${CONC:-1,8,32}"); [ -n "${VLLM_ARGS:-}" ] && more+=(--vllm-args="$VLLM_ARGS")
for s in upstream hybrid-pd-1p1d colocated; do run qwen3next $s j "${more[@]}"; done
for p in isl-bounding non-cached-tokens; do
  run qwen3next hybrid-pd-1p1d j --tag="-$p" --proxy-args="--pd-policy $p" "${more[@]}"
done
echo j-all >> "$R/done.txt"
