"""Benchmarks: the harness the CPU test bed and the GPU machines share, the benchmarks themselves, and every
run's results (results/<date>-<machine>-<topic>/summary.md).

Nothing of the product imports this package; tests may (tests/bench/test_*.py test the harness). The harness
(procs, client, setups, workloads, gpu/) imports nothing from tests/: the GPU machine runs it from
deploy/gpu/bench_gpu.sh with only the package and this folder in hand (tests/packaging/test_boundaries.py).
Some CPU benchmarks beside the harness reuse the tests' conversation, storm and tiny-layout helpers
(tests/support/), so they run from a checkout (`bash deploy/dev.sh run python -m benchmarks.NAME`).
"""
