#!/usr/bin/env bash
# A plan for `bench_gpu.sh background`: agentic 8k at c=1 and 8 on the Qwen3-Next shape with vLLM's default CUDA
# graphs, upstream PD first, then ours (the placement model picks D alone, P to the boundary or P to N-1 per turn,
# and logs each choice), then the colocated engine. Each line appends to /root/res/done.txt ("q-all" at the end).
set -u
R=/root/res; mkdir -p "$R/q"
export UCX_CUDA_IPC_ENABLE_GET_ZCOPY=on
B="--workloads agentic --lengths 8192 --concurrency 1,8 --deadline-s 1200 --graphs ${GRAPHS:-full}"
run() { local kind=$1 setup=$2 dir=$3; shift 3
  bash deploy/gpu/bench_gpu.sh run "$setup" "$kind" "$R/$dir" $B "$@" > "$R/$dir/$setup$*.log" 2>&1
  echo "$dir $setup $* rc=$?" >> "$R/done.txt"; }
for s in upstream hybrid-pd-1p1d colocated; do run qwen3next $s q; done
echo q-all >> "$R/done.txt"
