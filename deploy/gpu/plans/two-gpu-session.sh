#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on a two-GPU machine: judged-2gpu.sh (P on GPU 0, D on GPU 1; marks
# "j2-all"), then the family checks (families-033.sh) with four groups dealt out to both GPUs, two on each
# (marks "f-all"). One carry of the wheelhouse serves both.
set -u
bash deploy/gpu/plans/judged-2gpu.sh
FAMILY_GPUS=${FAMILY_GPUS:-"0 1"} \
FAMILY_GROUPS=${FAMILY_GROUPS:-"nemotron_h,granite_moe_hybrid zamba2,jamba qwen3_5,falcon_h1 qwen3_next,lfm2"} \
  bash deploy/gpu/plans/families-033.sh
