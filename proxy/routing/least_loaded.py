"""Fewer requests in flight through this proxy = higher score: 1 - in_flight / (busiest + 1)."""

from __future__ import annotations

from collections.abc import Sequence

from ..workers import Worker
from .base import Deps, RequestContext
from .registry import register_scorer


@register_scorer("least_loaded")
class LeastLoadedScorer:
    def __init__(self, deps: Deps | None = None):
        pass

    def score(self, ctx: RequestContext, workers: Sequence[Worker]) -> list[float]:
        busiest = max((w.in_flight for w in workers), default=0)
        return [1.0 - w.in_flight / (busiest + 1) for w in workers]
