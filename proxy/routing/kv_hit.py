"""Score = usable hybrid prefix hit / prompt length, from the workers' KV events (kv/index.py).

Needs the prompt's token ids (the proxy tokenizes only when this scorer is configured). The hits come from the
request's hit memo (kv/request_hits.py), which the PD flow and the deciders read too.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..workers import Worker
from .base import Deps, RequestContext
from .registry import register_scorer


@register_scorer("kv_hit")
class KVHitScorer:
    def __init__(self, deps: Deps):
        self._deps = deps

    def score(self, ctx: RequestContext, workers: Sequence[Worker]) -> list[float]:
        n = len(ctx.token_ids or ())
        if n < 2:
            return [0.0] * len(workers)
        hits = ctx.all_hits(self._deps)
        return [min(1.0, (hits.get(w.url) or hits.setdefault(w.url, 0)) / n) for w in workers]
