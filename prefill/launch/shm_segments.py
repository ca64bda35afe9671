"""The engine's shared-memory segments, recorded while it runs and removed once it is dead.

vLLM's message queues between its API server, engine core and workers are POSIX shared memory
(/dev/shm/psm_*, 160-250 MB each on a GPU engine). A killed engine cannot unlink them, and a pod's
memory-backed /dev/shm keeps them across container restarts, each restart adding its engine's set. So the
launcher writes down the segments its engine's processes map (`record`, once the engine is up), and removes
the ones its dead predecessor on the same port left (`remove_stale`, before it starts vLLM) and its own engine's
(`remove_stale` again after the engine stops):

    /dev/shm/hybrid-pd-engine-8200.segments     psm_3f9a...\\npsm_77c1...\\n

Only recorded names are removed, and only while no live process maps them: other engines on the machine and
anything else in /dev/shm are left alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

SHM = Path("/dev/shm")
PREFIX = "psm_"  # Python's multiprocessing.shared_memory names, which vLLM's queues use


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid in _pids():
        parent = _parent(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, [])
    return out


def mapped_segments(pids: Iterable[int], shm: Path = SHM) -> set[str]:
    """Names of the /dev/shm segments these processes map."""
    prefix = f"{shm}/"
    out = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text(errors="replace")
        except OSError:
            continue
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
            path = fields[5] if len(fields) == 6 else ""
            if path.startswith(prefix):
                out.add(path[len(prefix) :].removesuffix(" (deleted)"))
    return out


class EngineSegments:
    """The record of one engine's segments, by the port it serves (one engine per port on a machine)."""

    def __init__(self, port: int, shm: Path = SHM):
        self.shm = shm
        self.path = shm / f"hybrid-pd-engine-{port}.segments"

    def record(self, engine_pid: int) -> set[str]:
        names = {n for n in mapped_segments(descendants(engine_pid), self.shm) if n.startswith(PREFIX)}
        try:
            known = set(self.path.read_text().split()) if self.path.exists() else set()
            self.path.write_text("".join(f"{n}\n" for n in sorted(names | known)))
        except OSError:  # no writable /dev/shm: nothing to clean up later either
            pass
        return names

    def remove_stale(self) -> list[str]:
        """Unlink the recorded segments that no live process maps; forget the record. The names removed."""
        try:
            names = self.path.read_text().split()
        except OSError:
            return []
        in_use = mapped_segments(_pids(), self.shm)
        removed = []
        for name in names:
            if name.startswith(PREFIX) and "/" not in name and name not in in_use:
                try:
                    (self.shm / name).unlink()
                    removed.append(name)
                except FileNotFoundError:
                    pass
        kept = [n for n in names if n in in_use]
        if kept:
            self.path.write_text("".join(f"{n}\n" for n in kept))
        else:
            self.path.unlink(missing_ok=True)
        return removed
