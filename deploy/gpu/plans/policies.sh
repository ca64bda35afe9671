#!/usr/bin/env bash
# A plan for `bench_gpu.sh background`: our connector and proxy on the Qwen3-Next shape with another PD policy
# (POLICY, default always-remote: upstream's toy flow, every turn through P), agentic 8k at c=1 and 8, beside a
# plan's own rows on the same machine. GRAPHS as in the other plans (decode by default).
set -u
R=/root/res; mkdir -p "$R/p"
export UCX_CUDA_IPC_ENABLE_GET_ZCOPY=on
B="--workloads agentic --lengths 8192 --concurrency 1,8 --deadline-s 900 --graphs ${GRAPHS:-decode}"
P=${POLICY:-always-remote}
bash deploy/gpu/bench_gpu.sh run hybrid-pd-1p1d qwen3next "$R/p" $B --tag="-$P" --proxy-args="--pd-policy $P" \
  > "$R/p/hybrid-pd-1p1d-$P.log" 2>&1
echo "p hybrid-pd-1p1d $P rc=$?" >> "$R/done.txt"
echo p-all >> "$R/done.txt"
