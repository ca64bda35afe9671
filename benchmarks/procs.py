"""Real processes on 127.0.0.1, started with timeouts and stopped by PID: what a benchmark (and a test) runs.

`Launched` runs one command (a `hybrid-pd prefill|decode|proxy` launcher) in its own process group, waits
for its /health, and on stop sends SIGTERM to the launcher (which forwards it to vLLM), then SIGKILLs
whatever of the group or its descendants is left, and reports survivors.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
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
    """A launcher process, logging to a file; `stop` reports what had to be killed by force."""

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
