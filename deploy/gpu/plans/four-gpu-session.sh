#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on a four-GPU machine (nvidia-h100-x4 / nvidia-h200-x4), one carry of the
# wheelhouse for three things side by side:
# - GPUs 2 and 3: judged-2gpu.sh at c = CONC (default 1) with P on GPU 2 and D on GPU 3: upstream PD, ours with
#   its own decider and the always-remote variants (P stopping at the aligned boundary, and at N-1 with
#   --prefiller-stop last: our PD tax, merge.py pd_overhead_ms_c1 and pd_overhead_ms_c1_at_n_minus_1), then the
#   colocated engine alone on GPU 3 (one engine's own HTTP path, for the tax); upstream's P beside ours on the
#   same prompts gives the prefiller gap. Marks "j2-all".
# - GPUs 0 and 1: the family checks (families-033.sh), FAMILY_GROUPS dealt out to both, PYTEST_ADDOPTS (default:
#   the PD parity test and the scrambled-attention control) narrowing what each family runs. Marks "f-all".
# "x4-all" once both are done.
set -u
. deploy/gpu/plans/common.sh  # the KV digest check once, before both sides source it
export PYTEST_ADDOPTS=${PYTEST_ADDOPTS:-"-k 'test_pd_output or scrambled'"}
( FAMILY_GPUS="0 1" \
  FAMILY_GROUPS=${FAMILY_GROUPS:-"qwen3_next nemotron_h,lfm2 qwen3_5,falcon_h1 zamba2,jamba,granite_moe_hybrid"} \
  bash deploy/gpu/plans/families-033.sh ) &
( unset PYTEST_ADDOPTS
  P_GPU=2 D_GPU=3 CONC=${CONC:-1} COLD_C8=${COLD_C8:-0} VLLM_ARGS=${VLLM_ARGS:---jit-monitor-verbose} \
  VARIANTS=${VARIANTS:-"--pd-policy always-remote;--pd-policy always-remote --prefiller-stop last"} \
  bash deploy/gpu/plans/judged-2gpu.sh )
wait
echo x4-all >> /root/res/done.txt
