"""Score = usable hybrid prefix hit / prompt length, from the workers' KV events (kv/index.py).

Needs the prompt's token ids (the proxy tokenizes only when this scorer is configured). Records each
worker's hit in ctx.hits: the PD flow uses the decoder's to skip remote prefill and to report cached tokens.
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
        hits = all_hits(self._deps, ctx)
        return [min(1.0, (hits.get(w.url) or hits.setdefault(w.url, 0)) / n) for w in workers]


def hit_tokens(deps: Deps, ctx: RequestContext, w: Worker) -> int:
    """Usable hybrid hit of ctx's prompt on worker w. The first question answers for every indexed worker at
    once (one pass over the prompt's blocks), kept in ctx.hits for the request's other questions."""
    hits = ctx.hits
    if w.url not in hits:
        all_hits(deps, ctx).setdefault(w.url, 0)  # a worker the index does not know hits nothing
    return hits[w.url]


def all_hits(deps: Deps, ctx: RequestContext) -> dict[str, int]:
    """ctx.hits, holding every indexed worker's hit (computed on the first call)."""
    if not ctx.hits_known:
        ctx.hits.update(deps.kv_index.hits(len(ctx.token_ids or ()), ctx.keys_for, deps.kv.hash_block_size))
        ctx.hits_known = True
    return ctx.hits


def attention_hits(deps: Deps, ctx: RequestContext) -> dict[str, int]:
    """Every indexed worker's attention-only prefix of ctx's prompt, Mamba checkpoints not looked at: what a
    hybrid-blind router calls a hit (the peers' deciders, pd_policies.py). Computed once per request."""
    if ctx.attention_hits is None:
        n = len(ctx.token_ids or ())
        ctx.attention_hits = deps.kv_index.hits(n, ctx.keys_for, deps.kv.hash_block_size, attention_only=True)
    return ctx.attention_hits
