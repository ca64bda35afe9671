"""Fewer requests on a worker = higher score: 1 - load / (busiest + 1). The load is the worker's own figure where
its /metrics are read (every proxy replica's requests: proxy/engine_load.py), else this proxy's in flight."""

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
        busiest = max((w.load for w in workers), default=0)
        return [1.0 - w.load / (busiest + 1) for w in workers]
