"""`return_large_buffers_to_the_os`: after a large buffer raised glibc's mmap threshold, buffers just below it
freed again leave the RSS where it was; with the threshold fixed they leave nothing behind. Each case runs in a
fresh interpreter (the setting is per process)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

PROGRAM = """
import sys
from hybrid_pd.proxy.memory import return_large_buffers_to_the_os
fixed = return_large_buffers_to_the_os() if sys.argv[1] == "fix" else None
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
del_me = bytearray(8 << 20); del del_me        # a large body, freed: glibc raises its threshold to 8 MiB
before = rss()
bodies = [bytearray(1 << 20) for _ in range(64)]  # 64 bodies of 1 MiB (below the raised threshold)
last = bodies.pop()                               # the newest stays alive: the heap's top cannot shrink
del bodies
print(fixed, round(rss() - before, 1))
"""


def grown_mib(mode: str) -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    fixed, grown = out.stdout.split()
    return fixed, float(grown)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator")
def test_freed_large_buffers_leave_the_rss_where_it_was():
    assert grown_mib("fix") == ("True", pytest.approx(1.0, abs=4.0))
    fixed, grown = grown_mib("as is")  # the control: glibc's dynamic threshold keeps the freed pages
    assert fixed == "None" and grown > 40, grown
