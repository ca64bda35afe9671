#!/usr/bin/env bash
# Toy two-GPU integration run: prefill worker on GPU 0, decode worker on GPU 1, the proxy, a colocated
# reference engine (on GPU 1), a short multi-turn workload, greedy output compared with the reference, and a
# report (TTFT, ITL, bytes moved, prefix-hit tokens). With one GPU, pass 0 0 to put everything on it.
#   bash deploy/gpu/pd_two_gpu.sh REPORT_DIR [PREFILL_GPU] [DECODE_GPU] [MODEL] [CONNECTOR]
# Needs hybrid-pd and vLLM importable (a venv, or PYTHONPATH from install_wheelhouse.sh).
#
# At real model shapes (benchmarks/gpu/real_shapes.py, after `bench_gpu.sh install` and `bench_gpu.sh model KIND`), the
# three set-ups of the GPU benchmark with P on GPU 0 and D on GPU 1 (benchmarks/results/2026-11-24-h200x2-*, 2-4 min each;
# split them over device calls of under 10 minutes with SETUPS):
#   SETUPS="colocated upstream hybrid-pd-1p1d" bash deploy/gpu/pd_two_gpu.sh real KIND OUT [benchmarks/gpu/bench.py flags]
set -euo pipefail
if [ "${1:-}" = real ]; then
  kind=${2:?qwen3next|nemotronh}; out=${3:?out folder}; shift 3
  for setup in ${SETUPS:-colocated upstream hybrid-pd-1p1d}; do
    bash "$(dirname "$0")/bench_gpu.sh" run "$setup" "$kind" "$out" --prefill-gpu 0 --decode-gpu 1 --util 0.8 \
      --lengths 8192,32768 --concurrency 1,8,32 --workloads agentic --max-num-seqs 32 --max-model-len 65536 \
      --launcher-warmup 8192,32768 --decode-alone 32 --deadline-s 420 "$@"
  done
  exit 0
fi
OUT=${1:?report folder}; GP=${2:-0}; GD=${3:-1}; MODEL=${4:-tiny}; CONNECTOR=${5:-hybrid}
mkdir -p "$OUT"
# Two engines (plus the reference) share a GPU when GP == GD: leave each a slice of its memory.
UTIL=0.4; [ "$GP" = "$GD" ] && UTIL=0.25
# NVLink multicast stays off on shared hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
EXTRA=(--)
# The tiny model gains nothing from torch.compile and CUDA graphs, which cost minutes of start-up.
[ "$MODEL" = tiny ] && EXTRA+=(--enforce-eager)
if nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -qE "H100|H200|H800|GH200"; then
  EXTRA+=(--additional-config '{"gdn_prefill_backend":"triton"}')  # FlashInfer's GDN prefill needs CuTe DSL
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$OUT/gpus.txt" || true
set +e
python3 -m hybrid_pd.prefill.launch.command demo --device gpu --model "$MODEL" --connector "$CONNECTOR" \
  --prefill-gpu "$GP" --decode-gpu "$GD" --gpu-memory-utilization "$UTIL" --reference \
  --logs "$OUT/logs" --report "$OUT/report.json" "${EXTRA[@]}" 2>&1 | tee "$OUT/run.txt"
code=${PIPESTATUS[0]}
set -e
echo "exit code $code" | tee -a "$OUT/run.txt"
exit "$code"
