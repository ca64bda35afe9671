#!/usr/bin/env bash
# A plan for `bench_gpu.sh background`: where PD is judged, on one machine, vLLM's default CUDA graphs: upstream PD,
# ours (the placement model, P's call learned under load, each turn logged) and, on the same engines with a fresh
# proxy and prompts of their own (--proxy-variants), the peers' deciders (Dynamo's isl-bounding, llm-d's
# non-cached-tokens), ours without the shared-GPU term (--no-shared-device: as before 2026-11-26's H100 run), ours
# without the next turn's term (--no-next-turn: as before the two-H100 run), ours without the prefiller's queue
# term (--no-prefiller-queue: as before its second run) and ours
# under an ITL objective for D's streams (--itl-slo-ms ITL_SLO_MS, default 60: a short
# tail's prefill step, ~40 ms on top of a ~6 ms decode step, fits; a step of thousands of prompt tokens on D does
# not), then the colocated floor; agentic 8k at c = CONC (default 1,8,32). VLLM_ARGS: more vLLM flags for every
# engine (vLLM >= 0.32: --jit-monitor-verbose, every kernel compiled while serving); RATES (e.g. 2,4): the agentic 8k
# trace replayed open loop at each rate (requests/s) too. Each line appends to
# /root/res/done.txt ("j-all" at the end).
set -u
GRAPHS=${GRAPHS:-full}
. deploy/gpu/plans/common.sh
more=(--concurrency "${CONC:-1,8,32}"); [ -n "${VLLM_ARGS:-}" ] && more+=(--vllm-args="$VLLM_ARGS")
[ -n "${RATES:-}" ] && more+=(--workloads agentic,trace --rate "$RATES")  # and the agentic trace open loop at each
run qwen3next upstream j "${more[@]}"
peers="--pd-policy isl-bounding;--pd-policy non-cached-tokens;--itl-slo-ms ${ITL_SLO_MS:-60};--no-shared-device;--no-next-turn;--no-prefiller-queue"
run qwen3next hybrid-pd-1p1d j --proxy-variants="$peers" "${more[@]}"
run qwen3next colocated j "${more[@]}"
echo j-all >> "$R/done.txt"
