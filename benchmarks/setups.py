"""The set-ups a benchmark compares, on the CPU test bed or on GPUs: one harness for both.

- colocated: one engine, no connector: the quality bar (every hit is local, nothing moves).
- upstream: vLLM's NixlConnector on a prefill and a decode worker, driven by the flow of vLLM's toy proxy (P
  with max_tokens=1 and do_remote_decode, then D with P's kv_transfer_params), done by the client, as vLLM's
  NixlConnector usage guide runs it; `upstream_flow="proxy"` puts our proxy in front of the same workers.
- hybrid-pd-1p1d / hybrid-pd-2p1d: our proxy in front of one or two prefill workers and a decode worker.

Where the workers run and with which engine flags is the machine's (`CpuBed`: prefillers on one core, the
decoder and the colocated engine on the other; `Gpus`: a GPU for P and one for D, the same one by default).
Workers that share a GPU start one after the other (each profiles its memory alone); otherwise all start at
once. A worker counts as started when its launcher wrote its ready file (after /health and its warm-up).

Every set-up sends a completion and returns what the client saw: the text, streamed tokens with their arrival
times and margins, the usage block and the prefix hit. Processes are ours (launchers on 127.0.0.1) and are
stopped by PID when the set-up closes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from benchmarks.client import cached_of, log, placement_rates, post_json, stream_logprobs
from benchmarks.procs import HYBRID_PD, Launched, free_port
from hybrid_pd.prefill.dev.demo_workload import TRANSFER_METRICS, transfer_counters

SETUPS = ("colocated", "upstream", "hybrid-pd-1p1d", "hybrid-pd-2p1d")
TOY_KV_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}


@dataclass(frozen=True)
class CpuBed:
    """The 2-core CPU test bed: prefillers on `prefill_core`, the decoder and the colocated engine on
    `decode_core`; the tiny model's engine size (1 GiB of KV cache, 2,048-token context, 4 sequences, no
    warm-up). `extra`: launcher flags for every worker (run.py --worker-args), then optionally "--" and vLLM
    flags."""

    model: str
    extra: tuple[str, ...] = ()
    prefill_core: str = "0"
    decode_core: str = "1"
    served_name: str = "tiny"
    env: Mapping[str, str] = field(default_factory=dict)
    one_at_a_time = False  # each engine has cores of its own: all start at once

    def flags(self, role: str) -> list[str]:
        core = self.prefill_core if role == "prefill" else self.decode_core
        return ["--cpu-bind", core, "--kv-cache-gib", "1", "--max-model-len", "2048",
                "--max-num-batched-tokens", "2048", "--max-num-seqs", "4", "--warmup-lengths", "none",
                *_split(self.extra)[0]]

    def vllm_flags(self) -> list[str]:
        return _split(self.extra)[1]

    def worker_env(self, role: str) -> dict[str, str]:
        return dict(self.env)


@dataclass(frozen=True)
class Gpus:
    """GPU engines at real model shapes (benchmarks/gpu/bench.py), each with `util` of its GPU's memory. P on
    `prefill_gpu`, D and the colocated engine on `decode_gpu`. `graphs`: "decode" (full CUDA graphs for decode
    steps, no torch.compile: start-up in seconds), "full" (vLLM's default) or "none" (eager). On Hopper the GDN
    prefill runs on Triton (FlashInfer's needs CuTe DSL). `vllm_extra`: more vLLM flags (a profiler)."""

    model: str
    util: float = 0.28
    max_model_len: int = 40960
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 16
    checkpoint_every: int = 0
    graphs: str = "decode"
    launcher_warmup: str = "2048,8192"
    prefill_gpu: int = 0
    decode_gpu: int = 0
    vllm_extra: tuple[str, ...] = ()
    served_name: str = "m"
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def one_at_a_time(self) -> bool:
        return self.prefill_gpu == self.decode_gpu

    def flags(self, role: str) -> list[str]:
        return (["--device", "gpu", "--gpu-memory-utilization", str(self.util),
                 "--max-model-len", str(self.max_model_len),
                 "--max-num-batched-tokens", str(self.max_num_batched_tokens),
                 "--max-num-seqs", str(self.max_num_seqs), "--startup-timeout", "560",
                 "--warmup-lengths", self.launcher_warmup]
                + (["--checkpoint-every", str(self.checkpoint_every)] if self.checkpoint_every else []))

    def vllm_flags(self) -> list[str]:
        extra = ["--additional-config", json.dumps({"gdn_prefill_backend": "triton"})]
        if self.graphs == "none":
            extra += ["--enforce-eager"]
        elif self.graphs == "decode":
            sizes = [s for s in (1, 2, 4, 8, 16, 24, 32, 48, 64) if s <= self.max_num_seqs]
            extra += ["--compilation-config", json.dumps({"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY",
                                                          "cudagraph_capture_sizes": sizes})]
        return extra + list(self.vllm_extra)

    def worker_env(self, role: str) -> dict[str, str]:
        gpu = self.prefill_gpu if role == "prefill" else self.decode_gpu
        return dict(self.env, CUDA_VISIBLE_DEVICES=str(gpu))

    @classmethod
    def add_flags(cls, ap: argparse.ArgumentParser) -> None:
        """One command-line flag per setting (--max-num-seqs for max_num_seqs), its default the field's, and
        --v2 (vLLM's V2 model runner)."""
        ap.add_argument("--model", required=True)
        for f in fields(cls):
            if f.name not in ("model", "vllm_extra", "served_name", "env"):
                ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                                choices=("decode", "full", "none") if f.name == "graphs" else None,
                                help=GPU_FLAG_HELP.get(f.name))
        ap.add_argument("--v2", action="store_true", help="VLLM_USE_V2_MODEL_RUNNER=1")

    @classmethod
    def from_args(cls, args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Gpus:
        given = {f.name: getattr(args, f.name) for f in fields(cls)
                 if f.name not in ("vllm_extra", "env", "served_name") and hasattr(args, f.name)}
        return cls(**given, env={**({"VLLM_USE_V2_MODEL_RUNNER": "1"} if args.v2 else {}), **(env or {})})


GPU_FLAG_HELP = {
    "util": "--gpu-memory-utilization of every engine",
    "launcher_warmup": "the launchers' --warmup-lengths ('none': a cold engine, as before 2026-11-24)",
    "decode_gpu": "also the colocated engine's GPU",
    "graphs": "decode: full CUDA graphs for decode steps, no torch.compile; full: vLLM's default; none: eager",
}


Machine = CpuBed | Gpus


def launcher_argv(machine: Machine, role: str, connector: str, port: int, ready_file: Path) -> list[str]:
    """The `hybrid-pd prefill|decode` command of a worker on `machine` (side-channel and KV-event ports free)."""
    argv = [HYBRID_PD, role, "--connector", connector, "--model", machine.model, "--port", str(port),
            "--side-channel-port", str(free_port()), "--kv-events-port", str(free_port()),
            "--served-model-name", machine.served_name, "--ready-file", str(ready_file), *machine.flags(role)]
    if role == "decode" and connector == "hybrid":  # a params inbox, for a proxy variant with --early-decode
        argv += ["--params-port", str(free_port())]
    vllm_flags = machine.vllm_flags()
    return argv + (["--", *vllm_flags] if vllm_flags else [])


def vllm_splits_at_boundary(version: str | None = None) -> bool:
    """vLLM before 0.32 ends a prefill step at a prompt's last aligned boundary (our proxy's --align-split); later
    ones write the state there inside the prompt's last chunk. `version`: the installed vLLM's by default."""
    if version is None:
        try:
            version = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return False
    parts = re.match(r"(\d+)\.(\d+)", version)
    return parts is not None and (int(parts[1]), int(parts[2])) < (0, 32)


def proxy_argv(machine: Machine, port: int, prefill: list[Launched], decode: Launched, extra: tuple[str, ...] = ()
               ) -> list[str]:
    """Our proxy's command in front of these workers (Workers.proxy), --shared-device where P and D share a GPU,
    --align-split where the installed vLLM splits (vllm_splits_at_boundary)."""
    shared = isinstance(machine, Gpus) and machine.one_at_a_time
    argv = [HYBRID_PD, "proxy", "--port", str(port), "--decode", decode.url,
            "--decode-policy", "kv_hit=2,least_loaded", "--prefill-policy", "kv_hit=2,least_loaded",
            "--log-placement", "--warm-pairs", *(["--shared-device"] if shared else []),
            *(["--align-split"] if vllm_splits_at_boundary() else []), *extra]
    for p in prefill:
        argv += ["--prefill", p.url, "--prefill-events", events_url(p)]
    if inbox := inbox_url(decode):
        argv += ["--decode-inbox", inbox]
    return argv + ["--decode-events", events_url(decode)]


class Workers:
    """The processes of one set-up: launchers, then our proxy; log files `<prefix><name>.log` under `logs`."""

    def __init__(self, machine: Machine, logs: Path, prefix: str = ""):
        self.machine, self.logs, self.prefix = machine, logs, prefix
        self.procs: list[Launched] = []
        self.start_s: dict[str, float] = {}
        self._started: dict[str, float] = {}

    def start(self, name: str, role: str, connector: str) -> Launched:
        """Start a `hybrid-pd prefill|decode` launcher (not waiting: `ready` does)."""
        port = free_port()
        argv = launcher_argv(self.machine, role, connector, port, self._ready_file(name))
        proc = Launched(self.prefix + name, argv, f"http://127.0.0.1:{port}", self.logs,
                        env=self.machine.worker_env(role))
        self.procs.append(proc)
        self._started[name] = time.monotonic()
        log(f"starting {self.prefix}{name}: {' '.join(argv[1:])}")
        return proc

    def ready(self, proc: Launched, timeout: float = 900) -> Launched:
        """Wait for /health, then for the launcher's warm-up (it compiles kernels) to write its ready file."""
        name = proc.name.removeprefix(self.prefix)
        proc.wait_healthy(timeout)
        self.start_s[name] = round(time.monotonic() - self._started[name], 1)
        warm = proc.wait_file(self._ready_file(name), 300)
        self.start_s[f"{name} warm-up"] = round(warm, 1)
        said = [line for line in proc.log_path.read_text().splitlines() if "[hybrid-pd] warm-up:" in line]
        log(f"{proc.name} healthy after {self.start_s[name]} s, ready {warm:.1f} s later; {said[-1] if said else ''}")
        return proc

    def proxy(self, prefill: list[Launched], decode: Launched, extra: tuple[str, ...] = (), name: str = "proxy"
              ) -> Launched:
        """Our proxy in front of the workers, routing on their KV events (kv_hit, then the least loaded), logging
        each turn's placement, told that P and D share a device where they do (GPUs: P on D's GPU); `extra`:
        more proxy flags (e.g. another --pd-policy, --no-shared-device); `name`: its log's."""
        port = free_port()
        argv = proxy_argv(self.machine, port, prefill, decode, extra)
        proc = Launched(self.prefix + name, argv, f"http://127.0.0.1:{port}", self.logs)
        self.procs.append(proc)
        proc.wait_healthy(150)  # ready once its tokenizer loads (proxy/background.py: 120 s at most)
        return proc

    def close(self) -> None:
        for proc in reversed(self.procs):
            try:
                proc.stop()
            except Exception as e:  # keep stopping the others
                log(f"stopping {proc.name}: {e}")

    def _ready_file(self, name: str) -> Path:
        return self.logs / f"{self.prefix}{name}.ready"


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def events_url(worker: Launched) -> str:
    """Where a worker publishes its KV events (its --kv-events-port)."""
    return f"tcp://127.0.0.1:{flag(worker.argv, '--kv-events-port')}"


def inbox_url(worker: Launched) -> str | None:
    """Where a decoder takes P's params for early decodes (its --params-port), if it has an inbox."""
    return f"tcp://127.0.0.1:{flag(worker.argv, '--params-port')}" if "--params-port" in worker.argv else None


def _split(extra: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Launcher flags, then (after "--") vLLM flags."""
    cut = extra.index("--") if "--" in extra else len(extra)
    return list(extra[:cut]), list(extra[cut + 1:])


class Setup:
    """One set-up (a name of SETUPS): `start` its processes, `send` a completion the way its clients would,
    read the decoder's transfer counters, `close`. Its metrics live at `metric_urls`."""

    def __init__(self, name: str, machine: Machine, logs: Path, connector: str = "hybrid",
                 upstream_flow: str = "toy", proxy_args: tuple[str, ...] = ()):
        if name not in SETUPS:
            raise SystemExit(f"unknown set-up {name!r}: one of {', '.join(SETUPS)}")
        self.name, self.connector, self.upstream_flow = name, connector, upstream_flow
        self.proxy_args = proxy_args  # more flags for our proxy
        self.workers = Workers(machine, logs, prefix=f"{name}-")
        self.prefillers: list[Launched] = []
        self.decoder: Launched | None = None
        self.front: Launched | None = None  # what clients call: the proxy or the colocated engine (none: toy flow)
        self.flow = "engine"

    def start(self) -> None:
        w = self.workers
        if self.name == "colocated":
            self.front = w.ready(w.start("engine", "decode", "none"))
            return
        connector = "upstream" if self.name == "upstream" else self.connector
        count = int(self.name.removeprefix("hybrid-pd-")[0]) if self.name.startswith("hybrid-pd-") else 1
        for i in range(count):
            self.prefillers.append(w.start("prefill" if count == 1 else f"prefill{i}", "prefill", connector))
            if w.machine.one_at_a_time:  # the next engine profiles its memory after this one took its share
                w.ready(self.prefillers[-1])
        self.decoder = w.ready(w.start("decode", "decode", connector))
        if not w.machine.one_at_a_time:
            for p in self.prefillers:
                w.ready(p)
        self.flow = "toy" if self.name == "upstream" and self.upstream_flow == "toy" else "proxy"
        if self.flow == "proxy":
            self.front = w.proxy(self.prefillers, self.decoder, self.proxy_args)

    def restart_proxy(self, extra: tuple[str, ...], name: str) -> None:
        """Our proxy again, with `extra` flags after the set-up's own (a peer's --pd-policy), in front of the same
        engines: the one before stops first (its log stays). Its KV index starts empty; the engines keep their
        caches, so a variant's workload needs prompts of its own."""
        if self.flow != "proxy" or self.decoder is None:
            raise SystemExit(f"{self.name}: no proxy of ours to restart")
        if self.front is not None:
            self.front.stop()
            self.workers.procs.remove(self.front)
        self.front = self.workers.proxy(self.prefillers, self.decoder, self.proxy_args + extra, name)

    @property
    def metric_urls(self) -> dict[str, str]:
        named = (("front", self.front), ("prefill", self.prefillers[0] if self.prefillers else None),
                 ("decode", self.decoder))
        return {k: v.url for k, v in named if v is not None}

    def send(self, body: dict) -> dict:
        """-> {"text", "usage", "arrivals" (s from the call), "tokens", "margins", "e2e_s", "hit_tokens", "p_s"}
        and, through the toy flow, "reported_cached" (D's usage, as the toy proxy reports it; the real hit is
        P's own prefix hit)."""
        start = time.monotonic()
        if self.flow != "toy":
            assert self.front is not None, "send before start"
            seen = stream_logprobs(self.front.url, body)
            return seen | {"e2e_s": time.monotonic() - start, "hit_tokens": cached_of(seen["usage"]), "p_s": None}
        p, d = self.prefillers[0], self.decoder
        assert d is not None, "send before start"
        p_body = {k: v for k, v in body.items() if k != "logprobs"}  # as our proxy does: P's token is dropped
        p_resp = post_json(p.url + "/v1/completions",
                           dict(p_body, max_tokens=1, stream=False, kv_transfer_params=TOY_KV_PARAMS))
        offset = time.monotonic() - start
        seen = stream_logprobs(d.url, dict(body, kv_transfer_params=p_resp["kv_transfer_params"]))
        return seen | {"arrivals": [a + offset for a in seen["arrivals"]], "e2e_s": time.monotonic() - start,
                       "hit_tokens": cached_of(p_resp.get("usage") or {}), "reported_cached": cached_of(seen["usage"]),
                       "p_s": offset}

    def placement_rates(self) -> dict[str, float]:
        """Our proxy's placement model as learned so far ({} where no proxy of ours is in front)."""
        return placement_rates(self.front.url) if self.flow == "proxy" and self.front else {}

    def transfer_counters(self) -> dict[str, float]:
        """The decoder connector's counters (demo_workload.TRANSFER_METRICS); zeros without a decoder."""
        return transfer_counters(self.decoder.url) if self.decoder else {k: 0.0 for k in TRANSFER_METRICS}

    def close(self) -> None:
        self.workers.close()


@contextlib.contextmanager
def running(setup: Setup) -> Iterator[Setup]:
    try:
        setup.start()
        yield setup
    finally:
        setup.close()


def start_pd_pair(model: str, logs: Path, procs: list[Launched], timeout: float,
                  extra: tuple[str, ...] = ()) -> dict[str, Launched]:
    """A prefiller on core 0 and a decoder on core 1 of the CPU bed (our connector), each publishing KV events
    on a port of its own (events_url); appended to `procs` (the caller stops them) and
    ready on return. `extra`: CpuBed's (launcher flags, then optionally "--" and vLLM flags)."""
    workers = Workers(CpuBed(model, extra), logs)
    pair = {"p": workers.start("p", "prefill", "hybrid"), "d": workers.start("d", "decode", "hybrid")}
    procs.extend(pair.values())
    for w in pair.values():
        workers.ready(w, timeout)
    return pair
