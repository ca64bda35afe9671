"""Test support: real processes on 127.0.0.1, started with timeouts and stopped by PID.

`Launched` runs one command (a `hybrid-pd prefill|decode|proxy` launcher) in its own process group, waits
for its /health, and on stop sends SIGTERM to the launcher (which forwards it to vLLM), then SIGKILLs
whatever of the group or its descendants is left, and reports survivors.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from hybrid_pd.prefill.launch.supervisor import ChildProcess

BIN = Path(sys.executable).parent
HYBRID_PD = str(BIN / "hybrid-pd") if (BIN / "hybrid-pd").exists() else shutil.which("hybrid-pd")


_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A free port below the kernel's ephemeral range, never handed out before in this process.

    A port from the ephemeral range (what binding port 0 gives) can be taken as the source port of any
    outgoing connection once its server is gone, and stays taken in TIME_WAIT for a minute: a worker restarted
    on its own port then found its side-channel port "already in use" (CI, test_rejoin). Below the range only
    listeners take ports.
    """
    low = _ephemeral_range()[0]
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(max(1024, low - 12000), low)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


class Launched(ChildProcess):
    """A launcher process under test, logging to a file; `stop` reports what had to be killed by force."""

    def __init__(self, name: str, argv: list[str], url: str, log_dir: Path, env: dict | None = None):
        self.log_path = log_dir / f"{name}.log"
        super().__init__(name, argv, url, env={**os.environ, **(env or {})}, log=open(self.log_path, "w"))
        self.start()

    def wait_file(self, path: Path, timeout: float, poll: float = 0.2) -> float:
        """Block until `path` exists (a launcher's --ready-file); return the seconds it took. Raise if the
        launcher exits first or the time runs out."""
        start = time.monotonic()
        while not path.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode} before writing {path}")
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"{self.name}: no {path} after {timeout:.0f} s")
            time.sleep(poll)
        return time.monotonic() - start

    def descendants(self) -> list:
        import psutil

        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, grace: float = 30) -> list[int]:
        """SIGTERM the launcher only (it must stop vLLM itself); return the PIDs that survived it."""
        import psutil

        kids = self.descendants()
        survivors = []
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM, group=False)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                survivors.append(self.pid)
        survivors += [p.pid for p in psutil.wait_procs(kids, timeout=10)[1]]
        super().stop(grace=5)  # SIGKILLs the group if anything is left
        self._log.close()
        return survivors


def http_json(url: str, body: dict | None = None, timeout: float = 120) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def scrape_metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    pass
        return out


def metric_sum(metrics: dict[str, float], name: str) -> float:
    """Sum a metric over all its label sets (`name{...} value` lines)."""
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


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
        vllm_args = ["--enforce-eager", *json.loads(os.environ.get("HYBRID_PD_TEST_VLLM_ARGS", "[]")), *vllm_args]
    else:
        # no warm-up (the launcher warms CPUs up at 1024 tokens): ~10 s per engine start, and the tests' first requests
        # are not timed; tests of the warm-up ask for it
        argv += ["--cpu-bind", cpu_bind, "--kv-cache-gib", "1", "--max-model-len", "2048",
                 "--max-num-batched-tokens", "2048", "--warmup-lengths", "none"]
    if model:
        argv += ["--model", model]
    return argv + launcher_args + (["--", *vllm_args] if vllm_args else [])


