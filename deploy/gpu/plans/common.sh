# Sourced by the plans (not a plan itself): results under $R, UCX's cuda_ipc READs without NVLink, and
# `run KIND SETUP DIR [bench.py flags]`, one set-up of benchmarks/gpu/bench.py on the agentic 8k workload at
# c=1 and 8 (GRAPHS: decode by default, full for vLLM's defaults), a line in $R/done.txt when it ends.
R=/root/res
export UCX_CUDA_IPC_ENABLE_GET_ZCOPY=on
B="--workloads agentic --lengths 8192 --concurrency 1,8 --deadline-s ${DEADLINE_S:-1200} --graphs ${GRAPHS:-decode}"
# `probe RUN SETUP GPU [flags]`: benchmarks/gpu/prefill_probe.py, one set-up's prefiller alone on GPU, results in
# $R/RUN, a line in $R/done.txt when it ends (model: /root/models/$KIND, default qwen3next)
M=/root/models/${KIND:-qwen3next}
probe() {  # OUT SETUP GPU [flags]
  local run=$1 setup=$2 gpu=$3; shift 3; local out=$R/$run; mkdir -p "$out"
  TMPDIR=/tmp/probe-$gpu python3 -m benchmarks.gpu.prefill_probe --setup "$setup" --model "$M" --out "$out" \
    --prefill-gpu "$gpu" --decode-gpu "$gpu" "$@" > "$out/$setup.log" 2>&1
  echo "probe $run $setup gpu$gpu rc=$?" >> "$R/done.txt"; }
run() { local kind=$1 setup=$2 dir=$3; shift 3
  mkdir -p "$R/$dir"
  local log; log="$R/$dir/$setup$(printf %s "$*" | tr -c 'A-Za-z0-9=._-' _).log"
  bash deploy/gpu/bench_gpu.sh run "$setup" "$kind" "$R/$dir" $B "$@" > "$log" 2>&1
  echo "$dir $setup $* rc=$?" >> "$R/done.txt"; }
# `shape KIND`: a plan's first step: the wheelhouse's site (bench_gpu.sh install) on the path and the real-shape model
# KIND built on the GPU (bench_gpu.sh model), a line in $R/done.txt
shape() { export PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH} PATH=/root/site/bin:$PATH
  bash deploy/gpu/bench_gpu.sh model "$1" > "$R/model-$1.log" 2>&1
  echo "model $1 rc=$?" >> "$R/done.txt"; }
# Once per machine, first: the KV digest on this GPU (benchmarks/kv_digest_bench.py; ~20 s): the batched digest
# the connector runs on a GPU is checked against the per-layer one and the CPU's, and timed beside them
if [ ! -e "$R/kv-digest/results.json" ]; then
  mkdir -p "$R"
  PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH} python3 -m benchmarks.kv_digest_bench --device cuda --reps 30 \
    --out "$R/kv-digest" > "$R/kv-digest.txt" 2>&1
  echo "kv-digest rc=$?" >> "$R/done.txt"
fi
