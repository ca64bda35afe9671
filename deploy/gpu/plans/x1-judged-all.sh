#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on ONE GPU: every set-up where PD is judged on the Nemotron-H shape (built
# first), P and D sharing the GPU, decode-only CUDA graphs, in one run: upstream PD, ours with its defaults and, on
# the same engines with a fresh proxy and salted prompts, the peers' deciders (Dynamo's isl-bounding, llm-d's
# non-cached-tokens; upstream's every turn through P, where our PD path's own tax shows), then the colocated floor;
# agentic 8k at c = CONC (default 1,8,32) and the agentic 8k trace closed loop at the same concurrencies and open
# loop at RATES requests/s (default 4,8; empty: none). Results under ja, "ja-all" at the end. ~900 s of device time
# after the wheelhouse is in (the first engine compiles: ~190 s, 318 s on a fresh machine on 2026-12-07; RATES and
# the trace ~180 s of it). Where device
# time is short: PEERS (';'-separated proxy variants) and COLOCATED=0 leave set-ups out (ours against upstream
# alone where ours lost or had not run beside it: PEERS= COLOCATED=0 RATES=
# CONC=8,32, ~420 s). FAMILY_GROUPS (e.g. zamba2,
# whose tiny model's recipe changed on 2026-12-07): families-033.sh's family checks of those groups after ("f-all").
# Its results folder's extra_ratios.json (benchmarks/gpu/merge.py) can carry what this run does not measure, each with
# its source: proxy_cpu_vs_router_max (1.21, 2026-12-07-cpu-proxy-cpu), prefill_vs_upstream_prefill (1.002,
# 2026-12-07-h100-nemotronh-prefill-burst-vllm033).
set -u
export KIND=nemotronh
. deploy/gpu/plans/common.sh
shape nemotronh
more=(--concurrency "${CONC:-1,8,32}")
[ -n "${RATES-4,8}" ] && more+=(--workloads agentic,trace --rate "${RATES-4,8}")
run nemotronh upstream ja "${more[@]}"
# (--learn-local-alone, ours' local prefill rates learned from turns alone on D, is left out: 1.01x ours' defaults
# on the CPU bed at c=3, benchmarks/results/2026-12-08-cpu-pd-policies-itl; add it to PEERS to try it on the GPU)
peers=${PEERS---pd-policy isl-bounding;--pd-policy non-cached-tokens;--pd-policy always-remote}
run nemotronh hybrid-pd-1p1d ja --proxy-variants="$peers" "${more[@]}"
[ "${COLOCATED:-1}" = 1 ] && run nemotronh colocated ja "${more[@]}"
echo ja-all >> "$R/done.txt"
if [ -n "${FAMILY_GROUPS:-}" ]; then bash deploy/gpu/plans/families-033.sh; fi
