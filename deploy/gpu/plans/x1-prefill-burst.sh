#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on ONE GPU (nvidia-h100-x1 / nvidia-h200): where our prefiller loses under bursts
# of P legs (2026-12-06-h100-nemotronh-judged-vllm033: bursts of 8 on the Nemotron-H shape, ours' first answer 1.5-2.0x
# upstream's, its last 1.08-1.15x; a single P leg 60-62 ms against the same engine's plain request 56 and upstream's
# 55-58), and whether the KV integrity digests are the cause (P digests every block of a completed prompt after its
# step's forward, D every block a READ landed, each with a stream sync). The Nemotron-H shape (built first), then
# benchmarks/gpu/prefill_probe.py --burst P_BURST (default 8) for P_SETUPS (default upstream, ours, ours with the
# digests off, ours given plain requests: hybrid-plain, the same engine and flags with the connector idle), one after
# the other on the same GPU, each with --profile (the last round under vLLM's torch profiler: GPU kernel time against
# the step's wall time). Results under pb, a line per set-up in done.txt, "pb-all" at the end. Then, with JUDGED=1
# (default), agentic 8k at c = CONC (default 1,8): upstream PD, ours with every turn through P, then ours' own decider
# pricing P's stall of D's streams at half (--shared-device-stall 0.5), and every turn through P with the digests off on
# both engines (HYBRID_PD_KV_DIGESTS=0, results under j1p-nd; NODIGEST=0 leaves it out): whether the remote path's c=8
# TTFT (ours 462 ms p50 against upstream's 209) and the PD tax at c=1 (every turn through P) move. Results under j1p,
# "j1p-all", then "x1-all". Since written: D checks landed blocks on a CUDA stream of its own and its landing poll waits
# up to HYBRID_PD_DIGEST_WAIT_MS (3 ms) for them, so a checked load is reported in the step its READ landed (queued
# behind the forward pass: a step later). What to read first in pb/: in that run ours' answers of a cold burst trailed
# upstream's by a near-constant 76-129 ms from the first answer on (178/276/366/457/516 against 102/173/254/329/407 ms):
# a step's worth at the start, then steps 10-20% longer; whether the digests off or queued remove it, and where the
# profiled round puts it. ~1,600 s of device time after the wheelhouse is in (the probes alone, P_SETUPS="hybrid
# upstream" JUDGED=0: ~450 s, install and model included): send the first chunk's call alone, then the rest at once.
# The judged comparison alone, with the one engine for the c=1 floor and no digests-off pass (probes done: see
# 2026-12-07-h100-nemotronh-prefill-burst-vllm033), about 1,100 s after the wheelhouse: P_SETUPS="" NODIGEST=0
# COLOCATED=1 J_VARIANTS="--pd-policy always-remote". The wheelhouse's 52 calls of `stash` take ~170 s of device time
# when the machine stays up; a machine that stops answering loses them all.
set -u
export KIND=nemotronh
. deploy/gpu/plans/common.sh
shape nemotronh
mkdir -p /tmp/probe-0
for setup in ${P_SETUPS-upstream hybrid hybrid-nodigest hybrid-plain}; do
  probe pb "$setup" 0 --burst "${P_BURST:-8}" --profile
done
echo pb-all >> "$R/done.txt"
if [ "${JUDGED:-1}" = 1 ]; then
  remote=(--proxy-variants="--pd-policy always-remote" --concurrency "${CONC:-1,8}")
  # with ours' own decider pricing P's stall of D's streams at half of D's own (--shared-device-stall 0.5) last;
  # J_VARIANTS replaces these proxy variants
  run nemotronh hybrid-pd-1p1d j1p \
    --proxy-variants="${J_VARIANTS---pd-policy always-remote;--shared-device-stall 0.5}" \
    --concurrency "${CONC:-1,8}"
  if [ "${NODIGEST:-1}" = 1 ]; then HYBRID_PD_KV_DIGESTS=0 run nemotronh hybrid-pd-1p1d j1p-nd "${remote[@]}"; fi
  # upstream last (its prefiller compiles ~250 s): where the device time runs out, ours' pair has landed
  run nemotronh upstream j1p --concurrency "${CONC:-1,8}"
  # COLOCATED=1: the one engine too (the floor of ttft_p50_vs_colocated_c1), after the peers
  if [ "${COLOCATED:-0}" = 1 ]; then run nemotronh colocated j1p --concurrency "${CONC:-1,8}"; fi
  echo j1p-all >> "$R/done.txt"
fi
echo x1-all >> "$R/done.txt"
