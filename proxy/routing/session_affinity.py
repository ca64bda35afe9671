"""Keep a session on one worker (its prefix cache stays warm) without a table: rendezvous hashing.

Each worker gets the weight sha256(session, url); the heaviest scores 1, the rest 0. When the heaviest is
ejected the session moves to the next heaviest, and comes back when it returns; adding a worker moves only
the sessions it now wins. A request without a session (header or OpenAI `user`) scores 0 everywhere.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from ..workers import Worker
from .base import Deps, RequestContext
from .registry import register_scorer


def rendezvous_weight(session: str, url: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{session}\0{url}".encode()).digest()[:8], "big")


@register_scorer("session_affinity")
class SessionAffinityScorer:
    def __init__(self, deps: Deps | None = None):
        pass

    def score(self, ctx: RequestContext, workers: Sequence[Worker]) -> list[float]:
        if not ctx.session or not workers:
            return [0.0] * len(workers)
        weights = [rendezvous_weight(ctx.session, w.url) for w in workers]
        top = max(weights)
        return [1.0 if x == top else 0.0 for x in weights]
