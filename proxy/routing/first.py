"""The first worker (in configured order) among those with the best score: deterministic, for tests and for
operators who want a primary with fall-over."""

from __future__ import annotations

from collections.abc import Sequence

from ..workers import Worker
from .base import Deps, RequestContext
from .registry import register_picker


@register_picker("first")
class FirstBestPicker:
    def __init__(self, deps: Deps | None = None):
        pass

    def pick(self, ctx: RequestContext, workers: Sequence[Worker], scores: Sequence[float]) -> Worker:
        best = max(scores)
        return next(w for w, s in zip(workers, scores) if s >= best - 1e-9)
