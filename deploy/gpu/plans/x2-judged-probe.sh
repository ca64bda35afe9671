#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on a two-GPU machine (nvidia-h100-x2 / nvidia-h200-x2), one carry for three
# things in turn:
# 1. judged-2gpu.sh for KIND (default qwen3next) at c = CONC (default 1,8), ours first at c=8 on fresh engines and a
#    fresh proxy (COLD_C8=1), then ours with VARIANTS (default: always-remote, and the prefiller-queue term off:
#    its pricing at c=8 with the split priced as P now reports it). Marks "j2-all".
# 2. The prefiller alone (benchmarks/gpu/prefill_probe.py, the judged run's flags: decode-only CUDA graphs, 0.28 of a
#    GPU), upstream's and ours side by side on the two GPUs, then again with the GPUs swapped (a GPU's own speed
#    cancels in the pair), the torch profiler on the first pair's last round; then no connector. Results in
#    /root/res/p1, p2, p3; marks "p1", "p2", "p3".
# 3. With KIND2 (e.g. nemotronh, built first with `bench_gpu.sh model nemotronh`), judged-2gpu.sh for that model at
#    c = CONC2 (default 1) with VARIANTS2 (default always-remote: the PD tax). Marks "j2-KIND2-all".
# "x2-all" at the end.
set -u
. deploy/gpu/plans/common.sh
CONC=${CONC:-1,8} COLD_C8=${COLD_C8:-1} VLLM_ARGS=${VLLM_ARGS:---jit-monitor-verbose} \
  VARIANTS=${VARIANTS:-"--pd-policy always-remote;--no-prefiller-queue"} \
  bash deploy/gpu/plans/judged-2gpu.sh
export PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH} PATH=/root/site/bin:$PATH
mkdir -p /tmp/probe-0 /tmp/probe-1
probe p1 upstream 0 --profile & probe p1 hybrid 1 --profile & wait; echo p1 >> "$R/done.txt"
probe p2 hybrid 0 & probe p2 upstream 1 & wait; echo p2 >> "$R/done.txt"
probe p3 none 0 & probe p3 hybrid-noship 1 & wait; echo p3 >> "$R/done.txt"
if [ -n "${KIND2:-}" ]; then
  KIND=$KIND2 J=j2-$KIND2 CONC=${CONC2:-1} COLD_C8=0 VLLM_ARGS=${VLLM_ARGS:---jit-monitor-verbose} \
    VARIANTS=${VARIANTS2:-"--pd-policy always-remote"} bash deploy/gpu/plans/judged-2gpu.sh
fi
echo x2-all >> "$R/done.txt"
