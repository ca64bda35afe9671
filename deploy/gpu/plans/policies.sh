#!/usr/bin/env bash
# A plan for `bench_gpu.sh background`: our connector and proxy on the Qwen3-Next shape with another PD policy
# (POLICY, default always-remote: upstream's toy flow, every turn through P), agentic 8k at c=1 and 8, beside a
# plan's own rows on the same machine. GRAPHS as in the other plans (decode by default).
set -u
DEADLINE_S=900
. deploy/gpu/plans/common.sh
P=${POLICY:-always-remote}
run qwen3next hybrid-pd-1p1d p --tag="-$P" --proxy-args="--pd-policy $P"
echo p-all >> "$R/done.txt"
