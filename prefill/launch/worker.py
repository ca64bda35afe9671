"""The worker launcher both roles run: `hybrid-pd prefill` and `hybrid-pd decode` (prefill/cli.py, decode/cli.py).

Both roles share the flags; only the defaults differ (ports, cores: flags.ROLE_DEFAULTS). Anything after `--` goes
to vLLM unchanged, except the flags the launcher owns (it refuses those and names its own flag instead). In order:
refuse a broken configuration (exit 2), bind the launcher to its cores (cpu_affinity.py), start vLLM and wait for
/health (supervisor.py), warm it up (warmup.py), write the ready file (ready.py), forward SIGTERM.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from hybrid_pd.connector.contract import TINY_SERVED_NAME
from hybrid_pd.prefill.launch.aligned_block import AlignedBlockWatch
from hybrid_pd.prefill.launch.cpu_affinity import pin
from hybrid_pd.prefill.launch.errors import WorkerConfigError, WorkerError
from hybrid_pd.prefill.launch.flags import ROLE_DEFAULTS, add_flags, flag, from_flags
from hybrid_pd.prefill.launch.ready import ReadyFile
from hybrid_pd.prefill.launch.shm_segments import EngineSegments
from hybrid_pd.prefill.launch.supervisor import ChildProcess, run_until_signalled
from hybrid_pd.prefill.launch.warmup import (
    CONCURRENT,
    DEFAULT_WARMUP,
    describe,
    is_moe,
    parse_lengths,
    parse_steps,
    plan,
    warm_up,
)
from hybrid_pd.prefill.launch.worker_config import WorkerConfig


@dataclass(frozen=True)
class LaunchOptions:
    """The launcher's own settings (the worker's are WorkerConfig's), declared once with their flags."""

    tiny_seed: int = flag(0, "weight seed of the tiny model")
    startup_timeout: float = flag(900.0, "seconds vLLM may take to answer /health")
    warmup_lengths: str | None = flag(
        None,
        "once vLLM is healthy, send a prompt of each length from scratch and again after its prefix (compiles the "
        "GPU kernels clients would otherwise wait for), then write --ready-file; 'none' skips it (default: "
        f"{DEFAULT_WARMUP['gpu']} on GPUs, {DEFAULT_WARMUP['cpu']} on CPUs)",
        metavar="TOKENS[,TOKENS]",
    )
    warmup_steps: str = flag(
        "auto",
        "then one prompt per step size the fused-MoE kernel has a configuration for, up to this many tokens (each "
        "compiles on the first step of its size class otherwise: ~1 s while serving); 'auto': up to the largest "
        "step for a mixture-of-experts model on a GPU, none otherwise; 'none' skips it",
        metavar="auto|none|TOKENS",
    )
    ready_file: str | None = flag(
        None,
        "file written once the worker is healthy and warm, removed when it stops; it names the launcher and vLLM's "
        "API server, so test it with `python3 -m hybrid_pd.prefill.launch.ready FILE` (readiness probe)",
    )


def resolve_model(name: str, seed: int = 0) -> str:
    """'tiny' (the default) means the locally built tiny hybrid model; anything else is passed to vLLM."""
    if name != "tiny":
        return name
    from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model

    return str(build_tiny_model(TinyModelSpec(seed=seed)))


def add_worker_args(ap: argparse.ArgumentParser, role: str) -> None:
    add_flags(ap, WorkerConfig, role)
    add_flags(ap, LaunchOptions)
    ap.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then extra vLLM flags")


def config_from_args(args: argparse.Namespace, role: str, check_ports_free: bool = True) -> WorkerConfig:
    extra = list(args.vllm_args or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    given = from_flags(WorkerConfig, args)
    return WorkerConfig(
        **given
        | {
            "role": role,
            "model": resolve_model(args.model, args.tiny_seed),
            "cpu_bind": args.cpu_bind or None,
            "served_model_name": args.served_model_name or (TINY_SERVED_NAME if args.model == "tiny" else None),
            "extra_vllm_args": tuple(extra),
            "check_ports_free": check_ports_free,
        }
    )


def worker_main(role: str, argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=f"hybrid-pd {role}",
        description=f"Start a vLLM {role} worker configured for hybrid PD.",
    )
    add_worker_args(ap, role)
    args = ap.parse_args(argv)
    options = LaunchOptions(**from_flags(LaunchOptions, args))
    try:
        config = config_from_args(args, role)
        try:
            lengths = parse_lengths(options.warmup_lengths or DEFAULT_WARMUP[config.device])
        except ValueError as e:
            raise WorkerConfigError([f"--warmup-lengths: {e}"]) from None
        largest = config.checkpoint_every or config.max_num_batched_tokens
        try:
            steps = parse_steps(options.warmup_steps, largest, config.device == "gpu" and is_moe(config.model))
        except ValueError as e:
            raise WorkerConfigError([f"--warmup-steps: {e}"]) from None
        for w in config.warnings:
            print(f"[hybrid-pd] warning: {w}", file=sys.stderr)
        if config.cpu_cores is not None and config.cpu_bind is not None:
            pin(config.cpu_cores, config.cpu_bind, {r: d["cpu_bind"] for r, d in ROLE_DEFAULTS.items()})
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
            print(
                f"[hybrid-pd] warming up: {len(sizes) * 5} requests at most, then {CONCURRENT} at once, then "
                f"{len(steps)} step sizes",
                flush=True,
            )
            try:
                done = warm_up(
                    config.url,
                    config.served_model_name or config.model,
                    config.model,
                    sizes,
                    max_model_len=config.max_model_len,
                    steps=steps,
                )
            except Exception as e:  # a warm-up is an optimisation: never leave vLLM behind for it
                print(f"[hybrid-pd] warm-up stopped: {e!r}", flush=True)
                return
            print(f"[hybrid-pd] {describe(done)}", flush=True)

        return run_until_signalled(
            child,
            options.startup_timeout,
            warm_up=warm if lengths or steps else None,
            ready=ReadyFile(options.ready_file),
            segments=EngineSegments(config.port),
        )
    except WorkerError as e:
        print(f"[hybrid-pd] {role}: {e}", file=sys.stderr)
        return 2 if isinstance(e, WorkerConfigError) else 1
