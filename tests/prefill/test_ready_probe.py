"""Readiness that cannot lie, and restarts that leave nothing behind, with the real launcher loop
(prefill/launch/supervisor.py) around a fake engine: a small HTTP server that answers /health and maps a
shared-memory segment as vLLM's queues do.

- the engine killed: the probe fails at once, before the launcher has noticed;
- the whole container killed (an OOM kill): the ready file stays in its emptyDir, and the probe fails on it;
- the next launcher on that port removes the segments its killed predecessor's engine left, and nothing else.
"""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hybrid_pd.prefill.launch.ready import ReadyFile, check, process_start
from tests.support.procs import free_port

ENGINE = """
import http.server, mmap, os, sys
port, shm = int(sys.argv[1]), sys.argv[2]
path = f"{shm}/psm_{port}_{os.getpid()}"
with open(path, "wb") as f:
    f.truncate(1 << 20)
with open(path, "r+b") as f:
    segment = mmap.mmap(f.fileno(), 0)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""

LAUNCHER = """
import sys
from pathlib import Path
from hybrid_pd.prefill.launch.ready import ReadyFile
from hybrid_pd.prefill.launch.shm_segments import EngineSegments
from hybrid_pd.prefill.launch.supervisor import ChildProcess, run_until_signalled
port, ready, shm, engine = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4]
child = ChildProcess("fake engine", [sys.executable, "-c", engine, str(port), str(shm)],
                     f"http://127.0.0.1:{port}", log=sys.stdout)
sys.exit(run_until_signalled(child, 60, ready=ReadyFile(ready), segments=EngineSegments(port, shm)))
"""


def probe(ready: Path) -> int:
    """What the kubelet runs (deploy/k8s/base/*.yaml)."""
    return subprocess.run([sys.executable, "-m", "hybrid_pd.prefill.launch.ready", str(ready)], capture_output=True,
                          timeout=30).returncode


def launch(port: int, ready: Path, shm: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", LAUNCHER, str(port), str(ready), str(shm), ENGINE],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_ready(ready: Path, launcher: subprocess.Popen) -> list[int]:
    """The pids the ready file names (launcher, engine), once it names this launcher."""
    deadline = time.monotonic() + 60
    while True:
        assert launcher.poll() is None, launcher.stdout.read() if launcher.stdout else ""
        assert time.monotonic() < deadline, "no ready file of this launcher after 60 s"
        try:
            pids = [int(line.split()[0]) for line in ready.read_text().splitlines()]
        except FileNotFoundError:
            pids = []
        if pids[:1] == [launcher.pid]:
            return pids
        time.sleep(0.05)


def test_the_probe_fails_at_once_when_the_engine_dies(tmp_path: Path):
    port, ready = free_port(), tmp_path / "ready"
    launcher = launch(port, ready, tmp_path)
    try:
        launcher_pid, engine_pid = wait_ready(ready, launcher)
        assert launcher_pid == launcher.pid and probe(ready) == 0
        os.kill(launcher_pid, signal.SIGSTOP)  # the launcher cannot notice: only the probe can
        os.kill(engine_pid, signal.SIGKILL)
        started = time.monotonic()
        while process_start(engine_pid) is not None:  # the kernel's kill is asynchronous (microseconds)
            assert time.monotonic() - started < 5
        assert ready.exists()  # nobody cleared it; the engine is a zombie its frozen parent has not reaped
        assert check(str(ready)) == f"{ready}: process {engine_pid} (started at tick " \
            f"{ready.read_text().split()[3]}) is gone"
        assert probe(ready) == 1
        os.kill(launcher_pid, signal.SIGCONT)
        assert launcher.wait(30) == 1 and not ready.exists()  # the launcher exits with its engine
    finally:
        launcher.kill()


def test_a_ready_file_left_by_a_killed_container_fails_the_probe(tmp_path: Path):
    ready = tmp_path / "ready"
    ReadyFile(str(ready)).set()
    assert check(str(ready)) is None  # names this process, alive
    pid, started = ready.read_text().split()
    ready.write_text(f"{pid} {int(started) - 1}\n")  # the same PID (PID 1 of a restarted container), restarted
    assert check(str(ready)) == f"{ready}: process {pid} (started at tick {int(started) - 1}) is gone"
    assert probe(ready) == 1
    ReadyFile(str(ready))  # a launcher clears its predecessor's file first thing
    assert not ready.exists() and probe(ready) == 1
    assert process_start(os.getpid()) == int(started)


def test_a_restarted_launcher_removes_what_its_killed_engine_left_and_nothing_else(tmp_path: Path):
    port, ready = free_port(), tmp_path / "ready"
    other = tmp_path / "psm_another_engine"  # not recorded: another engine's, or anything else in /dev/shm
    other.write_bytes(b"x")
    launcher = launch(port, ready, tmp_path)
    launcher_pid, engine_pid = wait_ready(ready, launcher)
    killed_segment = tmp_path / f"psm_{port}_{engine_pid}"
    assert killed_segment.exists()
    assert (tmp_path / f"hybrid-pd-engine-{port}.segments").read_text() == f"{killed_segment.name}\n"
    # the container is OOM-killed: launcher and engine at once; nothing runs to clean up
    os.killpg(launcher_pid, signal.SIGKILL)
    os.killpg(engine_pid, signal.SIGKILL)
    launcher.wait(30)
    while process_start(engine_pid) is not None:
        time.sleep(0.05)
    assert killed_segment.exists() and ready.exists() and probe(ready) == 1
    # a recorded segment that a live process still maps stays (as a record of it)
    held = tmp_path / "psm_still_mapped"
    held.write_bytes(b"\0" * 4096)
    with open(tmp_path / f"hybrid-pd-engine-{port}.segments", "a") as f:
        f.write(f"{held.name}\n")
    with open(held, "r+b") as f, mmap.mmap(f.fileno(), 0):
        again = launch(port, ready, tmp_path)
        try:
            _, new_engine = wait_ready(ready, again)
            assert not killed_segment.exists()
            assert held.exists() and other.exists() and (tmp_path / f"psm_{port}_{new_engine}").exists()
            again.terminate()
            out = again.communicate(timeout=30)[0]
            assert "removed 1 shared-memory segments a previous engine on this port left" in out, out
        finally:
            again.kill()
