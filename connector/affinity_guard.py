"""Keep every thread of a CPU engine on the cores its launcher gave it (`--cpu-bind`).

vLLM's NixlConnector, on the CPU platform only, moves the worker's main thread (the one that runs the model
forward) onto the last core of each NUMA node, to "reserve cores for start_load_kv" (vLLM 0.32,
kv_connector/v1/nixl/base_worker.py). With one NUMA node of two cores, a prefill worker bound to core 0 gets
its forward moved onto core 1, the decode worker's core, where it waits in the run queue behind the decoder's
spinning worker: measured on the 2-core test bed, upstream's prefill leg took 0.13-0.78 s per agent-loop turn
instead of 43-80 ms (ours: 50-74 ms), which made every CPU comparison with upstream unfair.

The launchers set HYBRID_PD_KEEP_AFFINITY=1 for CPU engines; our vLLM plugin (connector/plugin.py) then
calls `install()` in every process vLLM starts, its engine-core and worker processes included. It drops a call that
would move the calling thread entirely off the cores it is bound to; narrowing within them still works.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable

_installed = False


def install() -> bool:
    global _installed
    if _installed:
        return True
    original = os.sched_setaffinity

    def sched_setaffinity(pid: int, mask: Iterable[int], _original: Callable = original) -> None:
        mask = set(mask)
        if pid == 0 and not mask & os.sched_getaffinity(0):
            print(
                f"[hybrid-pd] kept this thread on cores {sorted(os.sched_getaffinity(0))}: ignored a move to "
                f"{sorted(mask)} (HYBRID_PD_KEEP_AFFINITY)",
                file=sys.stderr,
                flush=True,
            )
            return None
        return _original(pid, mask)

    os.sched_setaffinity = sched_setaffinity
    _installed = True
    return True
