"""The process patches reach processes through vLLM's own plugin loader, only where their variables are set.

Each check runs in a child interpreter that calls `vllm.plugins.load_general_plugins()`, as vLLM's API server,
engine core and workers do at start-up: what pip installed (the entry point) is what is tested.
"""

import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

LOAD = "from vllm.plugins import load_general_plugins; load_general_plugins()\n"
MOVES = """
import os
os.sched_setaffinity(0, {0})
""" + LOAD + """
os.sched_setaffinity(0, {1})          # what vLLM's NixlConnector does to a CPU worker's forward thread
print(sorted(os.sched_getaffinity(0)))
os.sched_setaffinity(0, {0, 1})       # widening or narrowing that keeps a bound core is allowed
print(sorted(os.sched_getaffinity(0)))
"""
NIXL_DELAY = LOAD + """
import nixl._api as api
print(type(api.nixlBind.nixlAgentConfig).__name__, api.nixlBind.nixlAgentConfig.__name__)
"""
SCHEDULER = LOAD + """
from vllm.v1.core.sched.scheduler import Scheduler
print(getattr(Scheduler._mamba_block_aligned_split, "hybrid_pd_synced", False))
"""
PATCHES = ("HYBRID_PD_KEEP_AFFINITY", "NIXL_PTHR_DELAY_US", "HYBRID_PD_SYNC_SCHEDULER_BLOCK")


def child(code: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in PATCHES}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                          timeout=120)


def test_the_plugin_is_installed_where_vllm_looks():
    names = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert names.get("hybrid_pd_process_patches") == "hybrid_pd.connector.plugin:register"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_with_the_variable_a_move_off_the_bound_cores_is_dropped_and_others_pass():
    out = child(MOVES, HYBRID_PD_KEEP_AFFINITY="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[0]", "[0, 1]"]
    assert "ignored a move to [1]" in out.stderr


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_without_the_variable_the_process_is_untouched():
    out = child(MOVES)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[1]", "[0, 1]"]  # the move went through: nothing patched


def test_nixl_delay_only_where_asked():
    patched, plain = child(NIXL_DELAY, NIXL_PTHR_DELAY_US="500"), child(NIXL_DELAY)
    assert patched.returncode == 0 and plain.returncode == 0, patched.stderr + plain.stderr
    assert "DelayedAgentConfig" in patched.stdout
    assert "DelayedAgentConfig" not in plain.stdout


def test_a_bad_value_is_reported_not_raised():
    out = child(NIXL_DELAY, NIXL_PTHR_DELAY_US="soon")
    assert out.returncode == 0, out.stderr
    assert "process patches not applied" in out.stderr and "NIXL_PTHR_DELAY_US" in out.stderr


def test_the_scheduler_block_patch_only_where_asked():
    """(What it does to an engine's hits and answers: tests/connector/test_local_hits.py.)"""
    patched, plain = child(SCHEDULER, HYBRID_PD_SYNC_SCHEDULER_BLOCK="1"), child(SCHEDULER)
    assert patched.returncode == 0 and plain.returncode == 0, patched.stderr + plain.stderr
    assert patched.stdout.split() == ["True"] and plain.stdout.split() == ["False"]
