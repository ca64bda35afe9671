"""Benchmarks: the harness the CPU test bed and the GPU machines share, the benchmarks themselves, and every
run's results (results/<date>-<machine>-<topic>/summary.md).

Nothing of the product imports this package; tests may (benchmarks/ tests the harness). The harness
(procs, client, setups, workloads, gpu/) imports nothing from tests/: the GPU machine runs it from
deploy/gpu/bench_gpu.sh with only the package and this folder in hand.
"""
