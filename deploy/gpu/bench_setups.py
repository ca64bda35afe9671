"""The set-ups the GPU benchmark compares (bench_gpu.py): engines started one after the other when they share a
GPU (each profiles its memory alone), at once when P and D have a GPU each, and how each set-up's clients send
a completion (colocated engine, upstream's toy flow, our proxy)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench_client import cached_of, log, post_json, stream_logprobs

from hybrid_pd.prefill.dev.demo_workload import transfer_counters
from tests.support.procs import HYBRID_PD, Launched, free_port


def vllm_extra(args) -> list[str]:
    extra = ["--additional-config", json.dumps({"gdn_prefill_backend": "triton"})]  # Hopper: no CuTe DSL needed
    if args.graphs == "none":
        extra += ["--enforce-eager"]
    elif args.graphs == "decode":  # full CUDA graphs for decode steps, no torch.compile (start-up in seconds)
        sizes = [s for s in (1, 2, 4, 8, 16, 24, 32, 48, 64) if s <= args.max_num_seqs]
        extra += ["--compilation-config", json.dumps({"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY",
                                                      "cudagraph_capture_sizes": sizes})]
    # "full": vLLM's default (torch.compile + piecewise and full graphs)
    return extra


class Engines:
    """The processes of one set-up: workers started one after the other, then the proxy."""

    def __init__(self, args, logs: Path):
        self.args, self.logs = args, logs
        self.procs: list[Launched] = []
        self.start_s: dict[str, float] = {}
        self.started: dict[str, float] = {}
        self.env: dict[str, str] = {}
        if args.v2:
            self.env["VLLM_USE_V2_MODEL_RUNNER"] = "1"

    def worker(self, name: str, role: str, connector: str, gpu: int) -> Launched:
        """Start a launcher on GPU `gpu` (not waiting: `ready` does)."""
        a = self.args
        port = free_port()
        argv = [HYBRID_PD, role, "--device", "gpu", "--connector", connector, "--model", a.model,
                "--port", str(port), "--side-channel-port", str(free_port()), "--kv-events-port", str(free_port()),
                "--gpu-memory-utilization", str(a.util), "--max-model-len", str(a.max_model_len),
                "--max-num-batched-tokens", str(a.max_num_batched_tokens), "--max-num-seqs", str(a.max_num_seqs),
                "--served-model-name", "m", "--startup-timeout", "560",
                "--warmup-lengths", a.launcher_warmup, "--ready-file", str(self.logs / f"{name}.ready")]
        argv += (["--checkpoint-every", str(a.checkpoint_every)] if a.checkpoint_every else [])
        argv += ["--"] + vllm_extra(a)
        proc = Launched(name, argv, f"http://127.0.0.1:{port}", self.logs,
                        env=dict(self.env, CUDA_VISIBLE_DEVICES=str(gpu)))
        self.procs.append(proc)
        self.started[name] = time.monotonic()
        log(f"starting {name} on GPU {gpu}: {' '.join(argv[1:])}")
        return proc

    def ready(self, proc: Launched) -> Launched:
        """Wait for /health, then for the launcher's warm-up (it compiles kernels) to write its ready file."""
        name = proc.name
        proc.wait_healthy(580)
        self.start_s[name] = round(time.monotonic() - self.started[name], 1)
        warm = proc.wait_file(self.logs / f"{name}.ready", 300)
        self.start_s[f"{name} warm-up"] = round(warm, 1)
        said = [line for line in proc.log_path.read_text().splitlines() if "[hybrid-pd] warm-up:" in line]
        log(f"{name} healthy after {self.start_s[name]} s, ready {warm:.1f} s later; {said[-1] if said else ''}")
        return proc

    def proxy(self, prefill: list[Launched], decode: Launched) -> Launched:
        port = free_port()
        argv = [HYBRID_PD, "proxy", "--port", str(port), "--decode", decode.url,
                "--decode-policy", "kv_hit=2,least_loaded", "--prefill-policy", "kv_hit=2,least_loaded"]
        for p in prefill:
            argv += ["--prefill", p.url, "--prefill-events", f"tcp://127.0.0.1:{flag(p.argv, '--kv-events-port')}"]
        argv += ["--decode-events", f"tcp://127.0.0.1:{flag(decode.argv, '--kv-events-port')}"]
        proc = Launched("proxy", argv, f"http://127.0.0.1:{port}", self.logs)
        self.procs.append(proc)
        proc.wait_healthy(60)
        return proc

    def close(self) -> None:
        for proc in reversed(self.procs):
            try:
                proc.stop()
            except Exception as e:  # keep stopping the others
                log(f"stopping {proc.name}: {e}")


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


class Setup:
    """Sends one completion the way the set-up's clients would; knows where its metrics live."""

    def __init__(self, name: str, engines: Engines, upstream_flow: str):
        self.name = name
        e = engines
        if name == "colocated":  # alone on the decoder's GPU
            self.front = e.ready(e.worker("engine", "decode", "none", e.args.decode_gpu))
            self.p = self.d = None
            self.flow = "engine"
        else:
            connector = "upstream" if name == "upstream" else "hybrid"
            gp, gd = e.args.prefill_gpu, e.args.decode_gpu
            self.p = e.worker("prefill", "prefill", connector, gp)
            if gp == gd:  # sharing a GPU: the second engine profiles its memory after the first took its share
                e.ready(self.p)
            self.d = e.ready(e.worker("decode", "decode", connector, gd))
            if gp != gd:  # a GPU each: both started at once
                e.ready(self.p)
            self.flow = "toy" if name == "upstream" and upstream_flow == "toy" else "proxy"
            self.front = e.proxy([self.p], self.d) if self.flow == "proxy" else None
        self.metric_urls = {k: v.url for k, v in (("front", self.front), ("prefill", self.p), ("decode", self.d))
                            if v is not None}

    def send(self, body: dict) -> dict:
        start = time.monotonic()
        if self.flow != "toy":
            seen = stream_logprobs(self.front.url, body)
            return seen | {"e2e_s": time.monotonic() - start, "hit_tokens": cached_of(seen["usage"]), "p_s": None}
        p_body = {k: v for k, v in body.items() if k != "logprobs"}  # as our proxy does: P's token is dropped
        p_resp = post_json(self.p.url + "/v1/completions", dict(p_body, max_tokens=1, stream=False, kv_transfer_params={
            "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None}))
        offset = time.monotonic() - start
        seen = stream_logprobs(self.d.url, dict(body, kv_transfer_params=p_resp["kv_transfer_params"]))
        return seen | {"arrivals": [a + offset for a in seen["arrivals"]], "e2e_s": time.monotonic() - start,
                       "hit_tokens": cached_of(p_resp.get("usage") or {}), "reported_cached": cached_of(seen["usage"]),
                       "p_s": offset}

    def counters(self) -> dict:
        return transfer_counters(self.d.url) if self.d else {}


