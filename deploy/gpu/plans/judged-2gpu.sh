#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on a two-GPU machine (nvidia-h100-x2 / nvidia-h200-x2): judged.sh's
# comparison with P on GPU 0 and D on GPU 1 (P_GPU, D_GPU: others), as PD is deployed (no --shared-device: the benchmark sets it only
# where P and D share a GPU), and the colocated engine alone on GPU 1 (ratios per GPU: PD uses two). Decode-only
# CUDA graphs unless GRAPHS says otherwise; agentic 8k at c = CONC (default 1,8,32); every engine at
# --gpu-memory-utilization UTIL (default 0.28, as the one-GPU runs). Each line appends to /root/res/done.txt
# ("j2-all" at the end). Ours' variants: always-remote (every turn through P, stopping where P's connector does
# by default: HYBRID_PD_PREFILL_TO_BOUNDARY=auto; its phase probe gives our PD tax where
# ours serves the probe on D alone, merge.py pd_overhead_ms_c1; again with P computing N-1, --prefiller-stop last,
# pd_overhead_ms_c1_at_n_minus_1), the peers' deciders, the ITL objective, ours
# without the next turn's term and ours without the prefiller's queue term (each an A/B on the engines that served
# ours; --early-decode gained nothing in 2026-11-26-h100x2-qwen3next-judged-vllm033-r2); VARIANTS: another list
# (";"; set and empty: none). COLD_C8=1 (default) first runs ours at c=8 alone on fresh engines and a fresh proxy (part
# hybrid-pd-1p1d-cold): in 2026-11-27-h100x2-qwen3next-judged-vllm033-r3 ours led upstream at c=8 after the c=1
# cell had taught the proxy its rates, and lost from a cold proxy. KIND: the model (qwen3next, or nemotronh: build it
# first with `bench_gpu.sh model`); J: the results' folder under /root/res and the mark ("$J-all"; default j2).
set -u
GRAPHS=${GRAPHS:-decode}
. deploy/gpu/plans/common.sh
more=(--concurrency "${CONC:-1,8,32}" --prefill-gpu "${P_GPU:-0}" --decode-gpu "${D_GPU:-1}" --util "${UTIL:-0.28}")
[ -n "${VLLM_ARGS:-}" ] && more+=(--vllm-args="$VLLM_ARGS")
K=${KIND:-qwen3next} J=${J:-j2}
run "$K" upstream "$J" "${more[@]}"
[ "${COLD_C8:-1}" = 1 ] && run "$K" hybrid-pd-1p1d "$J" "${more[@]}" --concurrency 8 --tag=-cold
peers=${VARIANTS-"--pd-policy always-remote;--pd-policy always-remote --prefiller-stop last;--pd-policy isl-bounding;--pd-policy non-cached-tokens;--itl-slo-ms ${ITL_SLO_MS:-60};--no-next-turn;--no-prefiller-queue"}
if [ -n "$peers" ]; then run "$K" hybrid-pd-1p1d "$J" --proxy-variants="$peers" "${more[@]}"
else run "$K" hybrid-pd-1p1d "$J" "${more[@]}"; fi
run "$K" colocated "$J" "${more[@]}"
echo "$J-all" >> "$R/done.txt"
