#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on a two-GPU machine with little device time left (~10 minutes after the
# carry): side by side, Qwen3-Next's PD parity check on vLLM 0.33 (tests/connector/test_families.py
# test_pd_output_*, GPU 0; its decoder died at start-up in 2026-11-27-h100x2-families-gdn-vllm033) and ours at c=1
# with the always-remote variant (P on GPU 0, D on GPU 1): the variant's phase probe sends every turn through P, for
# our PD tax (merge.py pd_overhead_ms_c1), and the same with P computing N-1 (--prefiller-stop last,
# pd_overhead_ms_c1_at_n_minus_1). Marks "f-all" and "tax ..." in /root/res/done.txt, then "pt-all".
set -u
. deploy/gpu/plans/common.sh
( FAMILY_GPUS=0 FAMILY_GROUPS=qwen3_next PYTEST_ADDOPTS="-k test_pd_output" bash deploy/gpu/plans/families-033.sh ) &
run qwen3next hybrid-pd-1p1d tax --concurrency 1 --prefill-gpu 0 --decode-gpu 1 --util 0.28 \
  --vllm-args=--jit-monitor-verbose --proxy-variants="--pd-policy always-remote;--pd-policy always-remote --prefiller-stop last"
wait
echo pt-all >> "$R/done.txt"
