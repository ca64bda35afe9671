"""The set-ups a benchmark compares, on the same engine configuration, started one after the other.

- colocated: one engine, no connector: the quality bar (every hit is local, nothing moves).
- upstream: vLLM's NixlConnector on a prefill and a decode worker, driven by the toy proxy's flow (P with
  max_tokens=1 and do_remote_decode, then D with P's kv_transfer_params), done by the client.
- hybrid-pd-1p1d / hybrid-pd-2p1d: our proxy in front of one or two prefill workers and a decode worker.

Every set-up sends a request and returns what the client saw: streamed tokens with their arrival times and
the usage block. Processes are ours (launchers on 127.0.0.1) and are stopped by PID when the set-up closes.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from pathlib import Path

from hybrid_pd.prefill.dev.demo_workload import TRANSFER_METRICS, stream, transfer_counters
from tests.support.procs import HYBRID_PD, Launched, free_port, worker_argv


def post_stream(url: str, body: dict) -> tuple[list[float], dict, float]:
    """Stream a completion; return (token arrival times from the call, usage, end-to-end seconds)."""
    start = time.monotonic()
    _, usage, _, arrivals = stream(url, "/v1/completions", body)
    return arrivals, usage, time.monotonic() - start


def post_json(url: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def cached_of(usage: dict) -> int:
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


class Setup:
    name = "setup"

    worker_args: tuple[str, ...] = ()  # extra launcher flags for every worker of every set-up (run.py --worker-args)

    def __init__(self, model: str, logs: Path, connector: str = "upstream"):
        self.model, self.logs, self.connector = model, logs, connector
        self.procs: list[Launched] = []
        self.decode_url = ""

    def worker(self, name: str, role: str, connector: str, core: str) -> Launched:
        port = free_port()
        proc = Launched(f"{self.name}-{name}", worker_argv(role, connector=connector, port=port, cpu_bind=core,
                                                           model=self.model, extra=self.worker_args),
                        f"http://127.0.0.1:{port}", self.logs)
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        raise NotImplementedError

    def send(self, body: dict) -> dict:
        """-> {"arrivals", "usage", "e2e_s", "hit_tokens"}"""
        raise NotImplementedError

    def transfer_counters(self) -> dict[str, float]:
        return transfer_counters(self.decode_url) if self.decode_url else {k: 0.0 for k in TRANSFER_METRICS}

    def wait(self) -> None:
        for proc in self.procs:
            proc.wait_healthy(900)

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


class Colocated(Setup):
    name = "colocated"

    def start(self) -> None:
        self.engine = self.worker("engine", "decode", "none", "1")
        self.wait()

    def send(self, body: dict) -> dict:
        arrivals, usage, e2e = post_stream(self.engine.url, body)
        return {"arrivals": arrivals, "usage": usage, "e2e_s": e2e, "hit_tokens": cached_of(usage)}


class UpstreamToyProxy(Setup):
    name = "upstream"

    def start(self) -> None:
        self.p = self.worker("prefill", "prefill", "upstream", "0")
        self.d = self.worker("decode", "decode", "upstream", "1")
        self.decode_url = self.d.url
        self.wait()

    def send(self, body: dict) -> dict:
        start = time.monotonic()
        p_resp = post_json(self.p.url + "/v1/completions", dict(body, max_tokens=1, stream=False, kv_transfer_params={
            "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None}))
        offset = time.monotonic() - start
        arrivals, usage, e2e = post_stream(self.d.url, dict(body, kv_transfer_params=p_resp["kv_transfer_params"]))
        # the toy proxy reports D's usage as is; the real hit is P's own prefix hit
        return {"arrivals": [a + offset for a in arrivals], "usage": usage, "e2e_s": e2e + offset,
                "hit_tokens": cached_of(p_resp.get("usage") or {}), "reported_cached": cached_of(usage)}


class HybridPD(Setup):
    def __init__(self, model: str, logs: Path, connector: str = "upstream", prefillers: int = 1):
        super().__init__(model, logs, connector)
        self.prefillers = prefillers
        self.name = f"hybrid-pd-{prefillers}p1d"

    def start(self) -> None:
        ps = [self.worker(f"prefill{i}", "prefill", self.connector, "0") for i in range(self.prefillers)]
        d = self.worker("decode", "decode", self.connector, "1")
        self.decode_url = d.url
        self.wait()
        port = free_port()
        argv = [HYBRID_PD, "proxy", "--port", str(port), "--decode", d.url,
                "--decode-policy", "kv_hit=2,least_loaded", "--prefill-policy", "kv_hit=2,least_loaded"]
        for p in ps:
            argv += ["--prefill", p.url, "--prefill-events", f"tcp://127.0.0.1:{_flag(p.argv, '--kv-events-port')}"]
        argv += ["--decode-events", f"tcp://127.0.0.1:{_flag(d.argv, '--kv-events-port')}"]
        self.proxy = Launched(f"{self.name}-proxy", argv, f"http://127.0.0.1:{port}", self.logs)
        self.procs.append(self.proxy)
        self.proxy.wait_healthy(60)

    def send(self, body: dict) -> dict:
        arrivals, usage, e2e = post_stream(self.proxy.url, body)
        return {"arrivals": arrivals, "usage": usage, "e2e_s": e2e, "hit_tokens": cached_of(usage)}


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@contextlib.contextmanager
def running(setup: Setup):
    try:
        setup.start()
        yield setup
    finally:
        setup.close()


def start_pd_pair(model: str, logs: Path, procs: list[Launched], timeout: float) -> tuple[dict[str, Launched], dict]:
    """A prefiller on core 0 and a decoder on core 1 (our connector), each publishing KV events on a port of its
    own; appended to `procs` (the caller stops them) and healthy on return. Returns (workers, ports)."""
    ports = {k: free_port() for k in ("p", "d", "p_events", "d_events")}
    workers: dict[str, Launched] = {}
    for name, role, core in (("p", "prefill", "0"), ("d", "decode", "1")):
        argv = worker_argv(role, connector="hybrid", port=ports[name], cpu_bind=core, model=model)
        argv[argv.index("--kv-events-port") + 1] = str(ports[f"{name}_events"])
        workers[name] = Launched(name, argv, f"http://127.0.0.1:{ports[name]}", logs)
        procs.append(workers[name])
    for w in workers.values():
        w.wait_healthy(timeout)
    return workers, ports
