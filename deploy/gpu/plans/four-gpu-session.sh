#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on a four-GPU machine (nvidia-h100-x4 / nvidia-h200-x4), one carry of the
# wheelhouse for two things side by side:
# - GPUs 2 and 3: judged-2gpu.sh at c = CONC (default 1) with P on GPU 2 and D on GPU 3: upstream PD, ours with
#   its own decider and the always-remote variants (P stopping where its connector does by default, at N-1 with
#   --prefiller-stop last, at the aligned boundary with --prefiller-stop boundary: our PD tax, merge.py
#   pd_overhead_ms_c1 and pd_overhead_ms_c1_at_n_minus_1), then the
#   colocated engine alone on GPU 3 (one engine's own HTTP path, for the tax); upstream's P beside ours on the
#   same prompts gives the prefiller gap. Marks "j2-all".
# - GPUs 0 and 1: the family checks (families-033.sh), FAMILY_GROUPS dealt out to both, PYTEST_ADDOPTS (default:
#   the PD parity test and the scrambled-attention control) narrowing what each family runs. Marks "f-all". Or,
#   with KIND2 (e.g. nemotronh, built first with `bench_gpu.sh model nemotronh`), the same comparison for that
#   model with P on GPU 0 and D on GPU 1 (results and mark "j2-KIND2").
# "x4-all" once both are done.
set -u
. deploy/gpu/plans/common.sh  # the KV digest check once, before both sides source it
export PYTEST_ADDOPTS=${PYTEST_ADDOPTS:-"-k 'test_pd_output or scrambled'"}
judged() {  # P_GPU D_GPU KIND J
  ( unset PYTEST_ADDOPTS
    P_GPU=$1 D_GPU=$2 KIND=$3 J=$4 CONC=${CONC:-1} COLD_C8=${COLD_C8:-0} VLLM_ARGS=${VLLM_ARGS:---jit-monitor-verbose} \
    VARIANTS=${VARIANTS:-"--pd-policy always-remote;--pd-policy always-remote --prefiller-stop last;--pd-policy always-remote --prefiller-stop boundary"} \
    bash deploy/gpu/plans/judged-2gpu.sh ); }
if [ -n "${KIND2:-}" ]; then
  judged 0 1 "$KIND2" "j2-$KIND2" &
  sleep 20  # the two sides' first engines start apart
else
  ( FAMILY_GPUS="0 1" \
    FAMILY_GROUPS=${FAMILY_GROUPS:-"qwen3_next nemotron_h,lfm2 qwen3_5,falcon_h1 zamba2,jamba,granite_moe_hybrid"} \
    bash deploy/gpu/plans/families-033.sh ) &
fi
judged 2 3 "${KIND:-qwen3next}" j2
wait
echo x4-all >> /root/res/done.txt
