"""Errors of the worker launchers (prefill and decode share them).

WorkerError
+-- WorkerConfigError  a configuration known to break; the message names the flag to change
+-- WorkerStartError   the vLLM child died or never became healthy; carries its last log lines
"""

from collections.abc import Sequence


class WorkerError(Exception):
    pass


class WorkerConfigError(WorkerError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("refusing to start:\n" + "\n".join(f"  - {p}" for p in problems))


class WorkerStartError(WorkerError):
    def __init__(self, message: str, last_lines: Sequence[str] = ()):
        self.last_lines = list(last_lines)
        tail = "\n".join(f"  | {line}" for line in self.last_lines)
        super().__init__(message + (f"\nlast lines of the vLLM log:\n{tail}" if tail else ""))
