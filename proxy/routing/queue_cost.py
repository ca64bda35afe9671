"""Score = the cheapest prefiller's cost / this one's, where a prefiller's cost is the tokens it must compute
before this request's first token: the uncached tokens of what it already has in flight through this proxy, plus
this prompt's tokens past its usable hybrid hit.

Prefillers of one pool run the same model on the same hardware, so tokens stand for time; a request goes where it
would wait and compute least. A shared system prompt therefore draws requests to the prefiller that holds it
until the queue there costs more than computing the prefix elsewhere, and then the burst spreads (with
`kv_hit=2,least_loaded`, a prefiller holding half the prompt wins however loaded it is). The same token
currency decides where a turn D holds is computed (disagg.local_is_cheaper). Needs the prompt's token ids (the
proxy then tokenizes) and the workers' KV events; without them every hit counts as 0 and this is least-queued.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..workers import Worker
from .base import Deps, RequestContext
from .registry import register_scorer


@register_scorer("queue_cost")
class QueueCostScorer:
    def __init__(self, deps: Deps):
        self._deps = deps

    def score(self, ctx: RequestContext, workers: Sequence[Worker]) -> list[float]:
        costs = [w.queued_tokens + ctx.uncached_on(self._deps, w.url) for w in workers]
        best = min(costs, default=0)
        return [(best + 1) / (c + 1) for c in costs]  # 1 for the cheapest; +1: an empty prompt on idle workers
