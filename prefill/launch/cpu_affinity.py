"""The launcher's CPU cores: its own (`pin`), and other hybrid-pd workers on this machine bound to the same ones.

Two CPU engines on one core starve each other's threads. A prefiller alone with the decoder on one core now
feeds it (tests/e2e/test_contention.py), but in 2P1D on two cores every KV load from the prefiller that shares
the decoder's busiest core still failed its handshake (benchmarks/results/2026-11-24-cpu-burst/summary.md).
Laptops, the cpu-dev overlay and 2P1D on two cores all do it, so the launcher says so at start instead of
accepting the layout silently. Found by their command lines in /proc, not by asking them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROLES = ("prefill", "decode")


def parse_cores(spec: str | None) -> set[int] | None:
    """vLLM's VLLM_CPU_OMP_THREADS_BIND syntax ("0", "0-3,6", one list per TP rank joined by "|") -> cores, or
    None for no binding ("auto", "nobind", empty). ValueError if it does not parse."""
    if spec in (None, "", "auto", "nobind"):
        return None
    cores: set[int] = set()
    for part in spec.replace("|", ",").split(","):
        low, _, high = part.strip().partition("-")
        cores.update(range(int(low), int(high or low) + 1))
    return cores


def launcher_binding(argv: list[str]) -> tuple[str, str | None] | None:
    """(role, --cpu-bind or None when not given) of a `hybrid-pd prefill|decode ...` CPU worker's command line,
    else None (another program, the proxy, a GPU worker)."""
    for i, arg in enumerate(argv[:-1]):
        if os.path.basename(arg) == "hybrid-pd" and argv[i + 1] in ROLES:
            flags = argv[i + 2 :]
            if flag_value(flags, "--device") == "gpu":
                return None
            return argv[i + 1], flag_value(flags, "--cpu-bind")
    return None


def flag_value(flags: list[str], name: str) -> str | None:
    """The value of `name VALUE` or `name=VALUE` in an argument list (the first one), else None."""
    for j, flag in enumerate(flags):
        if flag == name and j + 1 < len(flags):
            return flags[j + 1]
        if flag.startswith(name + "="):
            return flag.split("=", 1)[1]
    return None


def sharing(cores: set[int], defaults: dict[str, str], proc: Path = Path("/proc")) -> list[str]:
    """The other CPU worker launchers whose cores (their --cpu-bind, else their role's default in `defaults`)
    overlap `cores`, described for a warning."""
    out = []
    for entry in sorted(proc.iterdir(), key=lambda p: p.name):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:  # gone, or not ours to read
            continue
        found = launcher_binding(argv)
        if not found:
            continue
        role, spec = found
        spec = spec if spec is not None else defaults.get(role)
        try:
            theirs = parse_cores(spec)
        except ValueError:
            continue
        if theirs and theirs & cores:
            out.append(f"the {role} worker pid {entry.name} (--cpu-bind {spec})")
    return out


def pin(cores: set[int], bind: str, defaults: dict[str, str]) -> None:
    """Warn about other workers on these cores, then bind this process to them. Every process the launcher starts
    inherits its cores from the first instruction: vLLM's own binding comes late (its worker), and until then
    `import torch` ran wherever the scheduler put it, once for minutes behind a busy decoder's spinning core."""
    for other in sharing(cores, defaults):
        print(
            f"[hybrid-pd] warning: --cpu-bind {bind} shares cores with {other}: two engines on one core starve each "
            "other's threads (slower steps and KV transfers); give each worker cores of its own",
            file=sys.stderr,
            flush=True,
        )
    os.sched_setaffinity(0, cores)
