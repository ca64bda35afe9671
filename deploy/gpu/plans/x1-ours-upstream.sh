#!/usr/bin/env bash
# A plan for `bench_gpu.sh background` on ONE GPU, the least device time that compares ours with upstream PD on the
# Nemotron-H shape (built first): ours with its defaults, then upstream PD, agentic 8k at c = CONC (default 8,32: the
# cells where ours loses or has not run beside upstream). Results under jc, "jc-all" at the end. ~420 s of device
# time after the wheelhouse is in (the first engine compiles: ~190 s of it).
set -u
export KIND=nemotronh
. deploy/gpu/plans/common.sh
shape nemotronh
run nemotronh hybrid-pd-1p1d jc --concurrency "${CONC:-8,32}" ${O_ARGS:+"--proxy-args=$O_ARGS"}
run nemotronh upstream jc --concurrency "${CONC:-8,32}"
echo jc-all >> "$R/done.txt"
