#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on the vLLM 0.33 wheelhouse: the family checks of every family
# (tests/connector/test_families.py on the GPU: log-probability parity with one engine, the negative controls of
# the decoder-alone turn, short and long tail) with the current tiny models, in three groups side by side on the
# one GPU. One group after another took 509 s for two families (2026-11-26-h100-families-vllm033), so eight in turn
# would take ~34 min, more than a lent machine is held; side by side each engine gets HYBRID_PD_TEST_GPU_UTIL of the
# GPU (3 groups x 5 engines at most, the tests' pool capacity, x 0.06 = 0.9; a tiny model's weights are megabytes).
# FAMILY_GPUS (e.g. "0 1" on a two-GPU machine) deals the groups out to those GPUs in turn (default: the one GPU).
# Each group's line appends to /root/res/done.txt as it ends ("f-all" once all have).
set -u
. deploy/gpu/plans/common.sh  # $R, and the KV digest check first
GROUPS_=${FAMILY_GROUPS:-"nemotron_h,granite_moe_hybrid,falcon_h1 zamba2,jamba,qwen3_5 qwen3_next,lfm2"}
read -r -a gpus <<< "${FAMILY_GPUS:-}"
# each engine's share: 0.9 of a GPU over the engines that may hold it at once (5 a group). On 2 x H100 at 0.06 for
# two groups a GPU (2026-11-26) the GDN families' (Qwen3.5, Qwen3-Next) first engines died at start-up; at 0.18, a
# family a GPU (2026-11-27-h100x2-families-gdn-vllm033), one decoder found -0.03 GiB for its KV cache: vLLM's
# memory profile counted its neighbours' start-up. The tests' GPU engines now size the cache outright
# (tests/support/procs.py, --kv-cache-memory-bytes).
read -r -a groups_ <<< "$GROUPS_"
per_gpu=$(( (${#groups_[@]} + ${#gpus[@]} - 1) / (${#gpus[@]} > 0 ? ${#gpus[@]} : 1) ))
[ ${#gpus[@]} -eq 0 ] && per_gpu=${#groups_[@]}
export HYBRID_PD_TEST_GPU_UTIL=${HYBRID_PD_TEST_GPU_UTIL:-$(python3 -c "print(round(0.9 / (5 * $per_gpu), 3))")}
pids=() i=0
for group in $GROUPS_; do
  mkdir -p "$R/fam-$group"
  [ ${#gpus[@]} -gt 0 ] && export CUDA_VISIBLE_DEVICES=${gpus[$((i % ${#gpus[@]}))]}
  i=$((i + 1))
  ( bash deploy/gpu/bench_gpu.sh families "$R/fam-$group" "$group" > "$R/fam-$group/plan.log" 2>&1
    echo "fam $group rc=$?" >> "$R/done.txt" ) &
  pids+=($!)
  sleep 20  # the groups' first engines start apart: their model builds and CUDA start-ups do not all collide
done
wait "${pids[@]}"
echo f-all >> "$R/done.txt"
