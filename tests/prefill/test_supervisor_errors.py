"""A child that dies before it is healthy: the error names its first exceptions (the root cause), even where a
long traceback after them fills the tail, as vLLM's API server's does when its engine core fails to start."""

from __future__ import annotations

import sys

import pytest

from hybrid_pd.prefill.launch.errors import WorkerStartError
from hybrid_pd.prefill.launch.supervisor import ChildProcess
from tests.support.procs import free_port

# What a failed engine start looks like: the engine core's root cause, then the API server's own traceback.
DYING = """
print("(EngineCore pid=7) ERROR EngineCore failed to start.")
print("(EngineCore pid=7) Traceback (most recent call last):")
print('(EngineCore pid=7)   File "core.py", line 1, in run')
print("(EngineCore pid=7) ValueError: Free memory on device cuda:0 (3.1/79.2 GiB) is less than desired (4.8 GiB)")
for i in range(200):
    print(f'  File "frame{i}.py", line {i}, in f')
print("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}")
raise SystemExit(1)
"""


def test_a_dead_childs_error_names_its_root_cause_beyond_the_tail():
    child = ChildProcess("dying", [sys.executable, "-c", DYING], f"http://127.0.0.1:{free_port()}", keep_lines=20)
    child.start()
    with pytest.raises(WorkerStartError) as caught:
        child.wait_healthy(timeout=30, poll=0.05)
    error = caught.value
    assert error.first_errors == [
        "(EngineCore pid=7) ValueError: Free memory on device cuda:0 (3.1/79.2 GiB) is less than desired (4.8 GiB)",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ]
    assert not any("ValueError" in line for line in error.last_lines)  # the tail alone would have lost it
    text = str(error)
    assert text.index("first exceptions") < text.index("Free memory") < text.index("last lines")
