"""The launcher command the tests start on a GPU machine (tests/support/procs.py, HYBRID_PD_TEST_DEVICE=gpu), read by
vLLM's own argument parser: no engine starts."""

from __future__ import annotations

from tests.support.procs import worker_argv


def vllm_flags(argv: list[str]) -> list[str]:
    return argv[argv.index("--") + 1:]


def test_gpu_engines_size_their_kv_cache_outright(monkeypatch):
    """Side by side on one GPU, vLLM's memory profile counts the other engines' start-up allocations as its own (a
    tiny Qwen3-Next's decoder found -0.03 GiB for its cache at 0.18 of an H100): the tests' engines there give the
    cache's size instead, and vLLM reads it as such."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    monkeypatch.setenv("HYBRID_PD_TEST_DEVICE", "gpu")
    monkeypatch.setenv("HYBRID_PD_TEST_VLLM_ARGS", '["--additional-config", "{}"]')
    argv = worker_argv("decode", connector="hybrid", port=8200, cpu_bind="1", model="/m", extra=["--", "--seed", "1"])
    flags = vllm_flags(argv)
    assert flags[:3] == ["--enforce-eager", "--kv-cache-memory-bytes", str(2 << 30)] and flags[-2:] == ["--seed", "1"]
    args = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(["--model", "/m", *flags])
    assert AsyncEngineArgs.from_cli_args(args).kv_cache_memory_bytes == 2 << 30
    monkeypatch.setenv("HYBRID_PD_TEST_KV_CACHE_BYTES", str(1 << 30))
    assert vllm_flags(worker_argv("decode", connector="none", port=8200, cpu_bind="1"))[2] == str(1 << 30)


def test_cpu_engines_keep_the_launchers_cache_size(monkeypatch):
    monkeypatch.delenv("HYBRID_PD_TEST_DEVICE", raising=False)
    argv = worker_argv("decode", connector="none", port=8200, cpu_bind="1")
    assert "--kv-cache-memory-bytes" not in argv and argv[argv.index("--kv-cache-gib") + 1] == "1"
