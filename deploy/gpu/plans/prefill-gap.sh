#!/usr/bin/env bash
# A plan for `bench_gpu.sh background`: where our prefiller's time goes with vLLM's default CUDA graphs (full and
# piecewise; the 2026-11-26 agentic run had our P at 107 ms against upstream's 66 ms on the same 4,858-token turn),
# then the agentic 8k comparison again (upstream, ours at the block boundary, ours at N-1), Qwen3-Next shape.
# Marks in /root/res/done.txt: "probes" after the three probes, "all" at the end.
set -u
R=/root/res; mkdir -p "$R/p" "$R/q"
export UCX_CUDA_IPC_ENABLE_GET_ZCOPY=on
M=/root/models/qwen3next
export PYTHONPATH=/root/site PATH=/root/site/bin:$PATH  # what bench_gpu.sh install put there
probe() { local setup=$1; shift
  python3 -m benchmarks.gpu.prefill_probe --setup "$setup" --model $M --out "$R/p" --graphs full "$@" \
    > "$R/p/$setup.log" 2>&1
  echo "p $setup rc=$?" >> "$R/done.txt"; }
probe upstream --profile
probe hybrid --profile
probe none
echo probes >> "$R/done.txt"
B="--workloads agentic --lengths 8192 --concurrency 1,8 --deadline-s 900 --graphs full"
run() { local setup=$1; shift
  bash deploy/gpu/bench_gpu.sh run "$setup" qwen3next "$R/q" $B "$@" > "$R/q/$setup$*.log" 2>&1
  echo "q $setup $* rc=$?" >> "$R/done.txt"; }
run upstream
HYBRID_PD_PREFILL_TO_BOUNDARY=0 run hybrid-pd-1p1d --tag=-n1
run hybrid-pd-1p1d
echo all >> "$R/done.txt"
