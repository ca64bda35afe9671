"""The affinity guard keeps a thread on the cores its launcher bound it to (run in a child interpreter)."""

import os
import subprocess
import sys

import pytest

CHILD = """
import os
from hybrid_pd.prefill.affinity_guard import install
os.sched_setaffinity(0, {0})
assert install()
os.sched_setaffinity(0, {1})          # what vLLM's NixlConnector does to a CPU worker's forward thread
print(sorted(os.sched_getaffinity(0)))
os.sched_setaffinity(0, {0, 1})       # widening or narrowing that keeps a bound core is allowed
print(sorted(os.sched_getaffinity(0)))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_move_off_the_bound_cores_is_dropped_and_others_pass():
    out = subprocess.run([sys.executable, "-c", CHILD], env={**os.environ, "HYBRID_PD_KEEP_AFFINITY": "1"},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[0]", "[0, 1]"]
    assert "ignored a move to [1]" in out.stderr


def test_without_the_variable_nothing_is_installed():
    out = subprocess.run([sys.executable, "-c", "from hybrid_pd.prefill.affinity_guard import install; "
                          "print(install())"], env={k: v for k, v in os.environ.items()
                                                   if k != "HYBRID_PD_KEEP_AFFINITY"},
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False"
