"""Test support: the launcher command the tests start (`worker_argv`); the processes themselves are the
benchmarks' (`benchmarks/procs.py`: started with timeouts, stopped by PID), as are the HTTP helpers
(`benchmarks/client.py`)."""

from __future__ import annotations

import json
import os

from benchmarks.client import http_json, metric_sum, scrape_metrics
from benchmarks.procs import HYBRID_PD, Launched, free_port

__all__ = ["HYBRID_PD", "Launched", "free_port", "http_json", "kv_events", "metric_sum", "scrape_metrics",
           "worker_argv"]


def kv_events(worker: Launched) -> str:
    """The ZMQ address of a launched worker's KV-event publisher (its --kv-events-port)."""
    return f"tcp://127.0.0.1:{worker.argv[worker.argv.index('--kv-events-port') + 1]}"


def worker_argv(role: str, *, connector: str, port: int, cpu_bind: str, model: str | None = None,
                extra: list[str] = ()) -> list[str]:
    """A launcher command for tests. HYBRID_PD_TEST_DEVICE=gpu runs the same tests on a GPU machine
    (deploy/gpu/bench_gpu.sh families): engines share the GPU, and HYBRID_PD_TEST_VLLM_ARGS (a JSON list) adds
    vLLM flags there."""
    argv = [HYBRID_PD, role, "--connector", connector, "--port", str(port),
            "--side-channel-port", str(free_port()), "--kv-events-port", str(free_port()),
            "--max-num-seqs", "4", "--served-model-name", "tiny"]
    extra = list(extra)  # launcher flags, then optionally "--" and vLLM flags
    cut = extra.index("--") if "--" in extra else len(extra)
    launcher_args, vllm_args = extra[:cut], extra[cut + 1:]
    if os.environ.get("HYBRID_PD_TEST_DEVICE") == "gpu":
        argv += ["--device", "gpu", "--gpu-memory-utilization", os.environ.get("HYBRID_PD_TEST_GPU_UTIL", "0.2"),
                 "--max-model-len", "4096", "--max-num-batched-tokens", "4096", "--warmup-lengths", "none"]
        # the KV cache sized outright, not by vLLM's memory profile: engines that start side by side on one GPU see
        # each other's allocations as their own (a tiny Qwen3-Next's D at 0.18 of an H100 found -0.03 GiB for its
        # cache, 2026-11-27-h100x2-families-gdn-vllm033)
        kv_bytes = os.environ.get("HYBRID_PD_TEST_KV_CACHE_BYTES", str(2 << 30))
        vllm_args = ["--enforce-eager", "--kv-cache-memory-bytes", kv_bytes,
                     *json.loads(os.environ.get("HYBRID_PD_TEST_VLLM_ARGS", "[]")), *vllm_args]
    else:
        # no warm-up (the launcher warms CPUs up at 1024 tokens): ~10 s per engine start, and the tests' first requests
        # are not timed; tests of the warm-up ask for it
        argv += ["--cpu-bind", cpu_bind, "--kv-cache-gib", "1", "--max-model-len", "2048",
                 "--max-num-batched-tokens", "2048", "--warmup-lengths", "none"]
    if model:
        argv += ["--model", model]
    return argv + launcher_args + (["--", *vllm_args] if vllm_args else [])


