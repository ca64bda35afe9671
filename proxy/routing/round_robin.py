"""Round robin among the workers that share the best score: plain round robin when no scorer is set, and
a fair tie-break otherwise (equal load, equal hit)."""

from __future__ import annotations

from collections.abc import Sequence

from ..workers import Worker
from .base import Deps, RequestContext
from .registry import register_picker


@register_picker("round_robin")
class RoundRobinPicker:
    def __init__(self, deps: Deps | None = None):
        self._next = 0

    def pick(self, ctx: RequestContext, workers: Sequence[Worker], scores: Sequence[float]) -> Worker:
        best = max(scores)
        tied = [w for w, s in zip(workers, scores) if s >= best - 1e-9]
        chosen = tied[self._next % len(tied)]
        self._next += 1
        return chosen
