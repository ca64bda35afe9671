"""The GPU benchmark at real model shapes (bench.py, one set-up per device call), the prefiller alone
(prefill_probe.py), the merge of the parts into results.json and summary.md (merge.py), the real-shape models
(real_shapes.py) and the yardsticks (device_copy.py, nixl_bench.py). Driven by deploy/gpu/bench_gpu.sh."""
