#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on a four-GPU machine (nvidia-h100-x4 / nvidia-h200-x4): why our turns
# through P lose to upstream's on the Nemotron-H shape at c=8 (2026-11-27-h100x4-nemotronh-judged-vllm033-r2: every
# turn through P 269 vs 158 ms TTFT p50, P's calls for turns that arrived together ending together, late), side by
# side:
# - GPUs 0-1: the Nemotron-H shape's build (`bench_gpu.sh model nemotronh`), then judged-2gpu.sh on it (P on 0, D on
#   1) at c = CONC (default 1,8) with N_VARIANTS (default: --early-decode, the ITL objective at the judged SLO's 50 ms,
#   both together, and every turn through P at N-1 with early decode: the PD tax with P's own delivery of its params
#   and without the checkpoint below N-1). Results under j2n, mark "j2n-all".
# - GPUs 2-3, once the model is built: the prefiller alone under bursts of P_BURST (default 8) P legs at once, upstream's
#   on GPU 2 and ours on GPU 3 at the same time, then swapped (benchmarks/gpu/prefill_probe.py --burst; results under
#   pb1 and pb2; marks "probe pb1 ...", "pb1", "pb2"). Beside them on GPU 3 first: benchmarks/tiny_attention_probe.py on
#   the tiny Zamba2 and Jamba trained TAP_STEPS (default 3000) steps per TAP_VARIANTS (default recall=0.3, recall=0.5):
#   whether a longer training with recall documents makes them read attention (results under tap, mark "tap").
# "x4-all" once both sides have ended. Each side on its own half of the host's cores (PIN=0: not).
set -u
. deploy/gpu/plans/common.sh
export PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH} PATH=/root/site/bin:$PATH
n=$(nproc) half=$(( $(nproc) / 2 ))
pin() { if [ "${PIN:-1}" = 1 ] && [ "$half" -ge 2 ]; then taskset -cp "$1" "$BASHPID" > /dev/null; fi; }
built=$R/model-nemotronh.built
always="--pd-policy always-remote --prefiller-stop last"
( pin "0-$((half - 1))"
  bash deploy/gpu/bench_gpu.sh model nemotronh > "$R/model-nemotronh.log" 2>&1
  echo "model nemotronh rc=$?" >> "$R/done.txt"; touch "$built"
  CONC=${CONC:-1,8} COLD_C8=0 VLLM_ARGS=${VLLM_ARGS:---jit-monitor-verbose} P_GPU=0 D_GPU=1 KIND=nemotronh J=j2n \
    VARIANTS="${N_VARIANTS---early-decode;--itl-slo-ms 50;--itl-slo-ms 50 --early-decode;$always --early-decode}" \
    bash deploy/gpu/plans/judged-2gpu.sh ) &
( pin "$half-$((n - 1))"
  mkdir -p "$R/tap"
  # shellcheck disable=SC2046
  ( CUDA_VISIBLE_DEVICES=3 timeout 900 python3 -m benchmarks.tiny_attention_probe --family zamba2 --block 16 \
      --family jamba --block 48 --steps "${TAP_STEPS:-3000}" \
      $(for v in ${TAP_VARIANTS:-recall=0.3 recall=0.5}; do printf -- '--variant %s ' "$v"; done) \
      --out "$R/tap" > "$R/tap/probe.log" 2>&1; echo "tap rc=$?" >> "$R/done.txt" ) &
  mkdir -p /tmp/probe-2 /tmp/probe-3
  while [ ! -e "$built" ]; do sleep 2; done
  M=/root/models/nemotronh  # probe's model (common.sh)
  burst=(--burst "${P_BURST:-8}")
  probe pb1 upstream 2 "${burst[@]}" & p=$!; probe pb1 hybrid 3 "${burst[@]}"; wait $p; echo pb1 >> "$R/done.txt"
  probe pb2 hybrid 2 "${burst[@]}" & p=$!; probe pb2 upstream 3 "${burst[@]}"; wait $p; echo pb2 >> "$R/done.txt"
  wait ) &
wait
echo x4-all >> "$R/done.txt"
