"""Errors of the worker launchers (prefill and decode share them).

WorkerError
+-- WorkerConfigError  a configuration known to break; the message names the flag to change
+-- WorkerStartError   the vLLM child died or never became healthy; carries its last log lines and the first
                       lines that named an exception (the root cause, which a traceback after it pushes out)
"""

from collections.abc import Sequence


class WorkerError(Exception):
    pass


class WorkerConfigError(WorkerError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("refusing to start:\n" + "\n".join(f"  - {p}" for p in problems))


class WorkerStartError(WorkerError):
    def __init__(self, message: str, last_lines: Sequence[str] = (), first_errors: Sequence[str] = ()):
        self.last_lines, self.first_errors = list(last_lines), list(first_errors)
        tail = "\n".join(f"  | {line}" for line in self.last_lines)
        errors = "\n".join(f"  | {line}" for line in self.first_errors)
        super().__init__(
            message
            + (f"\nfirst exceptions in the vLLM log:\n{errors}" if errors else "")
            + (f"\nlast lines of the vLLM log:\n{tail}" if tail else "")
        )
