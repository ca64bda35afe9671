#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on ONE GPU (nvidia-h100-x1 / nvidia-h200), where PD is judged: the Nemotron-H
# shape (built first, `bench_gpu.sh model nemotronh`) with P and D sharing the GPU, vLLM 0.33, decode-only CUDA graphs,
# agentic 8k at c = CONC (default 1,8): upstream PD, ours (its own decider; then on the same engines with a fresh
# proxy and salted prompts N_VARIANTS, default --early-decode, with the prefiller's own delivery of its params, and
# the ITL objective at the judged SLO's 50 ms), then the colocated floor (results under j1n, mark "j1n-all"). Then
# the prefiller alone under bursts of P_BURST (default 8) P legs at once, upstream's and ours one after the other on
# the same GPU (benchmarks/gpu/prefill_probe.py --burst; results under pb, mark "pb"): whether ours' P calls that
# arrive together end together. "x1-all" at the end.
set -u
export KIND=nemotronh
GRAPHS=${GRAPHS:-decode}
. deploy/gpu/plans/common.sh
shape nemotronh
more=(--concurrency "${CONC:-1,8}" --vllm-args=--jit-monitor-verbose)
run nemotronh upstream j1n "${more[@]}"
run nemotronh hybrid-pd-1p1d j1n --proxy-variants="${N_VARIANTS---early-decode;--itl-slo-ms 50}" "${more[@]}"
run nemotronh colocated j1n "${more[@]}"
echo j1n-all >> "$R/done.txt"
mkdir -p /tmp/probe-0
probe pb upstream 0 --burst "${P_BURST:-8}"
probe pb hybrid 0 --burst "${P_BURST:-8}"
echo pb >> "$R/done.txt"
echo x1-all >> "$R/done.txt"
