#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on ONE GPU: the tiny Zamba2 trained with a share of its positions hidden from
# its Mamba mixers for part of its training only (benchmarks/tiny_attention_probe.py, `blind_from` / `blind_until` /
# `blind_every`), judged on 12 prompts per tail by both controls: the scrambled attention block must move every prompt
# past the GPU runs' tolerance (~0.056 nats) and the zeroed state by > 1 nat (the "attention wrong" control, `wrong`,
# reported beside them since 2026-12-07-cpu-attention-wrong-probe). On an H100
# (2026-12-07-h100-zamba2-blind-mixers) 1,400 plain steps and then 1,400 blind at 0.3 did both on 24 of 24 prompts
# (torch 2.11; the build's recipe since, tiny_families.FAMILY_TRAINING), at 0.4 with seed 1 not (2 of 24); blind
# first, throughout or on every other step read attention on some prompts only or lost the state's weight. ~45 s of
# training per 1,400 steps and ~60 s of probing per variant on an H100; results under tap/, "zamba2-all" in done.txt
# at the end. Needs transformers and torch only (the GPU image's, or the wheelhouse's) and our package on PYTHONPATH
# (`bench_gpu.sh install WHEEL`, or pip --no-deps --target).
set -u
R=/root/res
mkdir -p "$R/tap"
export PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH}
# VARIANTS (space-separated) replaces the two below: the build's recipe drawn with other seeds (weights and corpus
# drawn again: whether it holds, or one training's luck). STEPS (default 2800) sets the training's length. FAMILY
# and BLOCK (its aligned block; default zamba2 and 16) probe another family, e.g. FAMILY=jamba BLOCK=48
# VARIANTS=blind=0.3,blind_from=1400 (the tiny Jamba's scrambled block moved it 0.02-0.03 nats on vLLM 0.33; its
# Mamba1 scan in transformers runs token by token without its kernels: fewer STEPS).
f=${FAMILY:-zamba2}
recipe=use_mem_rope=1,blind=0.3,blind_from=1400
for v in ${VARIANTS:-$recipe,seed=1 $recipe,seed=2}; do
  python3 -m benchmarks.tiny_attention_probe --family "$f" --block "${BLOCK:-16}" --steps "${STEPS:-2800}" \
    --prompts 12 --variant "$v" --out "$R/tap" >> "$R/tap/log.txt" 2>&1
  echo "$f $v rc=$?" >> "$R/done.txt"
done
echo "$f-all" >> "$R/done.txt"
