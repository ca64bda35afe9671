#!/usr/bin/env bash
# A plan for `bench_gpu.sh background`: the PD tax with and without --early-decode on one GPU, Qwen3-Next shape,
# vLLM's default CUDA graphs. Ours with the placement model forced remote (--pd-policy always-remote: every turn
# pays the tax), then, on the same engines with a fresh proxy and prompts of their own, the same with
# --early-decode (the decoder's params inbox, --params-port, is there in every set-up of ours:
# benchmarks/setups.py); agentic 8k at c = CONC (default 1,8). Per turn, each proxy's log has P's call and the
# time from P's answer to D's first byte ("pd timing" lines, --log-placement; kept in the logs' digest): compare
# them with `python -m benchmarks.early_decode --from-logs hybrid-pd-1p1d-proxy.log
# hybrid-pd-1p1d-proxy-early-decode.log` from the unpacked hybrid-pd-1p1d-logs.tar.gz. Each line appends to
# /root/res/done.txt ("e-all" at the end).
set -u
GRAPHS=${GRAPHS:-full}
. deploy/gpu/plans/common.sh
run qwen3next hybrid-pd-1p1d e --proxy-args="--pd-policy always-remote" --proxy-variants="--early-decode" \
  --concurrency "${CONC:-1,8}"
echo e-all >> "$R/done.txt"
