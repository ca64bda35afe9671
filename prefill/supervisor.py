"""Run a vLLM server as a child process: start it, wait for health, forward signals, report its death.

The child gets its own process group, so stopping it stops vLLM's engine-core processes too. Its output is
copied line by line to our stdout (or a log file) and the last lines are kept for the error message when it
dies. Used by the launchers and by the tests, which stop every worker they start by its PID.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import IO

from hybrid_pd.prefill.errors import WorkerStartError
from hybrid_pd.prefill.worker_config import WorkerConfig


class Worker:
    """One vLLM server process and its log tail."""

    def __init__(self, config: WorkerConfig, log: IO[str] | None = None, keep_lines: int = 60):
        self.config = config
        self._log = log
        self.tail: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self.proc: subprocess.Popen | None = None
        self._pump: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> "Worker":
        self.proc = subprocess.Popen(
            self.config.argv(), env=self.config.env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            start_new_session=True,  # own process group: one killpg stops the engine core as well
        )
        self._pump = threading.Thread(target=self._copy_output, name=f"log-{self.config.role}", daemon=True)
        self._pump.start()
        return self

    def _copy_output(self) -> None:
        assert self.proc and self.proc.stdout
        for line in self.proc.stdout:
            self.tail.append(line.rstrip("\n"))
            if self._log is not None:
                try:
                    self._log.write(line)
                    self._log.flush()
                except ValueError:  # log closed under us at shutdown
                    pass

    def wait_healthy(self, timeout: float = 600.0, poll: float = 0.5) -> float:
        """Block until GET /health answers 200; return the seconds it took. Raise if the child dies first."""
        assert self.proc
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                self._drain()
                raise WorkerStartError(f"{self.config.role} worker exited with code {self.proc.returncode} "
                                       "before it became healthy", list(self.tail))
            if health_ok(self.config.url):
                return time.monotonic() - start
            time.sleep(poll)
        raise WorkerStartError(f"{self.config.role} worker not healthy after {timeout:.0f}s", list(self.tail))

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace: float = 20.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds; return the exit code."""
        if not self.proc:
            return None
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)
        # vLLM's engine core may outlive the API server for a moment: make sure the group is gone.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._drain()
        return self.proc.returncode

    def _drain(self) -> None:
        if self._pump:
            self._pump.join(timeout=5)


def health_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def run_until_signalled(worker: Worker, startup_timeout: float) -> int:
    """The launcher's main loop: start, wait for health, forward SIGTERM/SIGINT, return the exit code."""
    stop = threading.Event()

    def forward(signum, _frame):
        stop.set()
        worker.signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    worker.start()
    try:
        took = worker.wait_healthy(startup_timeout)
    except WorkerStartError:
        worker.stop()
        raise
    print(f"[hybrid-pd] {worker.config.role} worker healthy at {worker.config.url} after {took:.1f}s "
          f"(pid {worker.pid}, kv events {worker.config.kv_events_endpoint})", flush=True)
    assert worker.proc
    code = worker.proc.wait()
    if not stop.is_set() and code != 0:
        worker._drain()
        raise WorkerStartError(f"{worker.config.role} worker died with code {code}", list(worker.tail))
    worker.stop(grace=5)
    return 0 if stop.is_set() else code
