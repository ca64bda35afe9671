#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on ONE GPU (nvidia-h100-x1 / nvidia-h200): where our prefiller loses under
# bursts of P legs (2026-12-06-h100-nemotronh-judged-vllm033: bursts of 8 on the Nemotron-H shape, ours' first
# answer 1.5-2.0x upstream's, its last 1.08-1.15x; a single P leg 60-62 ms against the same engine's plain request
# 56 and upstream's 55-58). The Nemotron-H shape (built first), then benchmarks/gpu/prefill_probe.py --burst P_BURST
# (default 8) for upstream, ours, ours with the KV integrity digests off and the engine without a connector, one
# after the other on the same GPU, each with --profile (the last round under vLLM's torch profiler: GPU kernel time
# against the step's wall time). Results under pb, a line per set-up in done.txt, "pb-all" at the end; then, with
# JUDGED=1, the agentic 8k judged run at c = CONC (default 8) for upstream and ours every turn through P (results
# under j1p, "j1p-all"): whether the remote path's c=8 TTFT (ours 462 ms p50 against upstream's 209) moved.
set -u
export KIND=nemotronh
. deploy/gpu/plans/common.sh
export PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH} PATH=/root/site/bin:$PATH
bash deploy/gpu/bench_gpu.sh model nemotronh > "$R/model-nemotronh.log" 2>&1
echo "model nemotronh rc=$?" >> "$R/done.txt"
mkdir -p /tmp/probe-0
for setup in ${P_SETUPS:-upstream hybrid hybrid-nodigest none}; do
  probe pb "$setup" 0 --burst "${P_BURST:-8}" --profile
done
echo pb-all >> "$R/done.txt"
if [ "${JUDGED:-1}" = 1 ]; then
  run nemotronh upstream j1p --concurrency "${CONC:-8}"
  run nemotronh hybrid-pd-1p1d j1p --proxy-variants="--pd-policy always-remote" --concurrency "${CONC:-8}"
  echo j1p-all >> "$R/done.txt"
fi
echo x1-all >> "$R/done.txt"
