#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on a four-GPU machine (nvidia-h100-x4 / nvidia-h200-x4), side by side:
# - GPUs 2-3: judged-2gpu.sh on Qwen3-Next (P on 2, D on 3) at c = CONC (default 1,8) with VARIANTS (default: every
#   turn through P stopping at N-1, without and with --early-decode: the PD tax with and without the overlap).
#   Mark "j2-all".
# - GPU 0: tiny-forwards.sh (vLLM's forward of the tiny Jamba and Zamba2 against transformers'; mark "fw-all"; FORWARDS=0:
#   not run),
#   beside it the Nemotron-H shape's build (`bench_gpu.sh model nemotronh`), then judged-2gpu.sh on Nemotron-H (P on
#   0, D on 1) at the same c with N_VARIANTS (default none: ours alone), results under j2n. Mark "j2n-all".
# - GPU 0, with P_BURST=N, after the forwards: upstream's prefiller, then ours, each alone under the prefiller probe
#   and bursts of N P legs at once (benchmarks/gpu/prefill_probe.py --burst N, Qwen3-Next; results under pburst):
#   whether our P's calls end later than upstream's when c=N sends them together.
# - GPU 1, beside the forwards, with DECODER_PROBE=1: a decoder's own prefill (a turn D serves alone) without and with
#   our connector, under the profiler at the end (benchmarks/gpu/prefill_probe.py --role decode --profile, Qwen3-Next;
#   results under dprobe; marks "probe dprobe none gpu1 ...", "probe dprobe hybrid gpu1 ...").
# "x4-all" once both sides have ended.
# Each side on its own half of the host's cores (PIN=0: not): a prefill step of these shapes is CPU-bound (kernels
# ~18 of 68-105 ms in 2026-11-27-h100x4-qwen3next-judged-vllm033-r6), so one side's compiles slowed the other's cells.
set -u
. deploy/gpu/plans/common.sh
export PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH} PATH=/root/site/bin:$PATH
always="--pd-policy always-remote --prefiller-stop last"
n=$(nproc) half=$(( $(nproc) / 2 ))
pin() { if [ "${PIN:-1}" = 1 ] && [ "$half" -ge 2 ]; then taskset -cp "$1" "$BASHPID" > /dev/null; fi; }
( pin "0-$((half - 1))"
  bash deploy/gpu/bench_gpu.sh model nemotronh > "$R/model-nemotronh.log" 2>&1 &
  if [ "${DECODER_PROBE:-0}" = 1 ]; then
    ( probe dprobe none 1 --role decode --profile; probe dprobe hybrid 1 --role decode --profile ) &
  fi
  [ "${FORWARDS:-1}" = 1 ] && CUDA_VISIBLE_DEVICES=0 bash deploy/gpu/plans/tiny-forwards.sh
  if [ "${P_BURST:-0}" -gt 0 ]; then  # the prefiller alone under bursts of P legs, upstream's then ours, on GPU 0
    probe pburst upstream 0 --burst "$P_BURST"; probe pburst hybrid 0 --burst "$P_BURST"
  fi
  wait
  CONC=${CONC:-1,8} COLD_C8=0 VLLM_ARGS=${VLLM_ARGS:---jit-monitor-verbose} P_GPU=0 D_GPU=1 KIND=nemotronh J=j2n \
    VARIANTS="${N_VARIANTS:-}" bash deploy/gpu/plans/judged-2gpu.sh ) &
( pin "$half-$((n - 1))"
  CONC=${CONC:-1,8} COLD_C8=0 VLLM_ARGS=${VLLM_ARGS:---jit-monitor-verbose} P_GPU=2 D_GPU=3 \
    VARIANTS=${VARIANTS-"$always;$always --early-decode"} bash deploy/gpu/plans/judged-2gpu.sh ) &
wait
echo x4-all >> "$R/done.txt"
