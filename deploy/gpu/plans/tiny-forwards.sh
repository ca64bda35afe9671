#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on one GPU: does vLLM compute the tiny FAMILIES (default "jamba zamba2") as
# transformers does, and where not, which part parts them? Per family, the built tiny model through
# benchmarks/tiny_vllm_vs_transformers.py three ways: as served; with the recurrent state in fp32
# (--ssm-cache-dtype float32); with vLLM's Mamba1 scan kernels in plain torch (--reference-scan). Results in
# /root/res/forwards/FAMILY-WAY.json; marks "fw FAMILY WAY rc=N", then "fw-all".
set -u
. deploy/gpu/plans/common.sh
export PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH} PATH=/root/site/bin:$PATH HYBRID_PD_CACHE=${HYBRID_PD_CACHE:-/root/hp-cache}
mkdir -p "$R/forwards"
for f in ${FAMILIES:-jamba zamba2}; do
  d=$(python3 -c "from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model as b; print(b(TinyModelSpec(family='$f')))" 2>/dev/null | tail -1)
  b=$(case $f in jamba) echo 48 ;; zamba2) echo 16 ;; *) echo 256 ;; esac)
  for way in served fp32-state $([ "$f" = jamba ] && echo reference-scan); do  # the scan patch: Mamba1 only
    flags=$(case $way in fp32-state) echo "--ssm-cache-dtype float32" ;; reference-scan) echo "--reference-scan" ;; esac)
    # shellcheck disable=SC2086
    python3 -m benchmarks.tiny_vllm_vs_transformers "$d" --block "$b" $flags --out "$R/forwards/$f-$way.json" \
      > "$R/forwards/$f-$way.log" 2>&1
    echo "fw $f $way rc=$?" >> "$R/done.txt"
  done
done
echo fw-all >> "$R/done.txt"
