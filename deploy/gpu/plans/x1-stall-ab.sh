#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on ONE GPU: whether ours' decider should price P's stall of D's streams at half
# of D's own on a shared GPU (--shared-device-stall 0.5) rather than all of it (1.0, the default). On 2026-12-07 (the
# Nemotron-H shape, agentic 8k, c=8; 2026-12-07-h100-nemotronh-judged-c8-vllm033) 0.5 gave TTFT p50 0.87x upstream's
# and 8 of 40 turns through P, where the default on 2026-12-06 gave 1.20x and 1 of 40: runs of two days. Here A/B/A on
# the same engines (the default, then 0.5, then 1.0 again, each with a fresh proxy and salted prompts), then upstream
# PD and the colocated floor, at c = CONC (default 1,8,32; a c=8 cell of 40 turns lasts ~3.5 s, so its p50 moves by
# 10-15% run to run). The Nemotron-H shape is built first. Results under jab, "jab-all" at the end. ~650 s of device
# time after the wheelhouse is in (the first engine compiles: ~190 s of it). Run 2026-12-07 (ours only: the machine
# went back during upstream's start): 0.5 lost p90 and output at c=8 and 32
# (2026-12-07-h100-nemotronh-stall-ab-vllm033).
set -u
export KIND=nemotronh
. deploy/gpu/plans/common.sh
shape nemotronh
more=(--concurrency "${CONC:-1,8,32}" --vllm-args=--jit-monitor-verbose)
run nemotronh hybrid-pd-1p1d jab --proxy-variants="--shared-device-stall 0.5;--shared-device-stall 1.0" "${more[@]}"
run nemotronh upstream jab "${more[@]}"
run nemotronh colocated jab "${more[@]}"
echo jab-all >> "$R/done.txt"
