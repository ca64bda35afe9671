#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on ONE GPU: the tiny Zamba2 trained with a share of its positions hidden from
# its Mamba mixers for part of its training only (benchmarks/tiny_attention_probe.py, `blind_from` / `blind_until`),
# judged on 12 prompts per tail by both controls: the scrambled attention block must move every prompt past the GPU
# runs' tolerance (~0.056 nats) and the zeroed state by > 1 nat. On an H100 (2026-12-07-h100-zamba2-blind-mixers)
# 1,400 steps blind at 0.3 read attention on 24 of 24 prompts but weighed the state less (zeroed: 0.48-1.64), longer
# blind training the reverse; here blind first and then not, or the other way round (blind first, then not, on torch
# 2.11: the attention read gone on 24 of 24, the state back). ~40 s of training per 1,400 steps and ~60 s of probing
# per variant on an H100; results under tap/, "zamba2-all" in done.txt at the end. Needs transformers and torch only
# (the GPU image's, or the wheelhouse's) and our package on PYTHONPATH (`bench_gpu.sh install WHEEL`, or pip --no-deps
# --target).
set -u
R=/root/res
mkdir -p "$R/tap"
export PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH}
# VARIANTS (space-separated) replaces the three below, e.g. the first alone where device time is short: blind on
# every other step (blind_every=2: 1,400 blind steps interleaved with 1,400 clean ones, where blind first and clean
# after lost the attention read), the same with another seed (weights and corpus drawn again: whether a recipe
# holds, or one training's luck), and at 0.4. STEPS (default 2800) sets the training's length.
for v in ${VARIANTS:-use_mem_rope=1,blind=0.3,blind_every=2 use_mem_rope=1,blind=0.3,blind_every=2,seed=1 \
         use_mem_rope=1,blind=0.4,blind_every=2}; do
  python3 -m benchmarks.tiny_attention_probe --family zamba2 --block 16 --steps "${STEPS:-2800}" --prompts 12 \
    --variant "$v" --out "$R/tap" >> "$R/tap/log.txt" 2>&1
  echo "zamba2 $v rc=$?" >> "$R/done.txt"
done
echo zamba2-all >> "$R/done.txt"
