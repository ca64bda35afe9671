"""The launcher's ready file, and the probe that tests it (Kubernetes startup and readiness probes).

The file exists while the worker is warm and not stopping, and names the processes that must be alive for it
to mean anything: the launcher and the engine (vLLM's API server), each as (pid, start time in clock ticks
since boot, from /proc/PID/stat). The probe passes only while both of those exact processes run:

    python3 -m hybrid_pd.prefill.launch.ready /tmp/hybrid-pd-ready     # exit 0: ready; 1: not

A file left behind by a killed container (an OOM kill leaves the pod's emptyDir as it was) names a launcher
that is gone, even where the new launcher got the same PID (PID 1 of the container): its start time differs.
An engine killed under a live launcher fails the probe at once, before the launcher notices and clears the
file. Standard library only: the probe runs every few seconds.
"""

from __future__ import annotations

import os
import sys

DEAD_STATES = {"Z", "X", "x"}  # zombie (killed, not reaped yet), dead


def process_start(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None when no live process has this PID."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": comm may hold spaces and parentheses
    if fields[0] in DEAD_STATES:
        return None
    return int(fields[19])  # field 22 of stat(5); fields[0] is field 3


class ReadyFile:
    """Written once the worker is warm (`set`), removed when it stops (`clear`); cleared when made, so a launcher
    never starts with its predecessor's file."""

    def __init__(self, path: str | None):
        self.path = path
        self.clear()

    def set(self, engine_pid: int | None = None) -> None:
        if not self.path:
            return
        pids = [os.getpid()] + ([engine_pid] if engine_pid is not None else [])
        lines = [f"{pid} {process_start(pid)}\n" for pid in pids]
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            f.writelines(lines)
        os.replace(tmp, self.path)  # the probe never reads half a file

    def clear(self) -> None:
        if self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def check(path: str) -> str | None:
    """None when ready; else why not."""
    try:
        with open(path, encoding="ascii") as f:
            lines = [line.split() for line in f if line.strip()]
    except OSError:
        return f"no ready file {path}"
    if not lines:
        return f"{path} names no process"
    for fields in lines:
        try:
            pid, started = int(fields[0]), int(fields[1])
        except (IndexError, ValueError):
            return f"{path}: not a ready file: {fields}"
        if process_start(pid) != started:
            return f"{path}: process {pid} (started at tick {started}) is gone"
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python3 -m hybrid_pd.prefill.launch.ready READY_FILE", file=sys.stderr)
        return 2
    why = check(args[0])
    if why:
        print(why, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
