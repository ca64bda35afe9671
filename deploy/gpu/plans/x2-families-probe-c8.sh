#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on a two-GPU machine (nvidia-h100-x2 / nvidia-h200-x2), three things in turn:
# 1. The family checks of FAMILY_GROUPS (default "zamba2 jamba", one group a GPU: tests/connector/test_families.py,
#    every test) with the current tiny models, and beside them on GPU 0 benchmarks/tiny_attention_probe.py (how far
#    noise in the last attention block moves each of those models in transformers, per training variant:
#    PROBE_VARIANTS). Marks "f-all" and "tap".
# 2. The prefiller alone, upstream's and ours side by side and swapped (x2-judged-probe.sh's p1 and p2: cold prompts
#    and a conversation's extension). Marks "p1", "p2".
# 3. judged-2gpu.sh at c = CONC (default 8) with VARIANTS (default none). Marks "j2-all". "x3-all" at the end.
# On four GPUs (P_GPU=2 D_GPU=3) 2 and 3 run beside 1 on GPUs 2 and 3; on two, after it.
set -u
. deploy/gpu/plans/common.sh
export PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH} PATH=/root/site/bin:$PATH
A=${P_GPU:-0} B=${D_GPU:-1}
mkdir -p "$R/tap"
( CUDA_VISIBLE_DEVICES=0 python3 -m benchmarks.tiny_attention_probe --family jamba --block 48 --family zamba2 \
    --block 16 $(for v in ${PROBE_VARIANTS:-drop=0 drop=0.3 drop=0.5 mamba_d_conv=2,drop=0}; do printf -- '--variant %s ' "$v"; done) \
    --out "$R/tap" > "$R/tap/probe.log" 2>&1; echo "tap rc=$?" >> "$R/done.txt" ) &
families() { FAMILY_GPUS=${FAMILY_GPUS:-"0 1"} FAMILY_GROUPS=${FAMILY_GROUPS:-"zamba2 jamba"} \
  bash deploy/gpu/plans/families-033.sh; wait; }
if [ "$A" -ge 2 ]; then families & else families; fi
mkdir -p "/tmp/probe-$A" "/tmp/probe-$B"
probe p1 upstream "$A" & p1=$!; probe p1 hybrid "$B"; wait $p1; echo p1 >> "$R/done.txt"
probe p2 hybrid "$A" & p2=$!; probe p2 upstream "$B"; wait $p2; echo p2 >> "$R/done.txt"
CONC=${CONC:-8} COLD_C8=0 VLLM_ARGS=${VLLM_ARGS:---jit-monitor-verbose} VARIANTS=${VARIANTS:-} P_GPU=$A D_GPU=$B \
  bash deploy/gpu/plans/judged-2gpu.sh
wait
echo x3-all >> "$R/done.txt"
