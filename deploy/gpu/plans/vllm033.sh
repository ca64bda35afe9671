#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on the vLLM 0.33 wheelhouse (VLLM=0.33.0 build_wheelhouse.sh): our
# connector and upstream's on the Qwen3-Next shape, agentic 8k at c=1 and 8, each set-up fresh. Decode-only CUDA
# graphs by default (GRAPHS=full for vLLM's defaults: the first engine compiles for minutes on a new torch).
# Each line appends to /root/res/done.txt ("v-all" at the end).
set -u
R=/root/res; mkdir -p "$R/v"
export UCX_CUDA_IPC_ENABLE_GET_ZCOPY=on
B="--workloads agentic --lengths 8192 --concurrency 1,8 --deadline-s 900 --graphs ${GRAPHS:-decode}"
run() { local kind=$1 setup=$2 dir=$3; shift 3
  bash deploy/gpu/bench_gpu.sh run "$setup" "$kind" "$R/$dir" $B "$@" > "$R/$dir/$setup$*.log" 2>&1
  echo "$dir $setup $* rc=$?" >> "$R/done.txt"; }
for s in hybrid-pd-1p1d upstream; do run qwen3next $s v; done
echo v-all >> "$R/done.txt"
